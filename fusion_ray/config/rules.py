"""The rules between a sweep file's fields that no single field's type can say: setting axes,
overrides, excluded cells, pinned keys and resources, checked together by ``semantic_problems``
(with the build of every grid point, ``config.build``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from fusion_ray.config.build import SECTIONS, build_points
from fusion_ray.config.combinations import GRID_AXIS_MODEL_FIELDS, AxisNamer, grid_namer
from fusion_ray.config.spec import AXES, OVERRIDABLE_TRAIN, Grid, Named, Rule, SubGrid, SweepSpec
from fusion_ray.data.spec import DataSpec
from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS
from fusion_ray.registry import Registry
from fusion_ray.schema import axis_text


def semantic_problems(spec: SweepSpec, name_axis: AxisNamer | None = None) -> list[str]:
    """Problems the schema cannot see: unknown registry names and options, rules that name no
    grid value, resources; then, when the file holds together, every grid point built as the
    trial its cells run (``build_points``). ``name_axis`` names the grid's axes in messages when
    the grid was written otherwise than under ``grid:`` (an HPO file's ``tune:`` section)."""
    problems, known = _axis_problems(spec, name_axis or grid_namer("grid"))
    axis_problems = setting_axis_problems(spec)
    problems += axis_problems
    problems += _exclude_problems(spec, known)
    problems += _override_problems(spec, known)
    problems += _grid_owned_problems(spec)
    problems += _preset_resource_problems(spec)
    if spec.baseline is not None and spec.baseline not in known["fusions"]:
        problems.append(
            f"baseline: {spec.baseline!r} is not one of the sweep's fusions; allowed: {', '.join(sorted(known['fusions']))}"
        )
    problems += _resource_problems(spec)
    if axis_problems:
        return problems  # the setting axes are in doubt: the points are built once they are fixed
    points, found = build_points(spec)
    if not points and not found and not problems:
        found = ["grid/include/exclude: the sweep expands to no cells; loosen the exclude rules"]
    spec.keep_points(points if not (problems or found) else None)
    return problems + found


_NOT_AXES = {f"model.{f}" for f in GRID_AXIS_MODEL_FIELDS} | {"data.cache_dir"}
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _setting_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a setting axis, or None."""
    hint = (
        "a grid axis is datasets, positions, attention_positions, fusions, or a dotted setting "
        "under data., model. or train. with a list of values (e.g. model.scale_embeddings: [true, false])"
    )
    if not _DOTTED.fullmatch(key) or key.split(".")[0] not in SECTIONS:
        return f"unknown key; {hint}"
    section, field, *inner = key.split(".")
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if field not in fields:
        allowed = sorted(f for f in fields if f"{section}.{f}" not in _NOT_AXES)
        return f"{section}.{field} is not a {section} setting; allowed: {', '.join(allowed)}"
    if key in _NOT_AXES or f"{section}.{field}" in _NOT_AXES:
        owner = {
            "fusion": "fusions",
            "position": "positions",
            "attention_position": "attention_positions",
        }
        axis = owner.get(field.removesuffix("_kwargs"))
        if axis:
            return f"set by grid.{axis}, not a setting axis; list the entries (with options) there"
        return "not an experimental setting; it cannot be a grid axis"
    if inner and not field.endswith("_kwargs"):
        return f"{section}.{field} has no inner settings; use {section}.{field} itself"
    return None


def _override_problems(spec: SweepSpec, known: dict[str, set[str]]) -> list[str]:
    """Overrides select cells like exclude rules, never by operator, and set only settings that
    leave what is computed unchanged, and none that a grid axis varies."""
    problems = []
    for i, override in enumerate(spec.overrides):
        where = f"overrides[{i}]"
        if override.where.fusions is not None:
            problems.append(
                f"{where}.where.fusions: an override may not select operators (the operators of a "
                "paired block must train alike); select datasets, positions or attention_positions"
            )
        problems += _rule_problems(f"{where}.where", override.where, known, spec)
        for key in override.train:
            if key not in OVERRIDABLE_TRAIN:
                problems.append(
                    f"{where}.train.{key}: an override may set only {', '.join(OVERRIDABLE_TRAIN)} "
                    "(settings that change what is computed belong in the presets or a grid axis)"
                )
            elif f"train.{key}" in spec.grid.settings:
                problems.append(
                    f"{where}.train.{key}: varied by the grid axis train.{key}; remove it here"
                )
    return problems


def _rule_problems(
    where: str, rule: Rule, known: dict[str, set[str]], spec: SweepSpec
) -> list[str]:
    """Values a rule names that no grid has (registry axes and setting axes)."""
    problems = []
    for axis in AXES:
        for value in getattr(rule, axis) or []:
            if value not in known[axis]:
                problems.append(
                    f"{where}.{axis}: {value!r} is in no grid; allowed: {', '.join(sorted(known[axis]))}"
                )
    for key, values in rule.settings.items():
        if key not in spec.grid.settings:
            problems.append(f"{where}.{key}: not a setting axis of grid:")
            continue
        allowed = {axis_text(v) for v in spec.grid.settings[key]}
        for value in values if isinstance(values, list) else [values]:
            if axis_text(value) not in allowed:
                problems.append(
                    f"{where}.{key}: {axis_text(value)!r} is not a value of the axis; allowed: {', '.join(sorted(allowed))}"
                )
    return problems


def setting_axis_problems(spec: SweepSpec) -> list[str]:
    """Setting axes: known dotted settings with distinct values, not pinned elsewhere; include
    sub-grids and exclude rules may name only the grid's setting axes."""
    problems = []
    axes = spec.grid.settings
    for key, values in axes.items():
        where = f"grid.{key}"
        problem = _setting_key_problem(key)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        problems += _values_problems(where, values)
        problems += [
            f"{p}: varied by the grid axis {key}; remove it here" for p in _pins(spec, key)
        ]
    owners: list[tuple[str, dict[str, Any]]] = [
        (f"include[{i}]", sub.settings) for i, sub in enumerate(spec.include)
    ]
    owners += [(f"exclude[{i}]", rule.settings) for i, rule in enumerate(spec.exclude)]
    for where, settings in owners:
        for key, values in settings.items():
            if key not in axes:
                known = ", ".join(axes) or "none"
                problems.append(
                    f"{where}.{key}: not a setting axis of grid:; add it to grid: first (setting axes: {known})"
                )
            elif where.startswith("include"):
                problems += _values_problems(f"{where}.{key}", values)
            else:
                allowed = (
                    {axis_text(v) for v in axes[key]} if isinstance(axes[key], list) else set()
                )
                for value in values if isinstance(values, list) else [values]:
                    if axis_text(value) not in allowed:
                        problems.append(
                            f"{where}.{key}: {axis_text(value)!r} is not a value of the axis; "
                            f"allowed: {', '.join(sorted(allowed))}"
                        )
    return problems


def _values_problems(where: str, values: Any) -> list[str]:
    if not isinstance(values, list) or not values:
        return [f"{where}: must be a non-empty list of values (e.g. [true, false])"]
    texts = [axis_text(v) for v in values]
    dupes = sorted({t for t in texts if texts.count(t) > 1})
    return [f"{where}: {d!r} is listed twice" for d in dupes]


def _pins(spec: SweepSpec, key: str) -> list[str]:
    """Places other than the grid that fix the setting ``key`` (they would be silently overridden)."""
    section, rest = key.split(".", 1)
    places: list[tuple[str, Any]] = []
    if section in ("model", "train"):
        places.append((f"defaults.{section}", getattr(spec.defaults, section)))
        places += [
            (f"datasets.{n}.{section}", getattr(p, section)) for n, p in spec.datasets.items()
        ]
    else:  # a data spec is a whole value: a setting differing from its default is pinned
        default = dataclasses.asdict(DataSpec())
        places += [
            (f"datasets.{n}.data", dataclasses.asdict(p.data))
            for n, p in spec.datasets.items()
            if _dotted_get(dataclasses.asdict(p.data), rest) != _dotted_get(default, rest)
        ]
    return [
        f"{where}.{rest}"
        for where, settings in places
        if _dotted_get(settings, rest) is not _MISSING
    ]


_MISSING = object()


def _dotted_get(mapping: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(mapping, dict) or key not in mapping:
            return _MISSING
        mapping = mapping[key]
    return mapping


def _axis_problems(spec: SweepSpec, name_grid: AxisNamer) -> tuple[list[str], dict[str, set[str]]]:
    """Datasets without a preset, unknown registry entries or options, entries listed twice; and
    every value each axis knows (names and labels), for the exclude rules and the baseline."""
    problems: list[str] = []
    registries: dict[str, Registry[Any]] = {
        "fusions": FUSIONS,
        "positions": POSITIONS,
        "attention_positions": ATTENTION_POSITIONS,
    }
    grids: list[tuple[AxisNamer, Grid | SubGrid]] = [(name_grid, spec.grid)]
    grids += [(grid_namer(f"include[{i}]"), sub) for i, sub in enumerate(spec.include)]
    known: dict[str, set[str]] = {axis: set() for axis in AXES}
    for name_axis, grid in grids:
        for name in grid.datasets or []:
            known["datasets"].add(name)
            if name not in spec.datasets:
                problems.append(
                    f"{name_axis('datasets', None)}: {name!r} has no entry under datasets:; defined: {', '.join(spec.datasets) or 'none'}"
                )
        for axis, registry in registries.items():
            entries: list[Named] = getattr(grid, axis) or []
            labels = [e.label for e in entries]
            for dup in sorted({x for x in labels if labels.count(x) > 1}):
                problems.append(f"{name_axis(axis, None)}: {dup!r} is listed twice")
            for i, entry in enumerate(entries):
                known[axis] |= {entry.name, entry.label}
                problems += [
                    f"{name_axis(axis, i)}: {p}" for p in registry.check(entry.name, entry.kwargs)
                ]
    return problems, known


def _exclude_problems(spec: SweepSpec, known: dict[str, set[str]]) -> list[str]:
    problems = []
    for i, rule in enumerate(spec.exclude):
        for axis in AXES:
            for value in getattr(rule, axis) or []:
                if value not in known[axis]:
                    problems.append(
                        f"exclude[{i}].{axis}: {value!r} is in no grid; allowed: {', '.join(sorted(known[axis]))}"
                    )
    return problems


def _grid_owned_problems(spec: SweepSpec) -> list[str]:
    places = [("defaults.model", spec.defaults.model)]
    places += [(f"datasets.{n}.model", p.model) for n, p in spec.datasets.items()]
    return [
        f"{where}.{key}: set by the grid axes, not here; list it under grid: instead"
        for where, settings in places
        for key in sorted(set(settings) & GRID_AXIS_MODEL_FIELDS)
    ]


def _preset_resource_problems(spec: SweepSpec) -> list[str]:
    """A preset's resources may not set what applies to the whole sweep."""
    return [
        f"datasets.{name}.resources.max_concurrent_trials: applies to the whole sweep; set it under resources:"
        for name, preset in spec.datasets.items()
        if preset.resources is not None
        and "max_concurrent_trials" in preset.resources.model_fields_set
    ]


def _resource_problems(spec: SweepSpec) -> list[str]:
    problems = []
    resource_sets = [("resources", spec.resources)]
    resource_sets += [
        (f"datasets.{n}.resources", p.resources) for n, p in spec.datasets.items() if p.resources
    ]
    for where, res in resource_sets:
        if res.use_gpu and res.gpus_per_worker == 0:
            problems.append(
                f"{where}.gpus_per_worker: must be > 0 when use_gpu is true (e.g. 1, or 0.25 to pack trials)"
            )
        if not res.use_gpu and res.gpus_per_worker > 0:
            problems.append(f"{where}.use_gpu: set it to true when gpus_per_worker > 0")
        if res.gpus_per_worker > 1 and res.gpus_per_worker != int(res.gpus_per_worker):
            problems.append(f"{where}.gpus_per_worker: above 1 it must be a whole number of GPUs")
        if res.workers > 1 and 0 < res.gpus_per_worker < 1:
            problems.append(
                f"{where}.gpus_per_worker: DDP workers (workers > 1) need whole GPUs; use 1"
            )
    return problems
