"""Expand a sweep into cells: one trial config per (dataset, position, attention position, fusion,
setting-axis values, seed)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fusion_ray.config import GridPoint, SweepFileError, SweepSpec, semantic_problems
from fusion_ray.config.combinations import flatten
from fusion_ray.model.fusion import is_gated
from fusion_ray.model.positions import POSITIONS
from fusion_ray.schema import AXIS_TAG_PREFIX, EXECUTION_PARAMS, GATED_TAG, POSITION_ALIAS_TAG
from fusion_ray.train.spec import TrialConfig

# Settings that say where things live or how a step is executed, not what is computed: they
# never change a cell's id. train.cuda_graphs replays the eager step's kernels on the same
# inputs (bitwise equal on a GPU where the eager step is itself reproducible:
# tests/fusion_ray/train/test_cuda_graphs.py, bench/RESULTS.md).
_NOT_IN_ID = ("data.cache_dir", *EXECUTION_PARAMS)
# Settings added to the schema after cell ids were first issued, with their defaults: while a
# sweep leaves one at its default it stays out of the id, so growing the schema does not
# change the ids (and re-run the finished cells) of sweeps that do not use the new setting.
_ID_DEFAULTS: dict[str, Any] = {
    "train.pad_to_multiple": 1,
    "train.micro_batch_size": None,
    "data.eval_lengths": [],
    "data.max_eval_samples": None,
}


def cell_id(trial: TrialConfig) -> str:
    """A stable id: a hash of the trial's full config (minus storage locations)."""
    return _hash_config(_id_fields(trial))


def _id_fields(trial: TrialConfig) -> dict[str, Any]:
    return {
        k: v
        for k, v in flatten(dataclasses.asdict(trial)).items()
        if k not in _NOT_IN_ID and not (k in _ID_DEFAULTS and v == _ID_DEFAULTS[k])
    }


def _hash_config(flat: dict[str, Any]) -> str:
    canonical = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


IDENTITY_TAGS = ("dataset", "position", "attention_position", "fusion", "seed")
"""The tags that name a study cell's grid point and seed (``Cell.identity``)."""


@dataclass(frozen=True)
class Cell:
    """One trial of the sweep."""

    cell_id: str
    dataset: str
    position: str
    attention_position: str
    fusion: str
    seed: int
    point_trial: TrialConfig = dataclasses.field(repr=False)
    """The trial of the cell's grid point (any seed): ``trial`` is it at this cell's seed."""
    axes: tuple[tuple[str, str], ...] = ()
    """(dotted key, value as text) of every setting axis of the grid."""

    @functools.cached_property
    def trial(self) -> TrialConfig:
        """The cell's full trial config (made on first use: a dry run of a million cells never
        needs most of them)."""
        if self.point_trial.seed == self.seed:
            return self.point_trial
        return dataclasses.replace(self.point_trial, seed=self.seed)

    @property
    def group(self) -> tuple[tuple[str, str], ...]:
        """The cells its comparisons pair within: every axis but the operator and the seed."""
        fixed = (
            ("dataset", self.dataset),
            ("position", self.position),
            ("attention_position", self.attention_position),
        )
        return fixed + tuple(self.axes)

    @property
    def level(self) -> str:
        """Its arm: the operator, the level the comparisons compare."""
        return self.fusion

    @property
    def settings(self) -> tuple[tuple[str, str], ...]:
        """The setting axes (key, level as text) an interaction varies."""
        return self.axes

    @property
    def regime(self) -> str:
        """Its place on the axis a trend runs along (the length question): its dataset."""
        return self.dataset

    @property
    def resource_group(self) -> str:
        """The cells that ask for the same resources: its dataset's (``resources_for``)."""
        return self.dataset

    @property
    def trial_name(self) -> str:
        """Its Ray Tune trial's name."""
        return f"{self.dataset}-{self.fusion}-{self.position}-s{self.seed}-{self.cell_id[:6]}"

    def identity(self) -> dict[str, str]:
        """The tags that name its grid point and seed (a run of other settings is matched by
        them to say what differs)."""
        return {t: str(getattr(self, t)) for t in IDENTITY_TAGS}

    @property
    def label(self) -> str:
        """How the console and run names show the cell's grid point (without its seed)."""
        parts = [self.dataset, self.position, self.attention_position, self.fusion]
        return "/".join(parts + [f"{key.rsplit('.', 1)[-1]}={text}" for key, text in self.axes])

    @property
    def run_name(self) -> str:
        """The cell's MLflow run name: what tells it from its siblings first (the operator, the
        setting levels, the seed), then where it ran (dataset/position/attention position), so
        the part MLflow's run table shows names the row."""
        levels = " ".join(f"{key.rsplit('.', 1)[-1]}={text}" for key, text in self.axes)
        lead = " ".join(p for p in (self.fusion, levels, f"seed {self.seed}") if p)
        return f"{lead} | {self.dataset}/{self.position}/{self.attention_position}"

    def tags(self, sweep: str, git_sha: str) -> dict[str, str]:
        """The MLflow tags of this cell's run (docs/reference/mlflow-schema.md): one per setting
        axis too, and the alias tag when the input position is another registry entry under a
        second name."""
        tags = {f"{AXIS_TAG_PREFIX}{key}": text for key, text in self.axes}
        same_as = POSITIONS.same_as(self.trial.model.position)
        if same_as is not None:
            tags[POSITION_ALIAS_TAG] = same_as
        tags[GATED_TAG] = "true" if is_gated(self.trial.model.fusion) else "false"
        return tags | {
            "cell_id": self.cell_id,
            "dataset": self.dataset,
            "position": self.position,
            "attention_position": self.attention_position,
            "fusion": self.fusion,
            "seed": str(self.seed),
            "sweep": sweep,
            "git_sha": git_sha,
            "role": "trial",
        }

    def params(self) -> dict[str, str]:
        """The trial's full config flattened with dots, as MLflow params."""
        flat = flatten(dataclasses.asdict(self.trial))
        flat.pop("data.cache_dir", None)
        return {
            k: json.dumps(v) if isinstance(v, (dict, list)) else str(v) for k, v in flat.items()
        }


