"""Anytime-valid decisions on paired per-seed deltas: how adaptive seeds decide each comparison.

A pure function of the deltas in seed order (no Ray, no MLflow), so a restarted driver that
reads the finished runs back recomputes the same states.

The evidence. For one comparison (an operator against the baseline), the paired delta of seed
t is D_t (accuracy points). Under the null of no effect the median of D is 0 and the sign of
each non-zero D_t is a fair coin given the past; the sign e-process with the
Krichevsky-Trofimov mixture over the win probability,

    E_n = 2^n B(w + 1/2, n - w + 1/2) / B(1/2, 1/2)     (w wins among n non-zero deltas),

is a test martingale under that null, so by Ville's inequality P(sup_n E_n >= 1/a) <= a
whatever the stopping rule; the anytime p-value is min(1, 1 / running max of E). Zeros and
missing pairs are skipped (a tie carries no sign). It is scale-free and needs only the sign,
so it stays valid for heavy-tailed and tie-heavy (integer count) deltas. Bets that also weigh
magnitudes (Vovk & Wang, "Nonparametric e-tests of symmetry", arXiv:2208.08925) can add power
under a symmetry null, at the price of that null; this module keeps the sign bet, whose null
(median 0) is the weaker assumption (bench/adaptive.py measures what it costs).

The family. Holm's step-down on the anytime p-values at every look controls the family-wise
error at all times at once, under any dependence between comparisons (they share each seed's
baseline run); Holm is monotone and the anytime p-values only fall, so a rejection never
un-happens. (e-BH or averaged e-processes do not keep that control: Tavyrikov, Goeman & de
Heide, arXiv:2501.19360.) A rejected comparison is "better" or "worse" by its wins and losses.

The effect. A confidence sequence for the median delta inverts the same e-process over shifts
mu: mu stays in while E_s(signs of D - mu) < m / a at every look s so far (Bonferroni over the
m comparisons: each sequence covers with probability at least 1 - a/m at all times, all of
them at least 1 - a). It only shrinks. "equivalent": a margin is given and the sequence lies
inside (-margin, +margin).

Futility. With ``max_seeds``, a comparison is "futile" when even winning every remaining seed
could not lift its e-process to 1 / a (the loosest Holm threshold), and equivalence is out of
reach (no margin, or the sequence already lies wholly outside (-margin, +margin)). Futility
only stops a comparison that could no longer be rejected, so it cannot raise the error rate.

States, one per seed of each comparison: "open", "better", "worse", "equivalent", "futile".
A comparison's state at its seed j is the family's decision at look j (every comparison's
first j + 1 seeds, or all it has); its last state is the decision with everything known. A
rejection outranks equivalence (both can hold: a small real effect); decided states persist.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from scipy.special import betaln

STATES = ("open", "better", "worse", "equivalent", "futile")
DECIDED = ("better", "worse", "equivalent", "futile")


@cache
def log_e(wins: int, n: int) -> float:
    """log of the KT sign e-value after ``wins`` wins among ``n`` non-zero deltas."""
    if n == 0:
        return 0.0
    return n * math.log(2.0) + betaln(wins + 0.5, n - wins + 0.5) - betaln(0.5, 0.5)


def sign_e_values(deltas: Sequence[float | None], shift: float = 0.0) -> list[float]:
    """E after each seed of ``deltas - shift`` (a zero or a missing pair leaves E as it was)."""
    wins = n = 0
    out = []
    for d in deltas:
        if d is not None and d != shift:
            n += 1
            wins += d > shift
        out.append(math.exp(log_e(wins, n)))
    return out


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
    e_max: float
    """The running maximum of the e-process (the anytime p-value is its inverse)."""
    p_anytime: float
    p_holm: float
    """The Holm-adjusted anytime p-value at the look this state comes from."""
    cs_low: float
    cs_high: float
    """The confidence sequence for the median delta (open interval; infinite when unbounded)."""
    state: str


def _check(deltas: Mapping[str, Sequence[float | None]], alpha: float, margin, max_seeds) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {alpha}); e.g. 0.05")
    if margin is not None and not margin > 0:
        raise ValueError(
            f"margin must be a positive number of accuracy points or None (got {margin})"
        )
    for name, row in deltas.items():
        if max_seeds is not None and len(row) > max_seeds:
            raise ValueError(
                f"comparison {name!r} has {len(row)} seeds, more than max_seeds {max_seeds}"
            )
        if any(d is not None and not math.isfinite(d) for d in row):
            raise ValueError(f"comparison {name!r}: deltas must be finite numbers or None")


def _holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _running(row: Sequence[float | None]) -> list[tuple[int, int, int, float, float]]:
    """Per seed: (pairs, wins, losses, e, running max of e)."""
    out, n_used, wins, losses, e_max = [], 0, 0, 0, 1.0
    for d in row:
        if d is not None:
            n_used += 1
            wins += d > 0
            losses += d < 0
        e = math.exp(log_e(wins, wins + losses))
        e_max = max(e_max, e)
        out.append((n_used, wins, losses, e, e_max))
    return out


def confidence_sequence(row: Sequence[float | None], level: float) -> tuple[float, float]:
    """The running-intersection confidence sequence for the median of ``row`` at e-threshold
    1 / ``level``, as an open interval (lo, hi) whose ends are the nearest excluded values."""
    values = sorted({d for d in row if d is not None})
    if not values:
        return -math.inf, math.inf
    candidates = [values[0] - 1.0, *values, values[-1] + 1.0]
    candidates += [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    threshold = math.log(1.0 / level)
    kept = [
        mu
        for mu in sorted(candidates)
        if max(math.log(e) for e in sign_e_values(row, mu)) < threshold
    ]
    if not kept:
        return math.nan, math.nan
    below = [c for c in candidates if c < kept[0]]
    above = [c for c in candidates if c > kept[-1]]
    return (max(below) if below else -math.inf), (min(above) if above else math.inf)


def _best_future_e(wins: int, losses: int, remaining: int) -> float:
    """The largest e-value reachable if every remaining seed went the majority's way."""
    n = wins + losses + remaining
    return math.exp(max(log_e(wins + remaining, n), log_e(wins, n)))


