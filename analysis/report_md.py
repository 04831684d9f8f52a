"""report.md, written from a report's context: one function per section."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from analysis.context import ARTIFACT_PATH, ReportContext
from analysis.extrapolation import CSV_FILES
from analysis.interaction import ADDITIVE, SCALE_AXIS
from analysis.reproduction import reproduction_markdown
from analysis.stats import method_lines
from analysis.tables import (
    column_label,
    describe_setting,
    interaction_caption,
    latency_note,
    select,
    stats_table,
)
from fusion_ray.schema import (
    CELLS_ARTIFACT,
    GATES_FILE,
    GRID_AXES_TAG,
    LENGTH_PREDICTIONS_FILE,
    OPERATOR_KWARGS_PREFIX,
    OPERATOR_PARAM,
    POSITION_ALIAS_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
)

TABLES = ("table1", "table2", "table3")
#: Where the paper-versus-ours table and the gate summary are written (``analysis.report``).
REPRODUCTION_CSV = "tables/reproduction.csv"
GATES_CSV = "gates_by_position.csv"


def render_report(ctx: ReportContext) -> str:
    """The whole of report.md."""
    lines = [
        *_header(ctx),
        *_warnings(ctx),
        *_scaling(ctx),
        *_method(ctx),
        *_tables(ctx),
        *_reproduction(ctx),
        *_paired_statistics(ctx),
        *_interactions(ctx),
        *_length_analysis(ctx),
        *_extrapolation(ctx),
        *_gates(ctx),
        *_figures(ctx),
        *_gaps(ctx),
        *_files(ctx),
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
    bullets += [f"- {line}" for line in _axis_lines(ctx) + _alias_lines(ctx)]
    table2 = ctx.tables["table2"].data
    if "latency_ratio_source" in table2:
        sources = table2["latency_ratio_source"]
        notes = latency_note(sources, ctx.baseline)
        bullets += [
            f"- **Latency ratio** (Table 2, latency / `{ctx.baseline}`): {n}" for n in notes
        ]
    return ["## Method", "", pairing, "", *bullets, ""]


def _axis_lines(ctx: ReportContext) -> list[str]:
    """The extra grid axes: their levels and reference, and that pairs stay within a level."""
    if not ctx.axis_levels:
        return []
    described = "; ".join(
        f"`{axis}`: {', '.join(levels)} (reference {levels[0]})"
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
            f"{alias} is the same model as {target}: tested once (tag `{POSITION_ALIAS_TAG}`; "
            f"{len(grp)} comparison(s) of {alias} with the same other settings as {target}'s "
            "are left out of the Holm family)."
        )
    return lines


def _scaling(ctx: ReportContext) -> list[str]:
    """With and without scaled token embeddings: each operator's effect against ``add`` per
    arm, and the interaction test (only when both arms are compared)."""
    check = ctx.scaling
    if not check.both_arms:
        return []
    effects = check.effects
    others = [k for k in ctx.keys if k != SCALE_AXIS and k in effects]
    if check.interaction_levels is not None:
        level, ref = check.interaction_levels
        inter_head = f"difference {level} − {ref}: median (p Holm)"
        inter_text = (
            f"and whether the effect differs between the arms (per seed, the delta at "
            f"`{SCALE_AXIS}` = {level} minus the delta at {ref}; exact two-sided Wilcoxon, Holm "
            "over the interaction family)"
        )
    else:
        inter_head = None
        inter_text = (
            f"(no interaction test: `{SCALE_AXIS}` is not a grid axis of this sweep; make it "
            f"one, `{SCALE_AXIS}: [true, false]`, to test it)"
        )
    lines = [
        "## Operator effects with and without embedding scaling",
        "",
        f"Both arms of `{SCALE_AXIS}` are compared with `{ADDITIVE}`: each operator's effect in "
        "each arm (median per-seed delta in pp, Holm-adjusted p of the comparisons against "
        f"the baseline), {inter_text}.",
        "",
    ]
    heads = [
        *(column_label(k, ctx.axes) for k in others),
        "operator",
        "scaled: Δ median (p Holm)",
        "unscaled: Δ median (p Holm)",
        *([inter_head] if inter_head else []),
    ]
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for _, r in effects.iterrows():
        cells = [str(r[k]) for k in others] + [str(r["operator"])]
        cells += [_effect(r, "scaled"), _effect(r, "unscaled")]
        if inter_head:
            cells.append(_effect(r, "interaction", median="interaction_median"))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _effect(row: pd.Series, arm: str, median: str | None = None) -> str:
    """``+1.25 (p Holm 0.031*)`` from an arm's columns of the scaling table ('–' if absent)."""
    value = row.get(median or f"{arm}_median_delta")
    p = row.get(f"{arm}_p_holm")
    if value is None or pd.isna(value):
        return "–"
    star = "*" if bool(row.get(f"{arm}_significant", False)) else ""
    return f"{value:+.2f} (p Holm {_fmt_p(p)}{star})"


