"""The statistics of a trainable's sweep (``trainable: NAME``) from its logged runs: each level
of the compared axis against the baseline within each group of the other axes, paired by seed
(``paired_statistics``: fixed-n, descriptive after adaptive seeds), and the family's decisions
recomputed as the driver made them (``trainable_decisions``: ``fusion_ray.decide`` on the runs'
scores, the sweep's own rule). Values are points: 100 x the metric's difference, positive =
better (a ``mode: min`` metric's difference negated), as the driver decides them.

    from analysis import load_experiment, compare_trainable
    result = compare_trainable(load_experiment("digits_label_smoothing", "sqlite:///mlflow.db"))
    result.paired      # one row per comparison
    result.decisions   # one row per hypothesis (decisions.csv's columns); None for fixed seeds
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import Experiment
from analysis.load.frame import parse_grid_axes
from analysis.stats.exact import hodges_lehmann, holm, wilcoxon_signed_rank
from analysis.stats.verdicts import sweep_rule
from fusion_ray.decide.questions import Arm, failed_runs_by_operator, hypotheses, possible, rows
from fusion_ray.decide.sequential import decision_rows, family_evidence
from fusion_ray.schema import (
    GRID_AXES_TAG,
    RETURNED_TAG,
    TRAINABLE_TAG,
    decided_metric,
    returned_metrics,
)

ALPHA = 0.05
"""The family-wise level of a sweep of fixed seeds (Holm); an adaptive sweep's is its own."""


@dataclass(frozen=True)
class TrainableRecord:
    """What a trainable's sweep compared (its parent run's ``trainable_sweep`` tag)."""

    trainable: str
    axis: str
    baseline: str
    metric: str
    """The decision metric (a sweep that named none: the first its first finished run returned)."""
    mode: str
    levels: dict[str, list[str]]
    """Each grid axis's levels as text, the sweep file's order (``grid_axes``)."""
    trend: str | None = None
    """The ordered axis of the trend question (kind ``length``), or None."""

    @property
    def sign(self) -> float:
        return 1.0 if self.mode == "max" else -1.0

    @property
    def others(self) -> list[str]:
        """The axes a comparison's group fixes: every one but the compared axis."""
        return [k for k in self.levels if k != self.axis]


def trainable_record(experiment: Experiment) -> TrainableRecord:
    """The experiment's ``TrainableRecord``; ValueError for the study's sweeps."""
    tags = experiment.parent_tags
    if TRAINABLE_TAG not in tags:
        raise ValueError(
            f"experiment {experiment.name!r} is not a trainable's sweep (its parent run has no "
            f"{TRAINABLE_TAG} tag): analyse it with compare() or python -m analysis.report"
        )
    raw = json.loads(tags[TRAINABLE_TAG])
    runs = experiment.finished
    texts = list(runs[RETURNED_TAG].dropna()) if RETURNED_TAG in runs else []
    returned = returned_metrics({RETURNED_TAG: str(texts[0])}) if texts else []
    metric = decided_metric(raw.get("metric"), returned) or "metric"
    levels = parse_grid_axes(tags.get(GRID_AXES_TAG), experiment.notes)
    mode, trend = raw.get("mode", "max"), raw.get("trend")
    return TrainableRecord(
        raw["trainable"], raw["axis"], raw["baseline"], metric, mode, levels, trend
    )


def paired_statistics(runs: pd.DataFrame, record: TrainableRecord) -> pd.DataFrame:
    """Each level of the compared axis against the baseline, within each group of the other
    axes, over the seeds where both finished (points, positive = better)."""
    axis, baseline, metric, levels = record.axis, record.baseline, record.metric, record.levels
    sign, others = record.sign, record.others
    runs = runs.assign(seed=runs["seed"].astype(str))
    finished = runs[runs["status"] == "FINISHED"]
    rows = []
    for group, part in _groups(finished, others, levels):
        base = part[part[axis] == baseline].set_index("seed")[metric]
        for level in [v for v in levels[axis] if v != baseline]:
            arm = part[part[axis] == level].set_index("seed")[metric]
            seeds = sorted(set(base.index) & set(arm.index), key=int)
            deltas = np.array([100.0 * sign * (arm[s] - base[s]) for s in seeds]).round(9)
            name = f"{axis}={level} vs {axis}={baseline}"
            failed = _failed(runs, others, group, axis, (level, baseline))
            rows.append(_paired_row(f"{group}: {name}" if group else name, deltas, failed))
    table = pd.DataFrame(rows)
    if len(table):
        table["p_holm"] = holm(table["wilcoxon_p"].fillna(1.0).to_numpy(dtype=float))
    return table


