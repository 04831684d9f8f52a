"""The study's figures, done properly: PNG and PDF, matplotlib's Agg backend, no pyplot state.

- paired per-seed deltas against the baseline, one panel per dataset (or per position family),
  integer seed axis, a zero line, wins k/n in each legend entry (the study's Figures 3, 5, 6, 7);
- accuracy by length regime per operator (datasets ordered by median document length);
- accuracy against measured latency;
- accuracy by length quantile inside each dataset, with paired deltas per bucket;
- accuracy against evaluation length (train short, test long), the training length marked;
- a forest plot of a family's decisions: each hypothesis's estimate with its interval.

The summary figures take an optional ``style_key``: a column whose values (e.g. the levels of an
extra grid axis) get a line style and marker each, so the levels share a panel.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402

FORMATS = ("png", "pdf")


SD_BARS = "bars: mean ± 1 sd over seeds"
"""What the error bars of a mean-over-seeds figure show, said on its axis."""


def slug(text: str) -> str:
    """A file-name-safe form of an operator or setting label."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "x"


def save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write the figure as PNG (150 dpi) and PDF; return both paths. The layout is computed
    once, for the PNG; the PDF keeps it (a third of the saving time)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in FORMATS:
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=150)  # constrained layout already fits; "tight" draws twice
        fig.set_layout_engine("none")  # every panel stays where the first save put it
        paths.append(path)
    return paths


def save_titled(fig: Figure, title: str, out_dir: Path, stem: str) -> list[Path]:
    """``save`` with ``title`` over the whole figure (above every panel)."""
    fig.suptitle(title, fontsize=10)
    return save(fig, out_dir, stem)


def _panels(
    n: int, width: float = 4.2, height: float = 3.2, sharey: bool = False
) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=sharey).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def operator_colors(operators: Sequence[str]) -> dict[str, str]:
    cycle = [
        "#0072B2",
        "#D55E00",
        "#009E73",
        "#CC79A7",
        "#E69F00",
        "#56B4E9",
        "#F0E442",
        "#000000",
    ]
    return {op: cycle[i % len(cycle)] for i, op in enumerate(operators)}


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def level_styles(levels: Sequence[str]) -> dict[str, tuple[str, str]]:
    """level -> (line style, marker), in the order given."""
    return {
        v: (LINE_STYLES[i % len(LINE_STYLES)], MARKERS[i % len(MARKERS)])
        for i, v in enumerate(levels)
    }


@dataclass(frozen=True)
class Styles:
    """How a figure's lines look: a colour per operator and, with ``key``, a line style and
    marker per value of that column, in ``order``."""

    colors: dict[str, str]
    key: str | None = None
    order: Sequence[str] = ()


def _styled(frame: pd.DataFrame, styles: Styles) -> list[tuple[str | None, pd.DataFrame, str, str]]:
    """(level or None, its rows, line style, marker) for each style level present in
    ``frame``; one unstyled entry when there is no ``styles.key``."""
    key = styles.key
    if key is None:
        return [(None, frame, "-", "o")]
    by_level = level_styles(list(styles.order))
    return [
        (v, frame[frame[key] == v], *by_level[v]) for v in styles.order if (frame[key] == v).any()
    ]


def _label(op: str, level: str | None) -> str:
    return op if level is None else f"{op} ({level})"


def present(values: Sequence[str], frame: pd.DataFrame, column: str) -> list[str]:
    """``values`` that occur in ``frame[column]``, in their order."""
    have = set(frame[column])
    return [v for v in values if v in have]


