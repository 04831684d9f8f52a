"""The typed result coming back across the Ray boundary: what a trial reports to Tune (plain
mappings), read in one place. The trial's loop writes the keys (``FINAL``, ``TRIAL_ERROR``,
``CHECKPOINT_SET_ASIDE``), the driver, the seed policy and the tuning read them through
``TrialResult``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fusion_ray.decide.questions import quarter_accuracy

FINAL = "final"
"""The key of the result a trial reports once, with its final (test) metrics."""
TRIAL_ERROR = "trial_error"
"""The key of the result a trial reports instead of raising an error that would repeat."""
CHECKPOINT_SET_ASIDE = "checkpoint_set_aside"
"""The key a trial adds to its first report after it set aside the checkpoint it could not load
and started again from scratch: ``<path>: <reason>; set aside as <path>.unreadable`` (a local
folder, renamed) or ``<path>: <reason>; left in place`` (a URI); ``set_aside_note`` writes it,
``SetAside.parse`` reads it."""

REPORTED = "reported_metrics"
"""The key a trainable's trial (``fusion_ray.trainables``) adds to each report: the names of the
trainable's own metrics in it, as a JSON list, in the order given (its final report: the order
it returned them). The driver logs exactly those; a study trial's reports have no such key."""

_MOVED, _KEPT = "; set aside as ", "; left in place"


def set_aside_note(path: str, reason: str, moved_to: str | None) -> str:
    """The text of ``CHECKPOINT_SET_ASIDE``: the checkpoint, why it could not be loaded, and
    where it went (``moved_to``; None: it was left in place)."""
    return f"{path}: {reason}" + (f"{_MOVED}{moved_to}" if moved_to else _KEPT)


@dataclass(frozen=True)
class SetAside:
    """A checkpoint a trial could not load and set aside before it started again from scratch."""

    path: str
    reason: str
    moved_to: str | None
    """What the folder was renamed (``<path>.unreadable``); None: left in place (a URI)."""

    @classmethod
    def parse(cls, note: str) -> SetAside:
        moved_to: str | None
        body, moved, moved_to = note.rpartition(_MOVED)
        if not moved:
            body, moved_to = note.removesuffix(_KEPT), None
        path, _, reason = body.partition(": ")
        return cls(path, reason, moved_to)

    @property
    def text(self) -> str:
        """As the trial reported it (``CHECKPOINT_SET_ASIDE``)."""
        return set_aside_note(self.path, self.reason, self.moved_to)

    def sentence(self, who: str) -> str:
        """``its checkpoint P could not be loaded (R); it was set aside as P.unreadable and the
        <who> started again`` (a URI: ``it was left in place``)."""
        where = f"it was set aside as {self.moved_to}" if self.moved_to else "it was left in place"
        return (
            f"its checkpoint {self.path} could not be loaded ({self.reason}); {where} and the "
            f"{who} started again"
        )


@dataclass(frozen=True)
class TrialResult:
    """One result a trial reported, as the driver reads it: an epoch's metrics, the final
    metrics, or the error that ended it. The one place that knows the result's keys."""

    metrics: Mapping[str, Any]

    @classmethod
    def of(cls, result: Mapping[str, Any] | None) -> TrialResult:
        return cls(result or {})

    @property
    def error(self) -> str | None:
        """Why the trial ended without results (an error that repeats on every attempt)."""
        return self.metrics.get(TRIAL_ERROR)

    @property
    def set_aside(self) -> SetAside | None:
        """The checkpoint the trial could not load and set aside before it started again."""
        note = self.metrics.get(CHECKPOINT_SET_ASIDE)
        return None if not note else SetAside.parse(str(note))

    @property
    def final(self) -> bool:
        """Whether these are the trial's final metrics (test accuracy at the best epoch)."""
        return bool(self.metrics.get(FINAL)) and self.error is None

    @property
    def reported(self) -> list[str] | None:
        """A trainable's own metric names in this report (``REPORTED``); None for the study's."""
        names = self.metrics.get(REPORTED)
        return None if names is None else list(json.loads(names))

    @property
    def epoch(self) -> int | None:
        return self.metrics.get("epoch")

    @property
    def test_acc(self) -> float | None:
        value = self.metrics.get("test_acc")
        return None if value is None else float(value)

    @property
    def scores(self) -> dict[str, float]:
        """The test accuracy on each part of the test split the trial reported
        (``fusion_ray.decide.questions.PARTS``): "all", and its shortest and longest quarter."""
        out = {} if self.test_acc is None else {"all": self.test_acc}
        out.update(quarter_accuracy(self.metrics))
        return out

    @property
    def checkpoint_path(self) -> str | None:
        """The checkpoint Ray Train's ``TuneReportCallback`` reported with these metrics."""
        return self.metrics.get("checkpoint_path")
