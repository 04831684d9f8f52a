"""report.md, written from a report's context: one function per section."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from analysis.context import ARTIFACT_PATH, ReportContext
from analysis.paired import method_lines
from analysis.schema import (
    CELLS_ARTIFACT,
    OPERATOR_KWARGS_PREFIX,
    OPERATOR_PARAM,
    ROLE_SWEEP,
    ROLE_TAG,
)
from analysis.tables import describe_setting, select, stats_table

TABLES = ("table1", "table2", "table3")


def render_report(ctx: ReportContext) -> str:
    """The whole of report.md."""
    lines = [
        *_header(ctx),
        *_warnings(ctx),
        *_method(ctx),
        *_tables(ctx),
        *_paired_statistics(ctx),
        *_length_analysis(ctx),
        *_figures(ctx),
        *_gaps(ctx),
        *_files(),
    ]
    return "\n".join(lines)


def _header(ctx: ReportContext) -> list[str]:
    exp, pairing = ctx.experiment, ctx.pairing
    runs = exp.runs
    status = ", ".join(f"{v} {k}" for k, v in runs["status"].value_counts().items())
    shas = sorted(set(runs["git_sha"].dropna()))
    scope = f" (restricted to {ctx.scope})" if ctx.scope else ""
    if ctx.logged_to:
        parent = f"`{exp.parent_run_id}`; this report is logged to it under `{ARTIFACT_PATH}/`"
    elif exp.parent_run_id:
        parent = f"`{exp.parent_run_id}` (not logged: --no-log)"
    else:
        parent = f"none (no run tagged {ROLE_TAG}={ROLE_SWEEP}), so this report is on disk only"
    return [
        f"# Fusion analysis: `{exp.name}`",
        "",
        f"- tracking URI: `{exp.tracking_uri}` (experiment id {exp.experiment_id})",
        f"- trial runs: {len(runs)} ({status}); analysed: {len(pairing.runs)} FINISHED runs, "
        f"{len(pairing.pairs)} seed pairs, {len(ctx.comparisons.table)} comparisons against "
        f"`{ctx.baseline}`{scope}",
        *_sweep_cells(ctx),
        f"- sweep parent run: {parent}",
        f"- code: git_sha {', '.join(s[:12] for s in shas) if shas else 'not tagged'}",
        f"- generated {ctx.generated_at}",
        "",
    ]


def _sweep_cells(ctx: ReportContext) -> list[str]:
    """The header line on the sweep's cells and the runs of other settings (none without
    sweep_cells.json)."""
    other = ctx.other_settings
    if other.sweep_cells is None:
        return []
    runs = other.sentence or "every trial run of the experiment is one of them."
    return [f"- sweep cells: {other.sweep_cells} (`{CELLS_ARTIFACT}` of the parent run); {runs}"]


def _warnings(ctx: ReportContext) -> list[str]:
    return ["## Warnings", "", *([f"- {w}" for w in ctx.warnings] or ["- none"]), ""]


def _method(ctx: ReportContext) -> list[str]:
    """How pairs are formed, then one line per statistic from the settings record."""
    pairing = (
        f"Within each {' x '.join(ctx.keys)} group, each operator is paired with "
        f"`{ctx.baseline}` by seed (same seed: same initialisation of shared modules, same "
        "batch order, same data split), using only seeds where both runs FINISHED and whose "
        f"configs agree on every param except `{OPERATOR_PARAM}` and "
        f"`{OPERATOR_KWARGS_PREFIX}*`. A delta is (operator - baseline) test accuracy computed "
        "from the integer correct counts, shown in percentage points (pp); ranks and ties are "
        "taken on the integers, so round-off cannot create or break ties."
    )
    bullets = [f"- {line}" for line in method_lines(ctx.record)]
    return ["## Method", "", pairing, "", *bullets, ""]


def _tables(ctx: ReportContext) -> list[str]:
    lines = []
    for key in TABLES:
        table = ctx.tables[key]
        lines += ["## " + table.caption.split(".")[0], "", table.to_markdown(), ""]
    return lines


def _paired_statistics(ctx: ReportContext) -> list[str]:
    table = ctx.comparisons.table
    if not len(table):
        return ["## Paired statistics", "", "No complete pair: nothing to compare yet.", ""]
    return [
        "## Paired statistics",
        "",
        stats_table(table, ctx.keys, ctx.record).to_markdown(),
        "",
        f"`*`: Holm-adjusted p ≤ {ctx.options.settings.alpha}. Every column, and more "
        "(Clopper-Pearson bounds, HL interval confidence, n_zeros, wilcoxon_method), is in "
        "`stats.csv`.",
        "",
    ]


def _length_analysis(ctx: ReportContext) -> list[str]:
    lengths = ctx.lengths
    if lengths is None or lengths.stats.empty:
        return []
    lines = [
        "## Length-aware analysis",
        "",
        "Test documents of each dataset are cut into length quantile buckets (tokens "
        "before truncation). Per bucket, paired deltas of correct counts get the same "
        "statistics as above (Holm over all bucket comparisons); `long-short` is, per seed, "
        "the delta in the longest bucket minus the delta in the shortest (Holm over the "
        "contrasts): a positive, significant contrast means the operator's advantage grows "
        "with length inside the dataset.",
        "",
        "| dataset | bucket | tokens | documents | truncated |",
        "|---|---|---|---|---|",
    ]
    for _, r in lengths.buckets.iterrows():
        trunc = "–" if pd.isna(r["truncated_share"]) else f"{r['truncated_share']:.0%}"
        lines.append(f"| {r['dataset']} | {r['bucket']} | {r['label']} | {r['n_docs']} | {trunc} |")
    lines += [
        "",
        f"Contrasts and buckets in the main setting ({describe_setting(ctx.main_setting)}):",
        "",
        "| dataset | operator | bucket | n | Δ mean (pp) | HL | p | p Holm | wins |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in select(lengths.stats, ctx.main_setting).iterrows():
        lines.append(
            f"| {r['dataset']} | {r['operator']} | {r['bucket']} | {int(r['n_pairs'])} | "
            f"{r['mean_delta']:+.2f} | {r['hl_estimate']:+.2f} | {_fmt_p(r['p_wilcoxon'])} | "
            f"{_fmt_p(r['p_holm'])}{'*' if r['significant'] else ''} | "
            f"{int(r['wins'])}/{int(r['n_pairs'])} |"
        )
    return [*lines, "", "All settings: `length_stats.csv`, `length_accuracy.csv`.", ""]


def _figures(ctx: ReportContext) -> list[str]:
    lines = ["## Figures", ""]
    if not ctx.figures:
        lines += ["None drawn (--no-figures, or nothing to draw).", ""]
    for caption, path in ctx.figures:
        rel = path.relative_to(ctx.out_dir).as_posix()
        lines += [f"**{caption}** (PDF: `{rel[:-4]}.pdf`)", "", f"![{caption}]({rel})", ""]
    return lines


def _gaps(ctx: ReportContext) -> list[str]:
    """What could not be paired: always the incomplete blocks and duplicate cells, the excluded
    runs and groups without a baseline only when there are some."""
    p, keys = ctx.pairing, ctx.keys
    sections = [
        _listing(
            "Incomplete blocks",
            p.incomplete,
            [*keys, "seed", "missing"],
            "- none: every seed of every group has every operator",
        ),
        _listing(
            "Duplicate cells",
            p.duplicates,
            [*keys, "operator", "seed", "run_ids", "differing_params"],
            "- none",
        ),
        _listing("Excluded runs", p.excluded, ["run_id", "run_name", "missing"]),
        _listing("Groups without a baseline", p.no_baseline, keys),
    ]
    lines: list[str] = []
    for section in filter(None, sections):
        lines += [*([""] if lines else []), *section]
    return lines


def _listing(
    title: str, frame: pd.DataFrame, columns: Sequence[str], empty: str | None = None
) -> list[str]:
    """A section listing one row per line; [] for an empty frame without an ``empty`` line."""
    if not len(frame):
        return ["## " + title, "", empty] if empty is not None else []
    items = [
        "- " + ", ".join(f"{c}={row[c]}" for c in columns if c in row and pd.notna(row[c]))
        for _, row in frame.iterrows()
    ]
    return ["## " + title, "", *items]


def _files() -> list[str]:
    return [
        "",
        "## Files",
        "",
        "`stats.csv`, `stats.json` (with every setting), `length_stats.csv`, "
        "`length_accuracy.csv`, `runs.csv`, `tables/` (Markdown, LaTeX, CSV), `figures/` "
        "(PNG, PDF).",
        "",
    ]


def _fmt_p(p: float) -> str:
    return "–" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.4g}"
