"""How many seeds, trials and card-hours an adaptive sweep will take, said before it runs: the
sweep's own schedule and decision rule (``SeedSchedule``, the driver's) run many times on
simulated results, each replay to its end, and what they used counted (no Ray, no MLflow).

Where the results come from (a ``World``):

- ``PilotWorld``: a first wave already logged (``fusion-ray plan --pilot``). Its runs are the
  replay's own results for their seeds (the real sweep keeps them), and every later seed is one
  of its seeds drawn again, all of a seed's runs together, so what one seed shares across arms
  (its data order, its initialisation) stays paired. Each replay first draws its own pilot of
  the same size from the pilot's seeds (a bootstrap of the pilot), and later seeds from that
  one: the replays then vary with the effects the pilot could have come from, not only with
  the seeds still to come.
- ``StatedWorld``: effects stated in points (``--effects``): each run's test accuracy is a base
  accuracy, plus its operator's effect on its dataset, plus a part its seed shares with every
  run of its group (``shared``), plus its own noise (``spread``), both normal; its shortest and
  longest quarters of documents are that accuracy with noise of ``spread`` each (so a length
  contrast within a dataset is null: both quarters carry the run's effect).

The numbers a forecast gives are those of its replays: a hypothesis's share of replays decided
within the cap, its seeds' mean and 90th percentile (and the 5-95 % band), the sweep's trials
and card-hours (mean and 90th percentile). They are as good as the world: a 6-seed pilot knows
the effects only as well as 6 seeds tell them (``bench/RESULTS.md``, "planner": how often the
seeds a sweep then used fell inside the band).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fusion_ray.config import AdaptiveSeeds
from fusion_ray.config.grid import Cell
from fusion_ray.decide.questions import Arm
from fusion_ray.policy.schedule import SeedSchedule, arm_of

Result = float | Mapping[str, float] | None
"""A cell's result as the schedule reads it: a test accuracy (0-1), per part, or None (failed)."""
Row = Mapping[Arm, Result]
"""Every arm's result at one seed."""

DEFAULT_REPLAYS = 200


class ForecastInputError(ValueError):
    """What a forecast was given cannot be forecast (a fixed-seed sweep, no pilot there, an
    effect naming no operator): one message saying what to give instead."""


class World(Protocol):
    """Where a replay's results come from."""

    def replay(self, rng: np.random.Generator, arms: Sequence[Arm]) -> Callable[[int], Row]:
        """One replay's results: seed -> every arm's result at that seed (the same row each time
        a seed is asked for)."""
        ...


@dataclass(frozen=True)
class PilotWorld:
    """Seeds drawn again from a logged first wave, all of a seed's runs together, smoothed."""

    rows: Sequence[Row]
    """The pilot's complete seeds: every arm's result at each (at least 2)."""
    smoothing: float = 1.0
    """h of a smoothed bootstrap: a drawn run's distance from its arm's pilot mean is mixed with
    normal noise of h times the arm's SD, rescaled by 1 / sqrt(1 + h^2) so the arm keeps its
    SD (0: the pilot's values exactly, so a replay knows only those few values)."""

    def __post_init__(self) -> None:
        if len(self.rows) < 2:
            raise ForecastInputError(
                f"a pilot needs at least 2 seeds with a result in every cell; it has "
                f"{len(self.rows)}: run the sweep's first wave first (seeds.max=2 or more)"
            )

    @functools.cached_property
    def _moments(self) -> dict[tuple[Arm, str], tuple[float, float]]:
        """Per arm and part: the pilot's mean and SD (n - 1) of its numbers (once per pilot,
        not once per replay)."""
        values: dict[tuple[Arm, str], list[float]] = {}
        for row in self.rows:
            for arm, result in row.items():
                for part, x in _parts(result).items():
                    if math.isfinite(x):
                        values.setdefault((arm, part), []).append(x)
        return {
            key: (float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0)
            for key, xs in values.items()
        }

    def replay(self, rng: np.random.Generator, arms: Sequence[Arm]) -> Callable[[int], Row]:
        n = len(self.rows)
        world = [self.rows[i] for i in rng.integers(n, size=n)]
        moments, h = self._moments, self.smoothing
        drawn: dict[int, Row] = {}

        def smooth(arm: Arm, result: Result) -> Result:
            if result is None or h == 0:
                return result
            out = {}
            for part, x in _parts(result).items():
                mean, sd = moments.get((arm, part), (x, 0.0))
                out[part] = mean + (x - mean + h * sd * rng.normal()) / math.sqrt(1 + h * h)
            return out["all"] if not isinstance(result, Mapping) else out

        def at(seed: int) -> Row:
            if seed not in drawn:
                row = world[int(rng.integers(n))]
                drawn[seed] = {arm: smooth(arm, result) for arm, result in row.items()}
            return drawn[seed]

        return at


def _parts(result: Result) -> dict[str, float]:
    """A result's numbers by part (a bare accuracy is the part "all")."""
    if result is None:
        return {}
    if isinstance(result, Mapping):
        return {k: float(v) for k, v in result.items()}
    return {"all": float(result)}


