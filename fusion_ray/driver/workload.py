"""What the driver asks of a kind of sweep, so that it runs any kind without knowing it: one
``Workload`` per kind, by name, in ``WORKLOADS``: ``trainable`` (a registered training function:
``fusion_ray.driver.trainable_trial``) is built in; the study's encoder is ``study``
(``fusion_ray.study.workload``), declared in the entry-point group ``fusion_ray.workloads`` like
a plug-in. A sweep spec names its kind (``spec.workload``).

A workload builds each cell's job (what crosses into the trial's process) and names the module
level function that runs it there; says what the sweep's parent run records of its cells, which
metrics of a trial's epoch and final results are logged (the tracker logs what it is told), and
which metric's steps say how far a run got; is told of each cell's final metrics and of its end
(what it keeps: the study's predictions and reference baselines); and says in a few words what
a finished trial gave (its progress line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fusion_ray.config import Resources
from fusion_ray.driver.trainable_trial import TrainableJob, run_trainable_cell
from fusion_ray.registry import Registry
from fusion_ray.schema import RETURNED_TAG, STEP_METRIC, TRAINABLE_TAG, decided_metric
from fusion_ray.train.result import TrialResult


class Workload(Protocol):
    """One kind of sweep as the driver runs it (``WORKLOADS``)."""

    trial_function: Callable[[Any], None]
    """Runs one job in its Tune trial's process (a module-level function: Ray pickles it)."""

    def job(self, cell: Any, resume_from: str | None, tune_run: str, train_storage: str) -> Any: ...

    step_metric: str
    """The epoch metric whose logged steps say how far a run got (a resumed run logs each
    epoch once)."""

    def parent_params(self, cells: Sequence[Any]) -> dict[str, str]:
        """Tags of the sweep's parent run that describe its cells."""

    def epoch_metrics(self, result: dict) -> Sequence[str]:
        """The metrics of an epoch's result that its run logs at the epoch's step."""

    def final_record(self, result: dict) -> tuple[Sequence[str], dict[str, str]]:
        """The metrics of the final result that its run logs, and the tags it sets first."""

    def final_metrics(self, tracker: Any, parent_id: str, cell: Any, result: dict) -> None:
        """Told once per cell when its final metrics are logged (the study: reference baselines
        on the parent run)."""

    def keep(self, tracker: Any, run_id: str, checkpoint: str) -> bool:
        """Keep in the run what it needs of a finished cell's last checkpoint (the study: its
        predictions); False when that is not there."""

    def completed(self, tracker: Any, cell: Any, run_id: str, checkpoint: str | None) -> None:
        """Told when a cell's run is about to be marked FINISHED, with its last checkpoint."""

    def outcome(self, last: TrialResult) -> str:
        """What a finished trial gave, for its progress line."""


def _accept(loaded: Any, origin: str) -> Any:
    if isinstance(loaded, type):
        return loaded
    raise TypeError(f"{origin}: a workload is a class taking the sweep's spec, not {loaded!r}")


WORKLOADS: Registry[Any] = Registry("workload", "fusion_ray.workloads", accept=_accept)
"""Kinds of sweep by name: classes ``Workload(spec)``."""


def workload_for(spec: Any) -> Workload:
    """The workload of ``spec`` (its ``workload`` name), built on it."""
    workload: Workload = WORKLOADS.get(spec.workload)(spec)
    return workload


@WORKLOADS.register("trainable")
class TrainableWorkload:
    """A trainable's sweep (``trainable: NAME``): each cell the trainable at its config and seed."""

    trial_function = staticmethod(run_trainable_cell)
    step_metric = STEP_METRIC

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def job(
        self, cell: Any, resume_from: str | None, tune_run: str, train_storage: str
    ) -> TrainableJob:
        spec = self.spec
        resources: Resources = spec.group_resources(cell.resource_group)
        return TrainableJob(
            cell.cell_id, spec.name, tune_run, spec.trainable, cell.config, cell.seed,
            resources, train_storage, metric=spec.metric.name, resume_from=resume_from,
        )  # fmt: skip

    def parent_params(self, cells: Sequence[Any]) -> dict[str, str]:
        spec = self.spec
        record = {"trainable": spec.trainable, "axis": spec.axis, "baseline": spec.baseline_text}
        record |= {"metric": spec.metric.name, "mode": spec.metric.mode, "trend": spec.trend}
        return {TRAINABLE_TAG: json.dumps(record)}

    def epoch_metrics(self, result: dict) -> Sequence[str]:
        """What the trainable reported at this step, and the step."""
        return (*(TrialResult.of(result).reported or ()), STEP_METRIC)

    def final_record(self, result: dict) -> tuple[Sequence[str], dict[str, str]]:
        """What it returned, their order in ``RETURNED_TAG``."""
        returned = TrialResult.of(result).reported or []
        return returned, {RETURNED_TAG: json.dumps(returned)[:4900]}

    def final_metrics(self, tracker: Any, parent_id: str, cell: Any, result: dict) -> None:
        return None

    def keep(self, tracker: Any, run_id: str, checkpoint: str) -> bool:
        return True  # its checkpoints are its own: nothing of them is copied to the run

    def completed(self, tracker: Any, cell: Any, run_id: str, checkpoint: str | None) -> None:
        return None

    def outcome(self, last: TrialResult) -> str:
        """The decision metric (the first returned when the sweep names none), 4 digits."""
        name = decided_metric(self.spec.metric.name, last.reported or [])
        value = last.metrics.get(name) if name else None
        return f"{name} {float(value):.4g}" if value is not None else "finished"
