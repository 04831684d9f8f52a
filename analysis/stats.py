"""Paired-seed statistics of each operator against a baseline.

The tests themselves are scipy's and statsmodels': ``scipy.stats.wilcoxon`` (exact),
``scipy.stats.binomtest`` (sign test, Clopper-Pearson interval), ``scipy.stats.bootstrap``
(percentile interval of the mean delta) and ``statsmodels.stats.multitest.multipletests``
with ``method="holm"`` (statsmodels' default, "hs", is Holm-Sidak, not Holm). The glue written
here is what they lack:

- deltas from correct counts (integers), so float round-off can neither create nor break ties;
- the exact null distribution of the signed-rank statistic conditional on tied ranks and zeros
  (scipy's exact method assumes neither; its permutation method enumerates 2^n sign vectors,
  seconds per comparison at n = 16); a shift-algorithm over doubled mid-ranks gives the same
  p-values in microseconds and is tested against scipy's permutation method;
- the Hodges-Lehmann estimate with its order-statistic confidence interval from Walsh averages,
  labelled exact or approximate from the data (``hl_ci_method``);
- the attainable-significance guard, counting only the non-zero deltas, whose signs are all
  the exact test permutes, and Holm's correction over comparisons with different floors.

Every statistic of a comparison is an entry of the registry ``STATISTICS`` (a ``Statistic``:
the function computing its columns from the paired deltas, its stats.csv columns, its words in
the settings record and its one-line Method description). ``describe_deltas``, the family-wide
columns (Holm, the guard), stats.csv's leading columns, report.md's compact table and its
Method section all follow the registry; ``register`` adds a statistic, ``unregister`` removes
one.
"""

from __future__ import annotations

import functools
import math
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy
from scipy import stats

ALTERNATIVES = ("two-sided", "greater", "less")
ZERO_METHODS = ("wilcox", "pratt", "zsplit")


@dataclass(frozen=True)
class StatsSettings:
    """Every choice that changes a number in the report; written into stats.json."""

    alpha: float = 0.05
    """Significance level of the tests, after Holm correction."""
    alternative: str = "two-sided"
    """two-sided, greater (operator better than baseline) or less, for Wilcoxon and sign test."""
    zero_method: str = "wilcox"
    """Zero deltas in the signed-rank test: wilcox (drop them, as R does), pratt or zsplit."""
    n_bootstrap: int = 9999
    """Paired-bootstrap resamples of the mean delta."""
    bootstrap_seed: int = 0
    """Base seed of the bootstrap; each comparison's stream also depends on its name only."""

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
    alternative: str = "two-sided",
    zero_method: str = "wilcox",
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


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> np.ndarray:
    """Holm step-down adjusted p-values (statsmodels ``multipletests(method="holm")``)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return p
    return multipletests(p, alpha=alpha, method="holm")[1]


@functools.lru_cache(maxsize=4096)
def sign_test(
    wins: int, losses: int, alternative: str = "two-sided", confidence: float = 0.95
) -> tuple[float, float, float]:
    """Exact sign test (ties dropped) and Clopper-Pearson interval of the win rate.

    ``scipy.stats.binomtest``; the interval is two-sided whatever the alternative.
    """
    if wins + losses == 0:
        return 1.0, math.nan, math.nan
    p = stats.binomtest(wins, wins + losses, 0.5, alternative=alternative).pvalue
    ci = stats.binomtest(wins, wins + losses).proportion_ci(confidence, "exact")
    return float(p), float(ci.low), float(ci.high)


def _bootstrap_ci(values: np.ndarray, confidence: float, n_resamples: int, seed: Any):
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


def _key_seed(base: int, key: str) -> list[int]:
    return [int(base), zlib.crc32(key.encode())]


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True, eq=False)
class PairedDeltas:
    """One comparison's integer paired differences ``num / denom`` (of accuracy), with the
    settings and what several statistics share, computed once."""

    num: np.ndarray
    denom: int
    settings: StatsSettings
    key: str = ""
    """The comparison's name; with ``bootstrap_seed`` it seeds the bootstrap stream."""

    @property
    def n(self) -> int:
        return len(self.num)

    @functools.cached_property
    def pp(self) -> np.ndarray:
        """The deltas in percentage points."""
        return 100.0 * self.num / self.denom

    @functools.cached_property
    def signed_rank(self) -> SignedRankResult:
        """The Wilcoxon signed-rank test on the integers (ties stay exact)."""
        s = self.settings
        return wilcoxon_signed_rank(self.num, s.alternative, s.zero_method)


