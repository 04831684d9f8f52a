"""The report's "Decisions" section, first after the summary: each comparison's anytime-valid
decision (``fusion_ray.decide.sequential``) from its per-seed paired deltas in seed order.

For an adaptive sweep (its parent run carries ``schema.ADAPTIVE_TAG``) this is the primary
analysis, with the sweep's own rule (alpha, margin, cap): the seeds each comparison got depended
on the evidence, so the fixed-n tests further down are descriptive only. For a fixed-seed
sweep it is a secondary view at the report's alpha, with no cap or margin: how close each
comparison is to a decision that would stay valid if seeds were added.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import pandas as pd

from analysis.render import drawing
from analysis.render.drawing import Figure, save
from analysis.render.escape import md, md_code
from analysis.sections.base import Drawn, Section, records, write_csv
from analysis.sections.context import ReportContext
from analysis.stats.verdicts import DecisionResult, verdicts
from fusion_ray.decide.sequential import decisions_footnotes
from fusion_ray.schema import DECISIONS_FILE

FIGURE = "decisions_e_process"
FOREST = "decisions_forest"


class DecisionsSection(Section):
    """Anytime-valid decisions per comparison; first in the report."""

    name = "decisions"
    follows = "summary"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> DecisionResult | None:
        alpha = float(ctx.options.settings.alpha)
        return verdicts(
            ctx.experiment, ctx.pairing, alpha=alpha, datasets=ctx.datasets, warnings=warnings
        )

    def markdown(self, result: DecisionResult, ctx: ReportContext) -> list[str]:
        saved = _saved(result, ctx) if result.primary else []
        return [*_intro(result), *saved, "", *_table_lines(result.table, result.alpha), ""]

    def figures(self, result: DecisionResult, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        m = len(result.evidence)
        if result.rule.family == "holm":
            how = f"Holm's thresholds (1/alpha to m/alpha, m = {m}) on the running maximum"
        else:
            how = (
                f"the closed test's thresholds: 1/alpha (dotted) is the least, m/alpha (dashed, "
                f"m = {m}) always suffices; where in between depends on the other comparisons"
            )
        caption = (
            "One panel per comparison: its e-value for 'no effect' by seed (solid"
            + (", and for '|effect| >= margin' dash-dotted" if result.margin else "")
            + f") against {how}. A marker shows where the comparison was decided."
        )
        level = result.table["ci_level"].dropna()  # alpha R / m: what the intervals may miss
        at = f"{1 - float(level.iloc[0]):.1%}" if len(level) else "none decided"
        forest_caption = (
            f"Every hypothesis of the family, its Hodges-Lehmann estimate (points of accuracy) "
            f"with its e-BY interval ({at}, valid for the decided ones together) where decided, "
            "and, greyed, its simultaneous confidence sequence where it is open or was stopped "
            "as futile (not drawn while unbounded); its verdict at the right."
        )
        title = "Decisions" + ("" if result.primary else " (a secondary view: fixed seeds)")
        forest = drawing.forest(result.table, fig_dir, FOREST, title)
        return [(forest_caption, forest), (caption, _draw(result, fig_dir))]

    def data_files(self, result: DecisionResult, ctx: ReportContext) -> list[Path]:
        return [write_csv(result.table, ctx.out_dir / DECISIONS_FILE)]

    def record(self, result: DecisionResult | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        rule = {
            "alpha": result.alpha,
            "margin": result.margin,
            "max_seeds": result.max_seeds,
            "first": result.first,
            "rule": result.rule.describe(),
            "null": result.rule.null,
        }
        return {"decisions": {"primary": result.primary, **rule, "rows": records(result.table)}}

    def listed_files(self, result: DecisionResult | None) -> list[str]:
        return [DECISIONS_FILE] if result is not None else []


def _intro(result: DecisionResult) -> list[str]:
    table = result.table
    summary = "; ".join(
        f"{kind}: " + ", ".join(f"{n} {v}" for v, n in rows["verdict"].value_counts().items())
        for kind, rows in table.groupby("kind", sort=False)
    )
    rule = result.rule
    margin = (
        f"equivalence margin ±{result.margin:g} points"
        if result.margin
        else "no equivalence margin, so no hypothesis can be decided equivalent"
    )
    if rule.family == "closure":
        guarantee = (
            f"the chance of any wrong decision in the family (a verdict for a hypothesis whose "
            f"null is true: an operator without effect, an effect that does not change with "
            f"length or with a setting; or a false equivalent) is at most alpha = "
            f"{result.alpha:g}, at every seed, whatever the stopping (closed testing with the "
            "mean of current e-values over every hypothesis); a wrong direction for a real "
            "effect is outside that proof, and the benchmark measured it below alpha"
        )
    else:
        guarantee = (
            f"the chance of a false better or worse is at most alpha = {result.alpha:g} at every "
            "seed (Holm over the anytime p-values); equivalence uses its own budget"
        )
    setting = f"rule {md_code(rule.describe())}, null: {rule.null}; {margin}"
    if result.primary:
        what = (
            f"**Primary analysis.** This sweep ran adaptive seeds (cap {result.max_seeds} seeds, "
            f"first wave {result.first}; {setting}): each hypothesis got seeds until it was "
            f"decided. The guarantee: {guarantee}. The fixed-n p-values and intervals in the "
            "tables below are descriptive only, since the number of seeds depended on the data."
        )
    else:
        what = (
            "**Secondary view.** This sweep ran a fixed list of seeds, and the fixed-n tests "
            f"below are its primary analysis. Here the same runs are read as anytime-valid "
            f"evidence ({setting}): a decision here would stay valid if seeds were added; "
            "'open' says more seeds could still decide."
        )
    return ["## Decisions", "", what, "", f"Verdicts: {summary}."]


def _saved(result: DecisionResult, ctx: ReportContext) -> list[str]:
    """What adaptivity saved: trials and trial time run, against the same grid at the cap with
    fixed seeds (each cell's time estimated by its runs' mean)."""
    runs = ctx.pairing.runs
    if runs.empty or result.max_seeds is None:
        return []
    cells = runs.groupby([*ctx.pairing.keys, "operator"], dropna=False)
    at_cap = len(cells) * result.max_seeds
    text = (
        f"What adaptivity saved: {len(runs)} trials ran, against {at_cap} for the same grid with "
        f"{result.max_seeds} fixed seeds ({len(runs) / at_cap:.0%})"
    )
    if "train_seconds" in runs and runs["train_seconds"].notna().all():
        spent = runs["train_seconds"].sum() / 3600
        full = (cells["train_seconds"].mean() * result.max_seeds).sum() / 3600
        text += f"; {spent:.3g} trial-hours of training against an estimated {full:.3g}"
    return ["", text + "."]


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _interval(low: Any, high: Any) -> str:
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "-"
    return f"({_fmt(low, '+.2f')}, {_fmt(high, '+.2f')})"


def _table_lines(table: pd.DataFrame, alpha: float = 0.05) -> list[str]:
    lines = [
        "| hypothesis | kind | verdict | decided after (seeds) | seeds | p family | mean | median "
        "| HL | e-BY interval | simultaneous CS | failed runs | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict(orient="records"):
        after = "-" if pd.isna(r["decided_at_seed"]) else str(int(r["decided_at_seed"]) + 1)
        lines.append(
            f"| {md(r['comparison'])} | {md(r['kind'])} | {md(r['verdict'])} | {after} | "
            f"{r['seeds_used']} | {_fmt(r['p_family'], '.3g')} | {_fmt(r['mean'], '+.2f')} | "
            f"{_fmt(r['median'], '+.2f')} | {_fmt(r['hodges_lehmann'], '+.2f')} | "
            f"{_interval(r['ci_low'], r['ci_high'])} | {_interval(r['cs_low'], r['cs_high'])} | "
            f"{r['failed_runs']} | {md(r['note'] or '')} |"
        )
    # the decisions table's columns are named by str (DecisionResult.table)
    rows = cast("list[dict[str, Any]]", table.to_dict(orient="records"))
    footnotes = decisions_footnotes(rows, alpha)
    for line in footnotes:  # one paragraph each, under the table
        lines += ["", md(line)]
    return lines


def _panel_title(name: str, verdict: str) -> str:
    """A panel's title in a panel's width: the contrast, its group wrapped at ``/``, and the
    verdict in the table's words."""
    group, _, contrast = name.rpartition(": ")
    lines: list[str] = []
    for part in group.split("/"):
        if lines and len(lines[-1]) + len(part) < PANEL_TITLE_CHARS:
            lines[-1] += "/" + part
        else:
            lines.append(part)
    return "\n".join([contrast, *lines, verdict])


