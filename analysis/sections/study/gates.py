"""Where gated fusion operators put their weight: the gate g on E against token position.

A gated operator (``gate_scalar``, ``gate_vector``, ``gate_cnn``, ``gate_mlp``) mixes
H = g * E + (1 - g) * P. Each of its trial runs carries ``gate_by_position.parquet``
(``schema.GATES_FILE``): g on the run's test split at its best validation epoch, averaged by
position bucket (columns ``schema.GATE_COLUMNS``). ``gate_frame`` gathers those tables with the
runs' tags; ``plot_gates`` draws the mean weight on E against position, one line per operator,
so one can see whether a gate leans on the tokens (g > 0.5) or on position (g < 0.5), and where
along the document that changes. ``gate_summary`` gives the same numbers as a table (mean and
range over seeds per bucket) and ``gate_ends`` its first and last bucket, for the report's
gate section (``GATES``: its markdown, figure, CSV file and stats.json block).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.load import FINISHED, local_artifact_path, tag_column  # noqa: E402
from analysis.render.drawing import operator_colors, save  # noqa: E402
from analysis.render.escape import md  # noqa: E402
from analysis.render.tables import column_label  # noqa: E402
from analysis.sections.base import Drawn, Section, records, write_csv  # noqa: E402
from analysis.sections.context import ReportContext, display_order  # noqa: E402
from fusion_ray.schema import AXIS_TAG_PREFIX, GATE_COLUMNS, GATED_TAG, GATES_FILE  # noqa: E402

#: The trial tags each row of the gate frame carries, beside every ``axis.*`` tag of its run.
RUN_TAGS = ("dataset", "fusion", "position", "attention_position", "seed")
#: The gate frame's leading columns (tag ``fusion`` is column ``operator``, as in analysis.load).
ID_COLUMNS = ["run_id", *(tag_column(t) for t in RUN_TAGS)]
#: The report's file of the gate summary (mean, min and max over seeds per bucket).
GATES_CSV = "gates_by_position.csv"
#: The built-in gated operators, for runs logged before trial runs carried ``schema.GATED_TAG``
#: (newer runs say themselves whether their operator is gated).
UNTAGGED_GATED_OPERATORS = ("gate_scalar", "gate_vector", "gate_cnn", "gate_mlp")
#: Columns of ``gate_summary`` after the group keys and ``operator``.
SUMMARY_COLUMNS = (
    "bucket_start",
    "bucket_end",
    "bucket",
    "n_seeds",
    "tokens",
    "gate_mean",
    "gate_min",
    "gate_max",
)


def is_gated(label: Any) -> bool:
    """Whether an operator label (tag ``fusion``: ``name`` or ``name(k=v,...)``) names one of
    the built-in gated operators (for runs without ``schema.GATED_TAG``)."""
    return str(label).split("(", 1)[0] in UNTAGGED_GATED_OPERATORS


def gated_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of gated operators, the only ones worth searching for ``schema.GATES_FILE``: by
    their ``schema.GATED_TAG``, or for runs logged without it, by the built-in names."""
    by_name = runs["operator"].map(is_gated)
    if GATED_TAG not in runs:
        return runs[by_name]
    tag = runs[GATED_TAG]
    return runs[tag.eq("true") | (tag.isna() & by_name)]


def gate_frame(client: Any, runs: Iterable[str], max_workers: int = 8) -> pd.DataFrame:
    """The gate-by-position tables of ``runs`` (run ids, e.g. ``experiment.finished["run_id"]``),
    one row per (run, position bucket), with each run's tags.

    Columns: ``run_id``, ``dataset``, ``operator`` (tag ``fusion``), ``position``,
    ``attention_position``, ``seed`` (nullable integer), one column per ``axis.*`` tag found on
    any of the runs (None on runs without it), then ``schema.GATE_COLUMNS``. Runs that are not
    FINISHED, and runs without the artifact (operators without a gate), contribute no rows.
    ``client`` is an ``mlflow.MlflowClient`` for the runs' tracking URI; artifacts are fetched
    with its ``download_artifacts``, a few runs at a time.
    """
    run_ids = list(dict.fromkeys(runs))
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        parts = [part for part in pool.map(lambda r: _run_gates(client, r), run_ids) if part]
    frame = pd.concat(
        [table for _, table in parts] or [pd.DataFrame(columns=[*ID_COLUMNS, *GATE_COLUMNS])],
        ignore_index=True,
    )
    axes = sorted({tag for tags, _ in parts for tag in tags if tag.startswith(AXIS_TAG_PREFIX)})
    for offset, axis in enumerate(axes):
        values = [tags.get(axis) for tags, table in parts for _ in range(len(table))]
        frame.insert(len(ID_COLUMNS) + offset, axis, pd.Series(values, dtype=object))
    frame["seed"] = pd.to_numeric(frame["seed"], errors="coerce").astype("Int64")
    return frame