@dataclass(frozen=True)
class Statistic:
    """One statistic of a comparison: how its stats.csv columns are computed and how it is
    described. Register it with ``register``; stats.csv, stats.json, report.md's table and its
    Method section all follow the registry (``STATISTICS``)."""

    name: str
    columns: tuple[str, ...]
    """The columns ``compute`` returns, in stats.csv order."""
    compute: Callable[[PairedDeltas], Mapping[str, Any]] | None
    """The columns' values for one comparison (None for a statistic of the whole family)."""
    method: str
    """One line for report.md's Method section; ``{field}`` is filled from the settings record
    (``settings_record``: the settings, ``m``, ``confidence`` and every ``record`` entry)."""
    headline: tuple[str, ...] = ()
    """Columns that lead stats.csv, after the comparison's name (the rest follow)."""
    record: Mapping[str, str] = field(default_factory=dict)
    """Entries of the settings record (stats.json) stating its choices in words; ``{field}`` is
    filled from the settings, ``m`` and ``confidence``."""
    cells: Callable[[pd.Series, Mapping[str, Any]], dict[str, str]] | None = None
    """Its cells in report.md's compact table, from a stats row and the settings record."""
    leads_table: bool = False
    """Its cells come before the others' in report.md's table (the effect estimates)."""
    family: Callable[[pd.DataFrame, StatsSettings], None] | None = None
    """Adds ``family_columns`` to a whole family of comparisons (e.g. Holm's correction)."""
    family_columns: tuple[str, ...] = ()


def _mean_delta(d: PairedDeltas) -> dict[str, Any]:
    s, pp, n = d.settings, d.pp, d.n
    low, high = _bootstrap_ci(pp, s.confidence, s.n_bootstrap, _key_seed(s.bootstrap_seed, d.key))
    return {
        "n_pairs": n,
        "mean_delta": float(pp.mean()) if n else math.nan,
        "sd_delta": float(pp.std(ddof=1)) if n > 1 else math.nan,
        "median_delta": float(np.median(pp)) if n else math.nan,
        "ci_low": low,
        "ci_high": high,
    }


def _wilcoxon(d: PairedDeltas) -> dict[str, Any]:
    w = d.signed_rank
    return {
        "wilcoxon_stat": w.statistic,
        "p_wilcoxon": w.pvalue,
        "wilcoxon_method": w.method,
        "n_zeros": w.n_zeros,
        "n_tied": w.n_ties,
    }


def _holm_family(table: pd.DataFrame, settings: StatsSettings) -> None:
    table["p_holm"] = holm(table["p_wilcoxon"].to_numpy(), settings.alpha)
    table["significant"] = table["p_holm"] <= settings.alpha


def _sign(d: PairedDeltas) -> dict[str, Any]:
    s = d.settings
    wins, losses = int((d.num > 0).sum()), int((d.num < 0).sum())
    sign_p, low, high = sign_test(wins, losses, s.alternative, s.confidence)
    return {
        "wins": wins,
        "losses": losses,
        "ties": d.n - wins - losses,
        "sign_p": sign_p,
        "win_rate_low": low,
        "win_rate_high": high,
    }


def _hodges_lehmann(d: PairedDeltas) -> dict[str, Any]:
    hl = hodges_lehmann(d.pp, d.settings.confidence)
    return {
        "hl_estimate": hl.estimate,
        "hl_ci_low": hl.low,
        "hl_ci_high": hl.high,
        "hl_confidence": hl.confidence,
        # from the integers, so float round-off can neither create nor break a tie
        "hl_ci_method": hl_interval_method(d.num) if d.n else "none",
    }


