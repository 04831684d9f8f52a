"""A trial's checkpoint: what it holds (model, optimiser, scheduler, RNG states, the best epoch
so far), saving it with the epoch's report, and resuming from it with every RNG where it was.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from fusion_ray.train.report import CHECKPOINT_FILE, Reporter
from fusion_ray.train.spec import (
    TrialConfig,
)

# ----------------------------------------------------------------------------- small helpers


def _lr_on_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """After ``load_state_dict`` (which puts the saved learning-rate tensor in place of the
    live one), the learning rate back on the device where a capturable optimiser reads it."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = group["lr"].to(device=device, dtype=torch.float32)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


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
    rng = [_rng_state(device)]
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
