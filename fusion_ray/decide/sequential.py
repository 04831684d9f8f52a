"""Anytime-valid decisions for a family of paired comparisons: how adaptive seeds decide.

A pure function of the deltas in seed order (no Ray, no MLflow), so a restarted driver that reads
the finished runs back recomputes the same states. A decision rule (``fusion_ray.decide.rules``, a
registry) turns each comparison's deltas into e-processes; this module combines them.

The default rule, ``magnitude``, decides by **closed testing with the mean of current e-values**.
Each comparison i has two hypotheses: H_i "no effect" (deltas symmetric about 0), with the
two-sided e-value E_i = (P_i + N_i) / 2, and, with a margin M, K_i "|effect| >= M", with
Q_i = min(L_i, U_i). H_i and K_i cannot both be true, so an intersection of true hypotheses holds
at most one per comparison, and its local test is the mean of their current e-values against
1 / alpha. Closing over those intersections: reject X_i (H_i or K_i) at a look when, for every
r = 0 .. m-1,

    e(X_i) + (sum of the r smallest of min(E_j, Q_j), j != i) >= (r + 1) / alpha.

The mean of current e-values of true hypotheses is a nonnegative supermartingale over seeds
(seeds are independent; a stopped comparison keeps its last value), so by Ville's inequality the
chance that any true hypothesis is ever rejected is at most alpha: one budget for every "better",
"worse" and "equivalent" the user reads, at every look, whatever the stopping. Rejections are
permanent. The family-adjusted anytime p-value of X_i is the smallest alpha at which it has been
rejected. A rejected H_i is "better" when P_i > N_i at that look, else "worse".

The ``sign`` rule keeps the earlier procedure: Holm's step-down on anytime p-values (1 / running
maximum of its e-process) and, with a margin, equivalence when its confidence sequence (at
alpha / m) lies inside the margin: a separate budget, so a mixed family can reach 2 alpha.

Confidence sequences: each rule inverts its own evidence over shifts of the deltas at alpha / m
(Bonferroni over the family, so all of them cover at once with probability 1 - alpha). For the
magnitude rule, zero leaves the sequence only when E_i >= m / alpha, which the closure rejects
as well: an undecided comparison's sequence always holds 0.

Futility (non-binding, so it cannot raise the error): with a cap, a comparison is "futile" when it
cannot be rejected in its remaining seeds (each seed at most doubles an e-value) or, after 8
seeds, its e-value is below 0.3; with a margin the same must hold for its equivalence e-value.

States, one per seed of each comparison: "open", "better", "worse", "equivalent", "futile". A
comparison's state at its seed j is the family's decision at look j (every comparison's first
j + 1 seeds, or all it has); its last state is the decision with everything known. A rejection
outranks equivalence (both can hold: a small real effect); decided states persist.

Why one module of this size: the closure, futility, equivalence and the confidence sequences
together make the one guarantee stated above; apart, a change to one could break it unseen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusion_ray.decide.questions import VERDICTS
from fusion_ray.decide.rules import (
    DEFAULT_RULE,
    DecisionRule,
    Evidence,
    build_rule,
    log_e,
    sign_confidence_sequence,
    sign_e_values,
)

STATES = ("open", "better", "worse", "equivalent", "futile")
DECIDED = ("better", "worse", "equivalent", "futile")
FIRST_WAVE = 6
"""Seeds every comparison has before the magnitude rule decides, unless the sweep says otherwise."""
FUTILE_AFTER, FUTILE_BELOW = 8, 0.3
FUTILITY: dict[str, tuple[int, float] | None] = {
    "operator": (FUTILE_AFTER, FUTILE_BELOW),
    "length": None,
    "interaction": None,
}
"""Per kind of hypothesis (``fusion_ray.decide.questions``): the heuristic futility stop (after
that many seeds, an e-value below that), or None for the exact stop alone (no remaining seed could
reach 1 / alpha). A contrast of two deltas has about twice a delta's variance, so its e-value
grows more slowly; bench/adaptive.py measures what each setting loses."""

__all__ = [
    "STATES",
    "Decision",
    "Look",
    "confidence_sequence",
    "decision_rows",
    "decisions",
    "decisions_footnotes",
    "decisions_text",
    "fewest_seeds",
    "family_evidence",
    "log_e",
    "replay_adaptive",
    "run_family",
    "sign_e_values",
]

confidence_sequence = sign_confidence_sequence
"""The sign rule's confidence sequence for the median (kept under its earlier name)."""