def _read_gates(client: Any, run_id: str, artifact_uri: str | None) -> pd.DataFrame | None:
    """One run's gate table, or None without one: read in place from a local artifact store,
    else listed and downloaded through ``client``."""
    local = local_artifact_path(artifact_uri) if artifact_uri else None
    if local is not None:
        path = local / GATES_FILE
        return pd.read_parquet(path, columns=list(GATE_COLUMNS)) if path.is_file() else None
    if GATES_FILE not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return pd.read_parquet(
            client.download_artifacts(run_id, GATES_FILE, tmp), columns=list(GATE_COLUMNS)
        )


def _run_gates(client: Any, run_id: str) -> tuple[dict[str, str], pd.DataFrame] | None:
    """(tags, gate table with the identifying columns in front) of one run, or None."""
    run = client.get_run(run_id)
    if run.info.status != FINISHED:
        return None
    table = _read_gates(client, run_id, run.info.artifact_uri)
    if table is None:
        return None
    tags = dict(run.data.tags)
    for offset, (column, tag) in enumerate(zip(ID_COLUMNS, ["run_id", *RUN_TAGS], strict=True)):
        table.insert(offset, column, run_id if tag == "run_id" else tags.get(tag))
    return tags, table


def gate_summary(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``frame``'s gate per (``keys``, ``operator``, position bucket), over seeds.

    ``frame`` has the columns ``keys``, ``operator``, ``seed`` and ``schema.GATE_COLUMNS``
    (``gate_frame``'s rows). As in the figure, the runs of one seed are averaged first; then
    ``gate_mean`` is the mean over seeds and ``gate_min`` / ``gate_max`` the lowest and highest
    seed. ``n_seeds`` counts the seeds, ``tokens`` is the bucket's tokens per seed (their mean),
    ``bucket`` labels the token positions (``0``, ``2-3``, ...). Buckets without tokens are
    left out; rows are sorted by key, operator and bucket."""
    data = frame[frame["tokens"] > 0].dropna(subset=["gate_mean"])
    group = [*keys, "operator", "bucket_start", "bucket_end"]
    per_seed = data.groupby([*group, "seed"], sort=True, dropna=False).agg(
        gate=("gate_mean", "mean"), tokens=("tokens", "mean")
    )
    summary = (
        per_seed.groupby(level=group, sort=True, dropna=False)
        .agg(
            n_seeds=("gate", "size"),
            tokens=("tokens", "mean"),
            gate_mean=("gate", "mean"),
            gate_min=("gate", "min"),
            gate_max=("gate", "max"),
        )
        .reset_index()
    )
    labels = [
        _bucket_label(int(s), int(e))
        for s, e in zip(summary["bucket_start"], summary["bucket_end"], strict=True)
    ]
    summary.insert(len(group), "bucket", pd.Series(labels, index=summary.index, dtype=object))
    return summary[[*keys, "operator", *SUMMARY_COLUMNS]]


def gate_ends(summary: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per (``keys``, ``operator``) of ``gate_summary``: its first and its last bucket (those
    holding tokens), as ``first_<c>`` and ``last_<c>`` for ``c`` in bucket, n_seeds,
    gate_mean, gate_min, gate_max, and ``change`` = last gate_mean - first gate_mean. Groups
    keep the order of ``summary``."""
    group = [*keys, "operator"]
    values = ("bucket", "n_seeds", "gate_mean", "gate_min", "gate_max")
    rows = []
    for key, grp in summary.groupby(group, sort=False, dropna=False):
        grp = grp.sort_values("bucket_start", kind="stable")
        first, last = grp.iloc[0], grp.iloc[-1]
        row = dict(zip(group, key, strict=True))
        row |= {f"first_{c}": first[c] for c in values}
        row |= {f"last_{c}": last[c] for c in values}
        row["change"] = last["gate_mean"] - first["gate_mean"]
        rows.append(row)
    columns = [*group, *(f"{end}_{c}" for end in ("first", "last") for c in values), "change"]
    return pd.DataFrame(rows, columns=columns)


def gate_figure(frame: pd.DataFrame) -> Figure | None:
    """The figure ``plot_gates`` saves, or None when ``frame`` has no bucket with tokens.

    One panel per dataset and per level of every ``axis.*`` column (and of ``position`` and
    ``attention_position`` where the frame holds several, so that no line averages different
    models), in the order they first occur in ``frame`` (the report passes it in display order:
    datasets shortest first, settings in the sweep file's order); in each, one line per operator: the mean over seeds of ``gate_mean`` per position
    bucket (runs of one seed averaged first), with a band spanning the seeds' lowest to highest
    value, and a dashed line at 0.5 (E and P weighed equally). Buckets without tokens are left
    out.
    """
    data = frame[frame["tokens"] > 0].dropna(subset=["gate_mean"])
    if data.empty:
        return None
    keys = _panel_keys(data)
    panels = list(data.groupby(keys, sort=False, dropna=False))
    colors = operator_colors(sorted(data["operator"].astype(str).unique()))
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5.8 * cols, 3.4 * rows), layout="constrained")  # legends beside panels
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (key, panel) in zip(axes, panels, strict=False):
        _draw_panel(ax, panel, colors)
        parts = [f"{_short(k)}={_text(v)}" for k, v in zip(keys[1:], key[1:], strict=True)]
        ax.set_title(", ".join([str(key[0]), *parts]), fontsize=9)
    fig.suptitle(
        # three short lines: the figure is 4.6 in wide when it has a single panel
        "Gate on token embeddings by position\n(test split, best epoch;\n"
        "line: mean over seeds, band: their range)",
        fontsize=10,
    )
    return fig


