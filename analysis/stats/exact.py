"""The exact paired tests and intervals: the signed-rank test conditional on ties and zeros,
Hodges-Lehmann with its order-statistic interval, the sign test, Holm, the attainable-p guard
and the bootstrap interval. Pure functions of the deltas returning result objects.
"""

from __future__ import annotations

import functools
import math
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

from fusion_ray.decide.sequential import holm  # noqa: F401  (one Holm for both families)

Alternative = Literal["two-sided", "greater", "less"]
"""The alternative of the Wilcoxon and sign tests, as scipy names it."""
ZeroMethod = Literal["wilcox", "pratt", "zsplit"]
"""The signed-rank test's treatment of zero deltas, as scipy names it."""
ALTERNATIVES: tuple[Alternative, ...] = ("two-sided", "greater", "less")
ZERO_METHODS: tuple[ZeroMethod, ...] = ("wilcox", "pratt", "zsplit")


@dataclass(frozen=True)
class StatsSettings:
    """Every choice that changes a number in the report; written into stats.json."""

    alpha: float = 0.05
    """Significance level of the tests, after Holm correction."""
    alternative: Alternative = "two-sided"
    """two-sided, greater (operator better than baseline) or less, for Wilcoxon and sign test."""
    zero_method: ZeroMethod = "wilcox"
    """Zero deltas in the signed-rank test: wilcox (drop them, as R does), pratt or zsplit."""
    n_bootstrap: int = 9999
    """Paired-bootstrap resamples of the mean delta."""
    bootstrap_seed: int = 0
    """Base seed of the bootstrap; each comparison's stream also depends on its name only."""
    descriptive: bool = False
    """True after adaptive seeds: the seeds each cell got depended on the decisions, so the
    fixed-n tests are descriptive: their p-values are kept, but none is called significant
    (``significant`` is False everywhere) and no table stars one; the anytime decisions are the
    analysis."""

    def __post_init__(self) -> None:
        if self.alternative not in ALTERNATIVES:
            raise ValueError(f"alternative {self.alternative!r}: choose one of {ALTERNATIVES}")
        if self.zero_method not in ZERO_METHODS:
            raise ValueError(f"zero_method {self.zero_method!r}: choose one of {ZERO_METHODS}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")

    @property
    def confidence(self) -> float:
        """Level of the two-sided intervals (bootstrap, Hodges-Lehmann, Clopper-Pearson)."""
        return 1.0 - self.alpha


# ----------------------------------------------------------------------------- signed rank


def _signed_rank_distribution(ranks2: np.ndarray) -> np.ndarray:
    """P(T2 = t) under H0 for T2 = sum of the doubled ranks given a positive sign.

    Each non-zero difference is positive with probability 1/2 independently (conditional on
    the observed absolute ranks), so the distribution is the convolution of two-point masses.
    Doubled mid-ranks are integers, so the support is 0..sum(ranks2).
    """
    total = int(ranks2.sum())
    dist = np.zeros(total + 1)
    dist[0] = 1.0
    for r in ranks2.astype(np.int64):
        shifted = np.zeros_like(dist)
        shifted[r:] = dist[: total + 1 - r]
        dist = 0.5 * (dist + shifted)
    return dist


def signed_rank_null_cdf(n: int) -> np.ndarray:
    """cdf[t] = P(T+ <= t) of the untied signed-rank statistic with n pairs (R's psignrank)."""
    dist = _signed_rank_distribution(2 * np.arange(1, n + 1))[::2]  # doubled support: even only
    return np.cumsum(dist)


@dataclass
class SignedRankResult:
    """Wilcoxon signed-rank test of paired differences."""

    statistic: float
    """V = T+, the sum of the ranks of the positive differences (R's ``V``)."""
    pvalue: float
    method: str
    """How the p-value was obtained (exact / exact conditional / none)."""
    n: int
    n_zeros: int
    n_ties: int
    """Number of non-zero differences sharing their absolute value with another one."""
    rank_biserial: float
    """Matched-pairs rank-biserial correlation (R+ - R-) / (R+ + R-) from the same ranks."""


