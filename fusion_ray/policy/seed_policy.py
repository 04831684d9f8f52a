"""Seed policies: which cells of a sweep run, in which Tune runs, and what is written at the end.

A sweep's seeds are one of two policies behind one small interface (``SeedPolicy``), chosen in
one place (``policy_for``) from the sweep file's ``seeds:``:

- ``FixedSeedPolicy``: every cell of every listed seed, in consecutive Tune runs of at most
  ``TUNE_RUN_CELLS`` cells, seed-major;
- ``AdaptiveSeedPolicy``: the first wave, then the next seed of each comparison still open, up to
  the cap, suggested by a Tune searcher as results arrive (one Tune run); each comparison is
  decided by the sweep's decision rule (``fusion_ray.decide.rules``, a registry), its evidence
  logged on the parent run at every look and its decisions at the end.

The driver (``fusion_ray.driver.runner``) asks the policy and never which policy it has. A new
stopping rule is a new entry of the decision-rule registry; a new policy is a class here and a line in
``policy_for``. Both policies are functions of the finished runs in the tracking store, so a
restarted driver makes the same choices.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fusion_ray.config.workload import AnySweep
from fusion_ray.decide.questions import KINDS, REGIME_KEY, failed_runs_by_operator
from fusion_ray.decide.sequential import decision_rows, decisions_text
from fusion_ray.policy.plan import Plan, plan
from fusion_ray.policy.schedule import SeedSchedule, finished_results
from fusion_ray.redact import redact
from fusion_ray.schema import ADAPTIVE_TAG

log = logging.getLogger(__name__)


class Tracker(Protocol):
    """What a policy reads from and writes to the tracking store: the runs ``plan`` compares
    the sweep with, and the decisions (``fusion_ray.driver.tracking.Tracker`` is one; the
    policies import nothing of the driver)."""

    def trial_runs(self) -> Any: ...

    def best_runs(self, runs: Any, metric: str | None, mode: str = "max") -> Any: ...

    def log_decisions(self, parent_id: str, rows: list[dict[str, Any]]) -> None: ...

    def log_decision_looks(
        self, parent_id: str, looks: dict[str, list[Any]], family: Sequence[str], alpha: float
    ) -> None: ...


class MLflowSweepCallback(Protocol):
    """The sweep's Tune callback as the adaptive policy writes through it while the sweep runs
    (``fusion_ray.driver.callbacks.MLflowSweepCallback`` is one)."""

    tracker: Tracker
    parent_id: str
    lease: Any
    """The driver's lease (its ``lost`` event is set once another driver owns the sweep)."""
    on_lost: Callable[[str], None] | None
    """Told each cell whose trial's process or node was lost."""


TUNE_RUN_CELLS = 200
"""Cells per Ray Tune run of fixed seeds. Tune's bookkeeping grows with the trials of one run (it
rewrites its experiment state after checkpoints and keeps every trial in memory), so a large
sweep runs as consecutive Tune runs of at most this many cells, seed-major as always: the
driver's per-trial overhead and memory stay flat (bench/scale.py, bench/RESULTS.md)."""


@dataclass(frozen=True)
class TuneRun:
    """One Ray Tune run of a sweep: its name, the cells it may run, and the searcher that
    suggests them (None: all of them, as a grid)."""

    name: str
    cells: list[Any]
    searcher: Any = None


class SeedPolicy(Protocol):
    """What the driver asks of a sweep's seeds."""

    at_most: bool
    """Whether the sweep's cell count is a worst case (the progress line says "at most")."""

    def needed(self) -> list[Any]:
        """The cells this invocation would run now (empty: nothing to do)."""

    def nothing_to_do(self) -> str:
        """Why nothing runs, when ``needed`` is empty."""

    def tune_runs(self, name: str, callback: MLflowSweepCallback) -> Iterator[TuneRun]:
        """The Tune runs that run the needed cells, one after the other."""

    def cells_left(self) -> tuple[int, int] | None:
        """(cells needed now, cells if every open question ran to the cap) for the console's
        time-left estimate; None: every pending cell runs."""

    def hypotheses_open(self) -> tuple[int, int] | None:
        """(hypotheses still open, hypotheses) for the console's status line; None: no
        hypotheses decide this sweep's seeds."""

    def plan_lines(self) -> list[str]:
        """What ``--dry-run`` says of the policy beyond the cells."""

    def parent_params(self) -> dict[str, str]:
        """What the parent run records of the policy."""

    def finish(self, tracker: Tracker, parent_id: str) -> list[dict[str, Any]] | None:
        """What is written to the parent run at the end (an adaptive sweep's decisions)."""

    def closing_lines(
        self, decisions: list[dict[str, Any]] | None, ran: int, cells: int
    ) -> list[str]:
        """What the console says of the policy after a sweep that has ``ran`` of its ``cells``
        trials (``decisions``: what ``finish`` returned)."""