def _state(
    rejected: bool,
    wins: int,
    losses: int,
    e_max: float,
    cs: tuple[float, float] | None,
    rule: tuple[float, float | None, int | None],
    seed: int,
) -> str:
    alpha, margin, max_seeds = rule
    if rejected:
        return "better" if wins > losses else "worse"
    if margin is not None and cs is not None and -margin <= cs[0] and cs[1] <= margin:
        return "equivalent"
    if max_seeds is None:
        return "open"
    remaining = max_seeds - (seed + 1)
    reachable = max(e_max, _best_future_e(wins, losses, remaining)) >= 1.0 / alpha
    outside = margin is None or (cs is not None and (cs[0] >= margin or cs[1] <= -margin))
    return "futile" if remaining > 0 and not reachable and outside else "open"


def family_evidence(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
    with_sequences: bool = True,
) -> dict[str, list[Look]]:
    """Every comparison's evidence and state after each of its seeds (see the module notes).
    ``with_sequences=False`` skips the confidence sequences when no margin needs them."""
    _check(deltas, alpha, margin, max_seeds)
    names = list(deltas)
    m = max(1, len(names))
    runs = {name: _running(deltas[name]) for name in names}
    longest = max((len(r) for r in runs.values()), default=0)
    adjusted = []  # per look: Holm-adjusted p of every comparison
    for look in range(longest):
        p = [1.0 / runs[n][min(look, len(runs[n]) - 1)][4] if runs[n] else 1.0 for n in names]
        adjusted.append(_holm(p))
    need_cs = with_sequences or margin is not None
    rule = (alpha, margin, max_seeds)
    out: dict[str, list[Look]] = {}
    for i, name in enumerate(names):
        looks, decided = [], None
        for seed, (n_used, wins, losses, e, e_max) in enumerate(runs[name]):
            look = longest - 1 if seed == len(runs[name]) - 1 else seed
            p_holm = adjusted[look][i]
            cs = confidence_sequence(deltas[name][: seed + 1], alpha / m) if need_cs else None
            state = _state(p_holm <= alpha, wins, losses, e_max, cs, rule, seed)
            if decided in ("better", "worse") or (decided and state in ("open", "futile")):
                state = decided  # decided states persist; a rejection may follow equivalence
            decided = state if state != "open" else decided
            low, high = cs if cs is not None else (math.nan, math.nan)
            looks.append(
                Look(
                    seed,
                    n_used,
                    wins,
                    losses,
                    e,
                    e_max,
                    min(1.0, 1.0 / e_max),
                    p_holm,
                    low,
                    high,
                    state,
                )
            )
        out[name] = looks
    return out


