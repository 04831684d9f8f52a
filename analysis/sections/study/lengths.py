"""Length-aware analysis from the per-document test predictions (the study did not do this).

Inside each dataset the test documents are cut into length quantile buckets (token counts
before truncation); every run's correct count per bucket gives per-operator accuracy by length
and, paired by seed, integer deltas per bucket with the same statistics as the main
comparisons. A long-minus-short contrast per seed (delta in the longest bucket minus delta in
the shortest) asks directly whether the operator's effect grows with length.

Only ``test_predictions.parquet`` is read (columns length, label, pred), only for the runs in
complete pairs, a thread pool for the I/O, and local artifact stores are read in place.

With extra grid axes, buckets are cut per dataset and axis level (an axis such as the tokenizer's
vocabulary changes the token counts), and the buckets, accuracies and comparisons carry a column
per axis.

``LENGTHS`` is the report's length section (``analysis.sections.base``): its markdown, figure, CSV
files and stats.json block. Its median test length per dataset sets the report's dataset order,
so it runs before the core is put in display order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import read_run_artifacts, recorded_order, unreadable_artifacts
from analysis.render import drawing
from analysis.render.escape import md
from analysis.render.tables import dataset_order, describe_setting, fmt_p, operator_order, select
from analysis.sections.base import Drawn, Section, records, write_csv
from analysis.sections.context import ReportContext, display_order, relabel
from analysis.sections.figures import names, with_level
from analysis.stats import StatsSettings, describe_deltas, finish_family
from fusion_ray.decide.questions import bucket_edges
from fusion_ray.schema import ADAPTIVE_TAG, PREDICTION_COLUMNS, PREDICTIONS_FILE

#: The section's CSV files: comparisons per bucket (and contrasts), accuracy per bucket.
STATS_CSV = "length_stats.csv"
ACCURACY_CSV = "length_accuracy.csv"


@dataclass
class LengthAnalysis:
    """Accuracy by length bucket per operator, and paired deltas per bucket."""

    buckets: pd.DataFrame
    """One row per (dataset, axis levels, bucket): label, token range, documents, share
    truncated."""
    accuracy: pd.DataFrame
    """One row per (group, operator, bucket): mean and sd over seeds of accuracy (%)."""
    stats: pd.DataFrame
    """One row per (group, operator, bucket) comparison, plus bucket 'long-short' contrasts."""
    warnings: list[str] = field(default_factory=list)
    median_length: dict[str, float] = field(default_factory=dict)


def analyse_lengths(
    pairing: Any,
    settings: StatsSettings | None = None,
    n_buckets: int = 4,
    max_workers: int = 8,
    tracking_uri: str | None = None,
) -> LengthAnalysis:
    """Length-bucket accuracy and paired per-bucket statistics for the runs of a Pairing
    (their predictions read through ``tracking_uri`` where the artifact store is remote)."""
    settings = settings or StatsSettings()
    keys = list(pairing.keys)
    scope = ["dataset", *getattr(pairing, "axes", ())]
    pairs = pairing.pairs
    warns: list[str] = []
    used = set(pairs["run_id"]) | set(pairs["baseline_run_id"])
    runs = pairing.runs[pairing.runs["run_id"].isin(used)]
    preds = _read_all(runs, max_workers, warns, tracking_uri)
    buckets, counts, medians = _bucket_counts(runs, preds, n_buckets, warns, scope)
    if counts.empty:
        empty = pd.DataFrame()
        return LengthAnalysis(buckets, empty, empty, warns, medians)
    accuracy = _bucket_accuracy(counts, runs, buckets, keys, scope)
    stats = _bucket_stats(counts, pairs, keys, pairing.baseline, settings)
    if len(stats):
        stats = _finish_families(stats, settings, warns)
    return LengthAnalysis(buckets, accuracy, stats, warns, medians)


def _read_all(
    runs: pd.DataFrame, max_workers: int, warns: list[str], tracking_uri: str | None
) -> dict[str, Any]:
    """run id -> its predictions; runs without the file are warned about and left out, a file
    that exists but cannot be read is an error (``unreadable_artifacts``)."""
    found = read_run_artifacts(
        runs, PREDICTIONS_FILE, PREDICTION_COLUMNS, max_workers, tracking_uri
    )
    if found.broken:
        raise unreadable_artifacts(found, PREDICTIONS_FILE, "length analysis", tracking_uri)
    if found.missing:
        warns.append(
            f"length analysis: {len(found.missing)} of {found.runs} paired runs have no "
            f"{PREDICTIONS_FILE} and are left out (e.g. {', '.join(found.missing[:3])})."
        )
    return found.frames


BUCKET_COLUMNS = [
    "dataset",
    "bucket",
    "label",
    "min_length",
    "max_length",
    "n_docs",
    "truncated_share",
]


def _bucket_counts(
    runs: pd.DataFrame,
    preds: dict[str, Any],
    n_buckets: int,
    warns: list[str],
    scope: list[str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """(the buckets of each dataset (and axis levels: ``scope``), documents and correct ones
    per run and bucket, median test length per dataset). Runs whose predictions disagree with
    their logged counts or with their scope's test lengths are left out (warned)."""
    scope = scope or ["dataset"]
    bucket_rows: list[dict[str, Any]] = []
    count_rows: list[tuple[str, int, int, int]] = []
    medians: dict[str, float] = {}
    inconsistent: list[str] = []
    for key, druns in runs.groupby(scope, sort=True):
        where = dict(zip(scope, key if isinstance(key, tuple) else (key,), strict=True))
        have = [r for r in druns["run_id"] if preds.get(r) is not None]
        if not have:
            continue
        ref = np.sort(preds[have[0]]["length"].to_numpy(np.int64))
        edges = bucket_edges(ref, n_buckets)
        medians.setdefault(str(where["dataset"]), float(np.median(ref)))
        bucket_rows += _describe_buckets(where, ref, edges, _max_length(druns))
        info = druns.set_index("run_id")
        for run_id in have:
            counted = _count_run(preds[run_id], info.loc[run_id], ref, edges)
            if counted is None:
                inconsistent.append(run_id)
                continue
            count_rows += [(run_id, b, n, c) for b, (n, c) in enumerate(counted)]
    if inconsistent:
        warns.append(
            f"length analysis: {len(inconsistent)} run(s) have predictions that disagree with "
            "their test_total / test_correct or with the dataset's test lengths, and are left "
            f"out: {', '.join(inconsistent[:5])}{' ...' if len(inconsistent) > 5 else ''}."
        )
    buckets = pd.DataFrame(bucket_rows, columns=[*scope, *BUCKET_COLUMNS[1:]])
    counts = pd.DataFrame(count_rows, columns=["run_id", "bucket", "n_docs", "correct"])
    return buckets, counts, medians


