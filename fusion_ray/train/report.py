"""Where a trial reports metrics and keeps checkpoints: locally, in Ray Tune, or in Ray Train.

The training loop is written once against ``Reporter``; these are the only places in
``fusion_ray.train`` that touch Ray, and only for reporting and checkpoints. A checkpoint that
cannot be used is set aside here (``Reporter.set_aside``): a local folder renamed
``<folder>.unreadable``, a URI left in place, and a note in the next report.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fusion_ray.redact import redact
from fusion_ray.train.result import CHECKPOINT_SET_ASIDE, SetAside, set_aside_note

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"
UNREADABLE_SUFFIX = ".unreadable"
"""What a checkpoint folder set aside is renamed with: ``<folder>.unreadable``."""
LOAD_ERRORS = (
    RuntimeError,  # a truncated or damaged zip archive, a legacy .tar file
    EOFError,  # an empty file
    pickle.UnpicklingError,  # garbage, or a pickle that would run code (weights_only)
    zipfile.BadZipFile,
    OSError,  # no state file in the folder, or one that cannot be read
    ValueError,
)
"""What ``torch.load`` raises for a state file it cannot read."""


class UnreadableCheckpointError(Exception):
    """A checkpoint's state file that ``torch.load`` cannot read; the message says why."""


def load_checkpoint_dir(path: str | os.PathLike) -> dict[str, Any]:
    """The training state saved by the loop in a checkpoint directory; raises
    ``UnreadableCheckpointError`` (one line: the file and why) when it cannot be read."""
    try:
        # weights_only: a checkpoint holds tensors and plain values only, so a tampered file
        # cannot run code when it is loaded.
        return torch.load(Path(path) / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    except LOAD_ERRORS as exc:
        raise UnreadableCheckpointError(f"{CHECKPOINT_FILE}: {load_error_text(exc)}") from exc


def load_error_text(exc: BaseException) -> str:
    """Why ``torch.load`` failed, in one line: its error's first sentence, or for a pickle that
    ``weights_only`` refuses the refused thing (never torch's advice to load it without)."""
    text = str(exc).strip()
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    sentence = text.splitlines()[0].split(". ")[0].rstrip(".") if text else ""
    if isinstance(exc, EOFError) and not sentence:
        sentence = "the file is empty or cut short"
    return f"{type(exc).__name__}: {sentence}" if sentence else type(exc).__name__


@dataclass(frozen=True)
class CheckpointSource:
    """Where a restored training state came from, so that it can be set aside if it is unusable."""

    shown: str
    """The checkpoint's path or URI as notes and messages name it (credentials blanked)."""
    folder: Path | None = None
    """Its folder on this machine, renamed when it is set aside; None for a URI (left in place)."""
    kept_by_ray: bool = False
    """Ray's checkpoint manager lists this folder and deletes it once newer checkpoints come: an
    empty folder is left where it was, so that Ray finds something to delete."""


def set_aside_folder(folder: Path, leave_empty: bool = False) -> Path | None:
    """Rename a checkpoint folder ``<folder>.unreadable`` (``.unreadable.N`` when that name is
    taken); with ``leave_empty`` an empty folder takes its place. None when there is nothing to
    rename (the folder is gone or empty)."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    target, number = folder.with_name(folder.name + UNREADABLE_SUFFIX), 0
    while target.exists():
        number += 1
        target = folder.with_name(f"{folder.name}{UNREADABLE_SUFFIX}.{number}")
    folder.rename(target)
    if leave_empty:
        folder.mkdir()
    return target


@dataclass
class Reporter:
    """Base reporter: one process, no Ray; subclasses say where results and checkpoints go."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    restored_from: CheckpointSource | None = field(default=None, init=False, repr=False)
    """The checkpoint ``restore`` last read (or failed to read)."""
    pending_note: str | None = field(default=None, init=False, repr=False)
    """What ``set_aside`` set aside and why, until the next report carries it."""

    def restore(self) -> dict[str, Any] | None:
        """The latest saved training state of this trial, or None to start fresh; raises
        ``UnreadableCheckpointError`` when its state file cannot be read."""
        return None

    def set_aside(self, reason: str) -> None:
        """Set aside the checkpoint ``restore`` read, which cannot be used (``reason``): rank 0
        renames a local folder ``<folder>.unreadable`` and leaves a URI in place, and its next
        report carries the note (``CHECKPOINT_SET_ASIDE``). Other ranks leave it to rank 0 (Ray
        Train reports rank 0's metrics to Tune)."""
        source = self.restored_from
        if source is None or self.rank != 0:
            return
        moved = None
        if source.folder is not None:
            moved = set_aside_folder(source.folder, leave_empty=source.kept_by_ray)
        self.pending_note = set_aside_note(
            source.shown, reason, redact(str(moved)) if moved else None
        )

    def with_note(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` for the next report: with the set-aside note, once, after ``set_aside``."""
        if self.pending_note is None:
            return metrics
        note, self.pending_note = self.pending_note, None
        return {**metrics, CHECKPOINT_SET_ASIDE: note}

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
        """``report_NNNN`` folders, in order; not those set aside (``report_NNNN.unreadable``)."""
        found = Path(self.out_dir, "checkpoints").glob("report_*")
        return sorted(p for p in found if p.name.removeprefix("report_").isdigit())

    def restore(self) -> dict[str, Any] | None:
        checkpoints = self._checkpoints()
        if not checkpoints:
            return None
        self.restored_from = CheckpointSource(redact(str(checkpoints[-1])), checkpoints[-1])
        return load_checkpoint_dir(checkpoints[-1])

    def set_aside(self, reason: str) -> None:
        super().set_aside(reason)
        if self.pending_note is not None:  # no driver to say it: this process says it
            log.warning(
                "trial in %s: %s", self.out_dir, SetAside.parse(self.pending_note).sentence("trial")
            )

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        metrics = self.with_note(metrics)
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


def _restore_from_ray(
    reporter: Reporter, checkpoint: Any, resume_from: str | None
) -> dict[str, Any] | None:
    """The state in Ray's own checkpoint of this trial (``checkpoint``), else in ``resume_from``;
    ``reporter.restored_from`` says which, for ``set_aside``."""
    from ray.train import Checkpoint

    kept_by_ray = checkpoint is not None
    if checkpoint is None and resume_from:
        checkpoint = Checkpoint(resume_from)
    if checkpoint is None:
        return None
    reporter.restored_from = _ray_source(checkpoint, None if kept_by_ray else resume_from)
    with checkpoint.as_directory() as path:
        return load_checkpoint_dir(path)


def _ray_source(checkpoint: Any, resume_from: str | None) -> CheckpointSource:
    """A Ray checkpoint as a ``CheckpointSource``: its folder when it is on this machine's file
    system (a local or shared ``storage_path``), else its URI."""
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        folder = Path(checkpoint.path)
        return CheckpointSource(redact(str(folder)), folder, kept_by_ray=resume_from is None)
    shown = resume_from or f"{checkpoint.filesystem.type_name}://{checkpoint.path}"
    return CheckpointSource(redact(shown))


@dataclass
class TuneReporter(Reporter):
    """One-worker trial running the loop directly inside a Ray Tune function trainable."""

    resume_from: str | None = None
    """A checkpoint URI from an earlier sweep invocation, used when Tune has none of its own."""

    def restore(self) -> dict[str, Any] | None:
        from ray import tune

        return _restore_from_ray(self, tune.get_checkpoint(), self.resume_from)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        from ray import tune
        from ray.tune import Checkpoint

        checkpoint = Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        tune.report(self.with_note(metrics), checkpoint=checkpoint)


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

        return _restore_from_ray(self, ray.train.get_checkpoint(), self.resume_from)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        import ray.train

        checkpoint = None
        if checkpoint_dir is not None and self.rank == 0:
            checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(self.with_note(metrics), checkpoint=checkpoint)