@dataclass(frozen=True)
class Look:
    """One comparison after one of its seeds."""

    seed: int
    """The seed's index in the comparison's list (seeds run 0, 1, 2, ...)."""
    n_used: int
    """Pairs so far (missing ones left out); zeros count here but carry no sign."""
    wins: int
    losses: int
    e_value: float
    """The two-sided e-value for "no effect" at this seed."""
    e_max: float
    """Its running maximum (the unadjusted anytime p-value is the inverse)."""
    e_equivalent: float
    """The e-value for "|effect| >= margin" (nan without a margin, and for the sign rule)."""
    p_anytime: float
    p_family: float
    """The family-adjusted anytime p-value of "no effect" at the look this state comes from
    (closed testing, or Holm for the sign rule)."""
    cs_low: float
    cs_high: float
    """The confidence sequence for the effect (open interval; infinite when unbounded)."""
    state: str


@dataclass(frozen=True)
class _Setting:
    alpha: float
    margin: float | None
    max_seeds: int | None
    first: int
    kinds: Mapping[str, str] | None = None

    def late_stop(self, name: str) -> tuple[int, float] | None:
        kind = (self.kinds or {}).get(name, "operator")
        return FUTILITY.get(kind, FUTILITY["operator"])


def _check(deltas: Mapping[str, Sequence[float | None]], s: _Setting) -> None:
    if not 0 < s.alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {s.alpha}); e.g. 0.05")
    if s.margin is not None and not s.margin > 0:
        raise ValueError(
            f"margin must be a positive number of accuracy points or None (got {s.margin})"
        )
    if s.first < 1:
        raise ValueError(f"first must be at least 1 (got {s.first})")
    for name, row in deltas.items():
        if s.max_seeds is not None and len(row) > s.max_seeds:
            raise ValueError(
                f"comparison {name!r} has {len(row)} seeds, more than max_seeds {s.max_seeds}"
            )
        if any(d is not None and not math.isfinite(d) for d in row):
            raise ValueError(f"comparison {name!r}: deltas must be finite numbers or None")


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values: sorted ascending, the k-th (from 1) times m - k + 1, a
    running maximum, capped at 1, in the input's order; a NaN stays NaN (sorted last). The
    anytime family's ``holm`` and the report's fixed-n correction both use it.

    The values of statsmodels' ``multipletests(method="holm")`` (tested), computed here because
    ``multipletests`` runs a full garbage collection at every call, which in a process holding a
    report's data costs more than the rest of a family."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return p
    order = np.argsort(p, kind="stable")
    steps = np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1))
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, steps)
    return adjusted


def closure_p(own: float, others: Sequence[float]) -> float:
    """The closed test's p-value for a hypothesis with current e-value ``own`` against the
    others' (per comparison: the smaller of its e-values): 1 / the smallest mean over the
    intersections that hold it, min over r of (own + r smallest others) / (r + 1)."""
    smallest, total, worst = sorted(others), own, own
    for r, e in enumerate(smallest, start=1):
        total += e
        worst = min(worst, total / (r + 1))
    return min(1.0, 1.0 / worst) if worst > 0 else 1.0


def _at(values: Sequence[float], look: int) -> float:
    return values[min(look, len(values) - 1)] if values else 1.0


