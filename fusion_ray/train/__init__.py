"""One trial's training: the per-worker loop, its reporters and its typed settings."""

TYPE_CHECKING = False
"""False at run time, true for type checkers (which read it by name): the same as
typing.TYPE_CHECKING without importing typing here."""
if TYPE_CHECKING:
    # what type checkers see; at run time __getattr__ below imports each name on first use
    from fusion_ray.train.loop import run_local, run_trial, train_worker
    from fusion_ray.train.spec import TrainSpec, TrialConfig

from fusion_ray.lazy import module_getattr  # noqa: E402 (after the type-only names)

_EXPORTS = {
    "run_local": "fusion_ray.train.loop",
    "run_trial": "fusion_ray.train.loop",
    "train_worker": "fusion_ray.train.loop",
    "TrainSpec": "fusion_ray.train.spec",
    "TrialConfig": "fusion_ray.train.spec",
}
"""Where each name of this package lives: imported on first use, so that importing one
submodule (e.g. the settings, for validation) does not import torch, pandas and the rest."""


__getattr__ = module_getattr(__name__, _EXPORTS)


__all__ = ["TrainSpec", "TrialConfig", "run_local", "run_trial", "train_worker"]
