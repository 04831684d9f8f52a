"""A trial's checkpoint: what it holds (model, optimiser, scheduler, RNG states, the best epoch
so far), saving it with the epoch's report, and resuming from it with every RNG where it was.
A checkpoint that cannot be loaded or does not fit the trial's model is set aside (``resume``)
and the trial starts again from scratch.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from fusion_ray.train.report import CHECKPOINT_FILE, Reporter, UnreadableCheckpointError
from fusion_ray.train.spec import (
    TrialConfig,
)

if TYPE_CHECKING:
    from fusion_ray.model.classifier import FusionClassifier

# ----------------------------------------------------------------------------- small helpers


def _lr_on_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """After ``load_state_dict`` (which puts the saved learning-rate tensor in place of the
    live one), the learning rate back on the device where a capturable optimiser reads it."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = group["lr"].to(device=device, dtype=torch.float32)


def unwrap(model: nn.Module) -> FusionClassifier:
    """The classifier itself, out of its DistributedDataParallel wrapper where it has one."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    # every model trained here is built by build_classifier: a FusionClassifier
    return cast("FusionClassifier", inner)


def state_dict_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in unwrap(model).state_dict().items()}


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@dataclasses.dataclass
class Progress:
    """Everything besides weights and optimiser that a resumed run needs to continue exactly."""

    epochs_done: int = 0
    best_val_acc: float = -1.0
    best_epoch: int = -1
    bad_epochs: int = 0
    stopped_early: bool = False
    train_seconds: float = 0.0
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def record(self, metrics: dict[str, float], patience: int | None) -> bool:
        """Add one epoch's metrics; True when its validation accuracy is the best so far."""
        epoch, val_acc = int(metrics["epoch"]), metrics["val_acc"]
        self.history.append(metrics)
        self.epochs_done = epoch + 1
        self.train_seconds += metrics["epoch_seconds"]
        improved = val_acc > self.best_val_acc
        if improved:
            self.best_val_acc, self.best_epoch, self.bad_epochs = val_acc, epoch, 0
        else:
            self.bad_epochs += 1
        if patience is not None and self.bad_epochs >= patience:
            self.stopped_early = True
        return improved


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    progress: Progress,
    best_state: dict[str, torch.Tensor] | None,
    trial: TrialConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Everything a resumed run needs to continue exactly: weights, optimiser, schedule, every
    rank's RNG state, progress, the best weights so far, and the trial's config."""
    rng: list[dict[str, Any] | None] = [_rng_state(device)]
    if dist.is_available() and dist.is_initialized():  # every rank's dropout stream
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, _rng_state(device))
    return {
        "model": state_dict_copy(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng,
        "progress": dataclasses.asdict(progress),
        "best_model": best_state,
        "trial": dataclasses.asdict(trial),
    }


SAVED_KEYS = ("model", "optimizer", "scheduler", "rng", "progress", "best_model")
"""What ``restore`` reads of a checkpoint state (``checkpoint_state`` writes them and more)."""


class Resumed(NamedTuple):
    """Where a resumed trial is: its progress, best weights so far, and the state it resumed."""

    progress: Progress
    best_state: dict[str, torch.Tensor] | None
    state: dict[str, Any]


def resume(
    reporter: Reporter,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    device: torch.device,
) -> Resumed | None:
    """The trial's latest checkpoint, loaded into the model, optimiser and schedule; None to
    start from scratch: there is none, or it cannot be loaded or does not fit (then the reporter
    sets it aside, with the reason, and nothing was loaded). Under DDP every rank resumes, or
    none does."""
    try:
        saved = reporter.restore()
        problem = None if saved is None else misfit(saved, model, optimizer)
    except UnreadableCheckpointError as exc:
        saved, problem = None, str(exc)
    problem = _any_rank(problem)
    if problem is not None:
        reporter.set_aside(problem)
        return None
    if saved is None:
        return None
    return Resumed(*restore(saved, model, optimizer, scheduler, rank, device), saved)


def misfit(saved: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why a saved state cannot be restored into this model and optimiser (a key missing, a
    progress record of another shape, weights with other names or shapes, other parameter
    groups), or None; checked before anything is loaded."""
    if not isinstance(saved, dict):
        return f"the state is a {type(saved).__name__}, not a training state"
    missing = [k for k in SAVED_KEYS if k not in saved]
    if missing:
        return f"the state has no {', '.join(repr(k) for k in missing)}"
    try:
        Progress(**saved["progress"])
    except TypeError as exc:
        return f"the saved progress does not fit: {exc}"
    expected = unwrap(model).state_dict()
    for name, what in (("model", "weights"), ("best_model", "best weights")):
        if name == "best_model" and saved[name] is None:
            continue  # no epoch had ended
        problem = weights_misfit(saved[name], expected)
        if problem is not None:
            return f"the saved {what} do not fit the model: {problem}"
    return optimizer_misfit(saved["optimizer"], optimizer) or _schedule_and_rng_misfit(saved)


