"""A sweep of a trainable (``trainable: NAME``, ``fusion_ray.trainables``): its schema, the
checks that need no training, and its cells.

The file names the training function and what to vary and compare::

    name: digits_smoothing
    trainable: digits_mlp
    defaults: {epochs: 10}                 # free-form: the trainable's own settings
    grid:                                  # any keys (dotted keys set nested settings)
      label_smoothing: [0.0, 0.1]
      hidden: [16, 64]
    compare: {axis: label_smoothing, baseline: 0.0}   # default: the first axis, its first level
    metric: {name: test_acc, mode: max}    # default: the trainable's first metric, maximised
    seeds: {adaptive: true, first: 6, max: 14}

A cell is one combination of the grid's levels at one seed: its config is ``defaults`` with the
combination's values set; its arm is its level of the compared axis, its group the levels of
the other axes (the comparisons pair arms within a group at one seed).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from fusion_ray.config.combinations import flatten, set_dotted
from fusion_ray.config.fields import Address, Description, StoragePath, SweepName, TrackingUri
from fusion_ray.config.names import TRAINABLES as TRAINABLE_NAMES
from fusion_ray.config.spec import AdaptiveSeeds, Resources, SeedList, Strict, adaptive_block
from fusion_ray.registry import unknown_name
from fusion_ray.schema import AXIS_TAG_PREFIX, TRAINABLE_RUN_TAG, axis_text

Level = StrictBool | StrictInt | StrictFloat | StrictStr
"""A grid level: a number, a string or a boolean (what a tag and a table cell show as written)."""


class Compare(Strict):
    """The axis whose levels are compared, and the level every other is compared against."""

    axis: str | None = None
    """A key of ``grid``; None: the grid's first key."""
    baseline: Level | None = None
    """One of the axis's levels; None: its first."""


class Metric(Strict):
    """The final metric the comparisons decide on."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_./ -]{1,250}$")
    """A metric the trainable returns; None: the first it returns."""
    mode: Literal["max", "min"] = "max"
    """Whether more is better (``max``: an accuracy) or less (``min``: a loss)."""


class TrainableSweep(Strict):
    """A sweep of a training function (``trainable: NAME``) over a grid of its settings."""

    name: SweepName
    """The MLflow experiment and the Ray Tune run name."""
    description: Description = ""
    """Free text shown as the MLflow experiment's and parent run's note."""
    trainable: str
    """The trainable's registered name (``fusion-ray list``: trainables)."""
    extends: list[str] = Field(default_factory=list)
    """Fragments merged under this file, in order (paths relative to it; this file's own keys
    win): a tuning's ``defaults:`` (``fusion-ray hpo``), settings shared by several sweeps."""
    defaults: dict[str, Any] = Field(default_factory=dict)
    """Settings every cell's config starts from (free-form: the trainable's own)."""
    grid: dict[str, list[Level]] = Field(min_length=1)
    """Each key's levels; every combination of levels is a grid point. Dotted keys
    (``optim.lr``) set a nested setting."""
    compare: Compare = Field(default_factory=Compare)
    metric: Metric = Field(default_factory=Metric)
    trend: str | None = None
    """A grid axis whose levels are ordered as listed (not the compared one): the sweep also
    asks whether each comparison's difference changes from its first level to its last (kind
    ``length`` in the decisions, as the study's question over its datasets)."""
    seeds: SeedList
    """Every grid point runs once per seed; or an adaptive block (``{adaptive: true, first: 6,
    max: 14}``)."""
    adaptive: AdaptiveSeeds | None = None
    """Set from an adaptive ``seeds:`` block."""
    resources: Resources = Field(default_factory=Resources)
    storage_path: StoragePath = "ray_results"
    tracking_uri: TrackingUri = "sqlite:///mlflow.db"
    retries: StrictInt = Field(1, ge=0, le=100)
    address: Address = None
    smoke: dict[str, Any] = Field(default_factory=dict)
    """Settings set over every cell's config by ``--smoke`` (dotted keys allowed), e.g.
    ``{epochs: 1}``: the shrunk copy that checks the file end to end in seconds."""

    @model_validator(mode="before")
    @classmethod
    def _adaptive_block(cls, raw: Any) -> Any:
        return adaptive_block(raw)

    @property
    def axis(self) -> str:
        """The compared axis."""
        return self.compare.axis or next(iter(self.grid))

    @property
    def baseline_text(self) -> str:
        """The compared axis's baseline level, as text."""
        level = self.compare.baseline
        return axis_text(self.grid[self.axis][0] if level is None else level)

    @property
    def baseline_label(self) -> str:
        """The baseline arm's name: ``axis=level`` (what the comparisons are against)."""
        return f"{self.axis}={self.baseline_text}"

    @property
    def regimes(self) -> list[str]:
        """The trend axis's levels as text, in the file's order (none without ``trend:``)."""
        if self.trend is None or self.trend not in self.grid:
            return []
        return [axis_text(v) for v in self.grid[self.trend]]

    @property
    def workload(self) -> str:
        """The kind of sweep the driver runs it as (``fusion_ray.driver.workload``)."""
        return "trainable"

    @property
    def regime_key(self) -> str:
        """The group axis the regimes are levels of: the trend axis ("" without one)."""
        return self.trend or ""

    def grid_levels(self) -> dict[str, list[str]]:
        """Each grid axis's levels as text, in the file's order (the parent run's ``grid_axes``)."""
        return {key: [axis_text(v) for v in levels] for key, levels in self.grid.items()}

    def with_resources(self, change: Callable[[Resources], Resources]) -> TrainableSweep:
        """A copy with ``change`` applied to its resources block."""
        return self.model_copy(update={"resources": change(self.resources)})

    def group_resources(self, group: str) -> Resources:
        """Every trial holds the sweep's ``resources:`` (one resource group: the trainable)."""
        return self.resources


