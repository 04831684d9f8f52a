"""One cell of a trainable's sweep on Ray: the trainable called in its Tune trial (one worker)
or as the per-worker loop of a Ray Train ``TorchTrainer`` (DDP, ``resources.workers > 1``).

Its ``report(metrics, step=..., checkpoint=...)`` goes to Tune (``tune.report``) or Ray Train
(``ray.train.report``, the checkpoint from rank 0) with the keys the driver reads
(``fusion_ray.train.result``): ``epoch`` (the step; else a metric ``epoch`` it reported; else
the report's number), ``REPORTED`` (the trainable's own metric names); its return value is reported once more as the ``FINAL`` result.
A resumed trial (Tune's retry, or a sweep run again) gets its last checkpoint as a local folder
in ``report.resume_from``. Runs in the trial's process; the driver builds the ``TrainableJob``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fusion_ray.config import Resources
from fusion_ray.driver.trial import REPEATING_ERRORS, error_summary, trainer_settings
from fusion_ray.schema import STEP_METRIC
from fusion_ray.train.result import FINAL, REPORTED, TRIAL_ERROR
from fusion_ray.trainables import TRAINABLES, Report, run_trainable


@dataclass(frozen=True)
class TrainableJob:
    """One cell of a trainable's sweep (``trainable: NAME``) as the driver hands it to Ray Tune."""

    cell_id: str
    sweep: str
    tune_run: str
    trainable: str
    """The trainable's registered name (loaded in the trial's process)."""
    config: dict[str, Any]
    """The cell's config: the sweep's defaults with its grid point's levels set."""
    seed: int
    """The paired seed (every arm of a block gets the same one)."""
    resources: Resources
    train_storage: str
    metric: str | None = None
    """The sweep's decision metric, which the trainable must return (None: its first)."""
    resume_from: str | None = None


RESERVED = frozenset({FINAL, REPORTED, TRIAL_ERROR, "checkpoint_path", "done", "config"})
"""Names the driver's protocol uses in a report: a trainable's metric may not take them."""


class RaySink:
    """A trainable's reports as results of its trial: ``send(result, checkpoint_dir)`` is
    ``tune.report`` or ``ray.train.report``."""

    def __init__(self, send: Callable[[dict[str, Any], str | None], None], name: str) -> None:
        self.send, self.name, self.reports = send, name, 0

    def __call__(self, metrics: dict[str, float], checkpoint_dir: str | None) -> None:
        taken = sorted(RESERVED & set(metrics))
        if taken:
            raise ValueError(
                f"{self.name} report: {taken} are names the sweep's results use; give the "
                "metric another name"
            )
        step = int(metrics.get("step", metrics.get("epoch", self.reports)))
        self.reports += 1
        names = [k for k in metrics if k != STEP_METRIC]
        # the step always goes with the report (its run's step metric: a resumed run logs each
        # step once), whether the trainable gave it or not
        result = {**metrics, STEP_METRIC: float(step), "epoch": step, REPORTED: json.dumps(names)}
        self.send(result, checkpoint_dir)

    def final(self, metrics: dict[str, float]) -> None:
        self.send({**metrics, FINAL: True, REPORTED: json.dumps(list(metrics))}, None)


@contextlib.contextmanager
def resume_folder(checkpoint: Any, resume_from: str | None) -> Iterator[str | None]:
    """Ray's checkpoint of this trial (a retry), else the cell's checkpoint from an earlier
    invocation (``resume_from``), as a local folder while the trainable runs; None: fresh."""
    if checkpoint is None and resume_from:
        from ray.train import Checkpoint

        checkpoint = Checkpoint(resume_from)
    if checkpoint is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="fusion-ray-resume-") as folder:
        checkpoint.to_directory(folder)
        yield folder


def call_trainable(
    job: TrainableJob, sink: RaySink, checkpoint: Any, rank: int, world: int
) -> None:
    """The trainable at the job's config and seed, its final metrics reported; a ``KeyError``
    when it does not return the sweep's decision metric."""
    entry = TRAINABLES.get(job.trainable)
    with resume_folder(checkpoint, job.resume_from) as folder:
        report = Report(sink, resume_from=folder, rank=rank, world_size=world, name=job.trainable)
        final = run_trainable(entry, job.config, job.seed, report)
    if job.metric is not None and job.metric not in final:
        raise KeyError(
            f"{job.trainable} returned {sorted(final)}, not the sweep's metric {job.metric!r}: "
            "return it, or name one of these under metric: {name: ...}"
        )
    sink.final(final)


def run_trainable_cell(job: TrainableJob) -> None:
    """Ray Tune function trainable of a trainable's cell: directly, or as a DDP TorchTrainer."""
    res = job.resources
    if res.workers > 1 or res.force_trainer:
        _run_trainer(job)
        return
    # lazy: ray.tune takes ~1.7 s to import; only a trial's process needs it
    from ray import tune

    def send(result: dict[str, Any], folder: str | None) -> None:
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder) if folder else None)

    torch.set_num_threads(max(1, int(res.cpus_per_worker)))
    try:
        call_trainable(job, RaySink(send, job.trainable), tune.get_checkpoint(), 0, 1)
    except REPEATING_ERRORS as exc:
        # the same config and seed fail the same way again: the trial ends FAILED, not retried
        tune.report({TRIAL_ERROR: error_summary(exc)})


def trainable_worker(config: dict[str, Any]) -> None:
    """One worker of a trainable's TorchTrainer: every rank reports, rank 0's checkpoint kept."""
    import ray.train

    job: TrainableJob = config["job"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()

    def send(result: dict[str, Any], folder: str | None) -> None:
        kept = ray.train.Checkpoint.from_directory(folder) if folder and rank == 0 else None
        ray.train.report(result, checkpoint=kept)

    torch.set_num_threads(max(1, int(job.resources.cpus_per_worker)))
    call_trainable(job, RaySink(send, job.trainable), ray.train.get_checkpoint(), rank, world)


def _run_trainer(job: TrainableJob) -> None:
    # lazy: ray.train takes ~3 s to import; only a multi-worker trial needs it
    from ray.train.torch import TorchTrainer

    name = f"{job.tune_run}-{job.cell_id}"
    trainer = TorchTrainer(
        trainable_worker,
        train_loop_config={"job": job},
        **trainer_settings(job.resources, name, job.train_storage),
    )
    trainer.fit()
