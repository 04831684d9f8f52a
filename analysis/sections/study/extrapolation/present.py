"""Train short, test long, shown: the tables, the stats.json record, the markdown and the
figure of an ``Extrapolation`` (``compute``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.render import drawing
from analysis.render.tables import Table, column_label, fmt
from analysis.sections.base import Drawn, records
from analysis.sections.context import ReportContext
from analysis.sections.study.extrapolation.compute import CSV_FILES, LONGER, Extrapolation
from analysis.stats import (
    hl_label,
    hl_marked,
)
from fusion_ray.schema import (
    LENGTH_PREDICTIONS_FILE,
)


def _times_train(length: int, train: float) -> str:
    """``128 (2× T)``: an evaluation length and its ratio to the training length T."""
    return str(length) if pd.isna(train) else f"{length} ({length / train:g}× T)"


def _pp(value: float) -> str:
    """``+1.25``: a signed value in pp, round-off below 1e-9 shown as +0.00 (not -0.00)."""
    return f"{0.0 if abs(value) < 1e-9 else value:+.2f}"


def _interval(estimate: float, low: float, high: float) -> str:
    """``+1.25 [+0.50, +2.00]``."""
    return f"{_pp(estimate)} [{_pp(low)}, {_pp(high)}]"


def _p_cells(r: Any) -> dict[str, str]:
    return {
        "p": f"{r['p_wilcoxon']:.4g}",
        "p Holm": f"{r['p_holm']:.4g}" + ("*" if r["significant"] else ""),
        "wins": f"{int(r['wins'])}/{int(r['n_pairs'])}",
    }


def _guard_note(table: pd.DataFrame, alpha: float) -> list[str]:
    blocked = table[~table["can_reach_alpha"].astype(bool)] if len(table) else table
    if not len(blocked):
        return []
    return [
        f"{len(blocked)} of {len(table)} tests cannot reach {alpha} with their number of seeds "
        f"(smallest attainable Holm-adjusted p = {blocked['min_attainable_p_holm'].min():.3g})."
    ]


def _family_table(
    frame: pd.DataFrame,
    keys: Sequence[str],
    axes: Sequence[str],
    title: tuple[str, str],
    cells: Callable[[pd.Series], dict[str, Any]],
    note: str,
    alpha: float,
) -> Table:
    """A table of one Holm family: per row of ``frame``, the group keys, the operator, its own
    ``cells`` and the p cells; ``title`` is (file name, caption)."""
    rows = [
        {
            **{column_label(k, axes): r[k] for k in keys},
            "operator": r["operator"],
            **cells(r),
            **_p_cells(r),
        }
        for _, r in frame.iterrows()
    ]
    name, caption = title
    notes = [note, *_guard_note(frame, alpha)]
    return Table(name, caption, pd.DataFrame(rows), frame.reset_index(drop=True), notes)


def length_table(
    stats: pd.DataFrame, keys: Sequence[str], axes: Sequence[str], record: Mapping[str, Any]
) -> Table:
    """ "Operator effect at each evaluation length": per comparison and L, the accuracies and
    the paired statistics, Holm over all (comparison, L) tests."""
    alpha, alt = record.get("alpha", 0.05), record.get("alternative", "two-sided")

    def cells(r: pd.Series) -> dict[str, Any]:
        return {
            "L": _times_train(int(r["eval_length"]), r["train_length"]),
            "n": int(r["n_pairs"]),
            "accuracy (%)": fmt(r["acc_mean"], r["acc_sd"]),
            f"{r['baseline']} (%)": fmt(r["baseline_acc_mean"], r["baseline_acc_sd"]),
            "Δ mean [boot CI] (pp)": _interval(r["mean_delta"], r["ci_low"], r["ci_high"]),
            "HL (pp)": _pp(r["hl_estimate"]),
        }

    note = (
        "Accuracy: mean ± sd over the paired seeds of the test split truncated at L (the model "
        "of each run's best validation epoch, chosen at its training length T only). Δ: "
        "operator − baseline accuracy from the integer correct counts at L. Exact "
        f"{alt} Wilcoxon signed-rank test of the per-seed deltas (zero_method = "
        f"{record.get('zero_method', 'wilcox')}); `*`: Holm-adjusted p ≤ {alpha}, Holm over "
        f"all m = {len(stats)} (comparison, L) tests, a family apart from the comparisons at "
        "the training length."
    )
    title = ("extrapolation_by_length", "Operator effect at each evaluation length.")
    return _family_table(stats, keys, axes, title, cells, note, alpha)


def slope_table(
    slopes: pd.DataFrame, keys: Sequence[str], axes: Sequence[str], record: Mapping[str, Any]
) -> Table:
    """ "Does the operator effect change with evaluation length?": the per-seed slopes of the
    delta against log2(L), their exact two-sided Wilcoxon test and Holm."""
    alpha = record.get("alpha", 0.05)

    def cells(r: pd.Series) -> dict[str, Any]:
        return {
            "lengths": r["lengths"].replace(",", ", "),
            "n": int(r["n_pairs"]),
            "Δ median, shortest L (pp)": _pp(r["median_delta_shortest"]),
            "Δ median, longest L (pp)": _pp(r["median_delta_longest"]),
            f"slope: median [{hl_label(record)}] (pp per doubling)": hl_marked(
                _interval(r["median_slope"], r["hl_ci_low"], r["hl_ci_high"]),
                r["hl_ci_method"],
            ),
        }

    note = (
        "Per seed: the least-squares slope of the operator's paired delta against the baseline "
        "(pp) on log2(L) over the evaluation lengths, in pp per doubling of L (the interval is "
        "the Hodges-Lehmann one, `(approx.)` where zeros or tied slopes make its coverage "
        "approximate; wins: positive slopes). Exact two-sided Wilcoxon signed-rank "
        f"test of the slopes over seeds (zero_method = {record.get('zero_method', 'wilcox')}); "
        f"`*`: Holm-adjusted p ≤ {alpha}, Holm over all m = {len(slopes)} slope tests (a family "
        "of its own)."
    )
    title = ("extrapolation_interaction", "Does the operator effect change with evaluation length?")
    return _family_table(slopes, keys, axes, title, cells, note, alpha)


def _documents(r: Any) -> str:
    """A ladder row's documents in words: ``> 128 tokens`` or ``65-128 tokens``."""
    if r["documents"] == LONGER:
        return f"> {int(r['l2'])} tokens"
    return f"{int(r['l1']) + 1}-{int(r['l2'])} tokens"


