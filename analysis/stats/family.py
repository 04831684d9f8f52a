"""Every registered statistic over a family of comparisons (``compare``): the paired deltas
from correct counts, the per-comparison columns, the family-wide ones (Holm, the guard) and the
settings record written to stats.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy

from analysis.stats.exact import (
    StatsSettings,
    hodges_lehmann,
    holm,
    holm_min_attainable_p,
    min_attainable_p,
    seeds_needed,
    wilcoxon_signed_rank,
)
from analysis.stats.present import fill, guard_warnings, small_n_cautions
from analysis.stats.registry import statistics
from analysis.stats.statistic import PairedDeltas


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


@dataclass
class Comparisons:
    """The stats table of a report (one row per comparison), per-seed deltas and warnings."""

    table: pd.DataFrame
    deltas: pd.DataFrame
    """One row per paired seed: group, operator, seed, accuracies and delta (pp)."""
    settings: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    decisions: pd.DataFrame | None = None
    """The anytime-valid decisions of every hypothesis (``DECISION_COLUMNS``), when
    ``analysis.compare`` was given the experiment; for an adaptive sweep they are its verdicts
    and this table is descriptive."""


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

    ``pairing`` is an ``analysis.stats.pairing.Pairing``. Holm's correction runs over every
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


def exact_family_warnings(
    table: pd.DataFrame, alpha: float, family: str, seeds: str, descriptive: bool = False
) -> list[str]:
    """Holm over a family of ``exact_test_columns`` rows (``holm_columns``), in place; returns
    the attainable-significance guard's warning, naming what the needed ``seeds`` are."""
    if table.empty:
        return []
    m = len(table)
    blocked = holm_columns(table, alpha, descriptive)
    if not blocked:
        return []
    return [
        f"{family}: {blocked} of {m} test(s) cannot reach alpha = {alpha} whatever the data "
        f"(exact two-sided Wilcoxon, Holm over m = {m}); {seeds} needed: "
        f"{seeds_needed(alpha, m, 'two-sided')}."
    ]


def holm_columns(table: pd.DataFrame, alpha: float, descriptive: bool = False) -> int:
    """Holm over a family of exact tests (``p_wilcoxon``, ``min_attainable_p`` columns), in
    place: ``p_holm``, ``significant`` (False throughout when ``descriptive``: after adaptive
    seeds), ``min_attainable_p_holm``, ``can_reach_alpha``. Returns how many tests cannot reach
    ``alpha`` whatever the data."""
    table["p_holm"] = holm(table["p_wilcoxon"].to_numpy(dtype=float))
    table["significant"] = (table["p_holm"] <= alpha) & (not descriptive)
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
    warns = guard_warnings(table, settings, family)
    if settings.zero_method == "wilcox" and (table["n_zeros"] > 0).any():
        k = int((table["n_zeros"] > 0).sum())
        warns.append(
            f"{family}: {k} comparison(s) have zero deltas (equal correct counts); "
            "zero_method=wilcox drops them from the signed-rank test, which then uses fewer "
            "pairs than n_pairs (column n_zeros); its floor min_attainable_p counts only the "
            "non-zero deltas (column n_nonzero)."
        )
    if cautions:
        warns += small_n_cautions(table, settings)
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
        rec.update((k, fill(v, fields, stat.name, "record")) for k, v in stat.record.items())
    rec.update(scipy=scipy.__version__, statsmodels=statsmodels.__version__)
    return rec
