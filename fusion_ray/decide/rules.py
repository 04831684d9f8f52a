"""Decision rules: how one comparison's paired per-seed deltas become evidence (a registry).

A comparison is one operator against the baseline; its delta at seed t is D_t (accuracy points,
None where a pair is missing). A rule turns the deltas, in seed order, into e-processes, one
value per seed:

- ``better`` (P) and ``worse`` (N): evidence that the operator is better / worse. Under the
  rule's null (no effect) each has expectation at most 1 at every seed, whatever came before,
  so ``(P + N) / 2`` is a two-sided e-process for "no effect" and, by Ville's inequality, crosses
  1 / a with probability at most a however the seeds are stopped;
- ``below_upper`` (L) and ``above_lower`` (U), only with an equivalence margin M: evidence that
  the effect is below +M and above -M; Q = min(L, U) is the e-process for "|effect| >= M";
- ``interval``: the confidence sequence for the effect that inverts the rule's evidence.

``fusion_ray.decide.sequential`` combines the comparisons of a family (closed testing or Holm, as the
rule's ``family`` says) into states. Built-ins: ``magnitude`` (the default) and ``sign``. A
package adds a rule with an entry point in the group ``fusion_ray.decision_rules`` naming a
``DecisionRule`` subclass; ``fusion-ray list`` shows every rule, and a sweep file selects one
with ``seeds: {adaptive: true, rule: NAME}``. ``fusion_ray.testing`` has the contract checks a
rule must pass (its evidence has expectation at most 1 under sign flips given the magnitudes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, ClassVar, Literal, cast

import numpy as np
from annotated_types import Gt
from scipy.special import betainc, betaln

from fusion_ray.registry import Registry

Row = Sequence[float | None]


__all__ = [
    "DEFAULT_RULE",
    "RULES",
    "DecisionRule",
    "Evidence",
    "MagnitudeRule",
    "SignRule",
    "build_rule",
    "log_e",
    "sign_confidence_sequence",
    "sign_e_values",
]


@dataclass(frozen=True)
class Evidence:
    """One comparison's e-processes, one value per seed of its row (1.0 where not yet defined)."""

    better: tuple[float, ...]
    worse: tuple[float, ...]
    below_upper: tuple[float, ...] | None = None
    """Evidence that the effect is below +margin (None without a margin)."""
    above_lower: tuple[float, ...] | None = None
    """Evidence that the effect is above -margin (None without a margin)."""

    def two_sided(self, seed: int) -> float:
        """The e-value for "no effect" at ``seed``: the mean of the two one-sided ones."""
        return (self.better[seed] + self.worse[seed]) / 2

    def equivalent(self, seed: int) -> float:
        """The e-value for "|effect| >= margin" at ``seed`` (nan without a margin)."""
        if self.below_upper is None or self.above_lower is None:
            return math.nan
        return min(self.below_upper[seed], self.above_lower[seed])


