"""What a trainable is given to report with, and one call of a trainable with its result checked.

``Report`` forwards to a sink (where the metrics go: Ray Tune, Ray Train, a local folder); it
checks what it is given first, so a trainable that reports a string, a tensor or a folder that
does not exist learns it at its first report, naming the metric, not from a failure in Tune.
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fusion_ray.trainables.registry import TrainableEntry

Sink = Callable[[dict[str, float], "str | None"], None]
"""Where reports go: ``sink(metrics, checkpoint_dir)``."""


def metric_values(metrics: Any, where: str) -> dict[str, float]:
    """``metrics`` as names to floats; a TypeError naming ``where`` and the offending entry when
    it is not a mapping of non-empty names to real numbers (Python or numpy ints, floats, bools;
    a one-element tensor's ``.item()``)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"{where}: metrics must be a mapping of names to numbers, got {type(metrics).__name__}"
        )
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: metric names must be non-empty strings, got {name!r}")
        if not isinstance(value, numbers.Real):
            raise TypeError(
                f"{where}: metric {name!r} is a {type(value).__name__}, not a number (report a "
                "tensor's .item(), and notes as tags, not metrics)"
            )
        out[name] = float(value)
    return out


class Report:
    """``report(metrics, step=None, checkpoint=None)``: what a trainable calls to report.

    ``metrics``: names to numbers; ``step``: the trainable's own step or epoch (reported as the
    metric ``step``); ``checkpoint``: a directory holding what the trainable needs to resume,
    copied away before ``report`` returns (the trainable may delete it afterwards).
    ``resume_from``: the directory of the last checkpoint this trial reported in an earlier
    attempt, or None."""

    def __init__(
        self,
        sink: Sink,
        *,
        resume_from: str | os.PathLike[str] | None = None,
        rank: int = 0,
        world_size: int = 1,
        name: str = "trainable",
    ) -> None:
        self._sink, self.name = sink, name
        self.resume_from = Path(resume_from) if resume_from is not None else None
        self.rank, self.world_size = rank, world_size
        self.reports = 0
        """How many reports went through."""

    def __call__(
        self,
        metrics: Mapping[str, Any],
        *,
        step: int | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        values = metric_values(metrics, f"{self.name} report")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
                raise TypeError(f"{self.name} report: step must be an int >= 0, got {step!r}")
            values["step"] = float(step)
        if checkpoint is not None and not Path(checkpoint).is_dir():
            raise ValueError(
                f"{self.name} report: checkpoint {os.fspath(checkpoint)!r} is not a directory; "
                "write the state to resume from into a directory and pass its path"
            )
        self._sink(values, os.fspath(checkpoint) if checkpoint is not None else None)
        self.reports += 1


def run_trainable(
    entry: TrainableEntry, config: Mapping[str, Any], seed: int, report: Report
) -> dict[str, float]:
    """One call of ``entry`` on a copy of ``config`` at ``seed``; its final metrics, checked
    (a non-empty mapping of names to numbers; non-finite values stay: the caller decides what a
    diverged run is)."""
    result = entry.call(copy.deepcopy(dict(config)), seed, report)
    values = metric_values(result, f"{report.name} returned")
    if not values:
        raise TypeError(f"{report.name} returned no metrics; return the final ones as a dict")
    return values
