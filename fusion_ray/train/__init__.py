"""One trial's training: the per-worker loop, its reporters and its typed settings."""

_EXPORTS = {
    "run_local": "fusion_ray.train.loop",
    "run_trial": "fusion_ray.train.loop",
    "train_worker": "fusion_ray.train.loop",
    "TrainSpec": "fusion_ray.train.spec",
    "TrialConfig": "fusion_ray.train.spec",
}
"""Where each name of this package lives: imported on first use, so that importing one
submodule (e.g. the settings, for validation) does not import torch, pandas and the rest."""


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TrainSpec", "TrialConfig", "run_local", "run_trial", "train_worker"]