def _groups(
    runs: pd.DataFrame, others: list[str], levels: dict[str, list[str]]
) -> list[tuple[str, pd.DataFrame]]:
    """The runs of each group of the other axes (``k=v k=v``), in the grid's order of levels."""
    if not others:
        return [("", runs)]
    found = []
    for key, part in runs.groupby(others, sort=False):
        values = key if isinstance(key, tuple) else (key,)
        rank = tuple(_rank(levels[k], str(v)) for k, v in zip(others, values, strict=True))
        name = " ".join(f"{k}={v}" for k, v in zip(others, values, strict=True))
        found.append((rank, name, part))
    return [(name, part) for _, name, part in sorted(found, key=lambda f: f[0])]


def _rank(levels: list[str], value: str) -> int:
    return levels.index(value) if value in levels else len(levels)


def _failed(
    runs: pd.DataFrame, others: list[str], group: str, axis: str, arms: tuple[str, str]
) -> int:
    """FAILED runs of the comparison's two arms in its group (its paired seeds leave them out;
    an adaptive sweep's decision counts them as a loss of their arm)."""
    failed = runs[(runs["status"] == "FAILED") & runs[axis].isin(arms)]
    for key, value in (item.split("=", 1) for item in group.split(" ") if item):
        failed = failed[failed[key] == value]
    return len(failed) if others or not group else 0


def _paired_row(name: str, d: np.ndarray, failed: int) -> dict[str, Any]:
    n = len(d)
    row: dict[str, Any] = {"comparison": name, "n_seeds": n, "failed_runs": failed}
    row["mean"] = float(d.mean()) if n else math.nan
    row["sd"] = float(d.std(ddof=1)) if n > 1 else math.nan
    hl = hodges_lehmann(d)
    row |= {"hodges_lehmann": hl.estimate, "hl_low": hl.low, "hl_high": hl.high}
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    row["sign_consistency"] = max(wins, losses) / (wins + losses) if wins + losses else math.nan
    row["wilcoxon_p"] = wilcoxon_signed_rank(d).pvalue if n else math.nan
    return row


@dataclass
class TrainableComparison:
    """The statistics of a trainable's sweep: what it compared, per comparison, per hypothesis."""

    record: TrainableRecord
    paired: pd.DataFrame
    decisions: pd.DataFrame | None
    """Recomputed from the runs with the sweep's rule (the rows of decisions.csv); None for a
    sweep of fixed seeds (Holm on ``paired`` decides it)."""


def _arm(run: pd.Series, record: TrainableRecord) -> Arm:
    group = tuple((k, str(run[k])) for k in record.others)
    return Arm(group, f"{record.axis}={run[record.axis]}")


def trainable_decisions(experiment: Experiment, record: TrainableRecord) -> pd.DataFrame | None:
    """The family's decisions from the runs, as the driver decides them: each cell's score (the
    signed metric of its FINISHED run; None for a cell whose runs FAILED), the hypotheses of
    ``fusion_ray.decide.questions`` over the arms, the sweep's own rule; None for fixed seeds."""
    adaptive, rule, built = sweep_rule(experiment, ALPHA)
    if not adaptive:
        return None
    runs = experiment.runs[experiment.runs["status"].isin(["FINISHED", "FAILED"])]
    seeds = sorted({int(s) for s in runs["seed"]})
    index = {seed: i for i, seed in enumerate(seeds)}
    scores: dict[tuple[Arm, int], float | None] = {}
    for status in ("FAILED", "FINISHED"):  # a FINISHED run of a cell replaces its failures
        for _, run in runs[runs["status"] == status].iterrows():
            value = record.sign * float(run[record.metric]) if status == "FINISHED" else None
            scores[(_arm(run, record), index[int(run["seed"])])] = value
    arms = list(dict.fromkeys(arm for arm, _ in scores))
    key = record.trend or ""
    regimes = built.get("regimes") or (record.levels[key] if record.trend else [])
    settings = [k for k in record.others if k != record.trend]
    levels = built.get("levels") or {k: record.levels[k] for k in settings}
    decide = built.get("decide") or possible({a.group for a in arms}, regimes, levels, key)
    baseline = f"{record.axis}={record.baseline}"
    family = hypotheses(arms, baseline, regimes, levels, decide, key)

    def score(arm: Arm, seed: int, part: str) -> float | None:
        found = scores.get((arm, seed))
        return found if part == "all" or found is None else math.nan

    values = rows(family, lambda a, s: (a, s) in scores, score, rule["max_seeds"] or len(seeds))
    failed = failed_runs_by_operator(family, score, {n: len(v) for n, v in values.items()})
    kinds = {h.name: h.kind for h in family}
    evidence = family_evidence(values, **rule, kinds=kinds)
    decided = decision_rows(
        evidence, rule["rule"], rule["margin"], values=values, kinds=kinds, failed=failed,
        alpha=rule["alpha"], first=rule["first"],
    )  # fmt: skip
    return pd.DataFrame(decided)


def compare_trainable(experiment: Experiment) -> TrainableComparison:
    """The paired statistics and decisions of a trainable's sweep (``load_experiment``'s)."""
    record = trainable_record(experiment)
    paired = paired_statistics(experiment.runs, record)
    return TrainableComparison(record, paired, trainable_decisions(experiment, record))