def trainable_sweep_problems(spec: TrainableSweep) -> list[str]:
    """What the schema cannot say: the grid's keys and levels, the compared axis and baseline
    against the grid, dotted keys against the defaults, the questions, the trainable's name."""
    return (
        grid_problems(spec.grid)
        + compare_problems(spec)
        + nesting_problems(spec)
        + question_problems(spec)
        + name_problems(spec)
    )


def question_problems(spec: TrainableSweep) -> list[str]:
    """The trend axis against the grid; ``length`` (the trend question) only with one, and
    ``length_within`` never (it needs the study's documents)."""
    problems = trend_problems(spec)
    asked = spec.adaptive.decide if spec.adaptive is not None else None
    allowed = ("operator", "interaction", "length") if spec.trend else ("operator", "interaction")
    wrong = [k for k in asked or [] if k not in allowed]
    if wrong:
        problems.append(
            f"seeds.decide: {', '.join(wrong)} asks about document length or a trend, which "
            "this sweep has no axis for; decide operator (each level against the baseline), "
            "interaction, and length with an ordered axis named by trend: KEY"
        )
    return problems


def trend_problems(spec: TrainableSweep) -> list[str]:
    """``trend:`` names a grid axis of two levels or more other than the compared one."""
    if spec.trend is None:
        return []
    if spec.trend not in spec.grid:
        return [f"trend: {unknown_name('grid axis', spec.trend, list(spec.grid))}"]
    if spec.trend == spec.axis:
        return [
            f"trend: {spec.trend} is the compared axis; a trend is along another axis (the "
            "comparisons' difference from its first level to its last)"
        ]
    if len(spec.grid[spec.trend]) < 2:
        return [f"trend: grid.{spec.trend} has one level; a trend needs two or more"]
    return []


def grid_problems(grid: dict[str, list[Any]]) -> list[str]:
    """Empty keys, empty axes and levels given twice."""
    problems = []
    for key, levels in grid.items():
        if not key or any(not part for part in key.split(".")):
            problems.append(f"grid: {key!r} is not a key (dotted parts must not be empty)")
        if not levels:
            problems.append(f"grid.{key}: give at least one level")
        texts = [axis_text(level) for level in levels]
        twice = sorted({t for t in texts if texts.count(t) > 1})
        if twice:
            problems.append(f"grid.{key}: levels {twice} are given twice; list each once")
    return problems


def compare_problems(spec: TrainableSweep) -> list[str]:
    """The compared axis and baseline against the grid."""
    axis = spec.axis
    if axis not in spec.grid:
        return [f"compare.axis: {unknown_name('grid axis', axis, list(spec.grid))}"]
    levels = [axis_text(level) for level in spec.grid[axis]]
    problems = []
    if len(levels) < 2:
        problems.append(
            f"grid.{axis}: the compared axis needs two levels or more (it has {levels}); add "
            "a level, or compare another axis (compare: {axis: KEY})"
        )
    if spec.baseline_text not in levels:
        problems.append(
            f"compare.baseline: {spec.baseline_text!r} is not a level of grid.{axis}; "
            f"its levels: {', '.join(levels)}"
        )
    return problems


def trainable_names() -> list[str]:
    """Every trainable name, without importing any trainable (``config.names``)."""
    return TRAINABLE_NAMES.names()


def name_problems(spec: Any) -> list[str]:
    """The trainable's name (``spec.trainable``: a sweep's or a tuning's), checked against the
    installed ones (nothing imported)."""
    names = trainable_names()
    if spec.trainable in names:
        return []
    return [f"trainable: {unknown_name('trainable', spec.trainable, names)}"]