class FixedSeedPolicy:
    """Every cell of every listed seed."""

    at_most = False

    def __init__(self, spec: AnySweep, todo: Plan) -> None:
        self.spec, self.todo = spec, todo

    def needed(self) -> list[Any]:
        return self.todo.pending

    def nothing_to_do(self) -> str:
        return f"all {len(self.todo.cells)} cells already have a FINISHED run"

    def tune_runs(self, name: str, callback: MLflowSweepCallback) -> Iterator[TuneRun]:
        pending = self.todo.pending
        parts = [pending[i : i + TUNE_RUN_CELLS] for i in range(0, len(pending), TUNE_RUN_CELLS)]
        for number, part in enumerate(parts, start=1):
            yield TuneRun(name if len(parts) == 1 else f"{name}-part{number}", part)

    def plan_lines(self) -> list[str]:
        return []

    def cells_left(self) -> tuple[int, int] | None:
        return None

    def hypotheses_open(self) -> tuple[int, int] | None:
        return None

    def parent_params(self) -> dict[str, str]:
        return {}

    def finish(self, tracker: Tracker, parent_id: str) -> list[dict[str, Any]] | None:
        return None

    def closing_lines(
        self, decisions: list[dict[str, Any]] | None, ran: int, cells: int
    ) -> list[str]:
        return []


class AdaptiveSeedPolicy:
    """The seeds each comparison's evidence needs, decided by the sweep's decision rule."""

    at_most = True

    def __init__(self, spec: AnySweep, todo: Plan) -> None:
        assert spec.adaptive is not None, "an adaptive policy for a sweep with fixed seeds"
        self.spec, self.todo, self.rule = spec, todo, spec.adaptive
        self.schedule = SeedSchedule(
            todo.cells,
            spec.baseline_label,
            spec.adaptive,
            finished_results(todo.cells, todo.existing),
            regimes=spec.regimes,
            regime_key=spec.regime_key,
        )

    def needed(self) -> list[Any]:
        return self.schedule.needed()

    def nothing_to_do(self) -> str:
        return "every comparison is decided or at its cap"

    def tune_runs(self, name: str, callback: MLflowSweepCallback) -> Iterator[TuneRun]:
        # lazy: the searcher imports ray.tune (~1.7 s); kept out of --dry-run and --help
        from fusion_ray.policy.searcher import AdaptiveSeedSearcher

        schedule = self.schedule
        cells = [c for c in self.todo.cells if c.cell_id not in schedule.results]
        on_change = live_decisions(callback)
        searcher = AdaptiveSeedSearcher(schedule, on_change)
        callback.on_lost = searcher.lost  # a lost process or node is not a failure of the cell
        on_change(schedule)  # what the finished runs already say
        yield TuneRun(name, cells, searcher)

    def hypotheses_open(self) -> tuple[int, int]:
        states = self.schedule.states()
        still = sum(
            1 for h in self.schedule.family if not states[h.name] or states[h.name][-1] == "open"
        )
        return still, len(self.schedule.family)

    def cells_left(self) -> tuple[int, int]:
        schedule = self.schedule
        now = {c.cell_id for c in schedule.needed()}
        worst = set(now)
        values, states = schedule.deltas(), schedule.states()
        for h in schedule.family:
            if states[h.name] and states[h.name][-1] != "open":
                continue
            for seed in range(len(values[h.name]), schedule.rule.max):
                for arm in h.arms:
                    cell = schedule.by_key.get((arm, seed))
                    if cell is not None and cell.cell_id not in schedule.results:
                        worst.add(cell.cell_id)
        return len(now), len(worst)

    def plan_lines(self) -> list[str]:
        rule, schedule = self.rule, self.schedule
        first = len(schedule.first_wave())
        kinds = Counter(h.kind for h in schedule.family)
        family = ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k])
        return [
            f"  adaptive seeds: first wave seeds 0-{rule.first - 1} ({first} cells), then the next "
            f"seed of each undecided hypothesis up to {rule.max} seeds; "
            f"{len(schedule.family)} hypotheses ({family}; vs {schedule.baseline}), alpha "
            f"{rule.alpha} for every decision (rule {rule.decision_rule().describe()})"
            + (f", equivalence margin +-{rule.margin} points" if rule.margin else ""),
            f"  worst case {schedule.worst_case()} cells (every hypothesis undecided to seed "
            f"{rule.max - 1}); {len(schedule.needed())} needed now given the finished ones",
        ]

    def parent_params(self) -> dict[str, str]:
        """The rule, and the order of the regimes and levels the contrasts follow, so the report
        rebuilds the same family."""
        schedule = self.schedule
        record = json.loads(self.rule.model_dump_json(exclude={"adaptive"}))
        record |= {"regimes": schedule.regimes, "levels": schedule.levels}
        if schedule.regime_key != REGIME_KEY:  # a trainable's trend axis
            record["regime_key"] = schedule.regime_key
        return {ADAPTIVE_TAG: json.dumps(record, separators=(",", ":"))}

    def finish(self, tracker: Tracker, parent_id: str) -> list[dict[str, Any]]:
        """The decisions, recomputed from the runs in the tracking store (as a restarted driver
        would), logged to the parent run: decisions.csv, and every hypothesis's last look as
        its final metrics."""
        again = AdaptiveSeedPolicy(self.spec, plan(self.spec, tracker))
        rows, evidence = decision_table(again.schedule, with_evidence=True)
        tracker.log_decisions(parent_id, rows)
        family, alpha = [h.name for h in again.schedule.family], again.schedule.rule.alpha
        last = {n: looks[-1:] for n, looks in evidence.items()}
        tracker.log_decision_looks(parent_id, last, family, alpha)
        return rows

    def closing_lines(
        self, decisions: list[dict[str, Any]] | None, ran: int, cells: int
    ) -> list[str]:
        rows = decisions
        if rows is None:
            return []
        return [
            f"\ndecisions (anytime-valid over the {len(rows)} hypotheses, one closed test):",
            decisions_text(rows, self.rule.alpha),
            f"adaptive seeds: {ran} trials of the {cells} this grid has at the cap of "
            f"{self.rule.max} fixed seeds ({ran / max(cells, 1):.0%}); trial time in the report",
        ]


