"""The statistics in words: report.md's compact cells and Method lines, and the warnings a
family of exact tests earns (floors above alpha, small samples).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis.stats.exact import StatsSettings, seeds_needed
from analysis.stats.registry import statistics


def summary_cells(row: pd.Series, record: Mapping[str, Any]) -> dict[str, Any]:
    """One comparison's cells in report.md's compact table: the effect estimates first, then
    the other statistics, in registry order."""
    ordered = [s for s in statistics() if s.leads_table] + [
        s for s in statistics() if not s.leads_table
    ]
    cells: dict[str, Any] = {}
    for stat in ordered:
        if stat.cells is not None:
            cells.update(stat.cells(row, record))
    return cells


def method_lines(record: Mapping[str, Any]) -> list[str]:
    """One line per statistic for report.md's Method section, from the settings record."""
    return [fill(stat.method, record, stat.name, "method") for stat in statistics()]


def fill(template: str, fields: Mapping[str, Any], name: str, part: str) -> str:
    try:
        return template.format(**fields)
    except KeyError as err:
        raise ValueError(
            f"statistic {name!r}: its {part} text names the field {err}, which the settings "
            f"record does not have; use one of {', '.join(sorted(fields))} (or add it to the "
            "statistic's record), and double literal braces"
        ) from None


def guard_warnings(table: pd.DataFrame, settings: StatsSettings, family: str) -> list[str]:
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


def small_n_cautions(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
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
