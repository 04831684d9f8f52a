"""What cannot be true in a FINISHED run's test metrics (counts that are not counts, an accuracy
that is not correct / total), checked before anything uses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.load.frame import ACC_TOLERANCE, FINISHED, SHOWN_RUNS, ImpossibleMetricsError


def metric_problems(runs: pd.DataFrame) -> dict[Any, list[str]]:
    """What cannot be true in each FINISHED run's test metrics: row label of ``runs`` -> the
    problems. A run lacking a metric is not judged here (pairing lists it as excluded)."""
    done = runs[runs["status"] == FINISHED]
    c, t, a = (
        pd.to_numeric(done[m], errors="coerce").astype("float64").to_numpy()
        for m in ("test_correct", "test_total", "test_acc")
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = c / t
        rules = [
            (_not_a_count(c), "test_correct {c} is not a whole number >= 0"),
            (_not_a_count(t), "test_total {t} is not a whole number >= 0"),
            (t == 0, "test_total is 0"),
            (c > t, "test_correct {c} > test_total {t}"),
            ((a < 0) | (a > 1), "test_acc {a} is outside [0, 1]"),
            (
                _valid_counts(c, t) & (np.abs(a - ratio) > ACC_TOLERANCE) & (a >= 0) & (a <= 1),
                "test_acc {a} disagrees with test_correct / test_total = {ratio}",
            ),
        ]
    problems: dict[Any, list[str]] = {}
    for mask, text in rules:
        for i in np.flatnonzero(mask):
            values = {"c": c[i], "t": t[i], "a": a[i], "ratio": ratio[i]}
            shown = {k: f"{v:.10g}" for k, v in values.items()}
            problems.setdefault(done.index[i], []).append(text.format(**shown))
    return problems


def _valid_counts(c: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whole numbers with 0 <= test_correct <= test_total and test_total > 0."""
    return ~_not_a_count(c) & ~_not_a_count(t) & (t > 0) & (c <= t) & (c >= 0)


def _not_a_count(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ~np.isnan(x) & (~np.isfinite(x) | (x < 0) | (np.mod(x, 1) != 0))


def check_metrics(runs: pd.DataFrame, experiment: str) -> None:
    """Raise ImpossibleMetricsError, listing each offending run, when a FINISHED run logged a
    test_correct above test_total, a negative or fractional count, a test_total of 0, or a
    test_acc outside [0, 1] or off test_correct / test_total by more than ACC_TOLERANCE."""
    problems = metric_problems(runs)
    if not problems:
        return
    lines = []
    for label, found in problems.items():
        r = runs.loc[label]
        lines.append(
            f"  run {r['run_id']} (cell_id {r['cell_id']}, dataset={r['dataset']}, "
            f"fusion={r['operator']}, seed={r['seed']}): " + "; ".join(found)
        )
    if len(lines) > SHOWN_RUNS:
        lines = [*lines[:SHOWN_RUNS], f"  ... and {len(lines) - SHOWN_RUNS} more"]
    raise ImpossibleMetricsError(
        f"{len(problems)} FINISHED trial run(s) of experiment {experiment!r} logged test "
        "metrics that cannot be true:\n" + "\n".join(lines) + "\nTheir logged metrics are "
        "inconsistent (test_correct must be a whole number from 0 to test_total, test_total at "
        "least 1, test_acc = test_correct / test_total), so nothing is analysed. Delete these "
        "runs (in the MLflow UI, or `mlflow runs delete --run-id RUN_ID` with "
        "MLFLOW_TRACKING_URI set) and re-run the sweep to train their cells again."
    )