class _Family:
    """The comparisons' evidence and the family's decisions at every look."""

    def __init__(
        self, deltas: Mapping[str, Sequence[float | None]], rule: DecisionRule, s: _Setting
    ):
        self.deltas, self.rule, self.s = deltas, rule, s
        self.names = list(deltas)
        self.m = max(1, len(self.names))
        self.evidence: dict[str, Evidence] = {
            n: rule.evidence(deltas[n], first=s.first, margin=s.margin) for n in self.names
        }
        self.longest = max((len(r) for r in deltas.values()), default=0)

    def e_two_sided(self, name: str, look: int) -> float:
        ev = self.evidence[name]
        return ev.two_sided(min(look, len(ev.better) - 1)) if ev.better else 1.0

    def e_equivalent(self, name: str, look: int) -> float:
        ev = self.evidence[name]
        return ev.equivalent(min(look, len(ev.better) - 1)) if ev.better else math.nan

    def family_p(self, stopped: Callable[[str, int, tuple[float, float]], bool]) -> list[Any]:
        """Per look: each comparison's adjusted anytime p of (no effect, |effect| >= margin),
        running minima over the looks (rejections are permanent).

        A row shorter than the look either stopped there (``stopped(name, its last seed, its p
        there)``: decided, futile, at the cap), and keeps its last value, or is still running and
        its next result has not arrived (a sweep in progress). Such a lagging comparison counts
        as 0 in the others' closed tests (its value to come is at least 0, and the test only
        rejects more as the others' values grow): a decision taken now stays taken when the
        missing result arrives. Holm on running maxima is monotone the same way."""
        out, best = [], {n: (1.0, 1.0) for n in self.names}
        e_maxes = {n: 1.0 for n in self.names}
        done: set[str] = set()
        for look in range(self.longest):
            lagging = {n for n in self.names if n not in done and len(self.deltas[n]) <= look}
            started = look + 1 >= self.s.first
            if self.rule.family == "holm":
                for n in self.names:
                    e_maxes[n] = max(e_maxes[n], self.e_two_sided(n, look))
                p = holm([1.0 / e_maxes[n] for n in self.names])
                now = {n: (float(p[i]), 1.0) for i, n in enumerate(self.names)}
            elif started:
                now = self._closure(look, lagging)
            else:
                now = {n: (1.0, 1.0) for n in self.names}
            best = {n: (min(best[n][0], now[n][0]), min(best[n][1], now[n][1])) for n in self.names}
            out.append(dict(best))
            ending = [n for n in self.names if n not in done and len(self.deltas[n]) == look + 1]
            done |= {n for n in ending if stopped(n, look, best[n])}
        return out

    def _closure(self, look: int, lagging: set[str]) -> dict[str, tuple[float, float]]:
        e = {n: self.e_two_sided(n, look) for n in self.names}
        q = {n: self.e_equivalent(n, look) for n in self.names}
        floor = {n: e[n] if math.isnan(q[n]) else min(e[n], q[n]) for n in self.names}
        floor.update(dict.fromkeys(lagging, 0.0))
        now = {}
        for n in self.names:
            if n in lagging:
                now[n] = (1.0, 1.0)  # no value of its own at this look
                continue
            others = [floor[o] for o in self.names if o != n]
            p_q = 1.0 if math.isnan(q[n]) else closure_p(q[n], others)
            now[n] = (closure_p(e[n], others), p_q)
        return now


def _direction(family: _Family, name: str, look: int, ev: Evidence) -> str:
    """better / worse by which one-sided e-value leads (ties: by wins and losses)."""
    up, down = _at(ev.better, look), _at(ev.worse, look)
    if up != down:
        return "better" if up > down else "worse"
    row = [d for d in family.deltas[name][: look + 1] if d is not None]
    return "better" if sum(d > 0 for d in row) >= sum(d < 0 for d in row) else "worse"


def _futile(family: _Family, name: str, seed: int, p_cs: tuple[float, float] | None) -> bool:
    """No remaining seed could decide it (see the module notes)."""
    s = family.s
    if s.max_seeds is None:
        return False
    remaining = s.max_seeds - (seed + 1)
    if remaining <= 0:
        return False
    if family.rule.family == "holm":
        return _sign_futile(family, name, seed, remaining, p_cs)
    if seed + 1 < s.first:
        return False

    heuristic = s.late_stop(name)

    def hopeless(e: float) -> bool:
        late = heuristic is not None and seed + 1 >= heuristic[0] and e < heuristic[1]
        return e * 2.0**remaining < 1.0 / s.alpha or late

    e = family.e_two_sided(name, seed)
    q = family.e_equivalent(name, seed)
    return hopeless(e) and (s.margin is None or hopeless(q))


