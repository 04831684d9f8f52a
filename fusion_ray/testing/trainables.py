"""The trainable contract suite: ``check_trainable(name)`` runs a registered trainable on a
small config, in this process and without Ray, and raises ``AssertionError`` naming the
trainable and the check that failed:

- it runs through its registered name and returns a non-empty mapping of metric names to
  numbers, and every report it makes is accepted (numbers, a step, a checkpoint directory);
- where it declares itself deterministic, the same config and seed give the same metrics;
- different seeds give different metrics (a trainable that ignores its seed pairs nothing);
- where it reports checkpoints: stopped after its first checkpoint and called again with
  ``report.resume_from`` set to it, it finishes with fewer reports than a fresh run (it resumed
  instead of starting again) and, where deterministic, with the same metrics.

Timings vary from run to run whatever the seed: metrics whose names contain ``seconds`` or
``latency`` or end in ``_ms`` are left out of the two comparisons (``TIMING``).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fusion_ray.trainables import TRAINABLES, Report, TrainableEntry, run_trainable

TIMING = re.compile(r"seconds|latency|_ms$")
"""Metric names that are timings: not compared between runs."""


class _Stopped(Exception):
    """Raised by the sink to stop a run after its first checkpoint (the resume check)."""


class _Sink:
    """Where a checked run's reports go: kept in memory, each checkpoint copied into ``folder``."""

    def __init__(self, folder: Path, stop_at_checkpoint: bool = False) -> None:
        self.folder, self.stop = folder, stop_at_checkpoint
        self.reports: list[dict[str, float]] = []
        self.checkpoints: list[Path] = []

    def __call__(self, metrics: dict[str, float], checkpoint: str | None) -> None:
        self.reports.append(metrics)
        if checkpoint is not None:
            kept = self.folder / f"checkpoint_{len(self.checkpoints):04d}"
            shutil.copytree(checkpoint, kept)
            self.checkpoints.append(kept)
            if self.stop:
                raise _Stopped


def _run(
    name: str, entry: TrainableEntry, config: Mapping[str, Any], seed: int, folder: Path, **kw: Any
) -> tuple[dict[str, float], _Sink]:
    resume_from = kw.pop("resume_from", None)
    sink = _Sink(folder, **kw)
    folder.mkdir(parents=True, exist_ok=True)
    report = Report(sink, resume_from=resume_from, name=f"trainable {name!r}")
    try:
        return run_trainable(entry, config, seed, report), sink
    except TypeError as exc:
        raise AssertionError(f"trainable {name!r} at seed {seed}: {exc}") from exc


def _compared(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not TIMING.search(k)}


def _differences(a: Mapping[str, float], b: Mapping[str, float]) -> list[str]:
    a, b = _compared(a), _compared(b)
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k)]


def check_trainable(
    name: str, config: Mapping[str, Any] | None = None, *, seeds: tuple[int, int] = (0, 1)
) -> str:
    """Run the contract on the trainable ``name`` with ``config`` (default: its declared
    example); returns its metric (the first it returns)."""
    entry = TRAINABLES.get(name)
    if config is None:
        assert entry.example is not None, (
            f"trainable {name!r} declares no example config: pass one to check_trainable, or "
            "register it with example={...}"
        )
        config = entry.example
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        first, sink = _run(name, entry, config, seeds[0], root / "first")
        if entry.deterministic:
            again, _ = _run(name, entry, config, seeds[0], root / "again")
            changed = _differences(first, again)
            assert not changed, (
                f"trainable {name!r} declares itself deterministic, but the same config and "
                f"seed {seeds[0]} gave different metrics: {'; '.join(changed)}"
            )
        other, _ = _run(name, entry, config, seeds[1], root / "other")
        assert _differences(first, other), (
            f"trainable {name!r} gave the same metrics at seeds {seeds[0]} and {seeds[1]}: it "
            "ignores its seed, so its arms' runs are not paired by it (derive the "
            "initialisation, data order and dropout from the seed)"
        )
        if sink.checkpoints:
            _check_resume(name, entry, config, seeds[0], root, first, len(sink.reports))
    return next(iter(first))


def _check_resume(
    name: str,
    entry: TrainableEntry,
    config: Mapping[str, Any],
    seed: int,
    root: Path,
    fresh: dict[str, float],
    fresh_reports: int,
) -> None:
    """Stopped at its first checkpoint and called again from it, the trainable resumes."""
    try:
        _run(name, entry, config, seed, root / "stopped", stop_at_checkpoint=True)
    except _Stopped:
        pass
    checkpoint = root / "stopped" / "checkpoint_0000"
    assert checkpoint.is_dir(), f"trainable {name!r} reported no checkpoint when run again"
    resumed, sink = _run(name, entry, config, seed, root / "resumed", resume_from=checkpoint)
    assert len(sink.reports) < fresh_reports, (
        f"trainable {name!r} called with report.resume_from set made {len(sink.reports)} "
        f"reports, as many as a fresh run ({fresh_reports}): it started again instead of "
        "resuming from its checkpoint (read report.resume_from)"
    )
    if entry.deterministic:
        changed = _differences(fresh, resumed)
        assert not changed, (
            f"trainable {name!r} resumed from its first checkpoint ended with other metrics than "
            f"a run without a stop: {'; '.join(changed)}"
        )
