"""What every kind of trial shares on Ray (the study's, ``fusion_ray.study.trial``; a
trainable's, ``fusion_ray.driver.trainable_trial``): the resources it holds, the device a
one-worker trial trains on, the errors that are not retried, and the ``TorchTrainer`` settings
of a multi-worker trial (DDP, its metrics forwarded by ``TuneReportCallback``). The driver's
side, Ray start-up, signals and stops, is ``fusion_ray.driver.session``.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any

import torch

from fusion_ray.config import Resources

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