def run_family(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
) -> dict[str, list[str]]:
    """Each comparison's state after each of its seeds: one of "open", "better", "worse",
    "equivalent", "futile". ``deltas`` maps each comparison's name to its per-seed paired
    deltas in seed order (accuracy points, None where a pair is missing); ``max_seeds`` is the
    cap (a comparison still undecided there stays "open")."""
    evidence = family_evidence(
        deltas, alpha=alpha, margin=margin, max_seeds=max_seeds, with_sequences=False
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


def decision_rows(evidence: Mapping[str, list[Look]]) -> list[dict[str, object]]:
    """One row per comparison (the names of ``fusion_ray.schema.DECISION_COLUMNS``): its state,
    seeds used, the seed it was decided at, its last e-value and running maximum, anytime p
    (raw and Holm-adjusted) and confidence sequence."""
    rows = []
    for decision in decisions(evidence):
        last = decision.last
        rows.append(
            {
                "comparison": decision.name,
                "state": decision.state,
                "seeds_used": decision.seeds_used,
                "decided_at_seed": decision.decided_at,
                "e_value": last.e_value if last else 1.0,
                "e_max": last.e_max if last else 1.0,
                "p_anytime": last.p_anytime if last else 1.0,
                "p_holm_anytime": last.p_holm if last else 1.0,
                "cs_low": last.cs_low if last else -math.inf,
                "cs_high": last.cs_high if last else math.inf,
            }
        )
    return rows


def decisions_text(rows: Sequence[Mapping[str, object]]) -> str:
    """The decisions as a console table."""
    width = max([len(str(r["comparison"])) for r in rows] + [10])
    lines = [
        f"{'comparison':<{width}}  {'state':<10} {'seeds':>5} {'decided':>7} {'e':>9} "
        f"{'p anytime':>9} {'p Holm':>8}  effect CS (points)"
    ]
    for r in rows:
        decided = "-" if r["decided_at_seed"] is None else str(r["decided_at_seed"])
        lines.append(
            f"{r['comparison']:<{width}}  {r['state']:<10} {r['seeds_used']:>5} {decided:>7} "
            f"{r['e_max']:>9.3g} {r['p_anytime']:>9.3g} {r['p_holm_anytime']:>8.3g}  "
            f"({r['cs_low']:+.2f}, {r['cs_high']:+.2f})"
        )
    return "\n".join(lines)


def replay_adaptive(
    deltas: Mapping[str, Sequence[float | None]],
    *,
    first: int,
    alpha: float = 0.05,
    margin: float | None = None,
    max_seeds: int | None = None,
) -> dict[str, list[str]]:
    """What adaptive seeds would have run on deltas logged for a fixed list of seeds: every
    comparison gets its first ``first`` seeds, then one more seed at a time while it is open
    (up to ``max_seeds`` or the seeds logged). Returns each comparison's states over the seeds
    it would have used (its length is the seeds used), as the driver's schedule computes them."""
    cap = max_seeds if max_seeds is not None else max(map(len, deltas.values()), default=0)
    used = {name: min(first, len(row), cap) for name, row in deltas.items()}
    while True:
        states = run_family(
            {name: deltas[name][: used[name]] for name in deltas},
            alpha=alpha,
            margin=margin,
            max_seeds=max_seeds,
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
