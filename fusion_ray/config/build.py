"""The one validation step of a sweep's settings: every grid point built into the trial it
will run (``build_points``), each distinct problem named once by the preset or grid point that
causes it; the built points are kept on the spec so later steps transform them as values.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import (
    TypeAdapter,
    ValidationError,
)

from fusion_ray.checks import bool_number_problems
from fusion_ray.config.combinations import (
    Combination,
    combination_settings,
    combinations,
    matches,
    set_dotted,
)
from fusion_ray.config.spec import Named, SweepSpec, pydantic_problems, resources_for
from fusion_ray.data.spec import DataSpec
from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS, model_rules
from fusion_ray.model.spec import ModelSpec
from fusion_ray.registry import Registry
from fusion_ray.schema import axis_text
from fusion_ray.train.spec import TrainSpec, TrialConfig, train_rules


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One grid point built: its registry entries and setting-axis values, and the trial its
    cells run (at seed 0; a cell differs from it only by its seed)."""

    combination: Combination
    trial: TrialConfig
    axes: tuple[tuple[str, str], ...]
    """(dotted key, value as text) of every setting axis of the grid."""


def build_points(spec: SweepSpec) -> tuple[list[GridPoint], list[str]]:
    """The one validation step of a sweep's settings: every grid point's data, model and train
    settings built as the trial will use them, each distinct problem once, named by the preset
    that caused it (``datasets.<name>.train.lr: ...``) or, when a setting axis, an override or
    a registry option of the grid point is involved, by the first grid point that has it.
    Settings that grid points share are built once."""
    builder = _PointBuilder(spec)
    buildable = [c for c in combinations(spec) if _buildable(spec, c)]
    points = [p for p in map(builder.build, buildable) if p is not None]
    problems = list(builder.problems.values()) + same_trial_problems(points)
    return (points if not problems else []), problems


def same_trial_problems(points: list[GridPoint]) -> list[str]:
    """Grid points written differently that build the same trial: levels of one axis that are
    one value once read as the setting's type (``[true, 1]``, ``[false, "no"]`` for a boolean,
    ``[0.001, 1e-3]`` for a number), in the grid or between the grid and an include. Their cells would be the same trial twice, with one id: trained twice at once into
    one MLflow run and one checkpoint folder, and compared with themselves."""
    first: dict[str, GridPoint] = {}
    problems: dict[str, None] = {}
    for point in points:
        key = json.dumps(dataclasses.asdict(point.trial), sort_keys=True, default=str)
        earlier = first.setdefault(key, point)
        if earlier is point:
            continue
        written = _written_differently(earlier, point)
        for axis, a, b in written:
            read = _read_as(point.trial, axis)
            problems[
                f"{axis}: {a!r} and {b!r} are one value once read"
                + (f" ({read})" if read else "")
                + ", so their cells would be the same trial twice; list each value once"
            ] = None
    return list(problems)


def _written_differently(a: GridPoint, b: GridPoint) -> list[tuple[str, str, str]]:
    """(axis as the file names it, a's text, b's text) for each axis the two points differ in."""
    out = []
    registry_axes = (("positions", "position"), ("attention_positions", "attention"))
    for axis, field in (*registry_axes, ("fusions", "fusion")):
        x, y = getattr(a.combination, field).label, getattr(b.combination, field).label
        if x != y:
            out.append((f"grid.{axis}", x, y))
    out += [(f"grid.{k}", x, y) for (k, x), (_, y) in zip(a.axes, b.axes, strict=True) if x != y]
    return out


def _read_as(trial: TrialConfig, axis: str) -> str:
    """How the trial holds a setting axis's value (``model.scale_embeddings = True``)."""
    dotted = axis.removeprefix("grid.")
    section, _, rest = dotted.partition(".")
    settings = getattr(trial, section, None)
    if not rest or settings is None:
        return ""
    value: Any = dataclasses.asdict(settings)
    for part in rest.split("."):
        if not isinstance(value, dict) or part not in value:
            return ""
        value = value[part]
    return f"{dotted} = {value!r}"