def _rank_biserial(d: PairedDeltas) -> dict[str, Any]:
    return {"rank_biserial": d.signed_rank.rank_biserial}


def _d_z(d: PairedDeltas) -> dict[str, Any]:
    sd = d.pp.std(ddof=1) if d.n > 1 else math.nan
    return {"d_z": float(d.pp.mean() / sd) if d.n > 1 and sd > 0 else math.nan}


def _attainable(d: PairedDeltas) -> dict[str, Any]:
    n_nonzero = int(np.count_nonzero(d.num))
    return {
        "n_nonzero": n_nonzero,
        "min_attainable_p": min_attainable_p(n_nonzero, d.settings.alternative),
    }


def _attainable_family(table: pd.DataFrame, settings: StatsSettings) -> None:
    m = len(table)
    table["min_attainable_p_holm"] = holm_min_attainable_p(table["min_attainable_p"].to_numpy())
    table["can_reach_alpha"] = table["min_attainable_p_holm"] <= settings.alpha
    table["seeds_needed"] = seeds_needed(settings.alpha, m, settings.alternative)


def _interval(estimate: float, low: float, high: float) -> str:
    return f"{estimate:+.2f} [{low:+.2f}, {high:+.2f}]"


def hl_label(record: Mapping[str, Any]) -> str:
    """How a table heads a Hodges-Lehmann interval: ``HL 95% CI``."""
    return f"HL {record.get('confidence', 0.95):.0%} CI"


def hl_marked(text: str, method: str) -> str:
    """An interval's text, marked `(approx.)` unless ``method`` (``hl_ci_method``) is exact:
    with zeros or tied |deltas| its coverage only approximates the level."""
    return text if method == "exact" else f"{text} (approx.)"


def _hl_cells(r: pd.Series, rec: Mapping[str, Any]) -> dict[str, str]:
    text = _interval(r["hl_estimate"], r["hl_ci_low"], r["hl_ci_high"])
    return {f"HL [{rec.get('confidence', 0.95):.0%} CI]": hl_marked(text, r["hl_ci_method"])}