def nesting_problems(spec: TrainableSweep) -> list[str]:
    """Dotted grid keys whose parent in ``defaults`` is a value, not a mapping."""
    problems = []
    for key in spec.grid:
        node: Any = spec.defaults
        for depth, part in enumerate(key.split(".")[:-1]):
            node = node.get(part) if isinstance(node, dict) else None
            if node is not None and not isinstance(node, dict):
                parent = ".".join(key.split(".")[: depth + 1])
                problems.append(
                    f"grid.{key}: defaults.{parent} is {node!r}, not a mapping, so {key} cannot "
                    "be set inside it"
                )
                break
    return problems


def with_levels(defaults: dict[str, Any], levels: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``defaults`` with each (dotted) key of ``levels`` set."""
    config = copy.deepcopy(defaults)
    for key, value in levels.items():
        set_dotted(config, key, value)
    return config


@dataclass(frozen=True)
class TrainableCell:
    """One grid point of a trainable sweep at one seed."""

    cell_id: str
    trainable: str
    seed: int
    level: str
    """Its arm: ``axis=level`` of the compared axis (``label_smoothing=0.1``)."""
    group: tuple[tuple[str, str], ...]
    """(key, level as text) of every other axis: the cells its comparisons pair within."""
    axes: tuple[tuple[str, str], ...]
    """(key, level as text) of every axis, the compared one included, in the grid's order."""
    config: dict[str, Any] = field(repr=False, compare=False)
    """The trainable's config: the defaults with this grid point's levels set."""
    trend: str = ""
    """The sweep's trend axis ("" without one)."""

    @property
    def label(self) -> str:
        """The grid point (without its seed), as the console and run names show it."""
        return " ".join(f"{key}={text}" for key, text in self.axes)

    @property
    def run_name(self) -> str:
        """Its MLflow run name: the compared level and the seed first, then the other levels."""
        rest = " ".join(f"{key}={text}" for key, text in self.group)
        lead = f"{self.level} seed {self.seed}"
        return f"{lead} | {rest}" if rest else lead

    @property
    def resource_group(self) -> str:
        """The cells that ask for the same resources: every cell of the sweep (its trainable)."""
        return self.trainable

    @property
    def trial_name(self) -> str:
        """Its Ray Tune trial's name: the grid point, the seed and the cell id's start."""
        levels = "-".join(text for _, text in self.axes)
        return f"{self.trainable}-{levels}-s{self.seed}-{self.cell_id[:6]}"

    def identity(self) -> dict[str, str]:
        """The tags that name its grid point and seed (a run of other settings is matched by
        them to say what differs)."""
        return {f"{AXIS_TAG_PREFIX}{key}": text for key, text in self.axes} | {
            "seed": str(self.seed)
        }

    @property
    def settings(self) -> tuple[tuple[str, str], ...]:
        """The axes an interaction varies: every axis but the compared one and the trend's."""
        return tuple((k, t) for k, t in self.group if k != self.trend)

    @property
    def regime(self) -> str:
        """Its level of the trend axis ("" without one)."""
        return dict(self.axes).get(self.trend, "") if self.trend else ""

    def tags(self, sweep: str, git_sha: str) -> dict[str, str]:
        """Its MLflow tags: one per grid axis (``axis.<key>``), and what names the cell."""
        tags = {f"{AXIS_TAG_PREFIX}{key}": text for key, text in self.axes}
        return tags | {
            "cell_id": self.cell_id,
            TRAINABLE_RUN_TAG: self.trainable,
            "seed": str(self.seed),
            "sweep": sweep,
            "git_sha": git_sha,
            "role": "trial",
        }

    def params(self) -> dict[str, str]:
        """Its config flattened with dots, as MLflow params."""
        flat = flatten(self.config)
        return {
            k: json.dumps(v) if isinstance(v, (dict, list)) else str(v) for k, v in flat.items()
        }


def cell_key(trainable: str, config: dict[str, Any], seed: int) -> str:
    """A cell's id: a hash of the trainable's name, its config and its seed."""
    canonical = json.dumps(
        {"trainable": trainable, "config": config, "seed": seed}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def trainable_cells(spec: TrainableSweep) -> list[TrainableCell]:
    """Every cell, seed-major (complete paired blocks first), grid points in the grid's order."""
    keys = list(spec.grid)
    points = []
    for combination in itertools.product(*(spec.grid[k] for k in keys)):
        levels = dict(zip(keys, combination, strict=True))
        axes = tuple((k, axis_text(v)) for k, v in levels.items())
        group = tuple((k, t) for k, t in axes if k != spec.axis)
        points.append(
            (
                with_levels(spec.defaults, levels),
                axes,
                group,
                f"{spec.axis}={axis_text(levels[spec.axis])}",
            )
        )
    return [
        TrainableCell(
            cell_key(spec.trainable, config, seed),
            spec.trainable,
            seed,
            level,
            group,
            axes,
            config,
            spec.trend or "",
        )
        for seed in spec.seeds
        for config, axes, group, level in points
    ]
