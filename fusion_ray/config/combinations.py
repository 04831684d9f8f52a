"""A sweep's grid combinations: every (dataset, position, attention position, fusion, setting
axes) point of the grid and its sub-grids, and the data, model and train settings each one gets
from its dataset's preset, the defaults, the grid's setting axes and the overrides' rules.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

from fusion_ray.config.spec import AXES, Grid, Named, Rule, SubGrid, SweepSpec
from fusion_ray.data.spec import DataSpec
from fusion_ray.schema import axis_text


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``; nested mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_specs(spec: SweepSpec, dataset: str) -> tuple[DataSpec, dict[str, Any], dict[str, Any]]:
    """A dataset's data spec and its merged (defaults + preset) model and train settings."""
    preset = spec.datasets[dataset]
    model = deep_merge(spec.defaults.model, preset.model)
    train = deep_merge(spec.defaults.train, preset.train)
    return preset.data, model, train


#: ModelSpec fields that the grid axes set; presets, defaults and tuning must leave them alone.
GRID_AXIS_MODEL_FIELDS = frozenset(
    {
        "fusion",
        "fusion_kwargs",
        "position",
        "position_kwargs",
        "attention_position",
        "attention_position_kwargs",
    }
)


class Combination(NamedTuple):
    """One point of the crossed grid: its registry entries and its setting-axis values."""

    dataset: str
    position: Named
    attention: Named
    fusion: Named
    settings: tuple[tuple[str, Any], ...] = ()
    """(dotted key, value) of every setting axis of the grid, in the grid's order."""

    @property
    def where(self) -> str:
        """How error messages name this grid point."""
        parts = [self.dataset, self.position.label, self.attention.label, self.fusion.label]
        parts += [f"{key}={axis_text(value)}" for key, value in self.settings]
        return "grid point " + "/".join(parts)


def _setting_values(grid: Grid | SubGrid, spec: SweepSpec) -> list[list[tuple[str, Any]]]:
    """Per setting axis of the sweep's grid, the (key, value) pairs this (sub-)grid crosses."""
    own = grid.settings
    return [
        [(key, value) for value in own.get(key, values)]
        for key, values in spec.grid.settings.items()
    ]


def combinations(spec: SweepSpec) -> list[Combination]:
    """The distinct grid points of the sweep (grid and includes, minus excludes), in file order."""
    grids: list[Grid | SubGrid] = [spec.grid, *spec.include]
    combos: dict[tuple, Combination] = {}
    for grid in grids:
        for dataset, position, attention, fusion, *settings in itertools.product(
            grid.datasets or spec.grid.datasets,
            grid.positions or spec.grid.positions,
            grid.attention_positions or spec.grid.attention_positions,
            grid.fusions or spec.grid.fusions,
            *_setting_values(grid, spec),
        ):
            combo = Combination(dataset, position, attention, fusion, tuple(settings))
            if any(matches(rule, combo) for rule in spec.exclude):
                continue
            key = (dataset, position.label, attention.label, fusion.label)
            key += tuple(axis_text(value) for _, value in settings)
            combos.setdefault(key, combo)
    return list(combos.values())


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level with dotted keys (``{"model": {"d_model": 8}}`` -> ``model.d_model``)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, inner in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(inner, dict) and inner:
            out.update(flatten(inner, name))
        else:
            out[name] = inner
    return out


def set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    """``target["a"]["b"] = value`` for ``dotted`` "a.b", creating inner mappings on the way."""
    *path, last = dotted.split(".")
    for key in path:
        inner = target.get(key)
        target[key] = inner = dict(inner) if isinstance(inner, dict) else {}
        target = inner
    target[last] = value


def combination_settings(
    spec: SweepSpec, combination: Combination
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The data, model and train settings of one grid point: the dataset's preset (defaults
    merged in), the overrides whose rule it matches, the registry axes, then the setting axes."""
    data, model, train = resolve_specs(spec, combination.dataset)
    for override in spec.overrides:
        if matches(override.where, combination):
            train = {**train, **override.train}
    sections = {
        "data": dataclasses.asdict(data),
        "model": {
            **model,
            "fusion": combination.fusion.name,
            "fusion_kwargs": combination.fusion.kwargs,
            "position": combination.position.name,
            "position_kwargs": combination.position.kwargs,
            "attention_position": combination.attention.name,
            "attention_position_kwargs": combination.attention.kwargs,
        },
        "train": copy.deepcopy(train),
    }
    for dotted, value in combination.settings:
        section, rest = dotted.split(".", 1)
        set_dotted(sections[section], rest, value)
    return sections["data"], sections["model"], sections["train"]


def matches(rule: Rule, combo: Combination) -> bool:
    values = {
        "datasets": {combo.dataset},
        "positions": {combo.position.name, combo.position.label},
        "attention_positions": {combo.attention.name, combo.attention.label},
        "fusions": {combo.fusion.name, combo.fusion.label},
    }
    for axis in AXES:
        allowed = getattr(rule, axis)
        if allowed is not None and not values[axis] & set(allowed):
            return False
    settings = {key: axis_text(value) for key, value in combo.settings}
    for key, allowed in rule.settings.items():
        if settings.get(key) not in {axis_text(v) for v in allowed}:
            return False
    return True


AxisNamer = Callable[[str, "int | None"], str]
"""How a message names a registry axis of the grid (``"fusions"``), or one of its entries when
given the entry's index: ``grid.fusions``, ``grid.fusions[1]``."""


def grid_namer(where: str) -> AxisNamer:
    """Axes named as a sweep file writes them: ``grid.fusions[1]``, ``include[0].datasets``."""
    return lambda axis, i: f"{where}.{axis}" + ("" if i is None else f"[{i}]")