PANEL_TITLE_CHARS = 34
"""Characters of a title line that fit a panel 3 inches wide at 7 points."""


def _draw(result: DecisionResult, fig_dir: Path) -> list[Path]:
    """One small panel per comparison, so that no line hides another."""
    m = len(result.evidence)
    cols = min(3, m)
    rows = math.ceil(m / cols)
    fig = Figure(figsize=(3.0 * cols, 2.3 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    verdicts = dict(zip(result.table["comparison"], result.table["verdict"], strict=True))
    for ax, (name, looks) in zip(axes.flat, result.evidence.items(), strict=False):
        seeds = [lk.seed for lk in looks]
        ax.step(seeds, [lk.e_value for lk in looks], where="post", color="C0")
        if result.margin:
            ax.step(seeds, [lk.e_equivalent for lk in looks], where="post", color="C2", ls="-.")
        ax.axhline(1 / result.alpha, color="grey", linestyle=":", linewidth=1)
        ax.axhline(m / result.alpha, color="grey", linestyle="--", linewidth=1)
        decided = next((lk for lk in looks if lk.state != "open"), None)
        if decided is not None:
            value = decided.e_equivalent if decided.state == "equivalent" else decided.e_value
            ax.plot([decided.seed], [value], marker="o", color="C3")
        ax.set_yscale("log")
        ax.set_title(_panel_title(name, verdicts.get(name, looks[-1].state)), fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[m:]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seed", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("e-value", fontsize=7)
    return save(fig, fig_dir, FIGURE)


DECISIONS = DecisionsSection()