def _legend_entries(axes: Sequence[Any]) -> dict[str, Any]:
    """label -> handle of what ``axes`` drew, each label once, in the order first drawn; an
    error bar's entry is its marker and line, without the caps that would hide the marker."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if isinstance(handle, ErrorbarContainer):
                handle = handle.lines[0]
            entries.setdefault(label, handle)
    return entries


def _grid_and_legend(ax, axis: str = "y") -> None:
    """A light grid, and the legend outside the axes on the right, so it never covers data."""
    ax.grid(axis=axis, alpha=0.3)
    entries = _legend_entries([ax])
    ax.legend(
        list(entries.values()),
        list(entries),
        fontsize=7,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )


def _figure_legend(fig: Figure, axes: Sequence[Any]) -> None:
    """One legend for every panel, outside them on the right, so it never covers data (each
    label once, in the order first drawn)."""
    entries = _legend_entries(axes)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside right upper",
            fontsize=7,
            frameon=False,
        )


def paired_deltas(
    deltas: pd.DataFrame,
    panel_key: str,
    panels: Sequence[str],
    operators: Sequence[str],
    baseline: str,
    title: str,
    out_dir: Path,
    stem: str,
    colors: dict[str, str] | None = None,
) -> list[Path]:
    """Per-seed paired deltas (pp), one panel per value of ``panel_key``."""
    panels = present(panels, deltas, panel_key)
    if not panels:
        return []
    colors = colors or operator_colors(operators)
    fig, axes = _panels(len(panels), sharey=True)  # one scale: magnitudes compare across panels
    ops = present(operators, deltas, "operator")
    width = 0.6 / max(1, len(ops))
    for ax, panel in zip(axes, panels, strict=True):
        sub = deltas[deltas[panel_key] == panel]
        for i, op in enumerate(ops):
            d = sub[sub["operator"] == op].sort_values("seed")
            if d.empty:
                continue
            x = d["seed"].to_numpy(dtype=float) + (i - (len(ops) - 1) / 2) * width
            y = d["delta"].to_numpy()
            wins = int((y > 0).sum())
            ax.vlines(x, 0, y, color=colors[op], lw=1.2, alpha=0.6)
            ax.scatter(x, y, color=colors[op], s=22, zorder=3, label=f"{op} ({wins}/{len(y)} > 0)")
        ax.axhline(0.0, color="0.2", lw=0.9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("seed")
        ax.set_ylabel(f"Δ accuracy vs {baseline} (pp)")
        ax.yaxis.set_tick_params(labelleft=True)
        ax.set_title(str(panel))
        _grid_and_legend(ax)
    return save_titled(fig, title, out_dir, stem)


def accuracy_by_regime(
    summary: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    medians: dict[str, float],
    title: str,
    out_dir: Path,
    styles: Styles,
    stem: str = "accuracy_by_length_regime",
) -> list[Path]:
    """Mean ± sd accuracy per operator across datasets ordered by median length (one line
    style per value of ``styles.key``, when given)."""
    datasets = present(datasets, summary, "dataset")
    if not datasets:
        return []
    fig = Figure(figsize=(max(4.5, 1.6 * len(datasets) + 2), 3.6), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(datasets))
    ops = present(operators, summary, "operator")
    lines = _series(summary, ops, styles)
    width = 0.5 / max(1, len(lines))
    for i, line in enumerate(lines):
        sub = line[2].set_index("dataset")
        mean = [sub["acc_mean"].get(d, np.nan) for d in datasets]
        sd = [sub["acc_sd"].get(d, np.nan) for d in datasets]
        xs = x + (i - (len(lines) - 1) / 2) * width
        _mean_sd_line(ax, xs, mean, sd, line, styles.colors)
    labels = [f"{d}\n(median {medians[d]:.0f} tok)" if d in medians else str(d) for d in datasets]
    ax.set_xticks(x, labels)
    ax.set_ylabel(f"test accuracy (%)\n{SD_BARS}")
    ax.set_xlabel("dataset, shortest to longest" if medians else "dataset")
    _grid_and_legend(ax)
    ax.set_title(title, fontsize=10)
    return save(fig, out_dir, stem)


def accuracy_vs_latency(
    summary: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    title: str,
    out_dir: Path,
    styles: Styles,
    stem: str = "accuracy_vs_latency",
) -> list[Path]:
    """Mean ± sd accuracy against mean latency with bars from the fastest to the slowest run
    (``latency_bar``: a latency is never below 0, and its spread is skewed), one panel per
    dataset (one marker per value of ``styles.key``, when given)."""
    datasets = present(datasets, summary, "dataset")
    if not datasets or summary["latency_mean"].isna().all():
        return []
    colors = styles.colors
    fig, axes = _panels(len(datasets))
    for ax, d in zip(axes, datasets, strict=True):
        sub = summary[summary["dataset"] == d]
        for op in operators:
            for level, rows, _, marker in _styled(sub, styles):
                r = rows[rows["operator"] == op]
                if r.empty:
                    continue
                r = r.iloc[0]
                ax.errorbar(
                    r["latency_mean"],
                    r["acc_mean"],
                    xerr=latency_bar(r),
                    yerr=0 if pd.isna(r["acc_sd"]) else r["acc_sd"],
                    fmt=marker,
                    color=colors[op],
                    capsize=3,
                    label=_label(op, level),
                )
        ax.set_xlabel("inference latency (ms/sample)")
        ax.set_title(str(d))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    _figure_legend(fig, axes)  # one legend beside the panels: the same entries in each
    return save_titled(fig, f"{title}\n{LATENCY_BARS}", out_dir, stem)


LATENCY_BARS = (
    "accuracy: mean ± 1 sd over seeds; latency: mean, bars from the fastest to the slowest run"
)


FOREST_DECIDED = "C0"
"""The colour of a decided hypothesis in the forest plot; an open one is grey."""


def forest(rows: pd.DataFrame, out_dir: Path, stem: str, title: str) -> list[Path]:
    """One line per hypothesis, top to bottom in the family's order: its Hodges-Lehmann
    estimate (its mean where it has none) as a point, with its e-BY interval where it is decided
    and, greyed, its simultaneous confidence sequence where it is not (open, or stopped as
    futile; an unbounded sequence is not drawn); the verdict at the right, a zero line.
    ``rows``: the decisions table (``comparison``, ``state``, ``verdict``, ``hodges_lehmann``,
    ``mean``, ``ci_*``, ``cs_*``)."""
    n = len(rows)
    fig = Figure(figsize=(7.5, 1.0 + 0.32 * n), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(rows.to_dict(orient="records")):
        y = n - 1 - i
        decided = r["state"] not in ("open", "futile")
        low, high = (r["ci_low"], r["ci_high"]) if decided else (r["cs_low"], r["cs_high"])
        colour = FOREST_DECIDED if decided else "0.65"
        point = r["hodges_lehmann"] if not pd.isna(r["hodges_lehmann"]) else r["mean"]
        if not (pd.isna(low) or pd.isna(high) or math.isinf(low) or math.isinf(high)):
            ax.plot([low, high], [y, y], color=colour, linewidth=2, solid_capstyle="butt")
        if not pd.isna(point):
            ax.plot([point], [y], marker="o", color=colour, markersize=5)
        ax.annotate(
            str(r["verdict"]), (1.01, y), xycoords=("axes fraction", "data"), fontsize=7,
            va="center", color="black" if decided else "0.45",
        )  # fmt: skip
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(n), [str(c) for c in rows["comparison"]][::-1], fontsize=7)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("effect (accuracy points): Hodges-Lehmann estimate, e-BY interval", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="0.9")
    ax.set_title(title, fontsize=9)
    return save(fig, out_dir, stem)


def latency_bar(row: pd.Series) -> list[list[float]]:
    """The latency bar of one group as matplotlib's ``xerr`` (below, above the mean): to the
    fastest and the slowest run's latency, so it never reaches below 0 ms (mean ± sd does
    wherever a group's latencies spread more than their mean: a skewed, positive quantity)."""
    mean = float(row["latency_mean"])
    low = row.get("latency_min", math.nan)
    high = row.get("latency_max", math.nan)
    if pd.isna(low) or pd.isna(high) or pd.isna(mean):
        return [[0.0], [0.0]]
    return [[max(mean - float(low), 0.0)], [max(float(high) - mean, 0.0)]]


