"""Train short, test long, computed: the accuracy curves over evaluation lengths, the operator
effect at each length, the slope of the effect against log2 of the length, and the truncation
ladder (``analyse_extrapolation`` -> ``Extrapolation``). Numbers only: nothing is written.

Why one module of this size: the curves, the per-length comparisons, the slopes and the ladder
are four views of one ``Extrapolation``, computed from the same paired counts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import (
    ACC_TOLERANCE,
    PARAM_PREFIX,
    eval_length_metric,
    eval_length_metrics,
    read_run_artifacts,
    unreadable_artifacts,
)
from analysis.stats import (
    StatsSettings,
    common_denominator,
    describe_deltas,
    exact_family_warnings,
    exact_test_columns,
    finish_family,
    integer_deltas,
)
from fusion_ray.schema import (
    EVAL_LENGTH_METRIC_PREFIXES,
    LENGTH_PREDICTION_COLUMNS,
    LENGTH_PREDICTIONS_FILE,
)

#: The param holding a run's training length (documents are truncated to it in training).
TRAIN_LENGTH_PARAM = PARAM_PREFIX + "data.max_length"
#: The three Holm families of this analysis, as warnings and report.md name them.
STATS_FAMILY = "operator effect at each evaluation length"
SLOPE_FAMILY = "slope of the operator effect against log2(evaluation length)"
LADDER_FAMILY = "truncation ladder"
#: The two sets of documents of a ladder step L1 -> L2.
LONGER = "longer than L2"
FIT = "fit in L2"
#: Slopes computed in floats are rounded to this many decimals before ranking, so that
#: round-off cannot break a tie or turn an exact zero into a sign.
SCORE_DECIMALS = 6
#: The report's files of this analysis: attribute of ``Extrapolation`` -> file name.
CSV_FILES = {
    "stats": "extrapolation.csv",
    "accuracy": "extrapolation_accuracy.csv",
    "slopes": "extrapolation_interaction.csv",
    "ladder": "truncation_ladder.csv",
}
#: The long frame of per-length counts.
COUNT_COLUMNS = ("run_id", "eval_length", "correct", "total")
#: Per run and ladder step: the documents and how many of them are right at L1 and at L2.
LADDER_RUN_COLUMNS = ("run_id", "l1", "l2", "documents", "n_docs", "correct_l1", "correct_l2")


@dataclass
class Extrapolation:
    """The train-short-test-long analysis of a report (``analyse_extrapolation``)."""

    lengths: list[int]
    """Every evaluation length logged by an analysed run, ascending."""
    accuracy: pd.DataFrame
    """Curves: one row per (group, operator, training length, L): runs, mean, sd, min and max
    of accuracy (%) over seeds."""
    stats: pd.DataFrame
    """One row per (group, operator, L): accuracies and the paired statistics against the
    baseline at L, Holm over the whole table (``STATS_FAMILY``)."""
    slopes: pd.DataFrame
    """One row per (group, operator): the per-seed slope of the delta against log2(L), its
    exact two-sided Wilcoxon test and Holm over the table (``SLOPE_FAMILY``)."""
    seed_slopes: pd.DataFrame
    """One row per (group, operator, seed): its slope (pp per doubling of L)."""
    ladder: pd.DataFrame
    """One row per (group, operator, step L1 -> L2, documents): mean gain of the operator and
    of the baseline, and the paired statistics of their difference, Holm over the table
    (``LADDER_FAMILY``). Empty when no predictions were read."""
    ladder_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per (run, step, documents): ``LADDER_RUN_COLUMNS`` and ``gain`` (pp)."""
    predictions_read: bool = False
    """Whether the by-length predictions were read (the ladder needs them)."""
    warnings: list[str] = field(default_factory=list)

    @property
    def train_lengths(self) -> list[int]:
        """The training lengths of the analysed runs, ascending."""
        values: pd.Series | list[float] = (
            self.accuracy["train_length"].dropna() if len(self.accuracy) else []
        )
        return sorted({int(v) for v in values})


# ----------------------------------------------------------------------------- loading


