"""Adaptive seeds: which cells the evidence still needs (no Ray, no MLflow).

A comparison is one operator against the sweep's baseline inside one group of cells that share
every other axis (dataset, position, attention position, setting-axis levels). Its evidence is
the per-seed paired delta of test accuracy (points), in seed order; ``fusion_ray.decide.sequential``
turns the deltas of all comparisons into one state per seed (open, better, worse, equivalent,
futile) with the sweep's decision rule, over all the sweep's comparisons at every look.

The schedule follows from the finished cells alone, so a restarted driver that reads them back
from the tracking store reaches the same states and asks for the same cells:
- every cell of seeds 0 .. first-1 runs (the first wave);
- an operator's cell at seed s >= first runs when every earlier seed of its comparison is
  resolved (finished or failed) and the comparison is still open after them, and s < max;
- a baseline cell at seed s runs when any operator of its group needs seed s.
A failed cell leaves its seed's pair out (None) and the comparison goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fusion_ray.config import AdaptiveSeeds
from fusion_ray.grid import Cell

Group = tuple[str, ...]


def group_of(cell: Cell) -> Group:
    """The cells a comparison pairs within: every axis but the operator and the seed."""
    axes = tuple(f"{key}={text}" for key, text in cell.axes)
    return (cell.dataset, cell.position, cell.attention_position, *axes)


def _short_axis(level: str) -> str:
    key, _, value = level.partition("=")
    return f"{key.rsplit('.', 1)[-1]}={value}"


def comparison_name(group: Group, operator: str, baseline: str) -> str:
    """How decisions name a comparison: ``short/sinusoidal/none/scale_embeddings=true: gate_scalar vs add``."""
    # an axis key keeps its last part (model.scale_embeddings=true -> scale_embeddings=true);
    # its value stays whole (train.lr=0.1 and train.lr=1.1 stay apart)
    parts = [*group[:3], *(_short_axis(g) for g in group[3:])]
    return f"{'/'.join(parts)}: {operator} vs {baseline}"


@dataclass
class SeedSchedule:
    """The cells of an adaptive sweep and what the finished ones say."""

    cells: list[Cell]
    baseline: str
    rule: AdaptiveSeeds
    results: dict[str, float | None] = field(default_factory=dict)
    """cell id -> test accuracy (0-1) of a finished cell, or None for a failed one."""

    def __post_init__(self) -> None:
        self.by_key: dict[tuple[Group, str, int], Cell] = {
            (group_of(c), c.fusion, c.seed): c for c in self.cells
        }
        self.order = {c.cell_id: i for i, c in enumerate(self.cells)}
        self.comparisons: dict[str, tuple[Group, str]] = {}
        for group, fusion, _ in self.by_key:
            if fusion != self.baseline:
                self.comparisons[comparison_name(group, fusion, self.baseline)] = (group, fusion)

    def resolved(self, group: Group, fusion: str, seed: int) -> bool:
        cell = self.by_key.get((group, fusion, seed))
        return cell is None or cell.cell_id in self.results

    def accuracy(self, group: Group, fusion: str, seed: int) -> float | None:
        cell = self.by_key.get((group, fusion, seed))
        return None if cell is None else self.results.get(cell.cell_id)

    def deltas(self) -> dict[str, list[float | None]]:
        """Each comparison's paired deltas (points) in seed order, up to its first unresolved seed."""
        out: dict[str, list[float | None]] = {}
        for name, (group, fusion) in self.comparisons.items():
            row: list[float | None] = []
            for seed in range(self.rule.max):
                if not (
                    self.resolved(group, fusion, seed) and self.resolved(group, self.baseline, seed)
                ):
                    break
                own = self.accuracy(group, fusion, seed)
                base = self.accuracy(group, self.baseline, seed)
                # rounded as the report's deltas from correct counts are, so both see equal ties
                row.append(None if own is None or base is None else round(100.0 * (own - base), 9))
            out[name] = row
        return out

    def evidence(self, with_sequences: bool = False) -> dict[str, list[Any]]:
        """Each comparison's evidence and state after each of its resolved seeds
        (``fusion_ray.decide.sequential.family_evidence``)."""
        from fusion_ray.decide.sequential import family_evidence

        return family_evidence(
            self.deltas(),
            alpha=self.rule.alpha,
            margin=self.rule.margin,
            max_seeds=self.rule.max,
            first=self.rule.first,
            rule=self.rule.decision_rule(),
            with_sequences=with_sequences,
        )

    def states(self) -> dict[str, list[str]]:
        """Each comparison's state after each of its resolved seeds (``run_family``)."""
        return {name: [lk.state for lk in looks] for name, looks in self.evidence().items()}

    def needed(self) -> list[Cell]:
        """The cells the evidence needs now and that have no result yet, seed-major."""
        states, deltas = self.states(), self.deltas()
        wanted: set[tuple[Group, str, int]] = set()
        for name, (group, fusion) in self.comparisons.items():
            seed = len(deltas[name])  # the comparison's next seed
            still_open = not states[name] or states[name][-1] == "open"
            if seed < self.rule.first:
                seeds = range(self.rule.first)
            elif still_open and seed < self.rule.max:
                seeds = range(seed, seed + 1)
            else:
                continue
            for s in seeds:
                wanted |= {(group, fusion, s), (group, self.baseline, s)}
        cells = [self.by_key[k] for k in wanted if k in self.by_key]
        todo = [c for c in cells if c.cell_id not in self.results]
        return sorted(todo, key=lambda c: (c.seed, self.order[c.cell_id]))

    def worst_case(self) -> int:
        """Cells the sweep runs if no comparison is ever decided: every seed up to max."""
        return len(self.cells)

    def first_wave(self) -> list[Cell]:
        return [c for c in self.cells if c.seed < self.rule.first]


def finished_results(cells: list[Cell], runs: Mapping[str, object]) -> dict[str, float | None]:
    """Results of the cells that already have a FINISHED run (``tracking.CellRun`` with a
    ``test_acc``) in the tracking store."""
    out: dict[str, float | None] = {}
    for cell in cells:
        run = runs.get(cell.cell_id)
        acc = getattr(run, "test_acc", None)
        if run is not None and getattr(run, "status", None) == "FINISHED" and acc is not None:
            out[cell.cell_id] = float(acc)
    return out
