"""Which figures a report draws, from its context (the drawing itself is ``analysis.drawing``).

With extra grid axes, the paired-delta figures get a panel per level (one figure per setting,
and per dataset one with a panel per setting), and the summary and length figures a line style
and marker per level. The gate figure (``analysis.gates``) has a panel per dataset and setting;
the train-short-test-long figure a panel per dataset (and level of every extra axis).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import drawing
from analysis.context import ReportContext
from analysis.gates import gate_figure
from analysis.tables import describe_setting, select
from fusion_ray.schema import AXIS_TAG_PREFIX

#: A figure of report.md: its caption and the PNG (a PDF lies next to it).
DrawnFigure = tuple[str, Path]


class _Drawn:
    """Collects the figures drawn: captions for report.md, and every file written."""

    def __init__(self) -> None:
        self.figures: list[DrawnFigure] = []
        self.files: list[Path] = []

    def add(self, caption: str, paths: list[Path]) -> None:
        if paths:
            self.figures.append((caption, paths[0]))
            self.files += paths


def draw_figures(ctx: ReportContext, fig_dir: Path) -> tuple[list[DrawnFigure], list[Path]]:
    """Every figure of the report; returns (caption, PNG path) pairs and all files written."""
    drawn = _Drawn()
    colors = drawing.operator_colors(ctx.operators)
    _paired_delta_figures(ctx, fig_dir, colors, drawn)
    _summary_figures(ctx, fig_dir, colors, drawn)
    _length_figure(ctx, fig_dir, colors, drawn)
    _extrapolation_figure(ctx, fig_dir, colors, drawn)
    _gate_figure(ctx, fig_dir, drawn)
    return drawn.figures, drawn.files


def _paired_delta_figures(
    ctx: ReportContext, fig_dir: Path, colors: dict[str, str], drawn: _Drawn
) -> None:
    """Per-seed deltas: one figure per setting (panels: datasets) and, when there are several
    settings, one per dataset (panels: settings, extra axis levels among them)."""
    other = [k for k in ctx.keys if k != "dataset"]
    settings = ctx.pairing.runs[other].drop_duplicates()
    settings = _in_level_order(settings, ctx.axis_levels).to_dict("records")
    deltas = ctx.comparisons.deltas
    for s in settings:
        label = describe_setting(s)
        paths = drawing.paired_deltas(
            select(deltas, s),
            "dataset",
            ctx.datasets,
            ctx.operators,
            ctx.baseline,
            f"Paired per-seed deltas vs {ctx.baseline} ({label})",
            fig_dir,
            "paired_deltas__" + "__".join(drawing.slug(v) for v in s.values()),
            colors,
        )
        drawn.add(f"Paired per-seed deltas vs `{ctx.baseline}` ({label})", paths)
    if len(settings) <= 1:
        return
    deltas = _in_level_order(deltas, ctx.axis_levels)
    deltas["setting"] = deltas[other].astype(str).agg(" / ".join, axis=1)
    setting_names = list(dict.fromkeys(deltas["setting"]))
    # with extra axes the panels are settings (a level each), not only position families
    what, stem = ("setting", "by_setting") if ctx.axes else ("position family", "by_position")
    for d in ctx.datasets:
        paths = drawing.paired_deltas(
            deltas[deltas["dataset"] == d],
            "setting",
            setting_names,
            ctx.operators,
            ctx.baseline,
            f"{d}: paired per-seed deltas vs {ctx.baseline} per {what} ({' / '.join(other)})",
            fig_dir,
            f"paired_deltas_{stem}__{drawing.slug(d)}",
            colors,
        )
        drawn.add(f"{d}: paired deltas per {what}", paths)


def _in_level_order(frame: pd.DataFrame, levels: dict[str, list[str]]) -> pd.DataFrame:
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


def _with_level(
    frame: pd.DataFrame, ctx: ReportContext
) -> tuple[pd.DataFrame, str | None, list[str]]:
    """(``frame`` with a ``level`` column naming its extra axis levels, the style column or
    None without axes, the levels in the sweep file's order)."""
    axes = [a for a in ctx.axes if a in frame]
    if not axes or frame.empty:
        return frame, None, []
    frame = _in_level_order(frame, ctx.axis_levels)
    frame["level"] = (
        frame[axes].astype(str).apply(lambda r: ", ".join(f"{a}={r[a]}" for a in axes), axis=1)
    )
    return frame, "level", list(dict.fromkeys(frame["level"]))


def _summary_figures(
    ctx: ReportContext, fig_dir: Path, colors: dict[str, str], drawn: _Drawn
) -> None:
    """Accuracy by length regime, and accuracy against latency, in the main setting."""
    where = describe_setting(ctx.main_setting)
    main_summary, style, order = _with_level(select(ctx.summary, ctx.main_setting), ctx)
    paths = drawing.accuracy_by_regime(
        main_summary,
        ctx.datasets,
        ctx.operators,
        ctx.medians,
        f"Accuracy by length regime ({where})",
        fig_dir,
        colors=colors,
        style_key=style,
        style_order=order,
    )
    drawn.add("Accuracy by length regime (datasets, shortest to longest)", paths)
    paths = drawing.accuracy_vs_latency(
        main_summary,
        ctx.datasets,
        ctx.operators,
        f"Accuracy vs latency ({where})",
        fig_dir,
        colors=colors,
        style_key=style,
        style_order=order,
    )
    drawn.add("Accuracy against measured latency", paths)


def _length_figure(
    ctx: ReportContext, fig_dir: Path, colors: dict[str, str], drawn: _Drawn
) -> None:
    lengths = ctx.lengths
    if lengths is None or lengths.accuracy.empty:
        return
    accuracy, style, order = _with_level(select(lengths.accuracy, ctx.main_setting), ctx)
    stats, _, _ = _with_level(select(lengths.stats, ctx.main_setting), ctx)
    paths = drawing.accuracy_by_length_bucket(
        accuracy,
        stats,
        ctx.datasets,
        ctx.operators,
        ctx.baseline,
        f"Accuracy by document length inside each dataset ({describe_setting(ctx.main_setting)})",
        fig_dir,
        "accuracy_by_length_bucket",
        colors,
        style_key=style,
        style_order=order,
    )
    drawn.add("Accuracy by length quantile inside each dataset", paths)


def _extrapolation_figure(
    ctx: ReportContext, fig_dir: Path, colors: dict[str, str], drawn: _Drawn
) -> None:
    """Accuracy against evaluation length: a panel per dataset and level of the other group
    keys (extra axes, ``--by`` params), a line per operator and position setting."""
    ex = ctx.extrapolation
    if ex is None or ex.accuracy.empty:
        return
    lines = [k for k in ("position", "attention_position") if k in ctx.keys]
    others = [k for k in ctx.keys if k not in lines and k != "dataset"]
    curves = ex.accuracy.copy()
    curves["panel"] = [
        ", ".join([str(d), *(f"{k}={v}" for k, v in zip(others, rest, strict=True))])
        for d, *rest in curves[["dataset", *others]].itertuples(index=False, name=None)
    ]
    curves["setting"] = curves[lines].astype(str).agg(" / ".join, axis=1)
    paths = drawing.accuracy_by_eval_length(
        curves,
        ctx.operators,
        "Accuracy against evaluation length (band: ± sd over seeds)",
        fig_dir,
        colors=colors,
    )
    drawn.add("Accuracy against evaluation length (dashed: the training length)", paths)


def _gate_figure(ctx: ReportContext, fig_dir: Path, drawn: _Drawn) -> None:
    """The gate on E by position bucket, one panel per dataset and setting (``gates_by_position``).

    ``gates.gate_figure`` makes a panel per ``axis.*`` column: the report's extra axes and
    ``--by`` params are handed over under that prefix, so that no line averages two settings."""
    if ctx.gates is None:
        return
    extra = [k for k in ctx.keys if k not in ("dataset", "position", "attention_position")]
    frame = ctx.gates.frame.rename(columns={k: AXIS_TAG_PREFIX + k for k in extra})
    fig = gate_figure(frame)
    if fig is None:
        return
    caption = "Gate on token embeddings by position (gated operators; 0.5: E and P weighed equally)"
    drawn.add(caption, drawing.save(fig, fig_dir, "gates_by_position"))
