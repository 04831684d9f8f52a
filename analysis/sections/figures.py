"""The report's own figures, from its paired core (the drawing itself is ``analysis.render.drawing``;
each section draws its own figures, ``Section.figures``), and the level helpers they share.

With extra grid axes, the paired-delta figures get a panel per level (one figure per setting,
and per dataset one with a panel per setting), and the summary figures (and the length section's)
a line style and marker per level.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.render import drawing
from analysis.render.escape import fence
from analysis.render.tables import describe_setting, select
from analysis.sections.base import Drawn
from analysis.sections.context import ReportContext, relabel, shown


def core_figures(ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
    """The core's figures: the paired deltas, accuracy by length regime and against latency
    (the sections draw theirs: ``Section.figures``), with the report's display names."""
    colors = drawing.operator_colors(names(ctx, "operators", ctx.operators))
    return [
        *_paired_delta_figures(ctx, fig_dir, colors),
        *_summary_figures(ctx, fig_dir, colors),
    ]


def _paired_delta_figures(ctx: ReportContext, fig_dir: Path, colors: dict[str, str]) -> list[Drawn]:
    """Per-seed deltas: one figure per setting (panels: datasets) and, when there are several
    settings, one per dataset (panels: settings, extra axis levels among them)."""
    drawn: list[Drawn] = []
    other = [k for k in ctx.keys if k != "dataset"]
    settings = ctx.pairing.runs[other].drop_duplicates()
    settings = in_level_order(settings, ctx.axis_levels).to_dict("records")
    deltas = ctx.comparisons.deltas
    labels = ctx.options.labels
    datasets, operators = (
        names(ctx, "datasets", ctx.datasets),
        names(ctx, "operators", ctx.operators),
    )
    baseline = names(ctx, "operators", [ctx.baseline])[0]
    for s in settings:
        label = describe_setting(relabel(pd.DataFrame([s]), labels).iloc[0].to_dict())
        paths = drawing.paired_deltas(
            relabel(select(deltas, s), labels),
            "dataset",
            datasets,
            operators,
            baseline,
            f"Paired per-seed deltas vs {baseline} ({label})",
            fig_dir,
            "paired_deltas__" + "__".join(drawing.slug(v) for v in s.values()),
            colors,
        )
        drawn.append((f"Paired per-seed deltas vs {fence(ctx.baseline)} ({label})", paths))
    if len(settings) <= 1:
        return drawn
    deltas = relabel(in_level_order(deltas, ctx.axis_levels), labels)
    deltas["setting"] = deltas[other].astype(str).agg(" / ".join, axis=1)
    setting_names = list(dict.fromkeys(deltas["setting"]))
    # with extra axes the panels are settings (a level each), not only position families
    what, stem = ("setting", "by_setting") if ctx.axes else ("position family", "by_position")
    for d in datasets:
        paths = drawing.paired_deltas(
            deltas[deltas["dataset"] == d],
            "setting",
            setting_names,
            operators,
            baseline,
            f"{d}: paired per-seed deltas vs {baseline} per {what} ({' / '.join(other)})",
            fig_dir,
            f"paired_deltas_{stem}__{drawing.slug(d)}",
            colors,
        )
        drawn.append((f"{d}: paired deltas per {what}", paths))
    return drawn


def names(ctx: ReportContext, kind: str, values: list[str]) -> list[str]:
    """``values`` as the report shows them (``ReportOptions.labels``)."""
    return shown(values, kind, ctx.options.labels)


def in_level_order(frame: pd.DataFrame, levels: dict[str, list[str]]) -> pd.DataFrame:
    """``frame`` with the extra axes' levels in the sweep file's order (stable otherwise)."""
    frame = frame.copy()
    axes = [a for a in levels if a in frame]
    if not axes:
        return frame
    ranks = {a: {v: i for i, v in enumerate(levels[a])} for a in axes}
    order = frame.assign(
        **{f"_r{i}": frame[a].astype(str).map(ranks[a]) for i, a in enumerate(axes)}
    )
    cols = [f"_r{i}" for i in range(len(axes))]
    return order.sort_values(cols, kind="stable").drop(columns=cols)


def with_level(
    frame: pd.DataFrame, ctx: ReportContext
) -> tuple[pd.DataFrame, str | None, list[str]]:
    """(``frame`` with a ``level`` column naming its extra axis levels, the style column or
    None without axes, the levels in the sweep file's order)."""
    axes = [a for a in ctx.axes if a in frame]
    if not axes or frame.empty:
        return frame, None, []
    frame = in_level_order(frame, ctx.axis_levels)
    frame["level"] = (
        frame[axes].astype(str).apply(lambda r: ", ".join(f"{a}={r[a]}" for a in axes), axis=1)
    )
    return frame, "level", list(dict.fromkeys(frame["level"]))


def _summary_figures(ctx: ReportContext, fig_dir: Path, colors: dict[str, str]) -> list[Drawn]:
    """Accuracy by length regime, and accuracy against latency, in the main setting."""
    labels = ctx.options.labels
    where = describe_setting(relabel(pd.DataFrame([ctx.main_setting]), labels).iloc[0].to_dict())
    main_summary, style, order = with_level(select(ctx.summary, ctx.main_setting), ctx)
    main_summary = relabel(main_summary, labels)
    styles = drawing.Styles(colors, style, order)
    datasets, operators = (
        names(ctx, "datasets", ctx.datasets),
        names(ctx, "operators", ctx.operators),
    )
    medians = dict(
        zip(names(ctx, "datasets", list(ctx.medians)), ctx.medians.values(), strict=True)
    )
    regime = drawing.accuracy_by_regime(
        main_summary,
        datasets,
        operators,
        medians,
        f"Accuracy by length regime\n({where})",  # two lines: a title wider than its axes is cut
        fig_dir,
        styles,
    )
    latency = drawing.accuracy_vs_latency(
        main_summary, datasets, operators, f"Accuracy vs latency\n({where})", fig_dir, styles
    )
    drawn = [
        ("Accuracy by length regime (datasets, shortest to longest)", regime),
        ("Accuracy against measured latency", latency),
    ]
    return drawn