def accuracy_by_length_bucket(
    accuracy: pd.DataFrame,
    length_stats: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    baseline: str,
    title: str,
    out_dir: Path,
    styles: Styles,
    stem: str = "accuracy_by_length_bucket",
    confidence: float = 0.95,
) -> list[Path]:
    """Top row: accuracy by length quantile per operator; bottom: mean paired delta per bucket
    with its percentile-bootstrap interval and a zero line (one line style per value of
    ``styles.key``, when given)."""
    datasets = present(datasets, accuracy, "dataset")
    if not datasets:
        return []
    fig = Figure(figsize=(4.2 * len(datasets), 6.0), layout="constrained")
    axes = fig.subplots(2, len(datasets), squeeze=False)
    for j, d in enumerate(datasets):
        top, bottom = axes[0][j], axes[1][j]
        sub = accuracy[accuracy["dataset"] == d]
        labels = sub.drop_duplicates("bucket").sort_values("bucket")["label"].tolist()
        _bucket_accuracy_panel(top, sub, operators, styles)
        top.set_title(str(d))
        top.set_xticks(np.arange(len(labels)), labels, fontsize=7)
        top.grid(axis="y", alpha=0.3)
        st = length_stats[(length_stats["dataset"] == d) & (length_stats["bucket"] != "long-short")]
        _bucket_delta_panel(bottom, st, operators, baseline, styles, confidence)
        bottom.set_xticks(np.arange(len(labels)), labels, fontsize=7)
        bottom.grid(axis="y", alpha=0.3)
    _figure_legend(fig, axes[0])
    return save_titled(fig, title, out_dir, stem)


def _mean_sd_line(ax, x: Any, mean: Any, sd: Any, line: tuple, colors: dict[str, str]) -> None:
    """Mean ± sd of one ``_series`` entry: markers joined by its line style, in its
    operator's colour, labelled with the operator and level."""
    op, level, _, ls, mk = line
    ax.errorbar(
        x,
        mean,
        yerr=sd,
        fmt=mk,
        ls=ls,
        color=colors[op],
        capsize=3,
        ms=4,
        lw=1,
        label=_label(op, level),
    )


