"""Expand a sweep into cells: one trial config per (dataset, position, attention position, fusion, seed)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from fusion_ray.config import Named, SweepSpec, combinations, resolve_specs
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train.spec import TrainSpec, TrialConfig

# Settings that say where things live, not what is computed: they never change a cell's id.
_NOT_IN_ID = ("data.cache_dir",)


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
    flat = {k: v for k, v in flatten(dataclasses.asdict(trial)).items() if k not in _NOT_IN_ID}
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


def _trial(
    spec: SweepSpec, dataset: str, position: Named, attention: Named, fusion: Named, seed: int
) -> TrialConfig:
    data, model, train = resolve_specs(spec, dataset)
    model = {
        **model,
        "fusion": fusion.name,
        "fusion_kwargs": fusion.kwargs,
        "position": position.name,
        "position_kwargs": position.kwargs,
        "attention_position": attention.name,
        "attention_position_kwargs": attention.kwargs,
    }
    return TrialConfig(
        dataset=dataset,
        data=data,
        model=TypeAdapter(ModelSpec).validate_python(model),
        train=TypeAdapter(TrainSpec).validate_python(train),
        seed=seed,
    )


def expand(spec: SweepSpec) -> list[Cell]:
    """Every cell of the sweep, seed-major: complete paired blocks are scheduled first."""
    cells = []
    for seed in spec.seeds:
        for dataset, position, attention, fusion in combinations(spec):
            trial = _trial(spec, dataset, position, attention, fusion, seed)
            cells.append(
                Cell(
                    cell_id=cell_id(trial),
                    dataset=dataset,
                    position=position.label,
                    attention_position=attention.label,
                    fusion=fusion.label,
                    seed=seed,
                    trial=trial,
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