@dataclass(frozen=True)
class StatedWorld:
    """Runs from stated effects: base + effect + a per-seed part shared by a group + noise."""

    effects: Mapping[str, float]
    """Points against the baseline, by ``OPERATOR`` or ``DATASET/OPERATOR`` (the latter wins);
    an operator named nowhere has no effect."""
    spread: float
    """The SD of one run's test accuracy around its arm's mean, points."""
    shared: float = 0.0
    """The SD of a part of a seed's accuracy every run of its group shares (data order, say),
    points: it cancels in a paired delta."""
    base: float = 80.0
    """The baseline's mean test accuracy, points."""

    def effect(self, arm: Arm) -> float:
        dataset = dict(arm.group).get("dataset", "")
        return self.effects.get(f"{dataset}/{arm.fusion}", self.effects.get(arm.fusion, 0.0))

    def replay(self, rng: np.random.Generator, arms: Sequence[Arm]) -> Callable[[int], Row]:
        drawn: dict[int, Row] = {}
        groups = list(dict.fromkeys(arm.group for arm in arms))

        def run(arm: Arm, common: float) -> dict[str, float]:
            whole = self.base + self.effect(arm) + common + rng.normal(0.0, self.spread)
            # its shortest and longest quarters: the run's accuracy, each with noise of its own
            parts = {p: whole + rng.normal(0.0, self.spread) for p in ("shortest", "longest")}
            return {"all": whole / 100.0, **{p: x / 100.0 for p, x in parts.items()}}

        def at(seed: int) -> Row:
            if seed not in drawn:
                common = {g: rng.normal(0.0, self.shared) if self.shared else 0.0 for g in groups}
                drawn[seed] = {arm: run(arm, common[arm.group]) for arm in arms}
            return drawn[seed]

        return at


@dataclass(frozen=True)
class HypothesisForecast:
    name: str
    kind: str
    decided: float
    """Share of replays where it was decided (better, worse or equivalent) within the cap."""
    futile: float
    """Share of replays where it was stopped as futile."""
    seeds: np.ndarray
    """In each replay, the seeds it was decided (or stopped as futile) after; the seeds it had
    at the end where it stayed open."""

    def seeds_at(self, q: float) -> int:
        return int(np.ceil(np.quantile(self.seeds, q)))

    @property
    def band(self) -> tuple[int, int]:
        """5th to 95th percentile of its seeds."""
        return int(np.floor(np.quantile(self.seeds, 0.05))), self.seeds_at(0.95)


@dataclass(frozen=True)
class Forecast:
    hypotheses: list[HypothesisForecast]
    trials: np.ndarray
    """Trials in each replay, the ones already finished included."""
    done: int
    """Trials already finished (the pilot's)."""
    worst_case: int
    """Trials if no hypothesis is ever decided (every cell to the cap)."""
    cap: int
    hours: np.ndarray | None = None
    """Card-hours still to run in each replay (None: no trial time known)."""
    hours_source: str = ""
    hours_unit: str = "card-hours"
    """What an hour counts: a card's (GPU trials) or a trial's (CPU trials: "trial-hours")."""
    per_trial: dict[str, float] = field(default_factory=dict)
    """Hours of one trial per dataset, as used."""

    @property
    def replays(self) -> int:
        return len(self.trials)

    def lines(self) -> list[str]:
        """The forecast as the command prints it."""
        width = max([len(h.name) for h in self.hypotheses] + [10])
        out = [
            f"{'hypothesis':<{width}}  decided  futile  seeds: mean   p90  band 5-95 %",
        ]
        for h in self.hypotheses:
            lo, hi = h.band
            out.append(
                f"{h.name:<{width}}  {h.decided:>7.0%}  {h.futile:>6.0%}  "
                f"{h.seeds.mean():>11.1f}  {h.seeds_at(0.9):>4d}  {lo}-{hi}"
            )
        trials = self.trials
        lo, hi = np.quantile(trials, [0.05, 0.95])
        out.append(
            f"trials: mean {trials.mean():.0f}, 90th percentile {np.quantile(trials, 0.9):.0f}, "
            f"band 5-95 % {lo:.0f}-{hi:.0f}, of at most {self.worst_case} ({self.done} finished "
            f"already; {self.replays} replays, cap {self.cap} seeds)"
        )
        if self.hours is not None:
            hours = self.hours
            out.append(
                f"{self.hours_unit} still to run: mean {hours.mean():.2f}, 90th percentile "
                f"{np.quantile(hours, 0.9):.2f} ({self.hours_source})"
            )
        return out


