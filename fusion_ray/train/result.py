"""The typed result coming back across the Ray boundary: what a trial reports to Tune (plain
mappings), read in one place. The trial's loop writes the keys (``FINAL``, ``TRIAL_ERROR``), the
driver, the seed policy and the tuning read them through ``TrialResult``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fusion_ray.decide.questions import quarter_accuracy

FINAL = "final"
"""The key of the result a trial reports once, with its final (test) metrics."""
TRIAL_ERROR = "trial_error"
"""The key of the result a trial reports instead of raising an error that would repeat."""


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
    def final(self) -> bool:
        """Whether these are the trial's final metrics (test accuracy at the best epoch)."""
        return bool(self.metrics.get(FINAL)) and self.error is None

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