def wilcoxon_signed_rank(
    d: Sequence[float] | np.ndarray,
    alternative: Alternative = "two-sided",
    zero_method: ZeroMethod = "wilcox",
) -> SignedRankResult:
    """Exact Wilcoxon signed-rank test of differences ``d`` (pass integers to keep ties exact).

    Without zeros or ties it is ``scipy.stats.wilcoxon(method="exact")``. With them, scipy's
    exact method would use the untied distribution, so the p-value comes from the exact
    permutation distribution conditional on the observed mid-ranks, the same as
    ``scipy.stats.wilcoxon(method=PermutationMethod())`` computes by enumeration.
    """
    d = np.asarray(d)
    if alternative not in ALTERNATIVES or zero_method not in ZERO_METHODS:
        raise ValueError(f"alternative {alternative!r} / zero_method {zero_method!r} unknown")
    n = len(d)
    zeros = d == 0
    n_zeros = int(zeros.sum())
    ranked = d[~zeros] if zero_method == "wilcox" else d
    ranks = stats.rankdata(np.abs(ranked))
    pos, neg = ranked > 0, ranked < 0
    r_plus, r_minus = float(ranks[pos].sum()), float(ranks[neg].sum())
    if zero_method == "zsplit":
        r_plus += float(ranks[ranked == 0].sum()) / 2
        r_minus += float(ranks[ranked == 0].sum()) / 2
    nz_abs = np.abs(d[~zeros])
    _, counts = np.unique(nz_abs, return_counts=True)
    n_ties = int(counts[counts > 1].sum())
    rb = (r_plus - r_minus) / (r_plus + r_minus) if r_plus + r_minus > 0 else 0.0
    if n - n_zeros == 0:
        return SignedRankResult(
            r_plus, 1.0, "none: every difference is zero (p = 1)", n, n_zeros, 0, rb
        )
    if n_zeros == 0 and n_ties == 0:
        res = stats.wilcoxon(d, alternative=alternative, method="exact", zero_method=zero_method)
        return SignedRankResult(r_plus, float(res.pvalue), "exact", n, n_zeros, n_ties, rb)
    # exact conditional distribution: only the non-zero differences change sign
    ranks2 = np.rint(2 * ranks[ranked != 0]).astype(np.int64)
    dist = _signed_rank_distribution(ranks2)
    t2 = int(np.rint(2 * ranks[ranked > 0].sum()))
    p_greater = float(dist[t2:].sum())
    p_less = float(dist[: t2 + 1].sum())
    if alternative == "greater":
        p = p_greater
    elif alternative == "less":
        p = p_less
    else:
        p = min(1.0, 2.0 * min(p_greater, p_less))
    why = []
    if n_zeros:
        why.append(f"{n_zeros} zero(s) {'dropped' if zero_method == 'wilcox' else zero_method}")
    if n_ties:
        why.append(f"{n_ties} tied |delta|")
    return SignedRankResult(
        r_plus,
        min(1.0, p),
        f"exact conditional ({', '.join(why)}; mid-ranks)",
        n,
        n_zeros,
        n_ties,
        rb,
    )


# ----------------------------------------------------------------------------- estimates


@dataclass
class HodgesLehmann:
    estimate: float
    low: float
    high: float
    confidence: float
    """Confidence of [low, high] under the untied signed-rank distribution (discrete: at least
    the requested level if n allows); the achieved coverage where ``method`` is exact."""
    method: str
    """exact (no zero, no tied |delta|), approximate (see ``hl_interval_method``) or none."""


def hl_interval_method(d: Sequence[float] | np.ndarray) -> str:
    """Whether the Hodges-Lehmann interval of ``d`` is exact: "exact" or "approximate".

    The interval's rank k comes from the untied signed-rank distribution, which is the null
    distribution only when no difference is zero and no two share their absolute value. That is
    R's condition too: ``wilcox.test(conf.int = TRUE)`` uses the exact interval only then (and
    a normal approximation otherwise). Zeros or tied |d| make the coverage approximate.
    """
    d = np.asarray(d)
    if len(d) == 0:
        raise ValueError("hl_interval_method needs at least one difference; got none")
    has_zero = bool((d == 0).any())
    has_tie = len(np.unique(np.abs(d))) < len(d)
    return "approximate" if has_zero or has_tie else "exact"