def weights_misfit(weights: Any, expected: Mapping[str, torch.Tensor]) -> str | None:
    """How saved weights differ from a model's state dict: names missing or unexpected, or a
    tensor of another shape (the first few of each); None when they fit."""
    if not isinstance(weights, Mapping):
        return f"the weights are a {type(weights).__name__}"
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    shapes = [
        f"{k} {tuple(weights[k].shape)} (the model's {tuple(v.shape)})"
        for k, v in expected.items()
        if k in weights
        and (not isinstance(weights[k], torch.Tensor) or weights[k].shape != v.shape)
    ]
    parts = [
        f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
        for what, names in (("missing", missing), ("unexpected", unexpected), ("shape", shapes))
        if names
    ]
    return "; ".join(parts) or None


def optimizer_misfit(state: Any, optimizer: torch.optim.Optimizer) -> str | None:
    """How a saved optimiser state differs from the optimiser's groups of parameters (what
    ``load_state_dict`` would refuse, or read later at the first step), or None."""
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    if not (
        isinstance(groups, list)
        and all(isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in groups)
        and isinstance(state.get("state"), Mapping)
    ):
        return "the saved optimizer state is not an optimiser's"
    saved_sizes = [len(g["params"]) for g in groups]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != sizes:
        return f"the saved optimizer has groups of {saved_sizes} parameters, not {sizes}"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in groups for i in g["params"]]
    for index, param in zip(ids, params, strict=True):
        per_param = state["state"].get(index, {})
        for name, value in per_param.items() if isinstance(per_param, Mapping) else ():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                shape, expected = tuple(value.shape), tuple(param.shape)
                return f"the saved optimizer's {name} of a parameter is {shape}, not {expected}"
    return None


def _schedule_and_rng_misfit(saved: dict[str, Any]) -> str | None:
    """Whether the saved schedule and RNG states are what ``restore`` sets (a mapping, and one
    CPU generator state per rank), or why not."""
    if not isinstance(saved["scheduler"], Mapping):
        return "the saved scheduler state is not a schedule's"
    rng, cpu_state = saved["rng"], torch.get_rng_state()
    if not (isinstance(rng, list) and rng):
        return "the state has no RNG state"
    for state in rng:
        generator = state.get("torch") if isinstance(state, Mapping) else None
        if not (
            isinstance(generator, torch.Tensor)
            and generator.dtype == cpu_state.dtype
            and generator.shape == cpu_state.shape
        ):
            return "the saved RNG state is not a generator's"
    return None


def _any_rank(problem: str | None) -> str | None:
    """The first rank's problem with the checkpoint, on every rank (under DDP): if one rank
    cannot resume from it, no rank does."""
    if not (dist.is_available() and dist.is_initialized()):
        return problem
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p if i == 0 else f"rank {i}: {p}" for i, p in enumerate(problems) if p), None)


def restore(
    saved: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    device: torch.device,
) -> tuple[Progress, dict[str, torch.Tensor] | None]:
    """Load a checkpoint state into the model, optimiser and schedule; (progress, best weights)."""
    unwrap(model).load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    _lr_on_device(optimizer, device)
    scheduler.load_state_dict(saved["scheduler"])
    _set_rng_state(saved["rng"][min(rank, len(saved["rng"]) - 1)], device)
    return Progress(**saved["progress"]), saved["best_model"]


def save_and_report(
    reporter: Reporter,
    metrics: dict[str, Any],
    state: dict[str, Any],
    files: Mapping[str, pd.DataFrame] | None = None,
) -> None:
    """Report ``metrics`` with a checkpoint of ``state`` and, beside it, ``files`` (parquet by
    file name: the test predictions, the gate by position, the predictions by length)."""
    with tempfile.TemporaryDirectory() as ckpt_dir:
        if reporter.rank == 0:
            torch.save(state, Path(ckpt_dir, CHECKPOINT_FILE))
            for name, frame in (files or {}).items():
                frame.to_parquet(Path(ckpt_dir, name), index=False)
        reporter.report(metrics, checkpoint_dir=ckpt_dir)
