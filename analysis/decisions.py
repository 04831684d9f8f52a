"""The report's "Decisions" section, first after the summary: each comparison's anytime-valid
decision (``analysis.sequential``) from its per-seed paired deltas in seed order.

For an adaptive sweep (its parent run carries ``schema.ADAPTIVE_TAG``) this is the primary
analysis, with the sweep's own rule (alpha, margin, cap): the seeds each comparison got depended
on the evidence, so the fixed-n tests further down are descriptive only. For a fixed-seed
sweep it is a secondary view at the report's alpha, with no cap or margin: how close each
comparison is to a decision that would stay valid if seeds were added.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.context import ReportContext
from analysis.drawing import Figure, save
from analysis.pairing import Pairing
from analysis.section import Drawn, Section, records, write_csv
from analysis.sequential import decision_rows, family_evidence
from fusion_ray.schema import ADAPTIVE_TAG, DECISIONS_FILE

FIGURE = "decisions_e_process"


@dataclass
class DecisionResult:
    """The rule used, the evidence per comparison, and its rows (``DECISION_COLUMNS``)."""

    primary: bool
    """True for an adaptive sweep (its decisions are the primary analysis)."""
    alpha: float
    margin: float | None
    max_seeds: int | None
    evidence: dict[str, list[Any]]
    table: pd.DataFrame


def _rule(ctx: ReportContext) -> tuple[bool, float, float | None, int | None]:
    text = ctx.experiment.parent_tags.get(ADAPTIVE_TAG)
    if text:
        rule = json.loads(text)
        return True, float(rule["alpha"]), rule.get("margin"), int(rule["max"])
    return False, float(ctx.options.settings.alpha), None, None


def comparison_deltas(pairing: Pairing) -> dict[str, list[float | None]]:
    """Each comparison's paired deltas (points) in seed order over the experiment's seeds
    (None where its pair is missing), named like the driver names them."""
    pairs = pairing.pairs
    if pairs.empty:
        return {}
    seeds = sorted(int(s) for s in pairing.runs["seed"].dropna().unique())
    keys = list(pairing.keys)
    delta = 100.0 * (pairs["correct"] - pairs["baseline_correct"]) / pairs["test_total"]
    frame = pairs.assign(delta=delta)
    out = {}
    for key, group in frame.groupby([*keys, "operator"], sort=False):
        *where, operator = key if isinstance(key, tuple) else (key,)
        by_seed = dict(zip(group["seed"].astype(int), group["delta"].astype(float), strict=True))
        last = max(by_seed)
        name = "/".join(str(w) for w in where) + f": {operator} vs {pairing.baseline}"
        out[name] = [by_seed.get(s) for s in seeds if s <= last]
    return out


class DecisionsSection(Section):
    """Anytime-valid decisions per comparison; first in the report."""

    name = "decisions"
    follows = "summary"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> DecisionResult | None:
        deltas = comparison_deltas(ctx.pairing)
        if not deltas:
            return None
        primary, alpha, margin, max_seeds = _rule(ctx)
        longest = max(len(d) for d in deltas.values())
        if max_seeds is not None and longest > max_seeds:
            warnings.append(
                f"decisions: the runs have {longest} seeds, more than the adaptive rule's cap "
                f"of {max_seeds}; the cap is ignored for these decisions"
            )
            max_seeds = None
        evidence = family_evidence(deltas, alpha=alpha, margin=margin, max_seeds=max_seeds)
        table = pd.DataFrame(decision_rows(evidence))
        return DecisionResult(primary, alpha, margin, max_seeds, evidence, table)

    def markdown(self, result: DecisionResult, ctx: ReportContext) -> list[str]:
        return [*_intro(result), "", *_table_lines(result.table), ""]

    def figures(self, result: DecisionResult, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        caption = (
            "Each comparison's e-process (running maximum) by seed against Holm's thresholds "
            f"(1/alpha to m/alpha, m = {len(result.evidence)}): a decision is reached where a "
            "line crosses its threshold."
        )
        return [(caption, _draw(result, fig_dir))]

    def data_files(self, result: DecisionResult, ctx: ReportContext) -> list[Path]:
        return [write_csv(result.table, ctx.out_dir / DECISIONS_FILE)]

    def record(self, result: DecisionResult | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        rule = {"alpha": result.alpha, "margin": result.margin, "max_seeds": result.max_seeds}
        return {"decisions": {"primary": result.primary, **rule, "rows": records(result.table)}}

    def listed_files(self, result: DecisionResult | None) -> list[str]:
        return [DECISIONS_FILE] if result is not None else []


def _intro(result: DecisionResult) -> list[str]:
    counts = result.table["state"].value_counts()
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    if result.primary:
        rule = f"alpha {result.alpha:g}, cap {result.max_seeds} seeds" + (
            f", equivalence margin ±{result.margin:g} points" if result.margin else ""
        )
        what = (
            f"**Primary analysis.** This sweep ran adaptive seeds ({rule}): each comparison got "
            "seeds until it was decided. These decisions are anytime-valid (a sign e-process per "
            "comparison, Holm over all of them at every seed); the fixed-n p-values in the "
            "tables below are descriptive only, since the number of seeds depended on the data."
        )
    else:
        what = (
            "**Secondary view.** This sweep ran a fixed list of seeds, and the fixed-n tests "
            "below are its primary analysis. Here the same runs are read as anytime-valid "
            f"evidence (alpha {result.alpha:g}, Holm over the comparisons): a decision here "
            "would stay valid if seeds were added; 'open' says more seeds could still decide."
        )
    return ["## Decisions", "", what, "", f"States: {summary}."]


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _table_lines(table: pd.DataFrame) -> list[str]:
    lines = [
        "| comparison | state | seeds used | decided at seed | e (max) | anytime p | "
        "p Holm | effect CS (points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict(orient="records"):
        decided = "-" if pd.isna(r["decided_at_seed"]) else str(int(r["decided_at_seed"]))
        lines.append(
            f"| {r['comparison']} | {r['state']} | {r['seeds_used']} | {decided} | "
            f"{_fmt(r['e_max'], '.3g')} | {_fmt(r['p_anytime'], '.3g')} | "
            f"{_fmt(r['p_holm_anytime'], '.3g')} | "
            f"({_fmt(r['cs_low'], '+.2f')}, {_fmt(r['cs_high'], '+.2f')}) |"
        )
    return lines


def _draw(result: DecisionResult, fig_dir: Path) -> list[Path]:
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.subplots()
    m = len(result.evidence)
    for name, looks in result.evidence.items():
        ax.step([lk.seed for lk in looks], [lk.e_max for lk in looks], where="post", label=name)
    ax.axhline(1 / result.alpha, color="grey", linestyle=":", linewidth=1)
    ax.axhline(m / result.alpha, color="grey", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("seed")
    ax.set_ylabel("e-process (running max)")
    if m <= 12:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, fig_dir, FIGURE)


DECISIONS = DecisionsSection()