def _sign_futile(family: _Family, name: str, seed: int, remaining: int, cs) -> bool:
    row = [d for d in family.deltas[name][: seed + 1] if d is not None]
    wins, losses = sum(d > 0 for d in row), sum(d < 0 for d in row)
    n = wins + losses + remaining
    best = math.exp(max(log_e(wins + remaining, n), log_e(wins, n), log_e(losses + remaining, n)))
    e_max = max(sign_e_values(family.deltas[name][: seed + 1]))
    reachable = max(e_max, best) >= 1.0 / family.s.alpha
    margin = family.s.margin
    outside = margin is None or (cs is not None and (cs[0] >= margin or cs[1] <= -margin))
    return not reachable and outside


def family_evidence(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
    first: int = FIRST_WAVE,
    rule: str | DecisionRule = DEFAULT_RULE,
    with_sequences: bool = True,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, list[Look]]:
    """Every comparison's evidence and state after each of its seeds (see the module notes).
    ``with_sequences=False`` skips the confidence sequences where no decision needs them;
    ``kinds`` maps a hypothesis to its kind (``fusion_ray.decide.questions``; default
    ``operator``), which sets its futility stop (``FUTILITY``)."""
    s = _Setting(alpha, margin, max_seeds, first, kinds)
    _check(deltas, s)
    the_rule = build_rule(rule)
    family = _Family(deltas, the_rule, s)
    level = alpha / family.m
    need_cs = with_sequences or (margin is not None and the_rule.family == "holm")

    def interval(name: str, seed: int) -> tuple[float, float] | None:
        row = deltas[name][: seed + 1]
        return the_rule.interval(row, level=level, first=first) if need_cs else None

    def stopped(name: str, seed: int, p: tuple[float, float]) -> bool:
        if max_seeds is not None and seed + 1 >= max_seeds:
            return True
        ev = family.evidence[name]
        return _state(family, name, seed, seed, ev, p, interval(name, seed)) != "open"

    adjusted = family.family_p(stopped)
    out: dict[str, list[Look]] = {}
    for name in family.names:
        row, ev = deltas[name], family.evidence[name]
        looks: list[Look] = []
        decided: str | None = None
        wins = losses = n_used = 0
        e_max = 1.0
        for seed, d in enumerate(row):
            if d is not None:
                n_used += 1
                wins += d > 0
                losses += d < 0
            # the family's decision at this seed's look; at the last seed, with everything known
            look = family.longest - 1 if seed == len(row) - 1 else seed
            p_h, p_k = adjusted[look][name]
            e_now = ev.two_sided(seed)
            e_max = max(e_max, e_now) if seed + 1 >= first or the_rule.family == "holm" else e_max
            cs = interval(name, seed)
            state = _state(family, name, seed, look, ev, (p_h, p_k), cs)
            if decided in ("better", "worse") or (decided and state in ("open", "futile")):
                state = decided  # decided states persist; a rejection may follow equivalence
            decided = state if state != "open" else decided
            low, high = cs if cs is not None else (math.nan, math.nan)
            looks.append(
                Look(
                    seed, n_used, wins, losses, e_now, e_max, ev.equivalent(seed),
                    min(1.0, 1.0 / e_max), p_h, low, high, state,
                )
            )  # fmt: skip
        out[name] = looks
    return out


def _state(family: _Family, name: str, seed: int, look: int, ev: Evidence, p, cs) -> str:
    s = family.s
    p_h, p_k = p
    if p_h <= s.alpha:
        return _direction(family, name, look, ev)
    if family.rule.family == "holm":
        margin = s.margin
        if margin is not None and cs is not None and -margin <= cs[0] and cs[1] <= margin:
            return "equivalent"
    elif p_k <= s.alpha:
        return "equivalent"
    return "futile" if _futile(family, name, seed, cs) else "open"