def hodges_lehmann(d: Sequence[float] | np.ndarray, confidence: float = 0.95) -> HodgesLehmann:
    """Hodges-Lehmann shift (median of Walsh averages) with its order-statistic interval.

    The interval is [W_(k), W_(N+1-k)] over the N = n(n+1)/2 sorted Walsh averages, k from the
    untied signed-rank distribution, exactly as R's ``wilcox.test(conf.int = TRUE)`` computes it
    when exact. When even k = 1 cannot reach the requested level (n <= 5 at 95 %), the interval
    is [min, max] and ``confidence`` says what it achieves. With zeros or tied |deltas| the same
    interval is kept (R switches to a normal approximation) and ``method`` is "approximate":
    its coverage is then only approximately ``confidence``.
    """
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        return HodgesLehmann(math.nan, math.nan, math.nan, math.nan, "none")
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2.0)
    estimate = float(np.median(walsh))
    cdf = signed_rank_null_cdf(n)
    alpha = 1.0 - confidence
    qu = int(np.searchsorted(cdf, alpha / 2 - 1e-12))  # smallest t with cdf[t] >= alpha/2
    qu = max(qu, 1)
    big_n = n * (n + 1) // 2
    achieved = 1.0 - 2.0 * float(cdf[qu - 1])
    return HodgesLehmann(
        estimate,
        float(walsh[qu - 1]),
        float(walsh[big_n - qu]),
        achieved,
        hl_interval_method(d),
    )


def min_attainable_p(n: int, alternative: str = "two-sided") -> float:
    """Smallest p-value an exact signed-rank (or sign) test can give with n non-zero deltas.

    Pass the number of non-zero deltas, not of pairs: under every zero policy (wilcox drops the
    zeros, pratt drops their ranks, zsplit splits their ranks evenly) and in the sign test, only
    the signs of the non-zero deltas are random under H0, so all of them on one side is the most
    extreme outcome, with probability 1/2^n.
    """
    if n <= 0:
        return 1.0
    return min(1.0, (2.0 if alternative == "two-sided" else 1.0) / 2.0**n)


def seeds_needed(alpha: float, m: int = 1, alternative: str = "two-sided") -> int:
    """Fewest paired seeds with a non-zero delta that let each of m Holm-corrected comparisons
    reach alpha when all m have that many.

    With equal floors, Holm's smallest adjusted p-value is m times the floor, so this is the
    least n with m * min_attainable_p(n) <= alpha. Seeds whose delta is zero do not count.
    """
    n = 1
    while max(1, m) * min_attainable_p(n, alternative) > alpha:
        n += 1
    return n


def holm_min_attainable_p(floors: Sequence[float] | np.ndarray) -> np.ndarray:
    """Smallest Holm-adjusted p-value each comparison of a family can reach, from every
    comparison's smallest raw p-value (its floor, ``min_attainable_p``).

    A comparison's adjusted p is smallest with its own p at its floor and the s lowest of the
    other floors ranked before it, also at their floors: max(max_{r <= s} (m - r + 1) g_(r),
    (m - s) f) over the sorted other floors g. This takes the least over s = 0..(number of
    lower floors). With equal floors (equal numbers of non-zero deltas) it is m * f; with
    unequal ones it can be lower, e.g. floors (0.001, 0.04) give (0.002, 0.04), not 0.08.
    """
    f = np.asarray(floors, dtype=float)
    m = len(f)
    out = np.empty(m)
    for k in range(m):
        others = np.delete(f, k)
        lower = np.sort(others[others < f[k]])
        s = np.arange(len(lower) + 1)
        # steps[s] = largest adjusted p among the s comparisons ranked before this one
        steps = np.concatenate(([0.0], np.maximum.accumulate((m - s[1:] + 1) * lower)))
        out[k] = min(1.0, float(np.maximum(steps, (m - s) * f[k]).min()))
    return out


@functools.lru_cache(maxsize=4096)
def sign_test(
    wins: int, losses: int, alternative: Alternative = "two-sided", confidence: float = 0.95
) -> tuple[float, float, float]:
    """Exact sign test (ties dropped) and Clopper-Pearson interval of the win rate.

    ``scipy.stats.binomtest``; the interval is two-sided whatever the alternative.
    """
    if wins + losses == 0:
        return 1.0, math.nan, math.nan
    p = stats.binomtest(wins, wins + losses, 0.5, alternative=alternative).pvalue
    ci = stats.binomtest(wins, wins + losses).proportion_ci(confidence, "exact")
    return float(p), float(ci.low), float(ci.high)


def bootstrap_ci(values: np.ndarray, confidence: float, n_resamples: int, seed: Any):
    if len(values) < 2:
        return math.nan, math.nan
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            (values,),
            np.mean,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            vectorized=True,
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def key_seed(base: int, key: str) -> list[int]:
    return [int(base), zlib.crc32(key.encode())]