def _max_length(druns: pd.DataFrame) -> float:
    """The runs' largest ``data.max_length`` (documents beyond it are truncated), NaN if none."""
    if "params.data.max_length" not in druns:
        return math.nan
    return float(pd.to_numeric(druns["params.data.max_length"], errors="coerce").max())


def _describe_buckets(
    where: dict[str, Any], ref: np.ndarray, edges: np.ndarray, max_len: float
) -> list[dict[str, Any]]:
    """One row per bucket of the test lengths ``ref`` of one dataset (and axis levels)."""
    ref_bucket = np.searchsorted(edges, ref, side="right")
    rows = []
    for b in range(len(edges) + 1):
        in_b = ref[ref_bucket == b]
        rows.append(
            {
                **where,
                "bucket": b,
                "label": f"{in_b.min()}-{in_b.max()}",
                "min_length": int(in_b.min()),
                "max_length": int(in_b.max()),
                "n_docs": len(in_b),
                "truncated_share": float((in_b > max_len).mean())
                if not math.isnan(max_len)
                else math.nan,
            }
        )
    return rows


def _count_run(
    df: pd.DataFrame, row: pd.Series, ref: np.ndarray, edges: np.ndarray
) -> list[tuple[int, int]] | None:
    """(documents, correct) per bucket of one run, or None when its predictions disagree with
    its logged test_total / test_correct or with the dataset's test lengths ``ref``."""
    length = df["length"].to_numpy(np.int64)
    correct = (df["pred"].to_numpy() == df["label"].to_numpy()).astype(np.int64)
    if (
        len(df) != row["test_total"]
        or int(correct.sum()) != row["test_correct"]
        or not np.array_equal(np.sort(length), ref)
    ):
        return None
    bucket = np.searchsorted(edges, length, side="right")
    n_b = np.bincount(bucket, minlength=len(edges) + 1)
    c_b = np.bincount(bucket, weights=correct, minlength=len(edges) + 1).astype(np.int64)
    return [(int(n_b[b]), int(c_b[b])) for b in range(len(edges) + 1)]