def forecast(
    cells: Sequence[Cell],
    baseline: str,
    rule: AdaptiveSeeds,
    world: World,
    *,
    regimes: Sequence[str] = (),
    known: Mapping[str, Result] | None = None,
    replays: int = DEFAULT_REPLAYS,
    seed: int = 0,
    trial_hours: Mapping[str, float] | None = None,
    hours_source: str = "",
    hours_unit: str = "card-hours",
) -> Forecast:
    """Run the sweep's schedule ``replays`` times to its end on results from ``world`` (the
    ``known`` results, cell id -> result, are every replay's own). ``trial_hours``: card-hours
    of one trial per dataset, for the hours still to run."""
    known = dict(known or {})
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    rng = np.random.default_rng(seed)
    seeds_used: dict[str, list[int]] = {}
    states_at_end: dict[str, list[str]] = {}
    trials, hours = [], []
    schedule = SeedSchedule(list(cells), baseline, rule, dict(known), regimes=list(regimes))
    kinds = {h.name: h.kind for h in schedule.family}
    for _ in range(replays):
        results: dict[str, Result] = dict(known)
        schedule = SeedSchedule(list(cells), baseline, rule, results, regimes=list(regimes))
        at = world.replay(rng, arms)
        ran: list[Cell] = []
        while needed := schedule.needed():
            for cell in needed:
                results[cell.cell_id] = at(cell.seed)[arm_of(cell)]
            ran += needed
        deltas, states = schedule.deltas(), schedule.states()
        for name in kinds:
            seeds_used.setdefault(name, []).append(decided_after(states[name], len(deltas[name])))
            states_at_end.setdefault(name, []).append(states[name][-1] if states[name] else "open")
        trials.append(len(results))
        if trial_hours is not None:
            hours.append(sum(trial_hours.get(c.dataset, math.nan) for c in ran))
    hypotheses = [
        HypothesisForecast(
            name,
            kind,
            decided=float(
                np.mean([s in ("better", "worse", "equivalent") for s in states_at_end[name]])
            ),
            futile=float(np.mean([s == "futile" for s in states_at_end[name]])),
            seeds=np.array(seeds_used[name]),
        )
        for name, kind in kinds.items()
    ]
    return Forecast(
        hypotheses,
        np.array(trials),
        done=len(known.keys() & {c.cell_id for c in cells}),
        worst_case=schedule.worst_case(),
        cap=rule.max,
        hours=np.array(hours) if trial_hours is not None else None,
        hours_source=hours_source,
        hours_unit=hours_unit,
        per_trial=dict(trial_hours or {}),
    )


def decided_after(states: Sequence[str], seeds: int) -> int:
    """The seeds after which a hypothesis left "open" (its seeds, if it never did)."""
    return next((i + 1 for i, state in enumerate(states) if state != "open"), seeds)


def pilot_rows(
    cells: Sequence[Cell], results: Mapping[str, Result], seeds: int | None = None
) -> tuple[list[Row], dict[str, Result]]:
    """A pilot's complete seeds as rows (every arm has a result at that seed), and the results
    kept as known: those of its first ``seeds`` seeds (all of them: None)."""
    by_seed: dict[int, dict[Arm, Result]] = {}
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    kept: dict[str, Result] = {}
    for cell in cells:
        if cell.cell_id in results and (seeds is None or cell.seed < seeds):
            by_seed.setdefault(cell.seed, {})[arm_of(cell)] = results[cell.cell_id]
            kept[cell.cell_id] = results[cell.cell_id]
    rows: list[Row] = [row for _, row in sorted(by_seed.items()) if all(a in row for a in arms)]
    return rows, kept


MEASURED_TRIALS = Path(__file__).with_name("measured_trials.json")
"""Per card (``H100``, ``H200``): each study preset's epoch and test times, measured
(``bench/gpu_hours.py --export``; the folders under ``bench/results/`` it names)."""


def measured_trial_hours(
    chip: str, datasets: Mapping[str, tuple[int, Any]]
) -> tuple[dict[str, float], str]:
    """Card-hours of one trial per dataset from ``chip``'s measured epochs: epochs x (training +
    validation + checkpoint) + one test pass, over the measured packing's speed-up (an upper
    bound: early stopping only shortens a trial). ``datasets``: name -> (epochs, resources).
    Only the study's presets, each trial on one card, were measured."""
    table = json.loads(MEASURED_TRIALS.read_text())
    if chip.upper() not in table:
        raise ForecastInputError(
            f"--chip {chip}: no measured epoch times for it; measured: {', '.join(sorted(table))} "
            "(or give --trial-hours DATASET=HOURS)"
        )
    entry = table[chip.upper()]
    hours, problems = {}, []
    for dataset, (epochs, res) in datasets.items():
        measured = entry["datasets"].get(dataset)
        if measured is None or res.workers > 1:
            problems.append(dataset)
            continue
        trial_s = epochs * measured["epoch_seconds"] + measured["test_seconds"]
        hours[dataset] = trial_s / measured["speedup"] / 3600
    if problems:
        raise ForecastInputError(
            f"--chip {chip}: no {chip.upper()} times for {', '.join(problems)} (measured: the "
            f"study's presets {', '.join(sorted(entry['datasets']))}, one card per trial); give "
            "--trial-hours DATASET=HOURS for them"
        )
    text = (
        f"{chip.upper()} epoch times measured for the study's presets ({entry['measured']}), x "
        "each trial's epochs: an upper bound"
    )
    return hours, text
