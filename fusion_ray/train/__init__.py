"""One trial's training: the per-worker loop, its reporters and its typed settings."""

from fusion_ray.train.loop import run_local, run_trial, train_worker
from fusion_ray.train.spec import TrainSpec, TrialConfig

__all__ = ["TrainSpec", "TrialConfig", "run_local", "run_trial", "train_worker"]