STATISTICS: list[Statistic] = [
    Statistic(
        name="mean_delta",
        columns=("n_pairs", "mean_delta", "sd_delta", "median_delta", "ci_low", "ci_high"),
        compute=_mean_delta,
        headline=("n_pairs", "mean_delta", "ci_low", "ci_high"),
        record={
            "bootstrap": "percentile paired bootstrap of the mean delta, {n_bootstrap} "
            "resamples, seeded from bootstrap_seed={bootstrap_seed} and the comparison's name"
        },
        method="**Mean delta**, {confidence:.0%} interval: {bootstrap}; it under-covers at n <= 6.",
        cells=lambda r, rec: {
            "n": int(r["n_pairs"]),
            f"Δ mean [{rec.get('confidence', 0.95):.0%} boot CI]": _interval(
                r["mean_delta"], r["ci_low"], r["ci_high"]
            ),
        },
        leads_table=True,
    ),
    Statistic(
        name="wilcoxon",
        columns=("wilcoxon_stat", "p_wilcoxon", "wilcoxon_method", "n_zeros", "n_tied"),
        compute=_wilcoxon,
        headline=("wilcoxon_stat", "p_wilcoxon"),
        record={
            "test": "Wilcoxon signed-rank on the integer count differences: scipy.stats.wilcoxon "
            "method='exact' without zeros or ties; with zeros or ties, the exact permutation "
            "distribution conditional on the mid-ranks (never the normal approximation)",
            "wilcoxon_stat": "V = T+, the sum of ranks of positive deltas (R's V)",
        },
        method="**Test** ({alternative}): {test}. Zero policy: zero_method = `{zero_method}` "
        "({zero_policy}). Statistic: {wilcoxon_stat}.",
        cells=lambda r, rec: {"V": f"{r['wilcoxon_stat']:g}", "p": f"{r['p_wilcoxon']:.4g}"},
    ),
    Statistic(
        name="holm",
        columns=(),
        compute=None,
        headline=("p_holm",),
        record={
            "correction": "holm",
            "correction_detail": "Holm step-down over all m = {m} comparisons of this report "
            "(statsmodels multipletests(method='holm'); its default 'hs' is Holm-Sidak)",
        },
        method="**Multiple comparisons**: {correction_detail}. The length analysis is a "
        "separate family.",
        cells=lambda r, rec: {"p Holm": f"{r['p_holm']:.4g}" + ("*" if r["significant"] else "")},
        family=_holm_family,
        family_columns=("p_holm", "significant"),
    ),
    Statistic(
        name="sign_test",
        columns=("wins", "losses", "ties", "sign_p", "win_rate_low", "win_rate_high"),
        compute=_sign,
        headline=("wins", "sign_p"),
        record={
            "sign_test": "scipy.stats.binomtest on wins vs losses (ties dropped); "
            "Clopper-Pearson interval"
        },
        method="**Sign test** ({alternative}): {sign_test} of the win rate.",
        cells=lambda r, rec: {
            "wins": f"{int(r['wins'])}/{int(r['n_pairs'])}",
            "sign p": f"{r['sign_p']:.3g}",
        },
    ),
    Statistic(
        name="hodges_lehmann",
        columns=("hl_estimate", "hl_ci_low", "hl_ci_high", "hl_confidence", "hl_ci_method"),
        compute=_hodges_lehmann,
        headline=("hl_estimate",),
        record={
            "hodges_lehmann": "median of Walsh averages; order-statistic interval (two-sided) "
            "[W_(k), W_(N+1-k)], k from the untied signed-rank distribution",
            "hl_ci_method": "exact where a comparison's deltas have no zero and no tied |delta| "
            "(R's wilcox.test condition for its exact interval); otherwise approximate: the "
            "untied distribution that sets k is then not the null distribution of the data, so "
            "the coverage only approximates hl_confidence (R uses a normal approximation there)",
        },
        method="**Hodges-Lehmann** shift with a {confidence:.0%} interval: {hodges_lehmann}; "
        "with few pairs the interval is [min, max] at the level in hl_confidence. Exact or "
        "approximate per comparison (column hl_ci_method; `(approx.)` in the table): "
        "{hl_ci_method}.",
        cells=_hl_cells,
        leads_table=True,
    ),
    Statistic(
        name="rank_biserial",
        columns=("rank_biserial",),
        compute=_rank_biserial,
        headline=("rank_biserial",),
        record={
            "rank_biserial": "matched-pairs rank-biserial (R+ - R-)/(R+ + R-), same ranks as "
            "the test"
        },
        method="**Rank correlation**: {rank_biserial}.",
        cells=lambda r, rec: {"r rb": f"{r['rank_biserial']:+.2f}"},
    ),
    Statistic(
        name="d_z",
        columns=("d_z",),
        compute=_d_z,
        headline=("d_z",),
        record={"d_z": "mean delta / sd of deltas (ddof = 1)"},
        method="**Cohen's d_z**: {d_z}.",
        cells=lambda r, rec: {"d z": "–" if pd.isna(r["d_z"]) else f"{r['d_z']:+.2f}"},
    ),
    Statistic(
        name="attainable_p",
        columns=("n_nonzero", "min_attainable_p"),
        compute=_attainable,
        headline=("min_attainable_p",),
        record={
            "guard": "min_attainable_p = 2/2^n (two-sided) or 1/2^n (one-sided), n = n_nonzero, "
            "the number of non-zero deltas (only their signs are random under H0, whatever "
            "zero_method); min_attainable_p_holm = the smallest Holm-adjusted p the comparison "
            "can reach, with every comparison of the family at its floor (m * min_attainable_p "
            "when all floors are equal)"
        },
        method="**Attainable significance**: an exact test on n non-zero deltas cannot go "
        "below {guard}. `min p (Holm)` shows that floor; comparisons whose floor exceeds "
        "alpha = {alpha} are named in the warnings with the seeds needed.",
        cells=lambda r, rec: {"min p (Holm)": f"{r['min_attainable_p_holm']:.3g}"},
        family=_attainable_family,
        family_columns=("min_attainable_p_holm", "can_reach_alpha", "seeds_needed"),
    ),
]