def logged_lengths(runs: pd.DataFrame) -> list[int]:
    """The evaluation lengths L with a per-length metric column in ``runs``, ascending."""
    parsed = (eval_length_metric(c) for c in eval_length_metrics(list(runs.columns)))
    return sorted({p[1] for p in parsed if p is not None})


def length_counts(runs: pd.DataFrame, warns: list[str] | None = None) -> pd.DataFrame:
    """The long frame of per-length counts: one row per (run, L) with both counts logged,
    columns ``COUNT_COLUMNS`` (integers). Counts that cannot be true (a fraction, correct above
    total, a total of 0, an accuracy off correct / total) are left out, said in ``warns``."""
    acc_p, correct_p, total_p = EVAL_LENGTH_METRIC_PREFIXES
    frames, bad = [], []
    ids = runs["run_id"].to_numpy()
    for length in logged_lengths(runs):
        if f"{correct_p}{length}" not in runs or f"{total_p}{length}" not in runs:
            continue
        c = pd.to_numeric(runs[f"{correct_p}{length}"], errors="coerce").to_numpy(float)
        t = pd.to_numeric(runs[f"{total_p}{length}"], errors="coerce").to_numpy(float)
        a = runs.get(f"{acc_p}{length}", pd.Series(np.nan, index=runs.index)).to_numpy(float)
        have = ~np.isnan(c) & ~np.isnan(t)
        with np.errstate(invalid="ignore", divide="ignore"):
            whole = (np.mod(c, 1) == 0) & (np.mod(t, 1) == 0)
            agrees = np.isnan(a) | (np.abs(a - c / t) <= ACC_TOLERANCE)
            ok = have & whole & (c >= 0) & (c <= t) & (t > 0) & agrees
        bad += [f"{r} at {length}" for r in ids[have & ~ok]]
        frames.append(
            pd.DataFrame(
                {
                    "run_id": ids[ok],
                    "eval_length": length,
                    "correct": c[ok].astype(np.int64),
                    "total": t[ok].astype(np.int64),
                }
            )
        )
    if bad and warns is not None:
        warns.append(
            f"train short, test long: {len(bad)} per-length count(s) cannot be true (not whole, "
            "correct above total, total 0, or accuracy off correct / total) and are left out: "
            f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}."
        )
    if not frames:
        return pd.DataFrame(columns=list(COUNT_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def train_lengths(runs: pd.DataFrame) -> pd.Series:
    """Each run's training length (param ``data.max_length``), NaN where not logged; indexed
    by run id."""
    if TRAIN_LENGTH_PARAM not in runs:
        return pd.Series(np.nan, index=runs["run_id"].to_numpy(), dtype=float)
    values = pd.to_numeric(runs[TRAIN_LENGTH_PARAM], errors="coerce").astype(float)
    return pd.Series(values.to_numpy(), index=runs["run_id"].to_numpy())


# ----------------------------------------------------------------------------- the analysis


def analyse_extrapolation(
    pairing: Any,
    settings: StatsSettings | None = None,
    read_predictions: bool = True,
    max_workers: int = 8,
    tracking_uri: str | None = None,
) -> Extrapolation | None:
    """Curves, per-length comparisons, slope tests and (with ``read_predictions``) the
    truncation ladder of a Pairing's runs; None when no run logged a per-length metric."""
    settings = settings or StatsSettings()
    runs = pairing.runs
    lengths = logged_lengths(runs)
    if not lengths:
        return None
    warns: list[str] = []
    keys = list(pairing.keys)
    counts = length_counts(runs, warns)
    trained = train_lengths(runs)
    accuracy = accuracy_curves(counts, runs, keys, trained)
    paired = paired_counts(counts, pairing.pairs, keys, trained, warns)
    stats = length_comparisons(paired, keys, pairing.baseline, settings)
    warns += finish_family(stats, settings, family=STATS_FAMILY, cautions=False)
    slopes, seed_slopes = slope_tests(paired, keys, pairing.baseline, settings)
    warns += finish_slopes(slopes, settings)
    ladder, ladder_runs = pd.DataFrame(), pd.DataFrame()
    if read_predictions and len(pairing.pairs):
        ladder_runs = ladder_counts(pairing, counts, max_workers, warns, tracking_uri)
        ladder = ladder_comparisons(ladder_runs, pairing, trained, settings, warns)
        warns += finish_family(ladder, settings, family=LADDER_FAMILY, cautions=False)
    return Extrapolation(
        lengths=lengths,
        accuracy=accuracy,
        stats=stats,
        slopes=slopes,
        seed_slopes=seed_slopes,
        ladder=ladder,
        ladder_runs=ladder_runs,
        predictions_read=read_predictions,
        warnings=warns,
    )


def accuracy_curves(
    counts: pd.DataFrame, runs: pd.DataFrame, keys: Sequence[str], trained: pd.Series
) -> pd.DataFrame:
    """Accuracy (%) per (group, operator, training length, L): runs, mean, sd (ddof 1), min,
    max over seeds."""
    meta = runs[["run_id", *keys, "operator", "seed"]]
    per_run = counts.merge(meta, on="run_id")
    per_run["train_length"] = per_run["run_id"].map(trained)
    per_run["acc"] = 100.0 * per_run["correct"] / per_run["total"]
    cols = [*keys, "operator", "train_length", "eval_length"]
    if per_run.empty:
        return pd.DataFrame(columns=[*cols, "n_runs", "acc_mean", "acc_sd", "acc_min", "acc_max"])
    return (
        per_run.groupby(cols, sort=True, dropna=False)["acc"]
        .agg(
            n_runs="size",
            acc_mean="mean",
            acc_sd=lambda s: s.std(ddof=1),
            acc_min="min",
            acc_max="max",
        )
        .reset_index()
    )


def paired_counts(
    counts: pd.DataFrame,
    pairs: pd.DataFrame,
    keys: Sequence[str],
    trained: pd.Series,
    warns: list[str],
) -> pd.DataFrame:
    """One row per (seed pair, L) where both runs logged counts at L: the pair's keys, both
    correct counts, the total and the training length. A pair whose two runs have different
    totals at L (not the same test documents) is left out at L, said in ``warns``."""
    ident = pairs[[*keys, "operator", "seed", "run_id", "baseline_run_id"]]
    base = counts.rename(
        columns={"run_id": "baseline_run_id", "correct": "baseline_correct", "total": "b_total"}
    )
    merged = ident.merge(counts, on="run_id").merge(base, on=["baseline_run_id", "eval_length"])
    differ = merged["total"] != merged["b_total"]
    if differ.any():
        shown = ", ".join(
            f"{r.run_id} vs {r.baseline_run_id} at {r.eval_length}"
            for r in merged[differ].head(3).itertuples()
        )
        warns.append(
            f"train short, test long: {int(differ.sum())} seed pair(s) were evaluated on "
            f"different numbers of test documents at an evaluation length, and are left out "
            f"there ({shown})."
        )
    merged = merged[~differ].drop(columns="b_total")
    merged["train_length"] = merged["run_id"].map(trained)
    return merged.sort_values([*keys, "operator", "eval_length", "seed"], kind="stable")


def _where(length: int, train: float) -> bool | float:
    """Whether ``length`` lies beyond the training length (NaN when that is unknown)."""
    return math.nan if pd.isna(train) else bool(length > train)


def length_comparisons(
    paired: pd.DataFrame, keys: Sequence[str], baseline: str, settings: StatsSettings
) -> pd.DataFrame:
    """The operator effect at each L: one row per (group, operator, L) with the accuracies and
    ``describe_deltas`` of the integer paired deltas (the family columns are added by
    ``finish_family``)."""
    rows = []
    for gkey, grp in paired.groupby([*keys, "operator", "eval_length"], sort=True):
        correct = grp["correct"].to_numpy(np.int64)
        base = grp["baseline_correct"].to_numpy(np.int64)
        total = grp["total"].to_numpy(np.int64)
        num, denom = integer_deltas(correct, base, total)
        acc, base_acc = 100.0 * correct / total, 100.0 * base / total
        n, train = len(grp), grp["train_length"].iloc[0]
        row: dict[str, Any] = dict(zip([*keys, "operator", "eval_length"], gkey, strict=True))
        row.update(
            baseline=baseline,
            train_length=train,
            beyond_training=_where(int(row["eval_length"]), train),
            seeds=",".join(str(int(s)) for s in grp["seed"]),
            test_total=int(total[0]) if len(set(total)) == 1 else -1,
            acc_mean=float(acc.mean()),
            acc_sd=float(acc.std(ddof=1)) if n > 1 else math.nan,
            baseline_acc_mean=float(base_acc.mean()),
            baseline_acc_sd=float(base_acc.std(ddof=1)) if n > 1 else math.nan,
        )
        name = "|".join(map(str, gkey))
        row.update(describe_deltas(num, denom, settings, f"extrapolation|{name}"))
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- slopes


def slope_weights(lengths: Sequence[int]) -> np.ndarray:
    """u_L = k log2(L) - sum over the k lengths of log2: the centred log-lengths times k, so
    that the least-squares slope of y against log2(L) is k * sum(u y) / sum(u^2). Integers
    when every L is a power of two."""
    x = np.log2(np.asarray(lengths, dtype=float))
    return len(x) * x - x.sum()


def seed_scores(num: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """Per seed (row of ``num``: integer deltas at each of ``lengths``), sum(u_L num_L): the
    slope up to a positive factor shared by the comparison, rounded to ``SCORE_DECIMALS`` (exact
    integers for power-of-two lengths), so that ties and zeros are exact."""
    return np.round(num.astype(float) @ slope_weights(lengths), SCORE_DECIMALS) + 0.0


def slope_tests(
    paired: pd.DataFrame, keys: Sequence[str], baseline: str, settings: StatsSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one slope test per (group, operator) with two or more lengths, the per-seed slopes).

    Only seeds paired at every length of the comparison enter it. Per seed the slope, in pp per
    doubling of L, is the least-squares slope of the delta against log2(L); the test is the
    exact two-sided Wilcoxon signed-rank test of the slopes (the direction of a change is not
    known in advance), run on ``seed_scores`` (a positive multiple of the slopes)."""
    rows, per_seed = [], []
    for gkey, grp in paired.groupby([*keys, "operator"], sort=True):
        lengths = sorted(grp["eval_length"].unique())
        values = ["correct", "baseline_correct", "total", "train_length"]
        wide = grp.pivot(index="seed", columns="eval_length", values=values)
        wide = wide[wide["correct"].notna().all(axis=1)]
        if len(lengths) < 2 or wide.empty:
            continue
        total = wide["total"][lengths].to_numpy(np.int64)
        denom = common_denominator(total.ravel())
        delta = wide["correct"][lengths].to_numpy(np.int64)
        delta = (delta - wide["baseline_correct"][lengths].to_numpy(np.int64)) * (denom // total)
        u = slope_weights(lengths)
        scores = seed_scores(delta, lengths)
        factor = 100.0 * len(lengths) / (denom * float(u @ u))  # pp per doubling per score
        slope = factor * scores
        ident = dict(zip([*keys, "operator"], gkey, strict=True))
        seeds = [int(s) for s in wide.index]
        per_seed += [{**ident, "seed": s, "slope": v} for s, v in zip(seeds, slope, strict=True)]
        pp = 100.0 * delta / denom
        row = {**ident, "baseline": baseline, "lengths": ",".join(map(str, lengths))}
        row["train_length"] = wide["train_length"].iloc[0, 0]
        row.update(_slope_test(scores, factor, pp, seeds, settings))
        rows.append(row)
    columns = [*keys, "operator", "seed", "slope"]
    return pd.DataFrame(rows), pd.DataFrame(per_seed, columns=columns)


def _slope_test(
    scores: np.ndarray,
    factor: float,
    pp: np.ndarray,
    seeds: Sequence[int],
    settings: StatsSettings,
) -> dict[str, Any]:
    """The columns of one slope test from its per-seed scores (the slopes are ``factor`` times
    them, ``factor`` > 0) and deltas (pp, a row per seed, a column per length). The
    Hodges-Lehmann estimate is taken on the scores and scaled, so round-off in the slopes cannot
    move it."""
    slope = factor * scores
    return {
        "n_pairs": len(scores),
        "seeds": ",".join(map(str, seeds)),
        "median_delta_shortest": float(np.median(pp[:, 0])),
        "median_delta_longest": float(np.median(pp[:, -1])),
        "mean_slope": float(slope.mean()),
        "median_slope": float(np.median(slope)),
        **exact_test_columns(scores, settings, scale=factor),
    }


def finish_slopes(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """Holm over the slope tests and the attainable-significance guard, in place; returns the
    guard's warning."""
    return exact_family_warnings(
        table, settings.alpha, SLOPE_FAMILY, "seeds with a non-zero slope", settings.descriptive
    )


# ----------------------------------------------------------------------------- the ladder


def read_all(
    runs: pd.DataFrame, max_workers: int, warns: list[str], tracking_uri: str | None = None
) -> dict[str, Any]:
    """run id -> its by-length predictions (runs without the file said in ``warns``; a file
    that cannot be read is an error); each run's file is read once."""
    found = read_run_artifacts(
        runs, LENGTH_PREDICTIONS_FILE, LENGTH_PREDICTION_COLUMNS, max_workers, tracking_uri
    )
    if found.broken:
        raise unreadable_artifacts(found, LENGTH_PREDICTIONS_FILE, LADDER_FAMILY, tracking_uri)
    if found.missing:
        warns.append(
            f"{LADDER_FAMILY}: {len(found.missing)} of {found.runs} paired runs have no "
            f"{LENGTH_PREDICTIONS_FILE} and are left out of the ladder (e.g. "
            f"{', '.join(found.missing[:3])})."
        )
    return found.frames


def docs_key(doc: np.ndarray, length: np.ndarray, label: np.ndarray) -> str:
    """A fingerprint of a set of documents (ids, lengths, labels), to check that two runs'
    ladder steps cover the same documents."""
    order = np.argsort(doc, kind="stable")
    stacked = np.stack([doc[order], length[order], label[order]]).astype(np.int64)
    return hashlib.blake2b(stacked.tobytes(), digest_size=8).hexdigest()


def run_ladder(preds: pd.DataFrame, logged: Mapping[int, tuple[int, int]]) -> list[dict] | None:
    """One run's ladder rows (``LADDER_RUN_COLUMNS`` and ``docs_key``) from its by-length
    predictions, or None when they disagree with its logged counts ``logged`` (L -> (correct,
    total)), repeat a document at a length, or give a document two lengths or labels."""
    right = preds["pred"].to_numpy() == preds["label"].to_numpy()
    frame = preds.assign(right=right)
    by_length = {}
    for length, at in frame.groupby("eval_length", sort=True):
        counted = (int(at["right"].sum()), len(at))
        if (int(length) in logged and counted != logged[int(length)]) or not at["doc"].is_unique:
            return None
        by_length[int(length)] = at.set_index("doc")
    rows = []
    lengths = sorted(by_length)
    for l1, l2 in zip(lengths, lengths[1:], strict=False):
        a, b = by_length[l1], by_length[l2]
        common = a.index.intersection(b.index).sort_values()
        a, b = a.loc[common], b.loc[common]
        if not (a["length"].equals(b["length"]) and a["label"].equals(b["label"])):
            return None
        size = b["length"].to_numpy(np.int64)
        for documents, mask in ((LONGER, size > l2), (FIT, (size > l1) & (size <= l2))):
            if not mask.any():
                continue
            rows.append(
                {
                    "l1": l1,
                    "l2": l2,
                    "documents": documents,
                    "n_docs": int(mask.sum()),
                    "correct_l1": int(a["right"].to_numpy()[mask].sum()),
                    "correct_l2": int(b["right"].to_numpy()[mask].sum()),
                    "docs_key": docs_key(
                        common.to_numpy()[mask], size[mask], b["label"].to_numpy()[mask]
                    ),
                }
            )
    return rows


def ladder_counts(
    pairing: Any,
    counts: pd.DataFrame,
    max_workers: int,
    warns: list[str],
    tracking_uri: str | None = None,
) -> pd.DataFrame:
    """Every paired run's ladder rows (``run_ladder``), each run's predictions read once; runs
    whose predictions disagree with their logged per-length counts are left out (warned)."""
    pairs = pairing.pairs
    used = set(pairs["run_id"]) | set(pairs["baseline_run_id"])
    runs = pairing.runs[pairing.runs["run_id"].isin(used)]
    preds = read_all(runs, max_workers, warns, tracking_uri)
    logged: dict[str, dict[int, tuple[int, int]]] = {}
    for r in counts.itertuples(index=False):
        # pandas-stubs type a row's fields as any scalar; these are COUNT_COLUMNS: a str run id
        # and integer counts
        logged.setdefault(r.run_id, {})[int(r.eval_length)] = (int(r.correct), int(r.total))  # type: ignore[arg-type]
    rows, inconsistent = [], []
    for run_id, frame in preds.items():
        found = run_ladder(frame, logged.get(run_id, {}))
        if found is None:
            inconsistent.append(run_id)
            continue
        rows += [{"run_id": run_id, **r} for r in found]
    if inconsistent:
        warns.append(
            f"{LADDER_FAMILY}: {len(inconsistent)} run(s) have by-length predictions that "
            "disagree with their logged test_correct_at_<L> / test_total_at_<L>, or list a "
            "document twice or with two lengths, and are left out: "
            f"{', '.join(sorted(inconsistent)[:5])}{' ...' if len(inconsistent) > 5 else ''}."
        )
    out = pd.DataFrame(rows, columns=[*LADDER_RUN_COLUMNS, "docs_key"])
    out["gain"] = 100.0 * (out["correct_l2"] - out["correct_l1"]) / out["n_docs"]
    return out


def ladder_comparisons(
    ladder_runs: pd.DataFrame,
    pairing: Any,
    trained: pd.Series,
    settings: StatsSettings,
    warns: list[str],
) -> pd.DataFrame:
    """Per (group, operator, step, documents): the operator's and the baseline's mean gain
    (pp) over the paired seeds and ``describe_deltas`` of the integer difference of their gains
    (correct-count changes over the step's documents). A seed pair whose two runs' steps cover
    different documents is left out (warned)."""
    keys = list(pairing.keys)
    step = ["l1", "l2", "documents"]
    ident = pairing.pairs[[*keys, "operator", "seed", "run_id", "baseline_run_id"]]
    base = ladder_runs.rename(columns=lambda c: c if c in step else f"b_{c}")
    merged = ident.merge(ladder_runs, on="run_id").merge(
        base.rename(columns={"b_run_id": "baseline_run_id"}), on=["baseline_run_id", *step]
    )
    differ = (merged["docs_key"] != merged["b_docs_key"]) | (merged["n_docs"] != merged["b_n_docs"])
    if differ.any():
        warns.append(
            f"{LADDER_FAMILY}: {int(differ.sum())} seed pair step(s) cover different test "
            "documents in the two runs (another test split?) and are left out."
        )
    merged = merged[~differ]
    rows = []
    for gkey, grp in merged.groupby([*keys, "operator", *step], sort=True):
        grp = grp.sort_values("seed")
        own = (grp["correct_l2"] - grp["correct_l1"]).to_numpy(np.int64)
        theirs = (grp["b_correct_l2"] - grp["b_correct_l1"]).to_numpy(np.int64)
        n_docs, train = int(grp["n_docs"].iloc[0]), trained.get(grp["run_id"].iloc[0], math.nan)
        row = dict(zip([*keys, "operator", *step], gkey, strict=True))
        row.update(
            baseline=pairing.baseline,
            train_length=train,
            beyond_training=_where(int(row["l2"]), train),
            n_docs=n_docs,
            seeds=",".join(str(int(s)) for s in grp["seed"]),
            acc_l1_mean=float(100.0 * grp["correct_l1"].mean() / n_docs),
            acc_l2_mean=float(100.0 * grp["correct_l2"].mean() / n_docs),
            gain_mean=float(100.0 * own.mean() / n_docs),
            baseline_acc_l1_mean=float(100.0 * grp["b_correct_l1"].mean() / n_docs),
            baseline_acc_l2_mean=float(100.0 * grp["b_correct_l2"].mean() / n_docs),
            baseline_gain_mean=float(100.0 * theirs.mean() / n_docs),
        )
        name = "|".join(map(str, gkey))
        row.update(describe_deltas(own - theirs, n_docs, settings, f"ladder|{name}"))
        rows.append(row)
    return pd.DataFrame(rows)
