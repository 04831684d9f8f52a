"""Does an operator's effect depend on a grid axis? Interaction tests, and the report section
that shows them (``INTERACTION``: a table per axis, ``interaction.csv``); the embedding-scale
confound check that reads them is ``analysis.sections.study.scaling``.

For an extra grid axis (e.g. ``model.scale_embeddings: [true, false]``) with reference level r
(the first in the sweep file) and another level l, every seed paired at both levels gives,
inside each combination of the other group keys, the operator's delta against the baseline at
l minus its delta at r. The deltas are integer correct-count differences over a common
denominator (shown in percentage points), so ties are exact; the test is the exact two-sided
Wilcoxon signed-rank test of ``analysis.stats`` (two-sided whatever the report's alternative:
the direction of an interaction is not known in advance), and Holm's correction runs over every
interaction test of the report, a family apart from the main comparisons. An axis with more
than two levels gives one test per non-reference level, each against the reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.render.escape import md, md_code
from analysis.render.tables import Table, interaction_caption, interaction_table
from analysis.sections.base import Section, records, write_csv
from analysis.sections.context import ReportContext, display_order
from analysis.stats import (
    StatsSettings,
    common_denominator,
    exact_family_warnings,
    exact_test_columns,
)
from fusion_ray.schema import ADAPTIVE_TAG

#: Name of the interaction family in warnings and in report.md.
FAMILY = "interaction tests"
#: The section's CSV file: one row per interaction test.
CSV = "interaction.csv"
#: Columns of the interaction table after the comparison's name (axis, levels, keys, operator).
RESULT_COLUMNS = (
    "baseline",
    "n_pairs",
    "seeds",
    "median_delta_reference",
    "median_delta_level",
    "mean_interaction",
    "median_interaction",
    "hl_estimate",
    "hl_ci_low",
    "hl_ci_high",
    "hl_confidence",
    "hl_ci_method",
    "wins",
    "losses",
    "ties",
    "wilcoxon_stat",
    "p_wilcoxon",
    "wilcoxon_method",
    "n_zeros",
    "n_nonzero",
    "min_attainable_p",
    "p_holm",
    "significant",
    "min_attainable_p_holm",
    "can_reach_alpha",
)


@dataclass
class Interactions:
    """The interaction family of a report: one row per test, and what it could not test."""

    table: pd.DataFrame
    """One row per (axis, non-reference level, other group keys, operator): columns ``axis``,
    ``level``, ``reference``, every group key (the tested axis's own column empty), then
    ``RESULT_COLUMNS``; interaction values in pp, level minus reference."""
    levels: dict[str, list[str]]
    """The axes tested -> their levels, the reference first."""
    warnings: list[str] = field(default_factory=list)

    @property
    def m(self) -> int:
        """The size of the Holm family."""
        return len(self.table)

    def for_axis(self, axis: str) -> pd.DataFrame:
        """The rows testing ``axis``."""
        return self.table[self.table["axis"] == axis] if len(self.table) else self.table


def interaction_tests(
    pairing: Any, levels: Mapping[str, Sequence[str]], settings: StatsSettings | None = None
) -> Interactions:
    """Test, for every axis in ``levels`` (axis -> levels, the reference first), whether each
    operator's paired delta against the baseline differs between a level and the reference.

    ``pairing`` is an ``analysis.stats.pairing.Pairing`` whose keys include the axes; only seeds
    paired at both levels, in the same combination of the other keys, enter a test."""
    settings = settings or StatsSettings()
    keys = list(pairing.keys)
    pairs = pairing.pairs
    tested = {a: list(v) for a, v in levels.items() if a in keys and len(v) >= 2}
    rows: list[dict[str, Any]] = []
    warns: list[str] = []
    for axis, axis_levels in tested.items():
        others = [k for k in keys if k != axis]
        reference = axis_levels[0]
        at_reference = pairs[pairs[axis].astype(str) == reference]
        for level in axis_levels[1:]:
            at_level = pairs[pairs[axis].astype(str) == level]
            merged = at_level.merge(
                at_reference, on=[*others, "operator", "seed"], suffixes=("", "_ref")
            )
            if merged.empty:
                if len(at_level) or len(at_reference):
                    warns.append(
                        f"{FAMILY}: no seed is paired at both {axis} = {level} and the reference "
                        f"level {reference} in any group, so that interaction is not tested."
                    )
                continue
            for gkey, grp in merged.groupby([*others, "operator"], sort=True, dropna=False):
                ident = dict(zip([*others, "operator"], gkey, strict=True))
                head = {"axis": axis, "level": level, "reference": reference, **ident}
                rows.append({**head, **_test(grp, pairing.baseline, settings)})
    columns = ["axis", "level", "reference", *keys, "operator", *RESULT_COLUMNS]
    table = pd.DataFrame(rows).reindex(columns=columns)
    warns += _finish_family(table, settings)
    return Interactions(table=table, levels=tested, warnings=warns)


def _test(grp: pd.DataFrame, baseline: str, settings: StatsSettings) -> dict[str, Any]:
    """The interaction statistics of one (axis level, group, operator) from its seed rows."""
    grp = grp.sort_values("seed")
    total = grp["test_total"].to_numpy(np.int64)
    total_ref = grp["test_total_ref"].to_numpy(np.int64)
    denom = common_denominator(np.concatenate([total, total_ref]))
    at_level = (grp["correct"].to_numpy(np.int64) - grp["baseline_correct"].to_numpy(np.int64)) * (
        denom // total
    )
    at_ref = (
        grp["correct_ref"].to_numpy(np.int64) - grp["baseline_correct_ref"].to_numpy(np.int64)
    ) * (denom // total_ref)
    num = at_level - at_ref
    pp = 100.0 * num / denom
    return {
        "baseline": baseline,
        "n_pairs": len(num),
        "seeds": ",".join(str(int(s)) for s in grp["seed"]),
        "median_delta_reference": float(np.median(100.0 * at_ref / denom)),
        "median_delta_level": float(np.median(100.0 * at_level / denom)),
        "mean_interaction": float(pp.mean()),
        "median_interaction": float(np.median(pp)),
        **exact_test_columns(num, settings, scale=100.0 / denom),
    }


def _finish_family(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """Holm over the whole family and the attainable-significance guard (the floors count the
    non-zero differences only, as the main family's do), in place; returns the guard's
    warning."""
    return exact_family_warnings(
        table,
        settings.alpha,
        FAMILY,
        "seeds paired at both levels with a non-zero difference",
        settings.descriptive,
    )


# ----------------------------------------------------------------------------- the section


class InteractionSection(Section):
    """The interaction tests of the grid's extra axes (none without extra axes)."""

    name = "interaction"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> Interactions | None:
        levels = ctx.axis_levels
        if not levels:
            return None
        inter = interaction_tests(ctx.pairing, levels, ctx.options.settings)
        inter.table = interaction_order(inter.table, ctx.datasets, ctx.operators, levels)
        warnings += inter.warnings
        return inter

    def tables(self, result: Interactions, ctx: ReportContext) -> dict[str, Table]:
        adaptive = bool(ctx.experiment.parent_tags.get(ADAPTIVE_TAG))
        return interaction_tables(result, ctx.keys, ctx.record, ctx.axes, stars=not adaptive)

    def markdown(self, result: Interactions, ctx: ReportContext) -> list[str]:
        return interaction_markdown(result, self.tables(result, ctx), ctx)

    def data_files(self, result: Interactions, ctx: ReportContext) -> list[Path]:
        return [write_csv(result.table, ctx.out_dir / CSV)]

    def record(self, result: Interactions | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        test = (
            "exact two-sided Wilcoxon signed-rank of per-seed (delta at level - delta at the "
            "reference level); Holm over all interaction tests"
        )
        return {"interaction_tests": {"m": result.m, "test": test, "rows": records(result.table)}}

    def listed_files(self, result: Interactions | None) -> list[str]:
        return [f"`{CSV}`"] if result is not None else []


def interaction_tables(
    interactions: Interactions,
    keys: list[str],
    settings: Any,
    axes: list[str],
    stars: bool = True,
) -> dict[str, Table]:
    """One "does the operator effect depend on <axis>?" table per setting axis (``stars``:
    mark Holm's rejections; False in an adaptive sweep, where these tests are descriptive)."""
    return {
        f"interaction:{axis}": interaction_table(
            interactions.for_axis(axis), axis, keys, settings, interactions.m, axes, stars
        )
        for axis in interactions.levels
    }


def interaction_order(
    table: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    levels: dict[str, list[str]],
) -> pd.DataFrame:
    """Interaction tests by axis and level (sweep file's order), then as ``display_order``."""
    if table.empty:
        return table
    ordered = display_order(table, datasets, operators, levels)
    axis_rank = {a: i for i, a in enumerate(levels)}
    level_rank = ordered.apply(lambda r: levels[r["axis"]].index(str(r["level"])), axis=1)
    return (
        ordered.assign(_x=ordered["axis"].map(axis_rank), _l=level_rank)
        .sort_values(["_x", "_l"], kind="stable")
        .drop(columns=["_x", "_l"])
        .reset_index(drop=True)
    )


def interaction_markdown(
    inter: Interactions, tables: dict[str, Table], ctx: ReportContext
) -> list[str]:
    """One table per extra grid axis: does the operator effect depend on it?"""
    lines = ["## Interaction tests", ""]
    if ctx.experiment.parent_tags.get(ADAPTIVE_TAG):
        lines += [
            "This sweep ran adaptive seeds: the seeds each cell got depended on the decisions, "
            "so these fixed-n tests are descriptive only (no star marks them). The "
            "interactions are decided in the Decisions section (kind `interaction`).",
            "",
        ]
    for axis in ctx.axes:
        table = tables.get(f"interaction:{axis}")
        if table is not None and len(table.display):
            lines += [table.to_markdown(), ""]
            continue
        compared = sorted(set(ctx.pairing.pairs[axis].astype(str)))
        why = (
            f"every comparison is at {md(axis)} = {md(compared[0])}"
            if len(compared) == 1
            else f"no seed is paired with {md_code(ctx.baseline)} at two levels of "
            f"{md_code(axis)} in the same combination of the other group keys"
        )
        lines += [f"**{md(interaction_caption(axis))}** Not tested: {why}.", ""]
    if inter.m:
        lines += [f"Every column of these tests is in `{CSV}`.", ""]
    return lines


INTERACTION = InteractionSection()
