"""What crosses the Ray boundary going out: the typed job (everything one sweep trial needs, built
by the driver from settings validation already built, and trusted as it is in the trial's
process). The typed result coming back is ``fusion_ray.train.result.TrialResult``: the trial
writes it, so it lives with the trial, below the driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusion_ray.config import Resources
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


@dataclass(frozen=True)
class TrainableJob:
    """One cell of a trainable's sweep (``trainable: NAME``) as the driver hands it to Ray Tune."""

    cell_id: str
    sweep: str
    tune_run: str
    trainable: str
    """The trainable's registered name (loaded in the trial's process)."""
    config: dict[str, Any]
    """The cell's config: the sweep's defaults with its grid point's levels set."""
    seed: int
    """The paired seed (every arm of a block gets the same one)."""
    resources: Resources
    train_storage: str
    metric: str | None = None
    """The sweep's decision metric, which the trainable must return (None: its first)."""
    resume_from: str | None = None