class DecisionRule:
    """One family of decision rules: subclass it, set the class attributes, implement
    ``evidence`` and ``interval``; user options are keyword-only ``__init__`` parameters."""

    name: ClassVar[str] = ""
    null: ClassVar[str] = ""
    """The null hypothesis a "better"/"worse" decision rejects, in one sentence."""
    family: ClassVar[Literal["closure", "holm"]] = "closure"
    """How the comparisons of a family are combined (``fusion_ray.decide.sequential``): "closure", closed
    testing with the mean of current e-values, or "holm", Holm's step-down on anytime p-values."""

    def evidence(self, row: Row, *, first: int, margin: float | None) -> Evidence:
        raise NotImplementedError(f"decision rule {self.name!r} defines no evidence()")

    def interval(self, row: Row, *, level: float, first: int) -> tuple[float, float]:
        """The confidence sequence for the effect after the whole row, at error ``level``
        (running intersection over the looks): an open interval, infinite ends when unbounded."""
        raise NotImplementedError(f"decision rule {self.name!r} defines no interval()")

    def selective_interval(self, row: Row, *, level: float, first: int) -> tuple[float, float]:
        """The effects not rejected by the e-value of the row's last look alone, at error
        ``level`` ({mu : E(row - mu) < 1 / level}, its hull): what e-BY reports for a decided
        hypothesis at ``level = alpha * R / m`` (``fusion_ray.decide.sequential``). The
        default: no such interval (infinite ends)."""
        return -math.inf, math.inf

    def max_log_e(self, n: int) -> float:
        """The largest log two-sided e-value of ``n`` seeds' values shifted far from the data
        (where a confidence sequence's ends lie; inf: no known ceiling): how many seeds an
        interval at a level needs before it can be bounded. Not necessarily a bound on a
        decision's e-value."""
        return math.inf

    def describe(self) -> str:
        """How the report names this rule with its options, e.g. ``magnitude(theta=1.5)``."""
        options = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        inner = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in options.items()
        )
        return f"{self.name}({inner})" if inner else self.name


RULES: Registry[type[DecisionRule]] = Registry("decision rule", group="fusion_ray.decision_rules")
DEFAULT_RULE = "magnitude"


def build_rule(rule: str | DecisionRule, **options: object) -> DecisionRule:
    """A rule instance from its registered name (with options) or the instance itself."""
    if isinstance(rule, DecisionRule):
        return rule
    return RULES.build(rule, **options)


# ----------------------------------------------------------------------------- magnitude


def _predictable_sd(values: list[float], fallback: float) -> float:
    """SD of the deltas seen so far (the bet's scale before the next one), ``fallback`` until
    two are seen or while they are all equal."""
    if len(values) < 2:
        return fallback
    sd = float(np.std(values, ddof=1))
    # equal deltas that differ only by float round-off (accuracies subtracted) count as equal
    return sd if sd > 1e-9 * max(1.0, max(abs(v) for v in values)) else fallback


