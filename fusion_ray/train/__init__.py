"""One trial's training: the per-worker loop, its reporters and its typed settings."""

TYPE_CHECKING = False
"""False at run time, true for type checkers (which read it by name): the same as
typing.TYPE_CHECKING without importing typing here."""
if TYPE_CHECKING:
    # what type checkers see; at run time __getattr__ below imports each name on first use
    from fusion_ray.train.loop import run_local, run_trial, train_worker
    from fusion_ray.train.spec import TrainSpec, TrialConfig

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
