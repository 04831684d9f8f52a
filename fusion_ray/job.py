"""What crosses the Ray boundary: the typed job going out (everything one sweep trial needs, built
by the driver from settings validation already built, and trusted as it is in the trial's
process) and the typed result coming back (``TrialResult``, read from what the trial reports to
Tune, which carries plain mappings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fusion_ray.config import Resources
from fusion_ray.decide.questions import quarter_accuracy
from fusion_ray.train.spec import TrialConfig


@dataclass(frozen=True)
class OperatorRef:
    """A fusion operator by registry name with its options (the sweep's latency baseline)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def mapping(self) -> dict[str, Any]:
        """As the training loop's ``latency_baseline`` takes it."""
        return {"name": self.name, "kwargs": dict(self.kwargs)}


@dataclass(frozen=True)
class TrialJob:
    """One cell's trial as the driver hands it to Ray Tune."""

    cell_id: str
    sweep: str
    tune_run: str
    """The Ray Tune run the trial belongs to (names its Ray Train run)."""
    trial: TrialConfig
    """The cell's full config at its seed, built and checked by validation."""
    resources: Resources
    """The trial's dataset's resources (workers, CPUs and GPUs per worker, ...)."""
    train_storage: str
    """Where a multi-worker trial's Ray Train run keeps its state (a path or URI)."""
    resume_from: str | None = None
    """The checkpoint the cell resumes from (its MLflow run's, inside storage), or None."""
    latency_baseline: OperatorRef | None = None
    """The operator the trial times itself against; None measures no latency ratio."""


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