def _series(
    frame: pd.DataFrame, operators: Sequence[str], styles: Styles
) -> list[tuple[str, str | None, pd.DataFrame, str, str]]:
    """(operator, level, rows, line style, marker) for each operator and style level present."""
    return [
        (op, level, rows[rows["operator"] == op], ls, mk)
        for op in present(operators, frame, "operator")
        for level, rows, ls, mk in _styled(frame, styles)
        if (rows["operator"] == op).any()
    ]


def _bucket_accuracy_panel(ax, sub: pd.DataFrame, operators: Sequence[str], styles: Styles) -> None:
    """Mean ± sd accuracy per length bucket, one line per operator (and style level)."""
    series = _series(sub, operators, styles)
    step = 0.3 / max(1, len(series))
    for i, line in enumerate(series):
        r = line[2].sort_values("bucket")
        xs = r["bucket"] + (i - (len(series) - 1) / 2) * step
        _mean_sd_line(ax, xs, r["acc_mean"], r["acc_sd"].fillna(0), line, styles.colors)
    ax.set_ylabel(f"accuracy (%)\n{SD_BARS}")


def _bucket_delta_panel(
    ax,
    st: pd.DataFrame,
    operators: Sequence[str],
    baseline: str,
    styles: Styles,
    confidence: float = 0.95,
) -> None:
    """Mean paired delta per length bucket with its bootstrap interval, and a zero line."""
    colors = styles.colors
    series = _series(st, operators, styles)
    width = 0.5 / max(1, len(series))
    for i, (op, level, r, _, mk) in enumerate(series):
        r = r.assign(b=lambda f: f["bucket"].astype(int)).sort_values("b")
        xs = r["b"].to_numpy() + (i - (len(series) - 1) / 2) * width
        err = np.vstack([r["mean_delta"] - r["ci_low"], r["ci_high"] - r["mean_delta"]])
        ax.errorbar(
            xs,
            r["mean_delta"],
            yerr=np.nan_to_num(err),
            fmt=mk,
            color=colors[op],
            capsize=3,
            label=_label(op, level),
        )
    ax.axhline(0.0, color="0.2", lw=0.9)
    ax.set_xlabel("document length (tokens, quantile buckets)")
    ax.set_ylabel(f"Δ vs {baseline} (pp)\nmean, bars: {confidence:.0%} bootstrap CI")


def accuracy_by_eval_length(
    curves: pd.DataFrame,
    operators: Sequence[str],
    title: str,
    out_dir: Path,
    stem: str = "accuracy_by_eval_length",
    colors: dict[str, str] | None = None,
) -> list[Path]:
    """Accuracy against evaluation length, one panel per value of ``curves["panel"]`` (in
    order of appearance): a line per operator (colour) and ``setting`` (line style and marker),
    mean ± sd over seeds as a band, a log2 x axis with a tick at each length, and a dashed
    vertical line at each training length ``train_length``."""
    panels = list(dict.fromkeys(curves["panel"]))
    if not panels:
        return []
    colors = colors or operator_colors(operators)
    settings = list(dict.fromkeys(curves["setting"]))
    styles = level_styles(settings)
    fig, axes = _panels(len(panels), width=5.2, height=3.8, sharey=True)
    for ax, panel in zip(axes, panels, strict=True):
        sub = curves[curves["panel"] == panel]
        for op in present(operators, sub, "operator"):
            for setting in present(settings, sub, "setting"):
                r = sub[(sub["operator"] == op) & (sub["setting"] == setting)]
                r = r.sort_values("eval_length")
                x, y = r["eval_length"].to_numpy(float), r["acc_mean"].to_numpy(float)
                sd = r["acc_sd"].fillna(0.0).to_numpy(float)
                ls, mk = styles[setting]
                label = op if len(settings) == 1 else f"{op} ({setting})"
                ax.plot(x, y, ls=ls, marker=mk, ms=4, lw=1.2, color=colors[op], label=label)
                ax.fill_between(x, y - sd, y + sd, color=colors[op], alpha=0.12, lw=0)
        for i, t in enumerate(sorted(sub["train_length"].dropna().unique())):
            train_label = "training length" if i == 0 else None
            ax.axvline(float(t), color="0.3", ls="--", lw=0.9, label=train_label)
        lengths = sorted(sub["eval_length"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks([float(v) for v in lengths], [str(int(v)) for v in lengths])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("evaluation length (tokens, log2 scale)")
        ax.set_ylabel(f"test accuracy (%), band: {SD_BARS.removeprefix('bars: ')}")
        ax.yaxis.set_tick_params(labelleft=True)
        ax.set_title(str(panel))
        _grid_and_legend(ax, "both")
    return save_titled(fig, title, out_dir, stem)