def _bucket_accuracy(
    counts: pd.DataFrame,
    runs: pd.DataFrame,
    buckets: pd.DataFrame,
    keys: list[str],
    scope: list[str] | None = None,
) -> pd.DataFrame:
    """Accuracy per (group, operator, bucket) over the runs used in pairs."""
    scope = scope or ["dataset"]
    meta = runs[[*keys, "operator", "seed", "run_id"]]
    per_run = counts.merge(meta, on="run_id")
    per_run["acc"] = 100.0 * per_run["correct"] / per_run["n_docs"]
    accuracy = (
        per_run.groupby([*keys, "operator", "bucket"], sort=True)["acc"]
        .agg(acc_mean="mean", acc_sd=lambda s: s.std(ddof=1), n_runs="size")
        .reset_index()
    )
    return accuracy.merge(buckets[[*scope, "bucket", "label", "n_docs"]], on=[*scope, "bucket"])


def _bucket_stats(
    counts: pd.DataFrame,
    pairs: pd.DataFrame,
    keys: list[str],
    baseline: str,
    settings: StatsSettings,
) -> pd.DataFrame:
    """Paired deltas per bucket, and the long-minus-short contrast, per (group, operator)."""
    wide_c = counts.pivot(index="run_id", columns="bucket", values="correct")
    wide_n = counts.pivot(index="run_id", columns="bucket", values="n_docs")
    ok = pairs[pairs["run_id"].isin(wide_c.index) & pairs["baseline_run_id"].isin(wide_c.index)]
    rows = []
    for gkey, grp in ok.groupby([*keys, "operator"], sort=True):
        grp = grp.sort_values("seed")
        c_op = wide_c.loc[grp["run_id"]].to_numpy()
        c_base = wide_c.loc[grp["baseline_run_id"]].to_numpy()
        n_docs = wide_n.loc[grp["run_id"]].to_numpy()
        ident = {**dict(zip([*keys, "operator"], gkey, strict=True)), "baseline": baseline}
        name = "|".join(map(str, gkey))
        valid = ~np.isnan(c_op.astype(float)).any(axis=0)
        nb = [b for b in range(c_op.shape[1]) if valid[b]]
        for b in nb:
            num = (c_op[:, b] - c_base[:, b]).astype(np.int64)
            denom = int(n_docs[0, b])
            row = {**ident, "bucket": str(b), "n_docs": denom}
            row.update(describe_deltas(num, denom, settings, f"{name}|bucket{b}"))
            rows.append(row)
        if len(nb) >= 2:
            lo, hi = nb[0], nb[-1]
            n_lo, n_hi = int(n_docs[0, lo]), int(n_docs[0, hi])
            d_lo = (c_op[:, lo] - c_base[:, lo]).astype(np.int64)
            d_hi = (c_op[:, hi] - c_base[:, hi]).astype(np.int64)
            num = d_hi * n_lo - d_lo * n_hi  # (d_hi/n_hi - d_lo/n_lo) over n_lo*n_hi
            row = {**ident, "bucket": "long-short", "n_docs": n_lo + n_hi}
            row.update(describe_deltas(num, n_lo * n_hi, settings, f"{name}|contrast"))
            rows.append(row)
    return pd.DataFrame(rows)