def run_family(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
    first: int = FIRST_WAVE,
    rule: str | DecisionRule = DEFAULT_RULE,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """Each comparison's state after each of its seeds: one of "open", "better", "worse",
    "equivalent", "futile". ``deltas`` maps each comparison's name to its per-seed paired
    deltas in seed order (accuracy points, None where a pair is missing); ``max_seeds`` is the
    cap (a comparison still undecided there stays "open"); ``first`` the first wave; ``rule`` a
    registered decision rule's name (``fusion_ray.decide.rules.RULES``) or an instance."""
    evidence = family_evidence(
        deltas,
        alpha=alpha,
        margin=margin,
        max_seeds=max_seeds,
        first=first,
        rule=rule,
        with_sequences=False,
        kinds=kinds,
    )
    return {name: [look.state for look in looks] for name, looks in evidence.items()}


@dataclass(frozen=True)
class Decision:
    """Where one comparison stands: its last look, and the seed its state was first reached."""

    name: str
    state: str
    seeds_used: int
    decided_at: int | None
    """The seed index at which the comparison was first decided (None while open)."""
    last: Look | None


def decisions(evidence: Mapping[str, list[Look]]) -> list[Decision]:
    """One ``Decision`` per comparison of ``family_evidence``'s result."""
    out = []
    for name, looks in evidence.items():
        last = looks[-1] if looks else None
        first = next((lk.seed for lk in looks if lk.state != "open"), None)
        state = last.state if last else "open"
        out.append(Decision(name, state, len(looks), first, last))
    return out


def _estimates(row: Sequence[float | None]) -> tuple[float, float, float]:
    """Mean, median and Hodges-Lehmann estimate (median of the Walsh averages) of a row."""
    x = np.array([d for d in row if d is not None], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    walsh = (x[:, None] + x[None, :])[np.triu_indices(x.size)] / 2
    return float(x.mean()), float(np.median(x)), float(np.median(walsh))


def _sign(x: float) -> int:
    return 0 if math.isnan(x) or x == 0 else (1 if x > 0 else -1)


def fewest_seeds(rule: DecisionRule, m: int, alpha: float) -> int | None:
    """The fewest seeds at which the rule's interval for one hypothesis at alpha / m can be
    bounded (its e-value's real ceiling reaches m / alpha); None without a known ceiling."""
    target = math.log(m / alpha)
    for n in range(1, 200):
        if rule.max_log_e(n) >= target:
            return n
    return None


def decision_rows(
    evidence: Mapping[str, list[Look]],
    rule: str | DecisionRule = DEFAULT_RULE,
    margin: float | None = None,
    *,
    values: Mapping[str, Sequence[float | None]] | None = None,
    kinds: Mapping[str, str] | None = None,
    failed: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
    alpha: float = 0.05,
    first: int = FIRST_WAVE,
) -> list[dict[str, Any]]:
    """One row per hypothesis (the names of ``fusion_ray.schema.DECISION_COLUMNS``): its kind,
    state and verdict in its kind's words, the rule, its null and margin, seeds used, the seed
    it was decided at, its last e-values, anytime p (raw and family-adjusted), the simultaneous
    confidence sequence (alpha / m), and, for a decided hypothesis, the e-BY interval: the
    effects its last e-value does not reject at alpha * R / m, R the number decided (a false
    coverage rate of at most alpha over the decided ones, Xu, Wang & Ramdas 2022); mean, median
    and Hodges-Lehmann estimate of its values (``values``: the rows the evidence came from), its
    failed runs (``failed``: per hypothesis and operator, (failed, runs), from
    ``questions.failed_runs_by_operator``) and a note where runs failed, where the estimates
    disagree in sign or where it may over-state the effect."""
    the_rule = build_rule(rule)
    found = decisions(evidence)
    m = max(1, len(found))
    decided = [d for d in found if d.state in ("better", "worse", "equivalent")]
    level = alpha * max(1, len(decided)) / m
    rows = []
    for decision in found:
        last = decision.last
        kind = (kinds or {}).get(decision.name, "operator")
        row = (values or {}).get(decision.name)
        mean, median, hl = _estimates(row) if row is not None else (math.nan,) * 3
        ci = (math.nan, math.nan)
        if decision in decided and row is not None:
            ci = the_rule.selective_interval(row, level=level, first=first)
        by_operator = (failed or {}).get(decision.name, {})
        verdict = VERDICTS.get(kind, {}).get(decision.state, decision.state)
        notes = (
            [_failure_note(verdict, decision.state, by_operator)]
            if any(f for f, _ in by_operator.values())
            else []
        )
        signs = {_sign(v) for v in (mean, median, hl)} - {0}
        if len(signs) > 1:
            notes.append("mean, median and HL differ in sign")
        near_zero = ci[0] if mean > 0 else -ci[1]
        if decision.state in ("better", "worse") and near_zero < abs(mean) / 2:
            notes.append("may over-state the effect")
        rows.append(
            {
                "comparison": decision.name,
                "kind": kind,
                "state": decision.state,
                "verdict": verdict,
                "rule": the_rule.describe(),
                "null": the_rule.null,
                "margin": margin,
                "seeds_used": decision.seeds_used,
                "decided_at_seed": decision.decided_at,
                "e_value": last.e_value if last else 1.0,
                "e_max": last.e_max if last else 1.0,
                "e_equivalent": last.e_equivalent if last else math.nan,
                "p_anytime": last.p_anytime if last else 1.0,
                "p_family": last.p_family if last else 1.0,
                "cs_low": last.cs_low if last else -math.inf,
                "cs_high": last.cs_high if last else math.inf,
                "ci_low": ci[0],
                "ci_high": ci[1],
                "ci_level": level if decision in decided else math.nan,
                "mean": mean,
                "median": median,
                "hodges_lehmann": hl,
                "failed_runs": sum(f for f, _ in by_operator.values()),
                "failed_by_operator": "; ".join(
                    f"{fusion} {f}/{n}" for fusion, (f, n) in by_operator.items()
                ),
                "note": "; ".join(notes),
            }
        )
    return rows


def _failure_note(verdict: str, state: str, by_operator: Mapping[str, tuple[int, int]]) -> str:
    """``better with its failures counted as losses: 2 of 11 runs of gate_scalar failed``: the
    failures beside a verdict, so none is hidden in it."""
    failed = "; ".join(
        f"{f} of {n} runs of {fusion} failed" for fusion, (f, n) in by_operator.items() if f
    )
    if state in ("better", "worse"):
        return f"{verdict} with failed runs counted as losses of their arm: {failed}"
    return failed


def _interval(low: float, high: float) -> str:
    lo, hi = float(low), float(high)
    if math.isnan(lo) or math.isnan(hi):
        return "-"
    return f"({lo:+.2f}, {hi:+.2f})"


def decisions_text(rows: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> str:
    """The decisions as a console table: each hypothesis's verdict, the seeds it was decided
    after, its estimates, the e-BY interval of a decided one and the simultaneous sequence."""
    width = max([len(str(r["comparison"])) for r in rows] + [10])
    lines = [
        f"{'hypothesis':<{width}}  {'kind':<11} {'verdict':<10} {'after':>5} {'seeds':>5} "
        f"{'p family':>8} {'mean':>7} {'median':>7} {'HL':>7}  {'e-BY interval':<17} "
        f"{'simultaneous CS':<17} failed  note"
    ]
    for r in rows:
        after = "-" if r["decided_at_seed"] is None else str(int(r["decided_at_seed"]) + 1)
        lines.append(
            f"{r['comparison']:<{width}}  {r.get('kind', 'operator'):<11} "
            f"{r.get('verdict', r['state']):<10} {after:>5} {r['seeds_used']:>5} "
            f"{r['p_family']:>8.3g} {r.get('mean', math.nan):>+7.2f} "
            f"{r.get('median', math.nan):>+7.2f} {r.get('hodges_lehmann', math.nan):>+7.2f}  "
            f"{_interval(r.get('ci_low', math.nan), r.get('ci_high', math.nan)):<17} "
            f"{_interval(r['cs_low'], r['cs_high']):<17} {r.get('failed_runs', 0):>6}  "
            f"{r.get('note', '')}"
        )
    lines += decisions_footnotes(rows, alpha)
    return "\n".join(lines)


def decisions_footnotes(rows: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> list[str]:
    """What every surface says under a decisions table: the columns, the rule, its null and
    what a verdict means."""
    if not rows:
        return []
    first = rows[0]
    m = len(rows)
    rule = build_rule(str(first.get("rule", DEFAULT_RULE)).split("(")[0])
    need = fewest_seeds(rule, m, alpha)
    margin = first.get("margin")
    out = [
        "after: the seeds a verdict was reached at; seeds: the seeds it has now; failed: its "
        "runs that failed (the note says whose); a seed with a failed run counts as a loss for "
        "the arm that failed of half the root mean square of the hypothesis's values before "
        "it (a gain when the baseline's run failed, a tie when both did), which keeps its null "
        "symmetric",
        f"e-BY interval: for decided hypotheses only, at alpha * R / m (R decided of m = {m}): "
        f"the expected share of decided hypotheses whose interval misses its effect (the centre "
        f"of symmetry of its values, what the null puts at 0) is at most "
        f"alpha = {alpha:g} (false coverage rate); simultaneous CS: every hypothesis at alpha / m"
        + (
            f", unbounded before {need} seeds (far from a hypothesis's values, where the "
            f"sequence's ends lie, the rule's evidence after n seeds is at most its ceiling, "
            f"which reaches m / alpha = {m / alpha:g} at {need}; a decision's own evidence can "
            "grow faster, up to 2^(n-1))"
            if need
            else ""
        ),
        f"rule {first.get('rule')}; null: {first.get('null')}"
        + (f"; equivalence margin ±{float(margin):g} points" if margin else ""),
        "a verdict says the paired values lean to one side by their signed sizes (the typical "
        "seed), not that the mean is higher: compare mean, median and HL; the error bound holds "
        "for nulls under which a hypothesis's values are symmetric about 0 (a contrast of two "
        "deltas shaped differently, an operator diverging on one regime only, is outside it: "
        "'grows' then says the values lean up, not that the mean gain grows); 'futile' means the "
        "comparison was stopped (it could no longer be decided by the cap, or its evidence was "
        "low after 8 seeds), not that there is no effect; 'may over-state': its interval "
        "reaches below half its mean, where the benchmark measured means of decided effects "
        "over-stating small effects (1.8x at 0.5 paired SD)",
    ]
    return out


def replay_adaptive(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    first: int,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
    rule: str | DecisionRule = DEFAULT_RULE,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """What adaptive seeds would have run on deltas logged for a fixed list of seeds: every
    comparison gets its first ``first`` seeds, then one more seed at a time while it is open
    (up to ``max_seeds`` or the seeds logged). Returns each comparison's states over the seeds
    it would have used (its length is the seeds used), as the driver's schedule computes them."""
    cap = max_seeds if max_seeds is not None else max(map(len, deltas.values()), default=0)
    used = {name: min(first, len(row), cap) for name, row in deltas.items()}
    the_rule = build_rule(rule)
    while True:
        states = run_family(
            {name: deltas[name][: used[name]] for name in deltas},
            alpha=alpha,
            margin=margin,
            max_seeds=max_seeds,
            first=first,
            rule=the_rule,
            kinds=kinds,
        )
        grow = [
            name
            for name, row in states.items()
            if (not row or row[-1] == "open") and used[name] < min(cap, len(deltas[name]))
        ]
        if not grow:
            return states
        for name in grow:
            used[name] += 1