def _equivalence_bets(row: Row, margin: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """L and U with predictable scales: L bets that each delta falls below +margin, U above
    -margin; valid when the deltas are symmetric about an effect at least ``margin`` away."""
    low = up = 1.0
    seen: list[float] = []
    lows, ups = [], []
    for d in row:
        if d is not None:
            sd = _predictable_sd(seen, margin)
            low *= 1 + math.tanh((margin - d) / sd)
            up *= 1 + math.tanh((d + margin) / sd)
            seen.append(d)
        lows.append(low)
        ups.append(up)
    return tuple(lows), tuple(ups)


@RULES.register("magnitude")
class MagnitudeRule(DecisionRule):
    """Bets on signed magnitudes (the default): each seed multiplies P by 1 + tanh(theta D / s)
    and N by 1 - tanh(theta D / s), where s is the root mean square of the comparison's deltas so
    far (over the whole first wave while in it): a function of the magnitudes only, so under the
    null (the signs are fair coins given the magnitudes) P and N have expectation exactly 1.
    Decisions start after the first wave. Scale-free, so the same rule serves 0-1 accuracies
    and points; larger deltas move the evidence more than small ones, which the sign bet ignores.
    """

    name = "magnitude"
    null = (
        "each paired delta is symmetric about 0 (the exact Wilcoxon test's null: swapping the "
        "operator and the baseline of a seed is as likely as not)"
    )
    family = "closure"

    def __init__(self, *, theta: Annotated[float, Gt(0)] = 1.5) -> None:
        self.theta = float(theta)

    def _bets(self, row: Row, first: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """P and N after each seed (1.0 before the first wave is complete)."""
        values = [(t, d) for t, d in enumerate(row) if d is not None]
        up = down = 1.0
        ups, downs = [1.0] * len(row), [1.0] * len(row)
        wave_end = min(first, len(row)) - 1
        for t in range(max(wave_end, 0), len(row)):
            seen = [d for j, d in values if j <= t]
            scale = math.sqrt(sum(d * d for d in seen) / len(seen)) if seen else 0.0
            if t == wave_end:  # the first wave: every delta at the wave's scale
                todo = seen
            else:
                delta = row[t]
                todo = [delta] if delta is not None else []
            for d in todo:
                step = math.tanh(self.theta * d / scale) if scale > 0 else 0.0
                up, down = up * (1 + step), down * (1 - step)
            ups[t], downs[t] = up, down
        return tuple(ups), tuple(downs)

    def evidence(self, row: Row, *, first: int, margin: float | None) -> Evidence:
        up, down = self._bets(row, first)
        if margin is None:
            return Evidence(up, down)
        return Evidence(up, down, *_equivalence_bets(row, margin))

    def _excluded(
        self, row: Row, shifts: np.ndarray, level: float, first: int, last: bool = False
    ) -> np.ndarray:
        """Per shift mu: whether the two-sided e-process of ``row - mu`` reached 1 / level at a
        look after the first wave (``last``: at the row's last look)."""
        values = np.array([np.nan if d is None else d for d in row], dtype=float)
        centred = values[None, :] - shifts[:, None]  # [shifts, seeds]
        present = ~np.isnan(centred)
        filled = np.where(present, centred, 0.0)
        count = np.cumsum(present, axis=1)
        scale = np.sqrt(np.cumsum(filled**2, axis=1) / np.maximum(count, 1))  # [shifts, seeds]
        wave_end = min(first, len(row)) - 1
        scale_at = scale[:, np.maximum(np.arange(len(row)), wave_end)]
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(scale_at > 0, np.tanh(self.theta * filled / scale_at), 0.0)
        up = np.cumprod(1 + step, axis=1)
        down = np.cumprod(1 - step, axis=1)
        two_sided = (up + down) / 2
        if last:
            return two_sided[:, -1] >= 1 / level
        # any over axis 1 of a [shifts, looks] array: an array, one per shift
        return cast(np.ndarray, (two_sided[:, wave_end:] >= 1 / level).any(axis=1))

    def max_log_e(self, n: int) -> float:
        # far from the data the shifted values have one sign and nearly one size, so each seed
        # multiplies P by about 1 + tanh(theta), and E = (P + N) / 2 <= (P + 1) / 2. A decision's
        # own e-value can exceed this (a value above the running RMS bets more than tanh(theta):
        # 95.5 against 86.8 at n = 8 when the values grow after the first wave); its only bound
        # is 2^(n-1), each seed at most doubling P
        return n * math.log1p(math.tanh(self.theta)) - math.log(2.0) if n else 0.0

    def selective_interval(self, row: Row, *, level: float, first: int) -> tuple[float, float]:
        return self.interval(row, level=level, first=first, last=True)

    def interval(
        self, row: Row, *, level: float, first: int, last: bool = False
    ) -> tuple[float, float]:
        values = [d for d in row if d is not None]
        if len(row) < first or not values:
            return -math.inf, math.inf
        spread = max(max(values) - min(values), max(abs(v) for v in values), 1e-9)
        grid = np.linspace(min(values) - 3 * spread, max(values) + 3 * spread, 601)
        excluded = self._excluded(row, grid, level, first, last)
        kept = np.flatnonzero(~excluded)
        if kept.size == 0:
            return math.nan, math.nan
        lo_i, hi_i = kept[0], kept[-1]
        end = len(grid) - 1
        lo = (
            -math.inf
            if lo_i == 0
            else self._edge(row, grid[lo_i - 1], grid[lo_i], level, first, last)
        )
        hi = (
            math.inf
            if hi_i == end
            else self._edge(row, grid[hi_i + 1], grid[hi_i], level, first, last)
        )
        return float(lo), float(hi)

    def _edge(
        self, row: Row, out: float, inside: float, level: float, first: int, last: bool
    ) -> float:
        """Bisection between an excluded and a kept shift; returns the excluded side's end."""
        for _ in range(30):
            mid = (out + inside) / 2
            if self._excluded(row, np.array([mid]), level, first, last)[0]:
                out = mid
            else:
                inside = mid
        return out


# ----------------------------------------------------------------------------- sign


@cache
def log_e(wins: int, n: int) -> float:
    """log of the KT sign e-value after ``wins`` wins among ``n`` non-zero deltas."""
    if n == 0:
        return 0.0
    return n * math.log(2.0) + betaln(wins + 0.5, n - wins + 0.5) - betaln(0.5, 0.5)


def sign_e_values(deltas: Row, shift: float = 0.0) -> list[float]:
    """The two-sided KT sign e-value after each seed of ``deltas - shift`` (a zero or a missing
    pair leaves it as it was)."""
    wins = n = 0
    out = []
    for d in deltas:
        if d is not None and d != shift:
            n += 1
            wins += d > shift
        out.append(math.exp(log_e(wins, n)))
    return out


def _one_sided_sign(wins: int, losses: int) -> tuple[float, float]:
    """The KT mixture split at p = 1/2 into its two halves, each renormalised: (evidence of
    more wins, evidence of more losses); their mean is the two-sided KT e-value."""
    e = math.exp(log_e(wins, wins + losses))
    upper = 1.0 - float(betainc(wins + 0.5, losses + 0.5, 0.5))  # posterior mass above 1/2
    return 2 * e * upper, 2 * e * (1.0 - upper)


def sign_confidence_sequence(row: Row, level: float, last: bool = False) -> tuple[float, float]:
    """The running-intersection confidence sequence for the median of ``row`` at e-threshold
    1 / ``level``, as an open interval (lo, hi) whose ends are the nearest excluded values
    (``last``: from the e-value of the row's last look alone)."""
    values = sorted({d for d in row if d is not None})
    if not values:
        return -math.inf, math.inf
    candidates = [values[0] - 1.0, *values, values[-1] + 1.0]
    candidates += [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    threshold = math.log(1.0 / level)

    def log_e_at(mu: float) -> float:
        e = sign_e_values(row, mu)
        return math.log(e[-1]) if last else max(math.log(v) for v in e)

    kept = [mu for mu in sorted(candidates) if log_e_at(mu) < threshold]
    if not kept:
        return math.nan, math.nan
    below = [c for c in candidates if c < kept[0]]
    above = [c for c in candidates if c > kept[-1]]
    return (max(below) if below else -math.inf), (min(above) if above else math.inf)


@RULES.register("sign")
class SignRule(DecisionRule):
    """The sign e-process (Krichevsky-Trofimov mixture over the win probability) with Holm's
    step-down on anytime p-values; equivalence when its confidence sequence for the median,
    at a / m, lies inside the margin (a separate budget: a mixed family can reach 2a). Counts
    wins only, so it also holds for skewed deltas, at a cost in seeds."""

    name = "sign"
    null = (
        "among non-zero paired deltas, a positive one is as likely as a negative one "
        "(P(D > 0) = P(D < 0))"
    )
    family = "holm"

    def evidence(self, row: Row, *, first: int, margin: float | None) -> Evidence:
        wins = losses = 0
        ups, downs = [], []
        for d in row:
            if d is not None:
                wins += d > 0
                losses += d < 0
            up, down = _one_sided_sign(wins, losses)
            ups.append(up)
            downs.append(down)
        return Evidence(tuple(ups), tuple(downs))

    def interval(self, row: Row, *, level: float, first: int) -> tuple[float, float]:
        return sign_confidence_sequence(row, level)

    def selective_interval(self, row: Row, *, level: float, first: int) -> tuple[float, float]:
        return sign_confidence_sequence(row, level, last=True)

    def max_log_e(self, n: int) -> float:
        return log_e(n, n)
