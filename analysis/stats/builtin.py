"""The built-in statistics, in stats.csv order: the mean delta with its bootstrap interval,
Wilcoxon's exact test with Holm, the sign test, Hodges-Lehmann, the effect sizes and the
attainable-significance guard, each with its cells in report.md's table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats.exact import (
    StatsSettings,
    bootstrap_ci,
    hl_interval_method,
    hodges_lehmann,
    holm,
    holm_min_attainable_p,
    key_seed,
    min_attainable_p,
    seeds_needed,
    sign_test,
)
from analysis.stats.statistic import PairedDeltas, Statistic


def _mean_delta(d: PairedDeltas) -> dict[str, Any]:
    s, pp, n = d.settings, d.pp, d.n
    low, high = bootstrap_ci(pp, s.confidence, s.n_bootstrap, key_seed(s.bootstrap_seed, d.key))
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
    table["p_holm"] = holm(table["p_wilcoxon"].to_numpy())
    table["significant"] = (table["p_holm"] <= settings.alpha) & (not settings.descriptive)


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
            "(the values of statsmodels multipletests(method='holm'); its default 'hs' is "
            "Holm-Sidak)",
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