def decision_table(schedule: SeedSchedule, with_evidence: bool = False) -> Any:
    """The rows of every hypothesis of ``schedule`` (``decision_rows``), as every surface
    shows them; with ``with_evidence`` also the evidence they came from."""
    rule = schedule.rule
    values = schedule.deltas()
    evidence = schedule.evidence(with_sequences=True)
    seeds = {n: len(r) for n, r in values.items()}
    failed = failed_runs_by_operator(schedule.family, schedule.accuracy, seeds)
    rows = decision_rows(
        evidence,
        rule.decision_rule(),
        rule.margin,
        values=values,
        kinds=schedule.kinds,
        failed=failed,
        alpha=rule.alpha,
        first=rule.first,
    )
    return (rows, evidence) if with_evidence else rows


def policy_for(spec: AnySweep, todo: Plan) -> SeedPolicy:
    """The sweep's seed policy over the cells ``todo`` plans."""
    return (
        AdaptiveSeedPolicy(spec, todo) if spec.adaptive is not None else FixedSeedPolicy(spec, todo)
    )


def live_decisions(callback: MLflowSweepCallback) -> Callable[[SeedSchedule], None]:
    """After each result: every hypothesis's looks not logged yet, and its last look again
    where the family's later looks changed it, as metrics of the parent run (step = its seeds
    so far), so the MLflow UI charts the decisions as they form and each one's last point is
    its state now. Each change of a verdict is also said on the console, in the words of the
    final table. Stops writing once the lease is lost (another driver owns the sweep)."""
    logged: dict[str, tuple[int, Any]] = {}

    def log_looks(schedule: SeedSchedule) -> None:
        if callback.lease is not None and callback.lease.lost.is_set():
            return
        evidence = schedule.evidence()
        new: dict[str, list[Any]] = {}
        for name, looks in evidence.items():
            count, last = logged.get(name, (0, None))
            fresh = looks[count:]
            if not fresh and looks and looks[-1] != last:
                fresh = looks[-1:]  # the same seed, a later look of the family
            if fresh:
                new[name] = fresh
        if not new:
            return
        for name, looks in new.items():
            before = logged.get(name, (0, None))[1]
            if looks[-1].state != (before.state if before is not None else "open"):
                h = schedule.by_name[name]
                log.info(
                    "decision: %s %s after %d seeds (p family %.3g)",
                    name, h.verdict(looks[-1].state), looks[-1].seed + 1, looks[-1].p_family,
                )  # fmt: skip
        try:
            family = [h.name for h in schedule.family]
            callback.tracker.log_decision_looks(
                callback.parent_id, new, family, schedule.rule.alpha
            )
        except Exception as exc:  # noqa: BLE001 - a chart is not worth the sweep; said, not raised
            log.warning("could not log the decisions' evidence to the parent run: %s", redact(exc))
            return
        logged.update({name: (len(looks), looks[-1]) for name, looks in evidence.items() if looks})

    return log_looks
