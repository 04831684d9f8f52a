"""Where a trial reports metrics and keeps checkpoints: locally, in Ray Tune, or in Ray Train.

The training loop is written once against ``Reporter``; these are the only places in
``fusion_ray.train`` that touch Ray, and only for reporting and checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FILE = "state.pt"


def load_checkpoint_dir(path: str | os.PathLike) -> dict[str, Any]:
    """The training state saved by the loop in a checkpoint directory."""
    # weights_only: a checkpoint holds tensors and plain values only, so a tampered file cannot
    # run code when it is loaded.
    return torch.load(Path(path) / CHECKPOINT_FILE, map_location="cpu", weights_only=True)


@dataclass
class Reporter:
    """Base reporter: one process, no Ray; subclasses say where results and checkpoints go."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def restore(self) -> dict[str, Any] | None:
        """The latest saved training state of this trial, or None to start fresh."""
        return None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        raise NotImplementedError

    # Observers for diagnostics and tests; the loop calls them, they change nothing.
    def on_train_batch(self, epoch: int, indices: list[int]) -> None:
        """Called with the document indices this rank trains on in each step."""

    def on_epoch_end(self, epoch: int, model: torch.nn.Module) -> None:
        """Called after each epoch's optimiser steps, before validation."""


@dataclass
class LocalReporter(Reporter):
    """Writes checkpoints to ``out_dir/checkpoints/epoch_NNNN`` and metrics to ``metrics.jsonl``.

    Used by ``python -m fusion_ray.train`` for debugging without Ray, and by tests.
    """

    out_dir: str = "trial_out"
    stop_after_reports: int | None = None
    """Raise ``KeyboardInterrupt`` after this many reports (to test resumption)."""
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        Path(self.out_dir, "checkpoints").mkdir(parents=True, exist_ok=True)

    def _checkpoints(self) -> list[Path]:
        return sorted(Path(self.out_dir, "checkpoints").glob("report_*"))

    def restore(self) -> dict[str, Any] | None:
        checkpoints = self._checkpoints()
        return load_checkpoint_dir(checkpoints[-1]) if checkpoints else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        self.history.append(dict(metrics))
        with open(Path(self.out_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if checkpoint_dir is not None:
            index = len(self._checkpoints())
            shutil.copytree(
                checkpoint_dir, Path(self.out_dir, "checkpoints", f"report_{index:04d}")
            )
        if self.stop_after_reports is not None and len(self.history) >= self.stop_after_reports:
            raise KeyboardInterrupt(f"stopped after {len(self.history)} reports")


def _restore_from_ray(checkpoint: Any, resume_from: str | None) -> dict[str, Any] | None:
    from ray.train import Checkpoint

    if checkpoint is None and resume_from:
        checkpoint = Checkpoint(resume_from)
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as path:
        return load_checkpoint_dir(path)


@dataclass
class TuneReporter(Reporter):
    """One-worker trial running the loop directly inside a Ray Tune function trainable."""

    resume_from: str | None = None
    """A checkpoint URI from an earlier sweep invocation, used when Tune has none of its own."""

    def restore(self) -> dict[str, Any] | None:
        from ray import tune

        return _restore_from_ray(tune.get_checkpoint(), self.resume_from)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        from ray import tune
        from ray.tune import Checkpoint

        checkpoint = Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        tune.report(metrics, checkpoint=checkpoint)


@dataclass
class TrainReporter(Reporter):
    """One worker of a Ray Train ``TorchTrainer`` (DDP); every rank reports, rank 0 checkpoints."""

    resume_from: str | None = None

    @classmethod
    def from_context(cls, resume_from: str | None = None) -> TrainReporter:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        return cls(
            world_size=ctx.get_world_size(),
            rank=ctx.get_world_rank(),
            local_rank=ctx.get_local_rank(),
            device=ray.train.torch.get_device(),
            resume_from=resume_from,
        )

    def restore(self) -> dict[str, Any] | None:
        import ray.train

        return _restore_from_ray(ray.train.get_checkpoint(), self.resume_from)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        import ray.train

        checkpoint = None
        if checkpoint_dir is not None and self.rank == 0:
            checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint)
