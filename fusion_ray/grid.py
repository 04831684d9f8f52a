"""Expand a sweep into cells: one trial config per (dataset, position, attention position, fusion, seed)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from fusion_ray.config import (
    Combination,
    SweepSpec,
    combination_model,
    combinations,
    resolve_specs,
)
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train.spec import TrainSpec, TrialConfig

# Settings that say where things live, not what is computed: they never change a cell's id.
_NOT_IN_ID = ("data.cache_dir",)
# Settings added to the schema after cell ids were first issued, with their defaults: while a
# sweep leaves one at its default it stays out of the id, so growing the schema does not
# change the ids (and re-run the finished cells) of sweeps that do not use the new setting.
_ID_DEFAULTS = {"train.pad_to_multiple": 1}


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


@dataclass(frozen=True)
class Cell:
    """One trial of the sweep."""

    cell_id: str
    dataset: str
    position: str
    attention_position: str
    fusion: str
    seed: int
    trial: TrialConfig

    def tags(self, sweep: str, git_sha: str) -> dict[str, str]:
        """The MLflow tags of this cell's run (DESIGN.md schema)."""
        return {
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


_MODEL_SPEC = TypeAdapter(ModelSpec)
_TRAIN_SPEC = TypeAdapter(TrainSpec)


def _trial(spec: SweepSpec, combination: Combination) -> TrialConfig:
    """The trial of one grid point at seed 0 (cells differ from it only by their seed)."""
    data, _, train = resolve_specs(spec, combination[0])
    return TrialConfig(
        dataset=combination[0],
        data=data,
        model=_MODEL_SPEC.validate_python(combination_model(spec, combination)),
        train=_TRAIN_SPEC.validate_python(train),
        seed=0,
    )


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell of the sweep, seed-major: complete paired blocks are scheduled first.

    Each grid point is validated and flattened once; a cell is that template with its seed."""
    templates = []
    for combination in combinations(spec):
        trial = _trial(spec, combination)
        dataset, position, attention, fusion = combination
        labels = (dataset, position.label, attention.label, fusion.label)
        templates.append((labels, trial, _id_fields(trial)))
    cells = []
    for seed in spec.seeds:
        for (dataset, position, attention, fusion), template, fields in templates:
            cells.append(
                Cell(
                    cell_id=_hash_config({**fields, "seed": seed}),
                    dataset=dataset,
                    position=position,
                    attention_position=attention,
                    fusion=fusion,
                    seed=seed,
                    trial=dataclasses.replace(template, seed=seed),
                )
            )
    return cells


def axis_counts(cells: list[Cell]) -> dict[str, dict[str, int]]:
    """How many cells each value of each axis has (for the dry run)."""
    counts: dict[str, dict[str, int]] = {}
    for axis in ("dataset", "position", "attention_position", "fusion", "seed"):
        per: dict[str, int] = {}
        for cell in cells:
            key = str(getattr(cell, axis))
            per[key] = per.get(key, 0) + 1
        counts[axis] = per
    return counts