def _tables(ctx: ReportContext) -> list[str]:
    lines = []
    for key in TABLES:
        table = ctx.tables[key]
        lines += ["## " + table.caption.split(".")[0], "", table.to_markdown(), ""]
    return lines


def _reproduction(ctx: ReportContext) -> list[str]:
    """The study's published cells that our runs reproduce, beside ours (none: no section)."""
    if ctx.reproduction is None:
        return []
    return [
        "## Reproduction: the paper's numbers beside ours",
        "",
        reproduction_markdown(ctx.reproduction).rstrip("\n"),
        "",
        f"Every column (differences, sd in points, the source of each number): "
        f"`{REPRODUCTION_CSV}`.",
        "",
    ]


def _gates(ctx: ReportContext) -> list[str]:
    """Per group and gated operator: the mean gate on E in the first and the last position
    bucket holding tokens, with its range over seeds (none logged: no section)."""
    gates = ctx.gates
    if gates is None:
        return []
    keys = [k for k in ctx.keys if k in gates.ends]
    heads = [*(column_label(k, ctx.axes) for k in keys), "operator", "seeds"]
    heads += ["first bucket", "g first [min, max]", "last bucket", "g last [min, max]"]
    lines = [
        "## Gate on token embeddings by position",
        "",
        "A gated operator mixes the token embeddings E and the position signal P as "
        "H = g E + (1 − g) P, so g is the weight on E: g = 0.5 weighs E and P equally, g = 1 "
        "keeps E alone, g = 0 keeps P alone (feature-wise gates are averaged over features "
        f"too). Each gated run logs `{GATES_FILE}`: g on its test split at its best validation "
        "epoch, averaged over the tokens of each position bucket (a bucket `a-b` holds the "
        "token positions a to b, counted from 0). Per group and operator: the mean over "
        "seeds of that gate in the first and in the last bucket holding tokens, the lowest "
        "and highest seed in brackets, and the last mean minus the first. No test is run on "
        f"these numbers. {gates.runs} run(s) logged their gates.",
        "",
        "| " + " | ".join([*heads, "last − first"]) + " |",
        "|" + "---|" * (len(heads) + 1),
    ]
    for r in gates.ends.to_dict(orient="records"):
        seeds = {int(r["first_n_seeds"]), int(r["last_n_seeds"])}
        cells = [*(str(r[k]) for k in keys), str(r["operator"])]
        cells += [" / ".join(str(n) for n in sorted(seeds)), str(r["first_bucket"])]
        cells += [_gate_value(r, "first"), str(r["last_bucket"]), _gate_value(r, "last")]
        cells.append(f"{r['change']:+.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", f"Every bucket (mean, min and max over seeds): `{GATES_CSV}`.", ""]


def _gate_value(row: dict, end: str) -> str:
    """``0.482 [0.451, 0.503]`` (no range for a single seed)."""
    mean = f"{row[f'{end}_gate_mean']:.3f}"
    if int(row[f"{end}_n_seeds"]) < 2:
        return mean
    return f"{mean} [{row[f'{end}_gate_min']:.3f}, {row[f'{end}_gate_max']:.3f}]"


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


def _interactions(ctx: ReportContext) -> list[str]:
    """One table per extra grid axis: does the operator effect depend on it?"""
    inter = ctx.interactions
    if inter is None:
        return []
    lines = ["## Interaction tests", ""]
    for axis in ctx.axes:
        table = ctx.tables.get(f"interaction:{axis}")
        if table is not None and len(table.display):
            lines += [table.to_markdown(), ""]
            continue
        compared = sorted(set(ctx.pairing.pairs[axis].astype(str)))
        why = (
            f"every comparison is at {axis} = {compared[0]}"
            if len(compared) == 1
            else f"no seed is paired with `{ctx.baseline}` at two levels of `{axis}` in the "
            "same combination of the other group keys"
        )
        lines += [f"**{interaction_caption(axis)}** Not tested: {why}.", ""]
    if inter.m:
        lines += ["Every column of these tests is in `interaction.csv`.", ""]
    return lines


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
    ]
    buckets = lengths.buckets
    bucket_axes = [a for a in ctx.axes if a in buckets]
    plain = buckets.drop(columns=bucket_axes).drop_duplicates()
    if bucket_axes and not plain.duplicated(["dataset", "bucket"]).any():
        buckets, bucket_axes = plain, []  # the same buckets at every level: list them once
    heads = ["dataset", *bucket_axes, "bucket", "tokens", "documents", "truncated"]
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for _, r in buckets.iterrows():
        trunc = "–" if pd.isna(r["truncated_share"]) else f"{r['truncated_share']:.0%}"
        levels = "".join(f" {r[a]} |" for a in bucket_axes)
        lines.append(
            f"| {r['dataset']} |{levels} {r['bucket']} | {r['label']} | {r['n_docs']} | {trunc} |"
        )
    stat_axes = [a for a in ctx.axes if a in lengths.stats]
    heads = ["dataset", *stat_axes, "operator", "bucket", "n", "Δ mean (pp)", "HL", "p"]
    heads += ["p Holm", "wins"]
    lines += [
        "",
        f"Contrasts and buckets in the main setting ({describe_setting(ctx.main_setting)}):",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "---|" * len(heads),
    ]
    for _, r in select(lengths.stats, ctx.main_setting).iterrows():
        levels = "".join(f" {r[a]} |" for a in stat_axes)
        lines.append(
            f"| {r['dataset']} |{levels} {r['operator']} | {r['bucket']} | {int(r['n_pairs'])} | "
            f"{r['mean_delta']:+.2f} | {r['hl_estimate']:+.2f} | {_fmt_p(r['p_wilcoxon'])} | "
            f"{_fmt_p(r['p_holm'])}{'*' if r['significant'] else ''} | "
            f"{int(r['wins'])}/{int(r['n_pairs'])} |"
        )
    return [*lines, "", "All settings: `length_stats.csv`, `length_accuracy.csv`.", ""]


