"""The study's sweeps as the driver runs them (``fusion_ray.driver.workload``; declared as
``study`` in the entry-point group ``fusion_ray.workloads``): each cell's ``TrialJob`` with the
operator every trial times itself against (the sweep's baseline); the parent run's display
order (operators in the fusion registry's order, datasets in the file's); the metrics its runs
log (``fusion_ray.schema``: each epoch's, and the final test metrics, length quarters,
initial scales, latency ratio, accuracies at evaluation lengths and reference baselines); each
dataset's reference baselines logged on the parent run from its first finished trial; each
finished cell's per-document predictions (and gates, and predictions by length) kept from its
final checkpoint; a finished trial said as its test accuracy in percent."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fusion_ray.config import SweepSpec
from fusion_ray.model.fusion import FUSIONS
from fusion_ray.schema import (
    DISPLAY_ORDER_TAG,
    EPOCH_METRICS,
    EVAL_LENGTH_METRIC_PREFIXES,
    FINAL_METRICS,
    GATES_FILE,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    LENGTH_PREDICTIONS_FILE,
    LENGTH_QUARTER_METRICS,
    PARENT_BASELINE_PREFIX,
    PREDICTIONS_FILE,
    REFERENCE_METRIC_PREFIX,
)
from fusion_ray.study.trial import OperatorRef, TrialJob, run_cell
from fusion_ray.train.result import TrialResult

log = logging.getLogger("fusion_ray.driver.callbacks")


class StudyWorkload:
    """The study's encoder over its datasets, positions and operators."""

    trial_function = staticmethod(run_cell)
    step_metric = "val_acc"

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.references_logged: set[str] = set()

    def job(
        self, cell: Any, resume_from: str | None, tune_run: str, train_storage: str
    ) -> TrialJob:
        return TrialJob(
            cell_id=cell.cell_id,
            sweep=self.spec.name,
            tune_run=tune_run,
            trial=cell.trial,
            resources=self.spec.group_resources(cell.resource_group),
            train_storage=train_storage,
            resume_from=resume_from,
            latency_baseline=latency_baseline(self.spec),
        )

    def parent_params(self, cells: Sequence[Any]) -> dict[str, str]:
        return {DISPLAY_ORDER_TAG: json.dumps(display_order(cells))}

    def epoch_metrics(self, result: dict) -> Sequence[str]:
        return EPOCH_METRICS

    def final_record(self, result: dict) -> tuple[Sequence[str], dict[str, str]]:
        return final_metric_names(result), {}

    def final_metrics(self, tracker: Any, parent_id: str, cell: Any, result: dict) -> None:
        """A dataset's reference baselines, from its first trial's final metrics."""
        if cell.dataset not in self.references_logged:
            tracker.log_parent_metrics(parent_id, reference_baselines(cell.dataset, result))
            self.references_logged.add(cell.dataset)

    def keep(self, tracker: Any, run_id: str, checkpoint: str) -> bool:
        return log_predictions(tracker, run_id, checkpoint)

    def completed(self, tracker: Any, cell: Any, run_id: str, checkpoint: str | None) -> None:
        """The predictions (and gates) of the final checkpoint, kept in the run's artifacts."""
        if checkpoint is None or not self.keep(tracker, run_id, checkpoint):
            log.warning(
                "cell %s: no test_predictions.parquet in its final checkpoint", cell.cell_id
            )

    def outcome(self, last: TrialResult) -> str:
        return f"test_acc {100 * (last.test_acc or 0.0):.2f}%"


def display_order(cells: Sequence[Any]) -> dict[str, list[str]]:
    """The sweep's operators in the fusion registry's order and its datasets in the sweep
    file's (the grid's cells come in it): how the report lists them (``DISPLAY_ORDER_TAG``)."""
    used = {c.fusion.split("(", 1)[0] for c in cells}
    registered = [name for name in FUSIONS.names() if name in used]
    return {
        "operator": registered + sorted(used - set(registered)),
        "dataset": list(dict.fromkeys(c.dataset for c in cells)),
    }


def latency_baseline(spec: SweepSpec) -> OperatorRef:
    """The operator every trial times itself against (the report's baseline)."""
    label = spec.baseline_label
    entries = [spec.grid.fusions, *(sub.fusions or [] for sub in spec.include)]
    entry = next(e for group in entries for e in group if label in (e.name, e.label))
    return OperatorRef(entry.name, entry.kwargs)


def final_metric_names(result: dict) -> tuple[str, ...]:
    """The final metrics a study trial's run logs: its test metrics, length quarters, initial
    scales and latency ratio, and those of its result at evaluation lengths and of the
    reference baselines."""
    prefixed = (*EVAL_LENGTH_METRIC_PREFIXES, REFERENCE_METRIC_PREFIX)
    fixed = (*FINAL_METRICS, *LENGTH_QUARTER_METRICS, *INIT_METRICS, LATENCY_RATIO_METRIC)
    return fixed + tuple(k for k in result if k.startswith(prefixed))


def reference_baselines(dataset: str, result: dict) -> dict[str, float]:
    """A dataset's reference baselines as the parent run's metrics, from a trial's final
    metrics: ``baseline.<dataset>.<baseline>.test_acc`` (and ``.val_acc``)."""
    return {
        PARENT_BASELINE_PREFIX + f"{dataset}." + k.removeprefix(REFERENCE_METRIC_PREFIX): v
        for k, v in result.items()
        if k.startswith(REFERENCE_METRIC_PREFIX)
    }


def log_predictions(tracker: Any, run_id: str, checkpoint: str) -> bool:
    """Copy ``test_predictions.parquet`` from the final checkpoint into the run's artifacts,
    and beside it ``gate_by_position.parquet`` (the loop writes it for gated operators only)
    and ``test_predictions_by_length.parquet`` (with data.eval_lengths only) when the
    checkpoint has them; False when the predictions are missing."""
    names = (PREDICTIONS_FILE, GATES_FILE, LENGTH_PREDICTIONS_FILE)
    return bool(tracker.log_checkpoint_files(run_id, checkpoint, names))
