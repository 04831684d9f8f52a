"""The smoke version of a sweep: the same file shrunk to a minutes-long check of its whole path
(``--smoke``): one seed, one epoch, at most ``SMOKE_DOCUMENTS`` documents per split, its own
experiment name."""

from __future__ import annotations

import copy
import dataclasses

from fusion_ray.config.spec import SweepSpec
from fusion_ray.train.spec import TrialConfig

SMOKE_DOCUMENTS = 64
"""Training documents, and at most validation and test documents, per dataset in a smoke run."""


def smoke_trial(trial: TrialConfig) -> TrialConfig:
    """A built trial shrunk as ``smoke_version`` shrinks its settings: one epoch, no early
    stopping, at most ``SMOKE_DOCUMENTS`` documents per split."""
    data = trial.data
    return dataclasses.replace(
        trial,
        data=dataclasses.replace(
            data,
            max_train_samples=min(data.max_train_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS),
            max_eval_samples=min(data.max_eval_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS),
        ),
        train=dataclasses.replace(trial.train, epochs=1, patience=None),
    )


def smoke_version(spec: SweepSpec) -> SweepSpec:
    """The same sweep shrunk to a minutes-long check of its whole path: one seed, one epoch,
    64 training and at most 64 validation and 64 test documents per dataset, its own
    experiment name. A new value made from the validated one: its grid points are the built
    ones shrunk (``smoke_trial``), not built and validated again."""
    smoke = _smoke_settings(spec)
    kept = spec.kept_points()
    if kept is not None:
        smoke.keep_points([dataclasses.replace(p, trial=smoke_trial(p.trial)) for p in kept])
    return smoke


def _smoke_settings(spec: SweepSpec) -> SweepSpec:
    datasets = {}
    for name, preset in spec.datasets.items():
        data = copy.deepcopy(preset.data)
        data.max_train_samples = min(data.max_train_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS)
        data.max_eval_samples = min(data.max_eval_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS)
        train = {**preset.train, "epochs": 1, "patience": None}
        datasets[name] = preset.model_copy(update={"data": data, "train": train})
    defaults = spec.defaults.model_copy(
        update={"train": {**spec.defaults.train, "epochs": 1, "patience": None}}
    )
    return spec.model_copy(
        update={
            "name": f"{spec.name}-smoke",
            "seeds": spec.seeds[:1],
            "adaptive": None,
            "datasets": datasets,
            "defaults": defaults,
        }
    )