def ladder_table(
    ladder: pd.DataFrame, keys: Sequence[str], axes: Sequence[str], record: Mapping[str, Any]
) -> Table:
    """The truncation ladder: per comparison, step and documents, the mean gains of the
    operator and of the baseline and the paired statistics of their difference."""
    alpha, alt = record.get("alpha", 0.05), record.get("alternative", "two-sided")

    def cells(r: pd.Series) -> dict[str, Any]:
        return {
            "L1 → L2": f"{int(r['l1'])} → {_times_train(int(r['l2']), r['train_length'])}",
            "documents": _documents(r),
            "docs": int(r["n_docs"]),
            "n": int(r["n_pairs"]),
            "gain (pp)": _pp(r["gain_mean"]),
            f"{r['baseline']} gain (pp)": _pp(r["baseline_gain_mean"]),
            "Δ gain mean [boot CI] (pp)": _interval(r["mean_delta"], r["ci_low"], r["ci_high"]),
        }

    note = (
        "Gain: accuracy at L2 minus accuracy at L1 on the same documents (pp), mean over the "
        "paired seeds. Δ gain: the operator's gain minus the baseline's, per seed, from integer "
        f"correct counts; exact {alt} Wilcoxon signed-rank test over seeds (zero_method = "
        f"{record.get('zero_method', 'wilcox')}); `*`: Holm-adjusted p ≤ {alpha}, Holm over all "
        f"m = {len(ladder)} ladder tests (a family of its own)."
    )
    title = (
        "truncation_ladder",
        "Truncation ladder: accuracy gained from a longer truncation, on the same documents.",
    )
    return _family_table(ladder, keys, axes, title, cells, note, alpha)


def extrapolation_tables(
    ex: Extrapolation | None, keys: Sequence[str], axes: Sequence[str], record: Mapping[str, Any]
) -> dict[str, Table]:
    """The report's tables of this analysis, those with rows: ``extrapolation:by_length``,
    ``extrapolation:interaction`` and ``extrapolation:ladder``."""
    if ex is None:
        return {}
    made = {
        "extrapolation:by_length": (ex.stats, length_table),
        "extrapolation:interaction": (ex.slopes, slope_table),
        "extrapolation:ladder": (ex.ladder, ladder_table),
    }
    return {
        name: build(frame, keys, axes, record)
        for name, (frame, build) in made.items()
        if len(frame)
    }


