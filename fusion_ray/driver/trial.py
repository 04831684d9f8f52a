"""What the sweep and the HPO phase share to run one trial on Ray: where its checkpoints go,
the resources it holds, the device it trains on, and the Tune trainable that runs it (the
driver's side, Ray start-up, signals and stops, is ``fusion_ray.driver.session``).

A trial with one worker trains directly inside its Tune trial; one with several workers runs a
Ray Train ``TorchTrainer`` (DDP) inside it, its metrics forwarded by ``TuneReportCallback``.
Everything here is called on the driver except ``run_cell`` and ``trial_device``, which run in
the trial's process.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any

import torch

from fusion_ray.config import Resources
from fusion_ray.driver.job import OperatorRef, TrialJob
from fusion_ray.train.report import TuneReporter
from fusion_ray.train.result import TRIAL_ERROR
from fusion_ray.train.spec import TrialConfig

log = logging.getLogger(__name__)

CPU_FALLBACK_ENV = "FUSION_RAY_CPU_FALLBACK"


def worker_resources(res: Resources) -> dict[str, float]:
    """What one worker of a trial holds: its CPUs, and its GPUs when the sweep asks for them."""
    out = {"CPU": res.cpus_per_worker}
    if res.use_gpu:
        out["GPU"] = res.gpus_per_worker
    return out


def trial_resources(res: Resources) -> dict[str, float]:
    """What the Tune trial itself holds: the worker (direct path), or a token bundle plus one unit of
    ``driver_resource`` when set (TorchTrainer path; the workers hold the CPUs and GPUs)."""
    if res.workers == 1 and not res.force_trainer:
        return worker_resources(res)
    # The TorchTrainer's workers request their own resources. Tune needs a non-empty bundle for the
    # trial itself; a token 1 KiB of memory keeps it from holding a CPU the workers need. With
    # `driver_resource`, one unit of that custom resource pins the trial (and the Train controller,
    # which Ray places on the trial's node) to the nodes offering it, e.g. the cluster's head.
    out: dict[str, float] = {"memory": 1024}
    if res.driver_resource:
        out[res.driver_resource] = 1
    return out


def trial_bundles(res: Resources) -> list[dict[str, float]]:
    """Every resource bundle one trial asks for: the trial's own, then one per TorchTrainer
    worker (the placement check packs these onto the cluster's nodes)."""
    own = trial_resources(res)
    if res.workers == 1 and not res.force_trainer:
        return [own]
    return [own] + [worker_resources(res) for _ in range(res.workers)]


def trial_device(res: Resources) -> Any:
    """The device a one-worker trial trains on, in the trial's process: its GPU when the sweep
    asks for one, the CPU otherwise. A GPU trial on a node whose torch has no CUDA fails with the
    fix, unless $FUSION_RAY_CPU_FALLBACK=1 asks to rehearse a GPU sweep on CPU nodes."""
    if not res.use_gpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if os.environ.get(CPU_FALLBACK_ENV) == "1":
        return torch.device("cpu")
    raise RuntimeError(
        f"the sweep asks for GPUs (resources.use_gpu: true) but torch {torch.__version__} on this "
        "node has no CUDA: install a CUDA build of torch on the GPU nodes, or set use_gpu: false "
        f"({CPU_FALLBACK_ENV}=1 trains on CPU instead, to rehearse a GPU sweep on CPU nodes)"
    )


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
    ``job`` was built and checked by the driver; it is used as it is (a trainable's cell runs
    through ``trainable_trial.run_trainable_cell``)."""
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


REPEATING_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FloatingPointError,
    FileNotFoundError,
    ConnectionError,
)
"""Errors a trial raises because of its config or data (bad values, a non-finite loss at a given
seed, a missing file, a dataset that cannot be downloaded): retrying would repeat them."""


def error_summary(exc: BaseException) -> str:
    lines = traceback.format_exception(exc)
    return "".join(lines[-6:]).strip() + "\n(not retried: this error repeats on every attempt)"


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


def trainer_settings(res: Resources, name: str, storage: str) -> dict[str, Any]:
    """The ``TorchTrainer`` keywords of every multi-worker sweep trial: DDP's backend (NCCL on
    GPUs, gloo on CPUs), its workers, and its Ray Train run ``name`` under ``storage``."""
    # lazy: ray.train takes ~3 s to import; only a multi-worker trial needs it
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig
    from ray.tune.integration.ray_train import TuneReportCallback

    return {
        "torch_config": TorchConfig(backend="nccl" if res.use_gpu else "gloo"),
        "scaling_config": ScalingConfig(
            num_workers=res.workers, use_gpu=res.use_gpu, resources_per_worker=worker_resources(res)
        ),
        # One Train run per cell and sweep invocation: a Tune retry of this trial restarts the
        # trainer under the same name, and Ray Train resumes it from its last checkpoint. Across
        # invocations a cell resumes only from the checkpoint its MLflow run records
        # (`resume_from`). Retries happen at one level, Tune's, so `retries` means what it says.
        "run_config": RunConfig(
            name=name,
            storage_path=storage,
            # ray.train exports Train V2's configs at run time (V2 is on by default), but
            # type checkers read its V1 ones (ray.air.config): no max_preemption_failures there,
            # and callbacks typed as Tune's
            failure_config=FailureConfig(  # type: ignore[call-arg]
                max_failures=0, max_preemption_failures=0
            ),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=[TuneReportCallback()],  # type: ignore[list-item]
        ),
    }