#: The truncation ladder, in words (report.md's "Train short, test long" section).
LADDER_TEXT = (
    "**Truncation ladder.** For consecutive evaluation lengths L1 < L2, each run's predictions "
    f"(`{LENGTH_PREDICTIONS_FILE}`) give its accuracy at L1 and at L2 on the same test "
    "documents; the gain is the difference (pp). Documents no longer than L1 read the same at "
    "both lengths and are left out; the others are split in two. Documents longer than L2 are "
    "cut at both lengths, L2 showing L2 − L1 more tokens of each: a gain on them comes from "
    "seeing more of each document. Documents that fit in L2 (L1 + 1 to L2 tokens) are read "
    "whole at L2. Up to the training length T the added tokens sit at trained positions, so the "
    "gain is what more evidence is worth there. Whether the model can use positions beyond the "
    "training length is what the steps beyond T show, on documents that fit in L2 above all "
    "(the whole document is read): with L1 ≥ T every added token sits at a position never "
    "trained on, so a gain means the model drew evidence from such positions and a loss that "
    "reading them cost more than they brought; a gain near zero cannot tell evidence the model "
    "could not use from evidence that adds nothing. Δ gain: the operator's gain minus the "
    "baseline's, per seed, on the same documents."
)


def _extrapolation(ctx: ReportContext) -> list[str]:
    """Train short, test long: the effect at each evaluation length, whether it changes with
    the length, and the truncation ladder (no section without per-length metrics)."""
    ex = ctx.extrapolation
    if ex is None:
        return []
    trained = ", ".join(map(str, ex.train_lengths)) or "not logged"
    lines = [
        "## Train short, test long",
        "",
        f"Each run trains on documents truncated at its training length T (param "
        f"`data.max_length`: {trained}); its model of the best validation epoch, chosen at T "
        "only, is then evaluated on the test split truncated at each evaluation length L "
        f"({', '.join(map(str, ex.lengths))}), a document no longer than L being read whole. "
        "Beyond T, tokens sit at positions the model never trained on. The figure *Accuracy "
        "against evaluation length* (under Figures) draws the curves, mean ± sd over seeds.",
        "",
    ]
    for name, absent in (
        ("extrapolation:by_length", "No seed pair has counts at an evaluation length."),
        ("extrapolation:interaction", "Not tested: no comparison has two evaluation lengths."),
    ):
        table = ctx.tables.get(name)
        lines += [table.to_markdown() if table is not None else absent, ""]
    lines += [LADDER_TEXT, ""]
    ladder = ctx.tables.get("extrapolation:ladder")
    if ladder is not None:
        lines += [ladder.to_markdown(), ""]
    elif not ex.predictions_read:
        lines += ["Not computed: --no-lengths, so the by-length predictions were not read.", ""]
    else:
        lines += ["No run's by-length predictions gave a ladder step (see the warnings).", ""]
    files = ", ".join(f"`{n}`" for a, n in CSV_FILES.items() if len(getattr(ex, a)))
    return [*lines, f"Every column: {files}.", ""]


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


def _files(ctx: ReportContext) -> list[str]:
    interaction = " `interaction.csv`," if ctx.interactions is not None else ""
    gates = f" `{GATES_CSV}`," if ctx.gates is not None else ""
    ex = ctx.extrapolation
    extrapolation = (
        "".join(f" `{n}`," for a, n in CSV_FILES.items() if len(getattr(ex, a)))
        if ex is not None
        else ""
    )
    reproduction = (
        f"; `{REPRODUCTION_CSV}`: the paper's numbers beside ours"
        if ctx.reproduction is not None
        else ""
    )
    return [
        "",
        "## Files",
        "",
        f"`stats.csv`, `stats.json` (with every setting),{interaction} `length_stats.csv`, "
        f"`length_accuracy.csv`,{extrapolation}{gates} `runs.csv`, `tables/` (Markdown, LaTeX, CSV"
        f"{reproduction}), `figures/` (PNG, PDF).",
        "",
    ]


def _fmt_p(p: float) -> str:
    return "–" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.4g}"
