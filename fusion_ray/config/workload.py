"""What the engine asks of a sweep, whichever it is: the study's (``SweepSpec``: the built-in
encoder over datasets, positions and operators) or a trainable's (``TrainableSweep``:
``trainable: NAME`` over a grid of its own settings). Both specs answer ``name``,
``tracking_uri``, ``storage_path``, ``address``, ``seeds``, ``adaptive``, ``retries``,
``resources``, ``baseline_label``, ``regimes``, ``grid_levels()`` and ``group_resources()``;
their cells answer ``cell_id``, ``seed``, ``group``, ``level``, ``settings``, ``regime``,
``resource_group``, ``label``, ``run_name``, ``trial_name``, ``tags()``, ``params()`` and
``identity()``. What differs is said here once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusion_ray.config.files import load_sweep, load_trainable_sweep, read_sweep_dict
from fusion_ray.config.grid import expand
from fusion_ray.config.smoke import smoke_version
from fusion_ray.config.spec import SweepSpec
from fusion_ray.config.trainable import TrainableSweep, trainable_cells, with_levels

AnySweep = SweepSpec | TrainableSweep
"""A sweep of the study or of a trainable."""


def is_trainable(spec: Any) -> bool:
    return isinstance(spec, TrainableSweep)


def load_any(path: str | Path, overrides: Sequence[str] = ()) -> AnySweep:
    """The sweep file validated as the sweep it is (``trainable:`` names a trainable's)."""
    if "trainable" in read_sweep_dict(path):
        return load_trainable_sweep(path, overrides)
    return load_sweep(path, overrides)


def cells_of(spec: AnySweep) -> list[Any]:
    """The sweep's cells, seed-major (``grid.expand`` / ``trainable.trainable_cells``)."""
    return trainable_cells(spec) if isinstance(spec, TrainableSweep) else expand(spec)


def decision_metric(spec: AnySweep) -> tuple[str | None, str]:
    """The final metric the comparisons decide on and whether more is better: the study's test
    accuracy; a trainable's ``metric:`` (None: the first one it returns)."""
    if isinstance(spec, TrainableSweep):
        return spec.metric.name, spec.metric.mode
    return "test_acc", "max"


def smoke_of(spec: AnySweep) -> AnySweep:
    """The ``--smoke`` copy: the study's ``smoke_version``; a trainable's at seed 0 alone, its
    ``smoke:`` settings over its defaults, as experiment NAME-smoke."""
    if not isinstance(spec, TrainableSweep):
        return smoke_version(spec)
    return spec.model_copy(
        update={
            "name": f"{spec.name}-smoke",
            "seeds": [0],
            "adaptive": None,
            "defaults": with_levels(spec.defaults, spec.smoke),
        }
    )
