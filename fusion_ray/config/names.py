"""The registry names a sweep file selects (its fusions, positions, attention positions, data
sources and tokenizers), checked before the registries are imported: the model's registries
import torch (seconds on a loaded machine), and a misspelt name is the commonest mistake.

Sound without the registries: an entry is registered by this package (the names below, which a
test holds equal to the registries' own), by an installed package's entry point (read from the
packages' metadata, nothing imported), or by code that imported the registry first; while a
registry's module is not imported, no code can have registered in it, and once it is, its own
names are used. A name found here may still have options the full check refuses; only the
names are asked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fusion_ray.registry import unknown_name


@dataclass(frozen=True)
class Family:
    """A registry as this check sees it: where it lives and what this package registers in it."""

    family: str
    """The registry's family, as its messages name it."""
    module: str
    attribute: str
    group: str
    """Its plug-ins' entry-point group."""
    built_in: tuple[str, ...]
    """This package's entries, in registration order."""

    def names(self) -> list[str]:
        """Every name the registry would hold: once imported, its own (with the installed entry
        points' where it has not loaded its plug-ins yet: loading imports their modules), else
        this package's and the installed entry points'."""
        loaded = sys.modules.get(self.module)
        registry = getattr(loaded, self.attribute, None) if loaded is not None else None
        if registry is not None and registry.plugins_loaded:
            return list(registry.names())
        own = registry.names_so_far() if registry is not None else list(self.built_in)
        plugins = sorted(point.name for point in metadata.entry_points(group=self.group))
        return [*own, *(name for name in plugins if name not in own)]


FUSIONS = Family(
    "fusion",
    "fusion_ray.model.fusion",
    "FUSIONS",
    "fusion_ray.fusions",
    ("add", "concat", "gate_scalar", "gate_cnn", "gate_mlp", "gate_vector", "mlp"),
)
POSITIONS = Family(
    "position",
    "fusion_ray.model.positions",
    "POSITIONS",
    "fusion_ray.positions",
    ("none", "sinusoidal", "learned", "rotary_features", "relative_table"),
)
ATTENTION_POSITIONS = Family(
    "attention_position",
    "fusion_ray.model.attention",
    "ATTENTION_POSITIONS",
    "fusion_ray.attention_positions",
    ("none", "rope", "alibi", "t5_bias", "untied", "disentangled", "xpos", "kerple_log", "fire"),
)
SOURCES = Family(
    "data source",
    "fusion_ray.data.sources",
    "SOURCES",
    "fusion_ray.sources",
    ("hub", "local", "synthetic"),
)
TOKENIZERS = Family(
    "tokenizer", "fusion_ray.data.tokenizer", "TOKENIZERS", "fusion_ray.tokenizers", ("bpe", "word")
)
FAMILIES = (FUSIONS, POSITIONS, ATTENTION_POSITIONS, SOURCES, TOKENIZERS)
TRAINABLES = Family(
    "trainable", "fusion_ray.trainables.registry", "TRAINABLES", "fusion_ray.trainables", ()
)
"""Trainables: every one, the study's encoder included, is an entry point (none built in)."""

_AXES = {"fusions": FUSIONS, "positions": POSITIONS, "attention_positions": ATTENTION_POSITIONS}


def name_problems(spec: Any) -> list[str]:
    """Every registry name of a schema-valid ``SweepSpec`` that no entry has, in the messages
    the full check gives (``grid.fusions[1]: unknown fusion 'gate_scaler'; allowed: ...; did you
    mean 'gate_scalar'?``)."""
    known = {family.family: family.names() for family in FAMILIES}
    problems = []
    grids = [("grid", spec.grid)] + [(f"include[{i}]", sub) for i, sub in enumerate(spec.include)]
    for where, grid in grids:
        for axis, family in _AXES.items():
            for i, entry in enumerate(getattr(grid, axis) or []):
                if entry.name not in known[family.family]:
                    problems.append(
                        f"{where}.{axis}[{i}]: {unknown_name(family.family, entry.name, known[family.family])}"
                    )
    for dataset, preset in spec.datasets.items():
        for field, family in (("source", SOURCES), ("tokenizer", TOKENIZERS)):
            name = getattr(preset.data, field)
            if name not in known[family.family]:
                problems.append(
                    f"datasets.{dataset}.data.{field}: {unknown_name(family.family, name, known[family.family])}"
                )
    return problems
