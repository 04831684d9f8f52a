"""report.md, written from a report's context: the core's parts, and each section's lines
after the part it follows (``Section.follows``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from analysis.render.escape import line_start, md, md_code, md_prose
from analysis.render.tables import latency_note, stats_table
from analysis.sections.base import PARTS, Section
from analysis.sections.context import ARTIFACT_PATH, ReportContext
from analysis.stats import method_lines
from fusion_ray.decide.questions import operator_hypothesis
from fusion_ray.redact import redact
from fusion_ray.schema import (
    CELLS_ARTIFACT,
    GRID_AXES_TAG,
    OPERATOR_KWARGS_PREFIX,
    OPERATOR_PARAM,
    POSITION_ALIAS_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
)

TABLES = ("table1", "table2", "table3")


def render_report(ctx: ReportContext, sections: Sequence[Section]) -> str:
    """The whole of report.md: the core's parts in order, each followed by the sections that
    follow it (in list order), then the "Files" line."""
    core: dict[str, Callable[[ReportContext], list[str]]] = {
        "header": _header,
        "summary": _summary,
        "tables": _tables,
        "paired statistics": _paired_statistics,
        "figures": _figures,
        "method": _method,
        "gaps": _gaps,
        "warnings": _warnings,
    }
    assert list(core) == list(PARTS), "report_md and section.PARTS disagree"
    lines: list[str] = []
    for part, write in core.items():
        lines += write(ctx)
        for section in sections:
            result = ctx.results.get(section.name)
            if section.follows == part and result is not None:
                lines += section.markdown(result, ctx)
    lines += _files(ctx, sections)
    return "\n".join(lines)


def _header(ctx: ReportContext) -> list[str]:
    exp, pairing = ctx.experiment, ctx.pairing
    runs = exp.runs
    status = ", ".join(f"{v} {md(k)}" for k, v in runs["status"].value_counts().items())
    shas = sorted(set(runs["git_sha"].dropna()))
    scope = f" (restricted to {md(ctx.scope)})" if ctx.scope else ""
    if ctx.logged_to:
        parent = (
            f"{md_code(exp.parent_run_id)}; this report is logged to it under `{ARTIFACT_PATH}/`"
        )
    elif exp.parent_run_id:
        parent = f"{md_code(exp.parent_run_id)} (not logged: --no-log)"
    else:
        parent = f"none (no run tagged {ROLE_TAG}={ROLE_SWEEP}), so this report is on disk only"
    return [
        f"# Fusion analysis: {md_code(exp.name)}",
        "",
        f"- tracking URI: {md_code(redact(exp.tracking_uri))} (experiment id {md(exp.experiment_id)})",
        f"- trial runs: {len(runs)} ({status}); analysed: {len(pairing.runs)} FINISHED runs, "
        f"{len(pairing.pairs)} seed pairs, {len(ctx.comparisons.table)} comparisons against "
        f"{md_code(ctx.baseline)}{scope}",
        *_sweep_cells(ctx),
        f"- sweep parent run: {parent}",
        f"- code: git_sha {', '.join(md(s[:12]) for s in shas) if shas else 'not tagged'}",
        f"- generated {ctx.generated_at}",
        "",
    ]


def _sweep_cells(ctx: ReportContext) -> list[str]:
    """The header line on the sweep's cells and the runs of other settings (none without
    sweep_cells.json)."""
    other = ctx.other_settings
    if other.sweep_cells is None:
        return []
    runs = (
        md_prose(other.sentence)
        if other.sentence
        else "every trial run of the experiment is one of them."
    )
    return [f"- sweep cells: {other.sweep_cells} (`{CELLS_ARTIFACT}` of the parent run); {runs}"]


WARNINGS_FILE = "warnings.md"
"""Every warning of the report in full (report.md shows each in one line, at the end)."""


def one_line(warning: str, width: int = 160) -> str:
    """A warning's first clause, at most ``width`` characters (the whole is in warnings.md)."""
    first = warning.split("; ")[0].split(". ")[0].rstrip(".")
    return first if len(first) <= width else first[: width - 1].rstrip() + "…"


def warnings_text(ctx: ReportContext) -> str:
    """warnings.md: every warning of the report, in full."""
    items = [f"{i}. {md_prose(w)}" for i, w in enumerate(ctx.warnings, 1)] or ["None."]
    return "\n".join([f"# Warnings: {md_code(ctx.experiment.name)}", "", *items, ""])


def _warnings(ctx: ReportContext) -> list[str]:
    if not ctx.warnings:
        return ["## Warnings", "", "- none", ""]
    lines = [f"- {md_prose(one_line(w))}" for w in ctx.warnings]
    return ["## Warnings", "", *lines, "", f"Each in full: `{WARNINGS_FILE}`.", ""]


def _where(row: pd.Series, ctx: ReportContext) -> str:
    """A comparison's group in words: ``short, sinusoidal, none, scale_embeddings=true``."""
    parts = []
    for key in ctx.keys:
        value = row[key]
        parts.append(f"{md(key.rsplit('.', 1)[-1])}={md(value)}" if key in ctx.axes else md(value))
    return ", ".join(parts)