PLUGIN_GROUP = "fusion_ray.statistics"
"""The entry-point group of plug-in statistics: ``name = "package.module:STATISTIC"`` naming a
``Statistic`` (or a function of no arguments returning one). Loaded the first time the registry
is read, in every process."""

_BUILT_IN = {s.name for s in STATISTICS}
_ORIGINS: dict[str, str] = {name: "analysis (built in)" for name in _BUILT_IN}
_plugins_loaded = False


def statistics() -> list[Statistic]:
    """The registered statistics, in order: the built-in ones, then the plug-ins of the
    ``fusion_ray.statistics`` entry-point group (loaded on first use), then any ``register``ed."""
    _load_plugins()
    return STATISTICS


def origin(name: str) -> str:
    """Where a statistic comes from: ``analysis (built in)``, a plug-in package, or ``register``."""
    _load_plugins()
    return _ORIGINS.get(name, "register()")


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib import metadata

    for point in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else point.value
        loaded = point.load()
        statistic = loaded if isinstance(loaded, Statistic) else loaded()
        if not isinstance(statistic, Statistic):
            raise TypeError(
                f"entry point {point.name!r} of {package} ({PLUGIN_GROUP}) gives "
                f"{type(statistic).__name__}, not an analysis.stats.Statistic"
            )
        if statistic.name in _ORIGINS:
            raise ValueError(
                f"statistic {statistic.name!r} of {package} clashes with the one of "
                f"{_ORIGINS[statistic.name]}; rename one of them"
            )
        _add(statistic)
        _ORIGINS[statistic.name] = package


def register(statistic: Statistic) -> None:
    """Add a statistic after the registered ones; it is computed for every comparison from then
    on (main comparisons and length buckets) and written to stats.csv and report.md."""
    _load_plugins()
    _add(statistic)


def _add(statistic: Statistic) -> None:
    if any(s.name == statistic.name for s in STATISTICS):
        raise ValueError(
            f"a statistic named {statistic.name!r} is already registered; unregister it first "
            "or choose another name"
        )
    taken = {c for s in STATISTICS for c in (*s.columns, *s.family_columns)}
    clash = sorted(taken & {*statistic.columns, *statistic.family_columns})
    if clash:
        raise ValueError(f"columns {clash} already belong to another statistic; rename them")
    STATISTICS.append(statistic)


def unregister(name: str) -> Statistic:
    """Remove the statistic ``name`` from the registry and return it."""
    _load_plugins()
    for i, s in enumerate(STATISTICS):
        if s.name == name:
            return STATISTICS.pop(i)
    known = ", ".join(s.name for s in STATISTICS)
    raise KeyError(f"no statistic named {name!r} is registered; registered: {known}")


def headline_columns() -> list[str]:
    """The statistics' columns that lead stats.csv, in registry order."""
    return [c for s in statistics() for c in s.headline]


def describe_deltas(
    num: np.ndarray,
    denom: int,
    settings: StatsSettings,
    key: str = "",
) -> dict[str, Any]:
    """Every per-comparison statistic of integer paired differences ``num / denom``.

    Effect sizes and intervals are in percentage points (100 * num / denom). The rank tests
    work on the integers themselves. Columns follow the registry's order.
    """
    deltas = PairedDeltas(np.asarray(num, dtype=np.int64), denom, settings, key)
    out: dict[str, Any] = {}
    for stat in statistics():
        if stat.compute is None:
            continue
        values = stat.compute(deltas)
        if set(values) != set(stat.columns):
            raise ValueError(
                f"statistic {stat.name!r} returned columns {sorted(values)} but declares "
                f"{list(stat.columns)}; make its compute function return exactly its columns"
            )
        out.update((c, values[c]) for c in stat.columns)
    return out


def summary_cells(row: pd.Series, record: Mapping[str, Any]) -> dict[str, str]:
    """One comparison's cells in report.md's compact table: the effect estimates first, then
    the other statistics, in registry order."""
    ordered = [s for s in statistics() if s.leads_table] + [
        s for s in statistics() if not s.leads_table
    ]
    cells: dict[str, str] = {}
    for stat in ordered:
        if stat.cells is not None:
            cells.update(stat.cells(row, record))
    return cells


