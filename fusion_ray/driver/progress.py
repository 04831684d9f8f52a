"""What a running sweep prints of its progress: durations, the time left at the pace so far,
and lines that fit the console (``LINE_WIDTH``), and why a trial failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def duration(seconds: float) -> str:
    """``40 s``, ``3 min`` or ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def time_left(cells_left: int, seconds_per_cell: float, worst: int | None = None) -> str:
    """``; about 3 min left`` at the pace so far (empty when nothing is left); with ``worst``
    (an adaptive sweep: ``cells_left`` are the cells its open hypotheses need now, ``worst``
    the cells if every open one ran to the cap), both."""
    if worst is None:
        return f"; about {duration(cells_left * seconds_per_cell)} left" if cells_left > 0 else ""
    if worst <= 0:
        return ""
    now, cap = duration(cells_left * seconds_per_cell), duration(worst * seconds_per_cell)
    if worst <= cells_left:
        return f"; about {now} left"
    return f"; about {now} left, at most {cap}"


LINE_WIDTH = 100
"""The console's progress lines fit in this many columns."""
STATUS_EVERY = 10
"""Ended trials between two status lines (and one at least every ``STATUS_SECONDS``)."""
STATUS_SECONDS = 120.0


def fit_line(prefix: str, name: str, suffix: str, width: int = LINE_WIDTH) -> str:
    """``prefix + name + suffix`` in ``width`` columns: the suffix (an error's text) cut first,
    down to 40 columns, then the name cut in its middle."""
    if len(prefix) + len(name) + len(suffix) <= width:
        return prefix + name + suffix
    room = width - len(prefix) - len(name)
    if len(suffix) > max(room, 40):
        suffix = suffix[: max(room, 40) - 1] + "…"
    room = width - len(prefix) - len(suffix)
    if len(name) > room:
        keep = max(room - 1, 8)
        name = name[: keep - keep // 2] + "…" + name[len(name) - keep // 2 :]
    return prefix + name + suffix


def trial_error_text(trial: Any) -> str:
    """The end of a failed Tune trial's traceback, for the run's failure_reason tag."""
    try:
        error_file = trial.error_file
        if error_file and Path(error_file).exists():
            text = Path(error_file).read_text().strip().splitlines()
            return "\n".join(text[-15:])
    except OSError:
        pass
    return "the trial raised an error; see the Ray Tune logs"