def _buildable(spec: SweepSpec, combo: Combination) -> bool:
    """Whether a grid point can be built: its dataset has a preset and its registry entries
    exist with valid options (otherwise the file-level checks said why)."""
    entries: tuple[tuple[Registry[Any], Named], ...] = (
        (FUSIONS, combo.fusion),
        (POSITIONS, combo.position),
    )
    entries += ((ATTENTION_POSITIONS, combo.attention),)
    return combo.dataset in spec.datasets and not any(
        registry.check(entry.name, entry.kwargs) for registry, entry in entries
    )


class _PointBuilder:
    """Builds grid points, caching each distinct section's settings and collecting problems."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.built: dict[str, tuple[Any, list[str]]] = {}
        self.problems: dict[tuple[str, str], str] = {}

    def section(self, name: str, settings: dict[str, Any], workers: int) -> tuple[Any, list[str]]:
        key = f"{name}:{workers}:{settings!r}"
        if key not in self.built:
            self.built[key] = _build_section(name, settings, workers)
        return self.built[key]

    def build(self, combo: Combination) -> GridPoint | None:
        workers = resources_for(self.spec, combo.dataset).workers
        sections = dict(zip(SECTIONS, combination_settings(self.spec, combo), strict=True))
        trial, found = build_trial(combo.dataset, sections, workers, self.section)
        for problem in found:
            self.report(combo, problem)
        if trial is None:
            return None
        return GridPoint(combo, trial, tuple((k, axis_text(v)) for k, v in combo.settings))

    def report(self, combo: Combination, problem: str) -> None:
        """Name the preset when the problem involves nothing the grid point sets itself."""
        own = [key for key, _ in combo.settings] + [
            "model.fusion",
            "model.position",
            "model.attention_position",
        ]
        own += [
            f"train.{k}" for o in self.spec.overrides if matches(o.where, combo) for k in o.train
        ]
        if any(key in problem for key in own):
            self.problems.setdefault(("", problem), f"{combo.where}: {problem}")
        elif self._from_defaults(combo.dataset, problem):
            self.problems.setdefault(("defaults", problem), f"defaults.{problem}")
        else:
            where = f"datasets.{combo.dataset}.{problem}"
            self.problems.setdefault((combo.dataset, problem), where)

    def _from_defaults(self, dataset: str, problem: str) -> bool:
        """Whether every setting the problem names (``train.lr: ...``, or the two of a rule
        between fields: ``model: model.n_heads=4 does not divide model.d_model=30``) comes from
        ``defaults:`` (the preset sets none of them): the file names it there, where the user
        wrote it, once for every dataset."""
        names = _SETTING.findall(problem.split(";", 1)[0])
        if not names:
            return False
        preset = self.spec.datasets.get(dataset)
        return all(
            name not in (getattr(preset, section, {}) if preset is not None else {})
            and name in getattr(self.spec.defaults, section)
            for section, name in names
        )


_SETTING = re.compile(r"\b(model|train)\.([A-Za-z_][A-Za-z0-9_]*)")
"""A model or train setting named in a problem (``model.d_model``)."""


def build_trial(
    dataset: str,
    sections: dict[str, dict[str, Any]],
    workers: int,
    build_section: Callable[[str, dict[str, Any], int], tuple[Any, list[str]]] | None = None,
) -> tuple[TrialConfig | None, list[str]]:
    """A trial (at seed 0) built from its ``data``, ``model`` and ``train`` settings: each section
    through its fields' constraints and its own rules, then the rules between sections. (The
    trial or None, the problems.)"""
    build_section = build_section or _build_section
    built, found = {}, []
    for name in SECTIONS:
        built[name], problems = build_section(name, sections[name], workers)
        found += problems
    if built["data"] is not None and built["model"] is not None:
        found += _max_len_problems(built["model"].max_len, built["data"], "model.max_len")
        found += _extrapolation_problems(built["model"], built["data"])
    if found:
        return None, found
    return TrialConfig(dataset, built["data"], built["model"], built["train"], seed=0), []


def section_builder(spec: SweepSpec) -> Callable[[str, dict[str, Any], int], tuple[Any, list[str]]]:
    """A ``build_section`` for ``build_trial`` that builds each distinct section once: trials
    that differ in one setting share the other sections' build (the model's is the costly one)."""
    return _PointBuilder(spec).section


def changed_trial_problems(
    spec: SweepSpec,
    point: GridPoint,
    changes: dict[str, Any],
    build_section: Callable[[str, dict[str, Any], int], tuple[Any, list[str]]] | None = None,
) -> list[str]:
    """The problems of a grid point's trial with dotted ``section.field`` values put in (a tuned
    setting at a bound of its search space), found by the same build step as the point's
    (``build_section``: e.g. ``section_builder(spec)``, to build the unchanged sections once)."""
    sections = {name: dataclasses.asdict(getattr(point.trial, name)) for name in SECTIONS}
    for key, value in changes.items():
        set_dotted(sections, key, value)
    workers = resources_for(spec, point.combination.dataset).workers
    return build_trial(point.combination.dataset, sections, workers, build_section)[1]


def _extrapolation_problems(model: ModelSpec, data: DataSpec) -> list[str]:
    """An attention position that, trained at data.max_length, would read untrained parameters
    at the longest of data.eval_lengths (``AttentionPosition.length_problems``)."""
    if not data.eval_lengths:
        return []
    entry = ATTENTION_POSITIONS.get(model.attention_position)
    problems = entry.length_problems(
        model.attention_position_kwargs, data.max_length, max(data.eval_lengths)
    )
    return [f"model.attention_position_kwargs: {p}" for p in problems]


def _max_len_problems(max_len: int, data: DataSpec, where: str) -> list[str]:
    """The model's position tables must cover every length a document is fed at: data.max_length
    and each of data.eval_lengths (positions never trained keep their initial values)."""
    # lazy: data.prepare imports the tokenizers and the cache (~0.15 s); --help runs without
    from fusion_ray.data.prepare import longest_input_length

    longest = longest_input_length(data)
    if max_len >= longest:
        return []
    what = (
        f"data.max_length {data.max_length}"
        if longest == data.max_length
        else f"the longest of data.eval_lengths ({longest}), which the position tables must cover"
    )
    return [f"{where}: {max_len} is shorter than {what}; set model.max_len >= {longest}"]


def _build_section(name: str, settings: dict[str, Any], workers: int) -> tuple[Any, list[str]]:
    """One trial's data, model or train settings built (pydantic checks each field's type and
    range), then the rules between its fields: (the settings or None, the problems)."""
    value, problems = validate_as(SECTIONS[name], settings, name)
    problems = [p.replace(f"{name}: ", f"{name}.", 1) for p in problems]
    problems = bool_number_problems(SECTIONS[name], settings, f"{name}.") + problems
    if value is None or problems:
        return None, problems
    if name == "data":
        # lazy: data.prepare imports the tokenizers and the cache (~0.15 s); --help runs without
        from fusion_ray.data.prepare import data_rules

        problems += data_rules(value)  # its messages name data.<field> already
    elif name == "model":
        problems += [f"model: {p}" for p in model_rules(value)]
    else:
        problems += [f"train.{p}" for p in train_rules(value, workers)]
    return (value if not problems else None), problems


SECTIONS: dict[str, type] = {"data": DataSpec, "model": ModelSpec, "train": TrainSpec}


@functools.cache
def _adapter(cls: Any) -> TypeAdapter:
    return TypeAdapter(cls)


def validate_as(cls: Any, raw: Any, where: str) -> tuple[Any, list[str]]:
    """``raw`` validated as ``cls`` (a pydantic-validatable type): (the value, []) or (None,
    every problem prefixed with ``where``)."""
    try:
        return _adapter(cls).validate_python(raw), []
    except ValidationError as exc:
        return None, [f"{where}: {p}" for p in pydantic_problems(exc, cls)]