def _verdict(row: pd.Series, ctx: ReportContext, decided: dict[str, Any] | None) -> str:
    """The comparison's verdict: the anytime-valid decision when it is the primary analysis,
    else the fixed-n test after Holm."""
    baseline = md(ctx.baseline)
    if decided is not None:
        return _decided_words(decided, f"than {baseline}", f"to {baseline}")
    alpha = ctx.options.settings.alpha
    if bool(row.get("significant")):
        side = "better" if row["mean_delta"] > 0 else "worse"
        return f"**{side} than {baseline}** (p Holm {row['p_holm']:.3g} <= {alpha:g})"
    return f"no significant difference (p Holm {row['p_holm']:.3g} > {alpha:g})"


def _decided_words(decided: dict[str, Any], than: str = "", to: str = "") -> str:
    """A decision row's verdict in words, with the seeds it was reached at."""
    state, verdict = decided["state"], decided.get("verdict", decided["state"])
    after = decided.get("decided_at_seed")
    seeds = decided["seeds_used"] if after is None or pd.isna(after) else int(after) + 1
    words = {
        "better": f"{verdict} {than}".strip(),
        "worse": f"{verdict} {than}".strip(),
        "equivalent": f"equivalent {to} within the margin".replace("  ", " "),
        "futile": "stopped as futile (it could no longer be decided by the cap)",
        "open": "undecided at the cap",
    }[state]
    if state in ("better", "worse"):
        return f"**{words}** after {seeds} seeds (anytime p family {decided['p_family']:.3g})"
    return f"**{words}** after {seeds} seeds"


def _interval_words(decided: dict[str, Any]) -> str:
    """The estimates of a decision row, and its e-BY interval where it was decided."""
    text = (
        f"mean {decided['mean']:+.2f}, median {decided['median']:+.2f}, Hodges-Lehmann "
        f"{decided['hodges_lehmann']:+.2f} points"
    )
    low, high = decided.get("ci_low", math.nan), decided.get("ci_high", math.nan)
    if decided["state"] in ("better", "worse", "equivalent") and not (
        pd.isna(low) or pd.isna(high)
    ):
        text += (
            f"; e-BY interval {low:+.2f} to {high:+.2f} (false coverage rate at most alpha over "
            "the decided hypotheses)"
        )
    if decided.get("failed_runs"):
        text += f"; {int(decided['failed_runs'])} failed run(s) counted as losses"
    note = decided.get("note")
    if isinstance(note, str) and note:
        text += f" ({md(note)})"
    return text


def _anytime_effect(row: pd.Series, decided: dict[str, Any]) -> str:
    """Wins, the estimates and the e-BY interval of a decided comparison."""
    return f"{int(row['wins'])} of {int(row['n_pairs'])} seeds won; " + _interval_words(decided)


def _summary(ctx: ReportContext) -> list[str]:
    """One line per comparison a reader can paste: effect, interval, seeds, verdict; in an
    adaptive sweep then one line per length and interaction hypothesis."""
    table = ctx.comparisons.table
    if not len(table):
        return []
    result = ctx.results.get("decisions")
    primary = getattr(result, "primary", False)
    rows = (
        {r["comparison"]: r for r in result.table.to_dict("records")}
        if primary and result is not None
        else {}
    )
    lines = ["## Summary", ""]
    for _, row in table.iterrows():
        where = _where(row, ctx)
        group = tuple((k, str(row[k])) for k in ctx.keys)
        name = operator_hypothesis(group, str(row["operator"]), str(ctx.baseline)).name
        decided = rows.get(name) if primary else None
        if decided is not None:
            effect = _anytime_effect(row, decided)
        else:
            effect = (
                f"{row['mean_delta']:+.2f} points (95 % CI {row['ci_low']:+.2f} to "
                f"{row['ci_high']:+.2f}; wins {int(row['wins'])} of {int(row['n_pairs'])} seeds)"
            )
        head = f"- {md_code(row['operator'])} vs {md_code(ctx.baseline)} on {where}: "
        if decided is not None:
            lines.append(head + _verdict(row, ctx, decided) + f"; {effect}.")
        else:
            lines.append(head + f"{effect}, " + _verdict(row, ctx, decided) + ".")
    contrasts = [r for r in rows.values() if r.get("kind") in ("length", "interaction")]
    if contrasts:
        lines += ["", "Does the effect depend on length, or on a setting?", ""]
        for r in contrasts:
            what = "length" if r["kind"] == "length" else "interaction"
            lines.append(
                f"- {what} {md_code(r['comparison'])}: {_decided_words(r)}; {_interval_words(r)}."
            )
    which = (
        "The verdicts are the anytime-valid decisions of this adaptive sweep (the primary "
        "analysis, next section): one closed test over every hypothesis, the operator "
        "comparisons, the length contrasts (the operator's delta on the longest regime minus "
        "the shortest, per seed) and the interactions (its delta at a setting level minus at "
        "the reference), valid however the seeds were stopped. The fixed-n intervals and "
        "p-values further down are descriptive only."
        if primary
        else "The verdicts are exact Wilcoxon signed-rank tests, Holm-adjusted over the "
        "comparisons (the primary analysis of a fixed-seed sweep)."
    )
    return [*lines, "", which, ""]