def plot_gates(frame: pd.DataFrame, path: str | Path) -> Path | None:
    """Save ``gate_figure(frame)`` as a PNG at ``path``; None (and no file) when the frame has
    nothing to draw."""
    fig = gate_figure(frame)
    if fig is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=150)
    return path


def _panel_keys(data: pd.DataFrame) -> list[str]:
    """dataset, the position columns that vary, then every axis.* column."""
    varying = [c for c in ("position", "attention_position") if data[c].nunique(dropna=False) > 1]
    axes = sorted(c for c in data.columns if str(c).startswith(AXIS_TAG_PREFIX))
    return ["dataset", *varying, *axes]


def _short(column: str) -> str:
    return column.removeprefix(AXIS_TAG_PREFIX)


def _text(value: Any) -> str:
    """A panel key's value as a title shows it (``unset`` for a run without the tag)."""
    return (
        "unset" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    )


def _bucket_label(start: int, end: int) -> str:
    return str(start) if end - start == 1 else f"{start}-{end - 1}"


def _draw_panel(ax: Any, panel: pd.DataFrame, colors: dict[str, str]) -> None:
    """One line (mean over seeds) and band (range over seeds) per operator on a categorical
    axis of the panel's position buckets."""
    buckets = sorted(set(zip(panel["bucket_start"], panel["bucket_end"], strict=True)))
    where = {bucket: i for i, bucket in enumerate(buckets)}
    for operator, rows in panel.groupby("operator", sort=True):
        per_seed = rows.groupby(["seed", "bucket_start", "bucket_end"], dropna=False)[
            "gate_mean"
        ].mean()
        stats = per_seed.groupby(level=["bucket_start", "bucket_end"]).agg(["mean", "min", "max"])
        x = np.array([where[bucket] for bucket in stats.index])
        seeds = per_seed.index.get_level_values("seed").nunique(dropna=False)
        color = colors[str(operator)]
        ax.plot(x, stats["mean"], marker="o", ms=3, color=color, label=f"{operator} ({seeds})")
        if seeds > 1:
            ax.fill_between(x, stats["min"], stats["max"], color=color, alpha=0.2, lw=0)
    ax.axhline(0.5, color="0.3", lw=0.9, ls="--")
    ax.set_xticks(range(len(buckets)), [_bucket_label(s, e) for s, e in buckets], rotation=45)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("token position (bucket)")
    ax.set_ylabel("mean gate g (weight on E)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(
        fontsize=7, frameon=False, title="operator (seeds)", title_fontsize=7,
        loc="upper left", bbox_to_anchor=(1.01, 1.0),  # outside the axes: it never covers data
    )  # fmt: skip


# ----------------------------------------------------------------------------- in a report


@dataclass
class GateAnalysis:
    """Where the gated operators' gate g (H = g E + (1 - g) P) puts its weight along the
    document, for the analysed runs that logged ``schema.GATES_FILE``."""

    frame: pd.DataFrame
    """One row per (run, position bucket): ``run_id``, the report's group keys, ``operator``,
    ``seed``, then ``schema.GATE_COLUMNS`` (from ``gates.gate_frame``)."""
    summary: pd.DataFrame
    """Per (group, operator, bucket holding tokens): mean, min and max over seeds
    (``gates.gate_summary``); written as ``gates_by_position.csv``."""
    ends: pd.DataFrame
    """Per (group, operator): the first and the last bucket holding tokens
    (``gates.gate_ends``)."""
    runs: int
    """How many runs logged their gates."""