def points(spec: SweepSpec) -> list[GridPoint]:
    """The sweep's grid points as validation built them (built now if ``spec`` was not
    validated as it is); a sweep with problems raises ``SweepFileError``."""
    kept = spec.kept_points()
    if kept is not None:
        return kept
    problems = semantic_problems(spec)
    if problems:
        raise SweepFileError("(sweep)", problems)
    return spec.kept_points() or []


class _SeededId:
    """A grid point's cell ids: the hash of its trial's id fields with the seed, computed from
    one serialisation of the fields (the seed's digits spliced in) rather than one per cell."""

    def __init__(self, trial: TrialConfig) -> None:
        canonical = json.dumps(_id_fields(trial), sort_keys=True, default=str)
        marker = f'"seed": {trial.seed}'
        at = canonical.index(marker) + len('"seed": ')
        self.head = hashlib.sha256(canonical[:at].encode())
        self.tail = canonical[at + len(str(trial.seed)) :]

    def __call__(self, seed: int) -> str:
        digest = self.head.copy()
        digest.update(f"{seed}{self.tail}".encode())
        return digest.hexdigest()[:16]


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell of the sweep, seed-major: complete paired blocks are scheduled first.

    Each grid point was built and checked once by validation; a cell is its trial with a seed."""
    built = [
        (
            _SeededId(p.trial),
            p.combination.dataset,
            p.combination.position.label,
            p.combination.attention.label,
            p.combination.fusion.label,
            p.trial,
            p.axes,
        )
        for p in points(spec)
    ]
    return [
        Cell(ids(seed), dataset, position, attention, fusion, seed, trial, axes)
        for seed in spec.seeds
        for ids, dataset, position, attention, fusion, trial, axes in built
    ]


def axis_counts(cells: list[Cell]) -> dict[str, dict[str, int]]:
    """How many cells each value of each axis has (for the dry run), in order of appearance."""
    counts: dict[str, dict[str, int]] = {}
    for axis in ("dataset", "position", "attention_position", "fusion", "seed"):
        counted = Counter(map(operator.attrgetter(axis), cells))
        counts[axis] = {str(value): n for value, n in counted.items()}
    for axes, n in Counter(c.axes for c in cells).items():
        for key, text in axes:
            per = counts.setdefault(key, {})
            per[text] = per.get(text, 0) + n
    return counts