def _method(ctx: ReportContext) -> list[str]:
    """How pairs are formed, then one line per statistic from the settings record."""
    pairing = (
        f"Within each {' x '.join(md(k) for k in ctx.keys)} group, each operator is paired with "
        f"{md_code(ctx.baseline)} by seed (same seed: same initialisation of shared modules, same "
        "batch order, same data split), using only seeds where both runs FINISHED and whose "
        f"configs agree on every param except `{OPERATOR_PARAM}` and "
        f"`{OPERATOR_KWARGS_PREFIX}*`. A delta is (operator - baseline) test accuracy computed "
        "from the integer correct counts, shown in percentage points (pp); ranks and ties are "
        "taken on the integers, so round-off cannot create or break ties."
    )
    bullets = [f"- {line}" for line in method_lines(ctx.record)]
    bullets += [f"- {line}" for line in _axis_lines(ctx) + _alias_lines(ctx)]
    table2 = ctx.tables["table2"].data
    if "latency_ratio_source" in table2:
        sources = table2["latency_ratio_source"]
        notes = latency_note(sources, ctx.baseline)
        bullets += [
            f"- **Latency ratio** (Table 2, latency / {md_code(ctx.baseline)}): {md_prose(n)}"
            for n in notes
        ]
    return ["## Method", "", pairing, "", *bullets, ""]


def _axis_lines(ctx: ReportContext) -> list[str]:
    """The extra grid axes: their levels and reference, and that pairs stay within a level."""
    if not ctx.axis_levels:
        return []
    described = "; ".join(
        f"{md_code(axis)}: {', '.join(map(md, levels))} (reference {md(levels[0])})"
        for axis, levels in ctx.axis_levels.items()
    )
    return [
        f"**Grid axes** beyond dataset, position, attention position and fusion: {described}. "
        "Each level is a group of its own, so a seed pair never crosses levels; levels are in "
        f"the sweep file's order (parent run tag `{GRID_AXES_TAG}`), the first being the "
        "reference of the interaction tests."
    ]


def _alias_lines(ctx: ReportContext) -> list[str]:
    """One line per position that is another one under a second name, tested once."""
    aliases = ctx.pairing.aliases
    if aliases.empty:
        return []
    lines = []
    for (alias, target), grp in aliases.groupby(["position", "alias_of"], sort=True):
        lines.append(
            f"{line_start(md(alias))} is the same model as {md(target)}: tested once (tag "
            f"`{POSITION_ALIAS_TAG}`; {len(grp)} comparison(s) of {md(alias)} with the same "
            f"other settings as {md(target)}'s "
            "are left out of the Holm family)."
        )
    return lines


def _tables(ctx: ReportContext) -> list[str]:
    lines = []
    for key in TABLES:
        table = ctx.tables[key]
        lines += ["## " + md_prose(table.caption.split(".")[0]), "", table.to_markdown(), ""]
    return lines


def _paired_statistics(ctx: ReportContext) -> list[str]:
    table = ctx.comparisons.table
    if not len(table):
        return ["## Paired statistics", "", "No complete pair: nothing to compare yet.", ""]
    return [
        "## Paired statistics",
        "",
        stats_table(table, ctx.keys, ctx.record, ctx.axes).to_markdown(),
        "",
        f"`*`: Holm-adjusted p ≤ {ctx.options.settings.alpha}. Every column, and more "
        "(Clopper-Pearson bounds, HL interval confidence, n_zeros, wilcoxon_method), is in "
        "`stats.csv`.",
        "",
    ]


def _figures(ctx: ReportContext) -> list[str]:
    lines = ["## Figures", ""]
    if not ctx.figures:
        lines += ["None drawn (--no-figures, or nothing to draw).", ""]
    for caption, path in ctx.figures:
        rel = path.relative_to(ctx.out_dir).as_posix()
        text = md_prose(caption)
        lines += [f"**{text}** (PDF: {md_code(rel[:-4] + '.pdf')})", "", f"![{text}]({rel})", ""]
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
        "- " + ", ".join(f"{c}={md(row[c])}" for c in columns if c in row and pd.notna(row[c]))
        for _, row in frame.iterrows()
    ]
    return ["## " + title, "", *items]


def _files(ctx: ReportContext, sections: Sequence[Section]) -> list[str]:
    results: list[tuple[Section, Any]] = [(s, ctx.results.get(s.name)) for s in sections]
    listed = "".join(f" {name}," for s, r in results for name in s.listed_files(r))
    notes = "".join(s.tables_note(r) for s, r in results)
    return [
        "",
        "## Files",
        "",
        f"`stats.csv`, `stats.json` (with every setting),{listed} `runs.csv`, `{WARNINGS_FILE}`, `tables/` "
        f"(Markdown, LaTeX, CSV{notes}), `figures/` (PNG, PDF).",
        "",
    ]
