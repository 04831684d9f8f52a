"""The verdicts of a sweep's runs: the family of hypotheses of ``fusion_ray.decide.questions``
(operator comparisons, length contrasts, interactions), valued from the logged runs as the driver
values them and decided with the sweep's own rule (``fusion_ray.decide.sequential``). The one
computation behind the report's Decisions section, its summary, the tables' marks and
``analysis.compare(..., experiment=)``, so they cannot disagree with each other or with the
driver's decisions.csv.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.load import Experiment
from analysis.stats import Comparisons, StatsSettings
from analysis.stats import compare as fixed_n
from analysis.stats.pairing import Pairing
from fusion_ray.decide.questions import (
    QUARTER_METRICS,
    Arm,
    Hypothesis,
    failed_runs_by_operator,
    hypotheses,
    possible,
    rows,
)
from fusion_ray.decide.rules import DEFAULT_RULE, DecisionRule, build_rule
from fusion_ray.decide.sequential import FIRST_WAVE, decision_rows, family_evidence
from fusion_ray.schema import ADAPTIVE_TAG


@dataclass
class DecisionResult:
    """The rule used, the evidence per hypothesis, and its rows (``DECISION_COLUMNS``)."""

    primary: bool
    """True for an adaptive sweep (its decisions are the primary analysis)."""
    alpha: float
    margin: float | None
    max_seeds: int | None
    first: int
    rule: DecisionRule
    evidence: dict[str, list[Any]]
    table: pd.DataFrame
    marks: dict[tuple, str] = field(default_factory=dict)
    """(group values..., operator) -> the state of its operator comparison (the tables' marks)."""

    def table_note(self, baseline: str) -> str:
        """The footnote of tables whose cells carry these decisions."""
        m = len(self.table)
        margin = f", equivalence margin ±{self.margin:g} points" if self.margin else ""
        return (
            f"Mean ± sd (ddof = 1) of test accuracy (%) over the seeds each cell ran (adaptive "
            f"seeds, first wave {self.first}, cap {self.max_seeds}). ↑ / ↓ / ≈: decided better / "
            f"worse than / equivalent to {baseline} by the anytime-valid rule "
            f"{self.rule.describe()} (one closed test over the sweep's m = {m} hypotheses, "
            f"alpha = {self.alpha:g}{margin}; null: {self.rule.null}). The seeds each cell got "
            "depended on the evidence, so no fixed-n test marks these cells."
        )


def sweep_rule(experiment: Experiment, alpha: float) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """Whether the decisions are primary, the rule's settings (the sweep's own for an adaptive
    sweep; a tag without ``rule`` was written when ``sign`` was the only rule), and how the
    driver built its family (regimes in the order of length, axis levels, questions)."""
    text = experiment.parent_tags.get(ADAPTIVE_TAG)
    if text:
        rule = json.loads(text)
        setting = {
            "alpha": float(rule["alpha"]),
            "margin": rule.get("margin"),
            "max_seeds": int(rule["max"]),
            "first": int(rule.get("first", FIRST_WAVE)),
            "rule": build_rule(rule.get("rule", "sign"), **rule.get("rule_options", {})),
        }
        built = {k: rule.get(k) for k in ("regimes", "levels", "decide")}
        return True, setting, built
    settings = {"alpha": float(alpha), "margin": None, "max_seeds": None}
    return False, {**settings, "first": None, "rule": build_rule(DEFAULT_RULE)}, {}


@dataclass
class FamilyValues:
    """The family of hypotheses the runs make, each one's values in seed order and failures."""

    family: list[Hypothesis]
    values: dict[str, list[float]]
    failed: dict[str, dict[str, tuple[int, int]]]
    """Per hypothesis and operator: (failed runs, runs) (``questions.failed_runs_by_operator``)."""


def family_values(
    experiment: Experiment,
    pairing: Pairing,
    built: dict[str, Any] | None = None,
    datasets: Sequence[str] = (),
) -> FamilyValues:
    """The hypotheses of ``fusion_ray.decide.questions`` over the experiment's runs, named and
    valued as the driver names and values them: a FINISHED run's accuracy from its correct
    counts; a cell whose only runs FAILED counts as ``questions.failure_value`` (a loss for its
    arm); seeds
    in order, each hypothesis up to its first seed that has neither."""
    built = built or {}
    keys = list(pairing.keys)
    done = pairing.runs
    failed_runs = _failed_runs(experiment, pairing, keys)
    frames = [f for f in (done, failed_runs) if not f.empty]
    if not frames:
        return FamilyValues([], {}, {})
    seeds = sorted({int(s) for f in frames for s in f["seed"].dropna()})
    index = {seed: i for i, seed in enumerate(seeds)}
    scores: dict[tuple[Arm, int], dict[str, float] | None] = {}
    for _, r in failed_runs.iterrows():
        scores[(_arm(r, keys), index[int(r["seed"])])] = None
    for _, r in done.iterrows():
        scores[(_arm(r, keys), index[int(r["seed"])])] = _parts(r)
    arms = list(dict.fromkeys(arm for arm, _ in scores))
    regimes = built.get("regimes") or list(datasets) or list(dict.fromkeys(done["dataset"]))
    levels = built.get("levels") or experiment.axis_levels
    decide = built.get("decide") or possible({a.group for a in arms}, regimes, levels)
    if not _has_quarters(done):  # runs logged before trials reported their length quarters
        decide = [k for k in decide if k != "length_within"]
    family = hypotheses(arms, pairing.baseline, regimes, levels, decide)

    def accuracy(arm: Arm, seed: int, part: str) -> float | None:
        found = scores.get((arm, seed), {})
        return None if found is None else found.get(part, math.nan)

    values = rows(family, lambda a, s: (a, s) in scores, accuracy, len(seeds))
    failed = failed_runs_by_operator(family, accuracy, {n: len(v) for n, v in values.items()})
    return FamilyValues(family, values, failed)


def _parts(run: pd.Series) -> dict[str, float]:
    """A FINISHED run's accuracy on each part of its test split it reported (``PARTS``)."""
    out = {"all": float(run["test_correct"]) / float(run["test_total"])}
    for part, (correct, total) in QUARTER_METRICS.items():
        if pd.notna(run.get(correct)) and pd.notna(run.get(total)) and run[total] > 0:
            out[part] = float(run[correct]) / float(run[total])
    return out


def _has_quarters(runs: pd.DataFrame) -> bool:
    return all(
        c in runs and runs[c].notna().any() for pair in QUARTER_METRICS.values() for c in pair
    )


def _arm(run: pd.Series, keys: list[str]) -> Arm:
    return Arm(tuple((k, str(run[k])) for k in keys), str(run["operator"]))


def _failed_runs(experiment: Experiment, pairing: Pairing, keys: list[str]) -> pd.DataFrame:
    """The FAILED trial runs of cells that have no FINISHED run (their failures count)."""
    runs = experiment.runs
    if runs.empty or "status" not in runs:
        return runs.iloc[0:0]
    failed = runs[runs["status"] == "FAILED"]
    if failed.empty or any(k not in failed for k in keys):
        return failed.iloc[0:0]
    failed = failed.dropna(subset=[*keys, "operator", "seed"])
    finished = {(_arm(r, keys), int(r["seed"])) for _, r in pairing.runs.iterrows()}
    keep = [(_arm(r, keys), int(r["seed"])) not in finished for _, r in failed.iterrows()]
    return failed[keep].drop_duplicates(subset=[*keys, "operator", "seed"])


def verdicts(
    experiment: Experiment,
    pairing: Pairing,
    *,
    alpha: float = 0.05,
    datasets: Sequence[str] = (),
    warnings: list[str] | None = None,
) -> DecisionResult | None:
    """Every hypothesis's decision over ``pairing``'s runs of ``experiment``: with the sweep's
    own rule for an adaptive sweep (the primary analysis), else the default rule at ``alpha``
    with every seed as the first wave (a secondary view). ``datasets``: the regimes in the
    order of length when the experiment does not record them. None when nothing pairs."""
    primary, rule, built = sweep_rule(experiment, alpha)
    found = family_values(experiment, pairing, built, datasets)
    if not found.values:
        return None
    longest = max((len(v) for v in found.values.values()), default=0)
    if rule["max_seeds"] is not None and longest > rule["max_seeds"]:
        (warnings if warnings is not None else []).append(
            f"decisions: the runs have {longest} seeds, more than the adaptive rule's cap "
            f"of {rule['max_seeds']}; the cap is ignored for these decisions"
        )
        rule["max_seeds"] = None
    if rule["first"] is None:  # a fixed list: every seed was planned, the wave is all of them
        rule["first"] = longest
    kinds = {h.name: h.kind for h in found.family}
    evidence = family_evidence(found.values, **rule, kinds=kinds)
    decided = decision_rows(
        evidence,
        rule["rule"],
        rule["margin"],
        values=found.values,
        kinds=kinds,
        failed=found.failed,
        alpha=rule["alpha"],
        first=rule["first"],
    )
    states = {r["comparison"]: r["state"] for r in decided}
    marks = {
        (*(v for _, v in h.terms[0][0].group), h.operator): states[h.name]
        for h in found.family
        if h.kind == "operator"
    }
    table = pd.DataFrame(decided)
    return DecisionResult(primary, evidence=evidence, table=table, marks=marks, **rule)


def compare(
    pairing: Pairing, settings: StatsSettings | None = None, experiment: Experiment | None = None
) -> Comparisons:
    """The paired statistics of every comparison (``analysis.stats.compare``: fixed-n tests,
    Holm over the comparisons) and, given the ``experiment`` the pairing came from, the
    anytime-valid decisions of every hypothesis in ``.decisions`` (for an adaptive sweep, its
    verdicts: the rows of decisions.csv and of the report)."""
    out = fixed_n(pairing, settings)
    if experiment is not None:
        alpha = (settings or StatsSettings()).alpha
        result = verdicts(experiment, pairing, alpha=alpha)
        out.decisions = result.table if result is not None else pd.DataFrame()
    return out