def written_files(ex: Extrapolation) -> list[str]:
    """The names of the CSV files (``CSV_FILES``) that have rows."""
    return [name for attribute, name in CSV_FILES.items() if len(getattr(ex, attribute))]


def extrapolation_record(ex: Extrapolation) -> dict[str, Any]:
    """stats.json's block on the train-short-test-long analysis: lengths, families, rows."""
    return {
        "eval_lengths": ex.lengths,
        "train_lengths": ex.train_lengths,
        "files": written_files(ex),
        "by_length": {"m": len(ex.stats), "rows": records(ex.stats)},
        "slopes": {
            "m": len(ex.slopes),
            "test": "exact two-sided Wilcoxon signed-rank of the per-seed least-squares slopes "
            "of the delta (pp) on log2(evaluation length); Holm over all slope tests",
            "rows": records(ex.slopes),
        },
        "truncation_ladder": {
            "predictions_read": ex.predictions_read,
            "m": len(ex.ladder),
            "rows": records(ex.ladder),
        },
    }


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


def extrapolation_markdown(
    ex: Extrapolation, tables: dict[str, Table], ctx: ReportContext
) -> list[str]:
    """Train short, test long: the effect at each evaluation length, whether it changes with
    the length, and the truncation ladder."""
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
    lines += fire_note(ctx, ex)
    for name, absent in (
        ("extrapolation:by_length", "No seed pair has counts at an evaluation length."),
        ("extrapolation:interaction", "Not tested: no comparison has two evaluation lengths."),
    ):
        table = tables.get(name)
        lines += [table.to_markdown() if table is not None else absent, ""]
    lines += [LADDER_TEXT, ""]
    ladder = tables.get("extrapolation:ladder")
    if ladder is not None:
        lines += [ladder.to_markdown(), ""]
    elif not ex.predictions_read:
        lines += ["Not computed: --no-lengths, so the by-length predictions were not read.", ""]
    else:
        lines += ["No run's by-length predictions gave a ladder step (see the warnings).", ""]
    files = ", ".join(f"`{n}`" for n in written_files(ex))
    return [*lines, f"Every column: {files}.", ""]


def fire_input_ceiling(length: int, c: float = 0.1, threshold: float = 512.0) -> float:
    """The largest input FIRE's MLP gets at ``length`` tokens in this bidirectional encoder:
    psi(length - 1) / psi(threshold), psi(x) = log(c x + 1) (a query before the threshold with a
    key at the far right), at FIRE's initial c and threshold."""
    return math.log1p(c * (length - 1)) / math.log1p(c * max(threshold, 0.0))


def fire_note(ctx: ReportContext, ex: Extrapolation) -> list[str]:
    """When ``fire`` runs are evaluated beyond their training length: the MLP's inputs there
    exceed what it was trained on, so its long-length results extrapolate the MLP too."""
    runs = ctx.pairing.runs
    if "attention_position" not in runs or not ex.lengths or not ex.train_lengths:
        return []
    if not runs["attention_position"].astype(str).str.startswith("fire").any():
        return []
    trained, longest = max(ex.train_lengths), max(ex.lengths)
    if longest <= trained:
        return []
    return [
        "**FIRE beyond its training length.** `fire` feeds its MLP psi(|i - j|) / "
        "psi(max(threshold, i)), psi(x) = log(c x + 1). The published FIRE is causal (j <= i), "
        "so the input stays in [0, 1]; in this bidirectional encoder keys to the right of a "
        "query make it larger. With the initial c = 0.1 and threshold 512 the largest input is "
        f"{fire_input_ceiling(trained):.2f} at the training length {trained} and "
        f"{fire_input_ceiling(longest):.2f} at {longest}: beyond T the MLP is also evaluated on "
        "inputs it never saw, and `fire`'s long-length results include that extrapolation.",
        "",
    ]


def extrapolation_figure(ex: Extrapolation, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
    """Accuracy against evaluation length: a panel per dataset and level of the other group
    keys (extra axes, ``--by`` params), a line per operator and position setting."""
    if ex.accuracy.empty:
        return []
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
        colors=drawing.operator_colors(ctx.operators),
    )
    return [("Accuracy against evaluation length (dashed: the training length)", paths)]