def _finish_families(
    stats: pd.DataFrame, settings: StatsSettings, warns: list[str]
) -> pd.DataFrame:
    """Buckets and contrasts are two Holm families; a ``family`` column says which."""
    is_contrast = stats["bucket"] == "long-short"
    parts = []
    for label, mask in (
        ("length buckets", ~is_contrast),
        ("long-minus-short contrasts", is_contrast),
    ):
        part = stats[mask].copy()
        warns += finish_family(part, settings, family=f"length analysis, {label}", cautions=False)
        part["family"] = label
        parts.append(part)
    return pd.concat(parts).sort_index()


# ----------------------------------------------------------------------------- the section


class LengthSection(Section):
    """Accuracy and operator effects by document length inside each dataset."""

    study = True
    name = "lengths"
    warns_with = "statistics"
    before_order = True

    def compute(self, ctx: ReportContext, warnings: list[str]) -> LengthAnalysis | None:
        o, pairing = ctx.options, ctx.pairing
        if not o.lengths or not len(pairing.pairs):
            return None
        lengths = analyse_lengths(
            pairing,
            o.settings,
            n_buckets=o.length_buckets,
            tracking_uri=ctx.experiment.tracking_uri,
        )
        if not lengths.stats.empty:
            runs = pairing.runs
            known = recorded_order(ctx.experiment.parent_tags)
            datasets = dataset_order(
                runs["dataset"], lengths.median_length, known.get("dataset", ())
            )
            operators = operator_order(runs["operator"], o.baseline, known.get("operator", ()))
            lengths.stats = display_order(lengths.stats, datasets, operators, ctx.axis_levels)
        warnings += lengths.warnings
        return lengths

    def markdown(self, result: LengthAnalysis, ctx: ReportContext) -> list[str]:
        return length_markdown(result, ctx)

    def figures(self, result: LengthAnalysis, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        return length_figure(result, ctx, fig_dir)

    def data_files(self, result: LengthAnalysis, ctx: ReportContext) -> list[Path]:
        if result.stats.empty:
            return []
        return [
            write_csv(result.stats, ctx.out_dir / STATS_CSV),
            write_csv(result.accuracy, ctx.out_dir / ACCURACY_CSV),
        ]

    def record(self, result: LengthAnalysis | None, ctx: ReportContext) -> dict[str, Any]:
        return {"length_comparisons": records(result.stats if result is not None else None)}

    def listed_files(self, result: LengthAnalysis | None) -> list[str]:
        return [f"`{STATS_CSV}`", f"`{ACCURACY_CSV}`"]


def length_markdown(lengths: LengthAnalysis, ctx: ReportContext) -> list[str]:
    """The length-aware analysis: the buckets, then the comparisons in the main setting."""
    if lengths.stats.empty:
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
    adaptive = bool(ctx.experiment.parent_tags.get(ADAPTIVE_TAG))
    if adaptive:
        lines += [
            "This sweep ran adaptive seeds: the seeds each cell got depended on the decisions, "
            "so these fixed-n tests are descriptive only (no star marks them). The length "
            "question across regimes is decided in the Decisions section (kind `length`).",
            "",
        ]
    lines += truncation_notes(lengths.buckets)
    buckets = lengths.buckets
    bucket_axes = [a for a in ctx.axes if a in buckets]
    plain = buckets.drop(columns=bucket_axes).drop_duplicates()
    if bucket_axes and not plain.duplicated(["dataset", "bucket"]).any():
        buckets, bucket_axes = plain, []  # the same buckets at every level: list them once
    heads = ["dataset", *bucket_axes, "bucket", "tokens", "documents", "truncated"]
    lines += ["| " + " | ".join(map(md, heads)) + " |", "|" + "---|" * len(heads)]
    for _, r in buckets.iterrows():
        trunc = "–" if pd.isna(r["truncated_share"]) else f"{r['truncated_share']:.0%}"
        levels = "".join(f" {md(r[a])} |" for a in bucket_axes)
        lines.append(
            f"| {md(r['dataset'])} |{levels} {md(r['bucket'])} | {md(r['label'])} | "
            f"{r['n_docs']} | {trunc} |"
        )
    stat_axes = [a for a in ctx.axes if a in lengths.stats]
    heads = ["dataset", *stat_axes, "operator", "bucket", "n", "Δ mean (pp)", "HL", "p"]
    heads += ["p Holm", "wins"]
    lines += [
        "",
        f"Contrasts and buckets in the main setting ({md(describe_setting(ctx.main_setting))}):",
        "",
        "| " + " | ".join(map(md, heads)) + " |",
        "|" + "---|" * len(heads),
    ]
    for _, r in select(lengths.stats, ctx.main_setting).iterrows():
        levels = "".join(f" {md(r[a])} |" for a in stat_axes)
        lines.append(
            f"| {md(r['dataset'])} |{levels} {md(r['operator'])} | {md(r['bucket'])} | "
            f"{int(r['n_pairs'])} | "
            f"{r['mean_delta']:+.2f} | {r['hl_estimate']:+.2f} | {fmt_p(r['p_wilcoxon'])} | "
            f"{fmt_p(r['p_holm'])}{'*' if r['significant'] and not adaptive else ''} | "
            f"{int(r['wins'])}/{int(r['n_pairs'])} |"
        )
    return [*lines, "", f"All settings: `{STATS_CSV}`, `{ACCURACY_CSV}`.", ""]


MOSTLY_TRUNCATED = 0.5
"""A longest bucket with at least this share of documents beyond ``max_length`` gets a note."""


def truncation_notes(buckets: pd.DataFrame) -> list[str]:
    """A note per dataset whose longest bucket is mostly truncated: its long-short contrast
    then measures what truncation removes as much as length."""
    if buckets.empty or "truncated_share" not in buckets:
        return []
    out = []
    for dataset, rows in buckets.groupby("dataset", sort=False):
        share = rows.iloc[-1]["truncated_share"]
        if pd.notna(share) and share >= MOSTLY_TRUNCATED:
            out += [
                f"**{md(dataset)}**: {share:.0%} of the longest bucket's documents are longer "
                "than the model's `max_length` and were truncated, so its `long-short` "
                "contrast measures truncation as much as length.",
                "",
            ]
    return out


def length_figure(lengths: LengthAnalysis, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
    """Accuracy by length quantile inside each dataset, in the main setting."""
    if lengths.accuracy.empty:
        return []
    labels = ctx.options.labels
    accuracy, style, order = with_level(select(lengths.accuracy, ctx.main_setting), ctx)
    stats, _, _ = with_level(select(lengths.stats, ctx.main_setting), ctx)
    operators = names(ctx, "operators", ctx.operators)
    paths = drawing.accuracy_by_length_bucket(
        relabel(accuracy, labels),
        relabel(stats, labels),
        names(ctx, "datasets", ctx.datasets),
        operators,
        names(ctx, "operators", [ctx.baseline])[0],
        f"Accuracy by document length inside each dataset ({describe_setting(ctx.main_setting)})",
        fig_dir,
        drawing.Styles(drawing.operator_colors(operators), style, order),
        confidence=ctx.options.settings.confidence,
    )
    return [("Accuracy by length quantile inside each dataset", paths)]


LENGTHS = LengthSection()
