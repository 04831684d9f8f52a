"""Adaptive seeds: which cells the evidence still needs (no Ray, no MLflow).

The sweep's questions are hypotheses of one family (``fusion_ray.decide.questions``): each
operator against the sweep's baseline inside one group of cells that share every other axis,
and, where the grid allows and the sweep asks (``seeds: {decide: [...]}``), the length contrast
(the operator's delta on the longest regime minus the shortest) and the interactions with the
setting axes. A hypothesis's value at seed t is a signed sum of its runs' test accuracies
(points); ``fusion_ray.decide.sequential`` turns the values of every hypothesis into one state
per seed (open, better, worse, equivalent, futile) with the sweep's decision rule, one closed
test over the whole family at every look.

The schedule follows from the finished cells alone, so a restarted driver that reads them back
from the tracking store reaches the same states and asks for the same cells:
- every cell of seeds 0 .. first-1 runs (the first wave);
- a hypothesis's runs at seed s >= first run when every earlier seed of it is resolved
  (finished or failed) and it is still open after them, and s < max; a cell runs when any
  hypothesis needs it (a contrast may need cells its operator comparisons no longer do);
- a failed cell counts: its seed takes ``questions.failure_value`` (a loss for its arm); a cell
  whose process or node was lost is not scored and runs again on the next invocation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fusion_ray.config import AdaptiveSeeds
from fusion_ray.decide.questions import REGIME_KEY, Arm, Group, Hypothesis, hypotheses, rows
from fusion_ray.decide.sequential import family_evidence


def group_of(cell: Any) -> Group:
    """The cells a comparison pairs within: every axis but the compared one and the seed (a
    study cell's dataset, positions and setting levels; a trainable cell's other axes)."""
    return tuple(cell.group)


def arm_of(cell: Any) -> Arm:
    """The cell's arm: its group and its level of the compared axis (a study cell's operator)."""
    return Arm(group_of(cell), cell.level)


def grid_order(cells: list[Any], datasets: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The regimes in the order of length (the sweep file's ``grid.datasets``, then any other
    regime of the cells; none for cells without one) and each setting axis's levels, the sweep
    file's first first."""
    regimes = list(dict.fromkeys([*datasets, *(c.regime for c in cells if c.regime)]))
    levels: dict[str, list[str]] = {}
    for cell in cells:
        for key, text in cell.settings:
            levels.setdefault(key, [])
            if text not in levels[key]:
                levels[key].append(text)
    return regimes, levels


@dataclass
class SeedSchedule:
    """The cells of an adaptive sweep, its hypotheses and what the finished cells say."""

    cells: list[Any]
    """The sweep's cells (``config.workload.cells_of``: a study's or a trainable's)."""
    baseline: str
    rule: AdaptiveSeeds
    results: dict[str, float | Mapping[str, float] | None] = field(default_factory=dict)
    """cell id -> a finished cell's test accuracy (0-1), or its accuracy on each part of its
    test split (``questions.PARTS``: "all", "shortest", "longest"); None for a failed one."""
    regimes: list[str] = field(default_factory=list)
    """The datasets in the order of length (empty: the order of the cells)."""
    regime_key: str = REGIME_KEY
    """The group axis the regimes are levels of: the study's ``dataset``, a trainable's
    ``trend:`` axis."""

    def __post_init__(self) -> None:
        self.by_key: dict[tuple[Arm, int], Any] = {(arm_of(c), c.seed): c for c in self.cells}
        self.order = {c.cell_id: i for i, c in enumerate(self.cells)}
        regimes, self.levels = grid_order(self.cells, self.regimes)
        self.regimes = regimes
        arms = list(dict.fromkeys(arm_of(c) for c in self.cells))
        self.family: list[Hypothesis] = hypotheses(
            arms, self.baseline, regimes, self.levels, self.rule.decide, self.regime_key
        )
        self.by_name = {h.name: h for h in self.family}
        self.kinds = {h.name: h.kind for h in self.family}

    @property
    def comparisons(self) -> dict[str, Hypothesis]:
        """Every hypothesis of the family by name (operator comparisons and contrasts)."""
        return self.by_name

    def resolved(self, arm: Arm, seed: int) -> bool:
        cell = self.by_key.get((arm, seed))
        return cell is None or cell.cell_id in self.results

    def accuracy(self, arm: Arm, seed: int, part: str = "all") -> float | None:
        """The arm's test accuracy at ``seed`` on ``part`` of its test split; None for a failed
        run; nan where the run did not report that part."""
        cell = self.by_key.get((arm, seed))
        result = None if cell is None else self.results.get(cell.cell_id)
        if result is None:
            return None
        if isinstance(result, Mapping):
            return result.get(part, math.nan)
        return float(result) if part == "all" else math.nan

    def deltas(self) -> dict[str, list[float]]:
        """Each hypothesis's values (points) in seed order, up to its first unresolved seed."""
        return rows(self.family, self.resolved, self.accuracy, self.rule.max)

    def evidence(self, with_sequences: bool = False) -> dict[str, list[Any]]:
        """Each hypothesis's evidence and state after each of its resolved seeds
        (``fusion_ray.decide.sequential.family_evidence``)."""
        return family_evidence(
            self.deltas(),
            alpha=self.rule.alpha,
            margin=self.rule.margin,
            max_seeds=self.rule.max,
            first=self.rule.first,
            rule=self.rule.decision_rule(),
            with_sequences=with_sequences,
            kinds=self.kinds,
        )

    def states(self) -> dict[str, list[str]]:
        """Each hypothesis's state after each of its resolved seeds."""
        return {name: [lk.state for lk in looks] for name, looks in self.evidence().items()}

    def needed(self) -> list[Any]:
        """The cells the evidence needs now and that have no result yet, seed-major."""
        states, deltas = self.states(), self.deltas()
        wanted = {k for k in self.by_key if k[1] < self.rule.first}  # the first wave: every cell
        for h in self.family:
            seed = len(deltas[h.name])  # the hypothesis's next seed
            still_open = not states[h.name] or states[h.name][-1] == "open"
            if seed >= self.rule.first and still_open and seed < self.rule.max:
                wanted |= {(arm, seed) for arm in h.arms}
        cells = [self.by_key[k] for k in wanted if k in self.by_key]
        todo = [c for c in cells if c.cell_id not in self.results]
        return sorted(todo, key=lambda c: (c.seed, self.order[c.cell_id]))

    def worst_case(self) -> int:
        """Cells the sweep runs if no hypothesis is ever decided: every seed up to max."""
        return len(self.cells)

    def first_wave(self) -> list[Any]:
        return [c for c in self.cells if c.seed < self.rule.first]


def finished_results(
    cells: list[Any], runs: Mapping[str, object]
) -> dict[str, float | Mapping[str, float] | None]:
    """Results of the cells whose run ended (``tracking.CellRun``): the score of a FINISHED run
    (its decision metric, more is better: the study's test accuracy), None for a cell whose best run FAILED by its own code (it counts as a failure
    and is not run again); a run whose process or node was lost (``infrastructure``) and a
    KILLED one (interrupted) are no result: the cell runs (or continues) again."""
    out: dict[str, float | Mapping[str, float] | None] = {}
    for cell in cells:
        run = runs.get(cell.cell_id)
        status = getattr(run, "status", None)
        acc = getattr(run, "score", None)
        if status == "FINISHED" and acc is not None:
            out[cell.cell_id] = {"all": float(acc), **getattr(run, "parts", {})}
        elif status == "FAILED" and not getattr(run, "infrastructure", False):
            out[cell.cell_id] = None  # a lost process or node is no result: the cell runs again
    return out