def method_lines(record: Mapping[str, Any]) -> list[str]:
    """One line per statistic for report.md's Method section, from the settings record."""
    return [_fill(stat.method, record, stat.name, "method") for stat in statistics()]


def _fill(template: str, fields: Mapping[str, Any], name: str, part: str) -> str:
    try:
        return template.format(**fields)
    except KeyError as err:
        raise ValueError(
            f"statistic {name!r}: its {part} text names the field {err}, which the settings "
            f"record does not have; use one of {', '.join(sorted(fields))} (or add it to the "
            "statistic's record), and double literal braces"
        ) from None


# ----------------------------------------------------------------------------- comparisons


@dataclass
class Comparisons:
    """The stats table of a report (one row per comparison), per-seed deltas and warnings."""

    table: pd.DataFrame
    deltas: pd.DataFrame
    """One row per paired seed: group, operator, seed, accuracies and delta (pp)."""
    settings: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def common_denominator(totals: np.ndarray) -> int:
    """Least common multiple of the test-set sizes of a comparison."""
    return int(np.lcm.reduce(np.asarray(totals, dtype=np.int64))) if len(totals) else 1


def integer_deltas(
    correct: np.ndarray, baseline_correct: np.ndarray, totals: np.ndarray
) -> tuple[np.ndarray, int]:
    """Accuracy deltas as integers over a common denominator: exact ties, no round-off."""
    correct = np.asarray(correct, dtype=np.int64)
    baseline_correct = np.asarray(baseline_correct, dtype=np.int64)
    totals = np.asarray(totals, dtype=np.int64)
    denom = common_denominator(totals)
    return (correct - baseline_correct) * (denom // totals), denom


def compare(pairing: Any, settings: StatsSettings | None = None) -> Comparisons:
    """Paired statistics of each operator against the baseline in each group of a Pairing.

    ``pairing`` is an ``analysis.pairing.Pairing``. Holm's correction runs over every
    comparison of the result (m = number of rows).
    """
    settings = settings or StatsSettings()
    keys = list(pairing.keys)
    pairs = pairing.pairs.sort_values([*keys, "operator", "seed"], kind="stable")
    pairs = pairs.reset_index(drop=True)
    correct = pairs["correct"].to_numpy(dtype=np.int64)
    base_correct = pairs["baseline_correct"].to_numpy(dtype=np.int64)
    total = pairs["test_total"].to_numpy(dtype=np.int64)
    seeds = pairs["seed"].to_numpy(dtype=np.int64)
    acc = 100.0 * correct / total
    base_acc = 100.0 * base_correct / total

    deltas = pairs[[*keys, "operator", "seed"]].copy()
    deltas["baseline"] = pairing.baseline
    deltas["acc"] = acc
    deltas["baseline_acc"] = base_acc
    deltas["delta"] = acc - base_acc

    rows = []
    if len(pairs):
        groups = pairs.groupby([*keys, "operator"], sort=False).indices
        for gkey, idx in groups.items():
            num, denom = integer_deltas(correct[idx], base_correct[idx], total[idx])
            n = len(idx)
            row = dict(zip([*keys, "operator"], gkey, strict=True))
            row.update(
                baseline=pairing.baseline,
                seeds=",".join(str(int(x)) for x in seeds[idx]),
                test_total=int(total[idx][0]) if len(set(total[idx])) == 1 else -1,
                acc_mean=float(acc[idx].mean()),
                acc_sd=float(acc[idx].std(ddof=1)) if n > 1 else math.nan,
                baseline_acc_mean=float(base_acc[idx].mean()),
                baseline_acc_sd=float(base_acc[idx].std(ddof=1)) if n > 1 else math.nan,
            )
            row.update(describe_deltas(num, denom, settings, "|".join(map(str, gkey))))
            rows.append(row)
    table = pd.DataFrame(rows)
    warns = finish_family(table, settings, family="comparisons against the baseline")
    return Comparisons(
        table=table,
        deltas=deltas,
        settings=settings_record(settings, len(table)),
        warnings=warns,
    )


def exact_test_columns(
    scores: np.ndarray, settings: StatsSettings, scale: float = 1.0
) -> dict[str, Any]:
    """The columns of one exact two-sided test over per-seed scores, as the interaction and
    slope families report them: the Hodges-Lehmann estimate and interval of the scores times
    ``scale`` (> 0: taken on the scores, so round-off in scaled values cannot move it), wins,
    losses, ties, the exact Wilcoxon signed-rank test and its attainable floor."""
    test = wilcoxon_signed_rank(scores, "two-sided", settings.zero_method)
    hl = hodges_lehmann(scores, settings.confidence)
    nonzero = int(np.count_nonzero(scores))
    return {
        "hl_estimate": scale * hl.estimate,
        "hl_ci_low": scale * hl.low,
        "hl_ci_high": scale * hl.high,
        "hl_confidence": hl.confidence,
        "hl_ci_method": hl.method,
        "wins": int((scores > 0).sum()),
        "losses": int((scores < 0).sum()),
        "ties": int((scores == 0).sum()),
        "wilcoxon_stat": test.statistic,
        "p_wilcoxon": test.pvalue,
        "wilcoxon_method": test.method,
        "n_zeros": test.n_zeros,
        "n_nonzero": nonzero,
        "min_attainable_p": min_attainable_p(nonzero, "two-sided"),
    }


def exact_family_warnings(table: pd.DataFrame, alpha: float, family: str, seeds: str) -> list[str]:
    """Holm over a family of ``exact_test_columns`` rows (``holm_columns``), in place; returns
    the attainable-significance guard's warning, naming what the needed ``seeds`` are."""
    if table.empty:
        return []
    m = len(table)
    blocked = holm_columns(table, alpha)
    if not blocked:
        return []
    return [
        f"{family}: {blocked} of {m} test(s) cannot reach alpha = {alpha} whatever the data "
        f"(exact two-sided Wilcoxon, Holm over m = {m}); {seeds} needed: "
        f"{seeds_needed(alpha, m, 'two-sided')}."
    ]


def holm_columns(table: pd.DataFrame, alpha: float) -> int:
    """Holm over a family of exact tests (``p_wilcoxon``, ``min_attainable_p`` columns), in
    place: ``p_holm``, ``significant``, ``min_attainable_p_holm``, ``can_reach_alpha``. Returns
    how many tests cannot reach ``alpha`` whatever the data."""
    table["p_holm"] = holm(table["p_wilcoxon"].to_numpy(dtype=float), alpha)
    table["significant"] = table["p_holm"] <= alpha
    floor = holm_min_attainable_p(table["min_attainable_p"].to_numpy(dtype=float))
    table["min_attainable_p_holm"] = floor
    table["can_reach_alpha"] = floor <= alpha
    return int((~table["can_reach_alpha"]).sum())


def finish_family(
    table: pd.DataFrame, settings: StatsSettings, family: str, cautions: bool = True
) -> list[str]:
    """Add the family-wide columns (Holm, the guard) to a family of comparisons, in place, and
    return its warnings.

    ``cautions`` adds the general small-n cautions (bootstrap under-coverage, HL interval
    level); the report asks for them once, on its main family.
    """
    if len(table) == 0:
        for col in (c for s in statistics() for c in s.family_columns):
            table[col] = pd.Series(dtype=float)
        return []
    for stat in statistics():
        if stat.family is not None:
            stat.family(table, settings)
    warns = _guard_warnings(table, settings, family)
    if settings.zero_method == "wilcox" and (table["n_zeros"] > 0).any():
        k = int((table["n_zeros"] > 0).sum())
        warns.append(
            f"{family}: {k} comparison(s) have zero deltas (equal correct counts); "
            "zero_method=wilcox drops them from the signed-rank test, which then uses fewer "
            "pairs than n_pairs (column n_zeros); its floor min_attainable_p counts only the "
            "non-zero deltas (column n_nonzero)."
        )
    if cautions:
        warns += _small_n_cautions(table, settings)
    return warns


def _guard_warnings(table: pd.DataFrame, settings: StatsSettings, family: str) -> list[str]:
    """The comparisons that cannot reach alpha whatever the data, and the seeds needed.

    Floors count the non-zero deltas only (column n_nonzero): a zero delta adds a pair but no
    sign, so it cannot make a p-value smaller.
    """
    blocked = table[~table["can_reach_alpha"]]
    if not len(blocked):
        return []
    m, alt = len(table), settings.alternative
    side = "two-sided" if alt == "two-sided" else "one-sided"
    # equal n_nonzero => equal floor => equal Holm floor within a family
    by_n = blocked.groupby("n_nonzero")[["min_attainable_p", "min_attainable_p_holm"]].min()
    floors = ", ".join(
        f"n = {int(n)}: {r['min_attainable_p']:.4g}"
        + (f" ({r['min_attainable_p_holm']:.4g} after Holm)" if m > 1 else "")
        for n, r in by_n.iterrows()
    )
    alone = seeds_needed(settings.alpha, 1, alt)
    need = seeds_needed(settings.alpha, m, alt)
    return [
        f"{family}: {len(blocked)} of {m} comparison(s) cannot reach alpha = "
        f"{settings.alpha} whatever the data. Smallest exact {side} Wilcoxon p-value "
        f"with n non-zero deltas (zero deltas carry no sign; column n_nonzero): {floors}"
        + (
            f"; after Holm over m = {m}, the smallest adjusted p with every comparison at its floor"
            if m > 1
            else ""
        )
        + f". Seeds with a non-zero delta needed: {alone} for a single comparison"
        + (f", {need} with Holm over m = {m}." if m > 1 else ".")
    ]


def _small_n_cautions(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    warns = []
    if (table["n_pairs"] <= 6).any():
        warns.append(
            f"{int((table['n_pairs'] <= 6).sum())} comparison(s) have n <= 6 paired seeds: "
            "percentile bootstrap intervals of the mean delta under-cover badly at such n; "
            "read them as descriptive (the Hodges-Lehmann interval is exact where "
            "hl_ci_method = exact)."
        )
    approximate = table["hl_ci_method"] == "approximate"
    if approximate.any():
        warns.append(
            f"{int(approximate.sum())} Hodges-Lehmann interval(s) are approximate "
            "(hl_ci_method): their deltas contain a zero or a tied |delta| (columns n_zeros, "
            "n_tied), so the untied signed-rank distribution that sets the interval's rank is "
            "not their null distribution and the coverage only approximates hl_confidence."
        )
    low_level = table["hl_confidence"] < settings.confidence - 1e-9
    if low_level.any():
        warns.append(
            f"{int(low_level.sum())} Hodges-Lehmann interval(s) cannot reach "
            f"{settings.confidence:.0%} with so few pairs: they span [min, max] of the deltas, "
            "at the level in hl_confidence."
        )
    return warns


ZERO_POLICIES = {
    "wilcox": "zero deltas are dropped before ranking (Wilcoxon 1945; R's wilcox.test)",
    "pratt": "zero deltas are ranked, then their ranks dropped (Pratt 1959)",
    "zsplit": "zero deltas are ranked and their ranks split between signs",
}


def settings_record(settings: StatsSettings, m: int) -> dict[str, Any]:
    """The settings block of stats.json: every choice, stated in words as well (each
    statistic's words come from its registry entry)."""
    import statsmodels

    rec = asdict(settings)
    rec.update(
        confidence=settings.confidence,
        m=m,
        delta="operator - baseline test accuracy, from correct counts, in percentage points",
        zero_policy=ZERO_POLICIES[settings.zero_method],
        intervals="two-sided at level `confidence` whatever the alternative",
    )
    fields = dict(rec)
    for stat in statistics():
        rec.update((k, _fill(v, fields, stat.name, "record")) for k, v in stat.record.items())
    rec.update(scipy=scipy.__version__, statsmodels=statsmodels.__version__)
    return rec