def analyse_gates(ctx: ReportContext, warnings: list[str]) -> GateAnalysis | None:
    """The gate by position of the analysed runs of gated operators, grouped by the report's
    keys and in display order; None when none of them logged it. Downloads one artifact per
    gated run (ungated runs are not searched). When the artifacts cannot be read, or only some
    gated runs have one, says so in ``warnings``."""
    exp, pairing = ctx.experiment, ctx.pairing
    gated = gated_runs(pairing.runs)
    if gated.empty:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        logged = gate_frame(MlflowClient(exp.tracking_uri), list(gated["run_id"]))
    except (MlflowException, OSError, ValueError) as err:
        warnings.append(
            f"gates: the {GATES_FILE} artifacts of the {len(gated)} gated runs could not be "
            f"read ({err!r}), so the report has no gate figure or section; check that the "
            "artifact store of the runs is reachable from here."
        )
        return None
    have = logged["run_id"].nunique()
    if have and have < len(gated):
        warnings.append(
            f"gates: {len(gated) - have} of the {len(gated)} analysed runs of gated operators "
            f"have no {GATES_FILE}; the gate figure and section show the other {have}."
        )
    keys = list(pairing.keys)
    ids = gated[["run_id", *keys, "operator", "seed"]]
    frame = ids.merge(logged[["run_id", *GATE_COLUMNS]], on="run_id", how="inner")
    summary = gate_summary(frame, keys)
    if summary.empty:
        return None
    summary = display_order(summary, ctx.datasets, ctx.operators, ctx.axis_levels)
    return GateAnalysis(frame, summary, gate_ends(summary, keys), int(have))


# ----------------------------------------------------------------------------- the section


class GateSection(Section):
    """The gated operators' gate by position (only with figures: it downloads an artifact per
    gated run)."""

    study = True
    name = "gates"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> GateAnalysis | None:
        return analyse_gates(ctx, warnings) if ctx.options.make_figures else None

    def markdown(self, result: GateAnalysis, ctx: ReportContext) -> list[str]:
        return gates_markdown(result, ctx)

    def figures(self, result: GateAnalysis, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        return report_gate_figure(result, ctx, fig_dir)

    def data_files(self, result: GateAnalysis, ctx: ReportContext) -> list[Path]:
        return [write_csv(result.summary, ctx.out_dir / GATES_CSV)]

    def record(self, result: GateAnalysis | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        block = {
            "file": GATES_CSV,
            "artifact": GATES_FILE,
            "runs": result.runs,
            "first_and_last_bucket": records(result.ends),
        }
        return {"gates": block}

    def listed_files(self, result: GateAnalysis | None) -> list[str]:
        return [f"`{GATES_CSV}`"] if result is not None else []


def gates_markdown(gates: GateAnalysis, ctx: ReportContext) -> list[str]:
    """Per group and gated operator: the mean gate on E in the first and the last position
    bucket holding tokens, with its range over seeds."""
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
        "| " + " | ".join(map(md, [*heads, "last − first"])) + " |",
        "|" + "---|" * (len(heads) + 1),
    ]
    for r in gates.ends.to_dict(orient="records"):
        seeds = {int(r["first_n_seeds"]), int(r["last_n_seeds"])}
        cells = [*(md(r[k]) for k in keys), md(r["operator"])]
        cells += [" / ".join(str(n) for n in sorted(seeds)), md(r["first_bucket"])]
        cells += [_gate_value(r, "first"), md(r["last_bucket"]), _gate_value(r, "last")]
        cells.append(f"{r['change']:+.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", f"Every bucket (mean, min and max over seeds): `{GATES_CSV}`.", ""]


def _gate_value(row: dict, end: str) -> str:
    """``0.482 [0.451, 0.503]`` (no range for a single seed)."""
    mean = f"{row[f'{end}_gate_mean']:.3f}"
    if int(row[f"{end}_n_seeds"]) < 2:
        return mean
    return f"{mean} [{row[f'{end}_gate_min']:.3f}, {row[f'{end}_gate_max']:.3f}]"


def report_gate_figure(gates: GateAnalysis, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
    """The gate on E by position bucket, one panel per dataset and setting (``gates_by_position``).

    ``gates.gate_figure`` makes a panel per ``axis.*`` column: the report's extra axes and
    ``--by`` params are handed over under that prefix, so that no line averages two settings."""
    extra = [k for k in ctx.keys if k not in ("dataset", "position", "attention_position")]
    frame = display_order(gates.frame, ctx.datasets, ctx.operators, ctx.axis_levels)
    frame = frame.rename(columns={k: AXIS_TAG_PREFIX + k for k in extra})
    fig = gate_figure(frame)
    if fig is None:
        return []
    caption = "Gate on token embeddings by position (gated operators; 0.5: E and P weighed equally)"
    return [(caption, save(fig, fig_dir, "gates_by_position"))]


GATES = GateSection()
