"""One cell of the study's sweep on Ray: the typed job that crosses the Ray boundary (``TrialJob``,
built by the study's workload from settings validation already built, trusted as it is in the
trial's process) and the Tune function trainable that runs it: the training loop directly in
the Tune trial (one worker), or as a Ray Train ``TorchTrainer`` (DDP) whose metrics
``TuneReportCallback`` forwards. ``run_direct`` is the HPO phase's too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fusion_ray.config import Resources
from fusion_ray.driver.trial import REPEATING_ERRORS, error_summary, trainer_settings, trial_device
from fusion_ray.train.report import TuneReporter
from fusion_ray.train.result import TRIAL_ERROR
from fusion_ray.train.spec import TrialConfig


@dataclass(frozen=True)
class OperatorRef:
    """A fusion operator by registry name with its options (the sweep's latency baseline)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def mapping(self) -> dict[str, Any]:
        """As the training loop's ``latency_baseline`` takes it."""
        return {"name": self.name, "kwargs": dict(self.kwargs)}


@dataclass(frozen=True)
class TrialJob:
    """One cell's trial as the driver hands it to Ray Tune."""

    cell_id: str
    sweep: str
    tune_run: str
    """The Ray Tune run the trial belongs to (names its Ray Train run)."""
    trial: TrialConfig
    """The cell's full config at its seed, built and checked by validation."""
    resources: Resources
    """The trial's dataset's resources (workers, CPUs and GPUs per worker, ...)."""
    train_storage: str
    """Where a multi-worker trial's Ray Train run keeps its state (a path or URI)."""
    resume_from: str | None = None
    """The checkpoint the cell resumes from (its MLflow run's, inside storage), or None."""
    latency_baseline: OperatorRef | None = None
    """The operator the trial times itself against; None measures no latency ratio."""


def run_direct(
    trial: TrialConfig,
    res: Resources,
    reporter_cls: type,
    *,
    latency_baseline: OperatorRef | None = None,
    **reporter_options: Any,
) -> None:
    """Train ``trial`` in this process (a one-worker Tune trial), reporting through ``reporter_cls``;
    ``latency_baseline`` (the sweep's baseline operator, or None) as in ``run_trial``."""
    # lazy: the training loop imports pandas and pyarrow (~0.45 s); only a trial's process
    # trains, the driver's --help and --dry-run run without it
    from fusion_ray.train.loop import run_trial

    torch.set_num_threads(max(1, int(res.cpus_per_worker)))
    reporter = reporter_cls(device=trial_device(res), **reporter_options)
    baseline = latency_baseline.mapping() if latency_baseline is not None else None
    run_trial(trial, reporter, latency_baseline=baseline)


def run_cell(job: TrialJob) -> None:
    """Ray Tune function trainable of a sweep cell: directly (one worker) or as a DDP TorchTrainer.
    ``job`` was built and checked by the driver; it is used as it is."""
    res = job.resources
    if res.workers == 1 and not res.force_trainer:
        try:
            run_direct(
                job.trial,
                res,
                TuneReporter,
                latency_baseline=job.latency_baseline,
                resume_from=job.resume_from,
            )
        except REPEATING_ERRORS as exc:
            # The same config, data and seed fail the same way every time: end the trial with
            # the reason (recorded FAILED by the tracking callback) instead of letting Tune retry.
            # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
            from ray import tune

            tune.report({TRIAL_ERROR: error_summary(exc)})
        return
    _run_trainer(job)


def _run_trainer(job: TrialJob) -> None:
    # lazy: ray.train takes ~3 s to import; only a multi-worker trial needs it
    from ray.train.torch import TorchTrainer

    from fusion_ray.train.loop import train_worker

    res = job.resources
    baseline = job.latency_baseline
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={
            "trial": job.trial,
            "resume_from": job.resume_from,
            "threads": max(1, int(res.cpus_per_worker)),
            "latency_baseline": baseline.mapping() if baseline is not None else None,
        },
        **trainer_settings(res, f"{job.tune_run}-{job.cell_id}", job.train_storage),
    )
    trainer.fit()
