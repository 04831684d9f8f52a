"""The report's "Reference baselines" section, right after the summary: are the compared models
any good? Each dataset's bag-of-words baseline (TF-IDF + logistic regression on exactly the
tokens the trials read, fitted on the training split, its C chosen on validation, tested once;
``fusion_ray.data.reference``) and the majority class, beside the best compared operator.

A warning when the best operator is more than ``BELOW_POINTS`` points below bag-of-words (its
differences may reflect under-training rather than fusion); a note when bag-of-words is at
chance (within two standard errors of the majority class: the task needs word order, which a
position-blind model cannot use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.render.escape import fence, line_start, md, md_code
from analysis.render.tables import select
from analysis.sections.base import Section, records
from analysis.sections.context import ReportContext

BELOW_POINTS = 3.0
"""How far (accuracy points) the best compared operator may trail bag-of-words unwarned."""


@dataclass
class ReferenceResult:
    table: pd.DataFrame
    """One row per dataset (x extra axis levels) of the main setting: bag-of-words, majority,
    the best operator and its accuracy, whether it is below, whether bag-of-words is at chance."""


def reference_rows(summary: pd.DataFrame, row_keys: list[str]) -> pd.DataFrame:
    """Per Table 1 row: the reference accuracies (%) and the best compared operator."""
    if "bow_acc" not in summary or summary["bow_acc"].isna().all():
        return pd.DataFrame()
    rows = []
    for key, group in summary.groupby(row_keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        # idxmax gives an index label, which .loc takes; pandas-stubs type the label as Hashable,
        # which no overload of .loc's lists
        best = group.loc[group["acc_mean"].idxmax()]  # type: ignore[call-overload]
        bow = float(group["bow_acc"].mean())
        majority = float(group["majority_acc"].mean()) if "majority_acc" in group else math.nan
        n = float(group["n_test"].median()) if "n_test" in group else math.nan
        se = 100.0 * math.sqrt(max(bow, 0.0) / 100 * (1 - bow / 100) / n) if n > 0 else math.nan
        rows.append(
            {
                **dict(zip(row_keys, key, strict=True)),
                "bag_of_words": bow,
                "majority": majority,
                "best_operator": best["operator"],
                "best_acc": float(best["acc_mean"]),
                "gap": float(best["acc_mean"]) - bow,
                "below": float(best["acc_mean"]) < bow - BELOW_POINTS,
                "at_chance": bool(bow <= majority + 2 * se) if not math.isnan(se) else False,
            }
        )
    return pd.DataFrame(rows)


def _where(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(
        str(row[k]) if k == "dataset" else f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys
    )


class ReferenceSection(Section):
    study = True
    name = "reference"
    follows = "summary"
    warns_with = "start"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> ReferenceResult | None:
        keys = ["dataset", *ctx.axes]
        table = reference_rows(select(ctx.summary, ctx.main_setting), keys)
        if table.empty:
            return None
        for _, r in table[table["below"]].iterrows():
            warnings.append(
                f"the compared models are below a bag-of-words baseline on {_where(r, keys)}: "
                f"the best, {fence(r['best_operator'])} at {r['best_acc']:.2f} %, is "
                f"{-r['gap']:.2f} points below TF-IDF + logistic regression on the same tokens "
                f"({r['bag_of_words']:.2f} %); their differences may reflect under-training "
                "rather than fusion (train longer, or a larger model, before reading them)"
            )
        return ReferenceResult(table)

    def markdown(self, result: ReferenceResult, ctx: ReportContext) -> list[str]:
        keys = ["dataset", *ctx.axes]
        lines = [
            "## Reference baselines",
            "",
            "Bag-of-words: TF-IDF + logistic regression on exactly the tokens the trials read "
            "(fitted on the training split, C chosen on validation, test once); it ignores word "
            "order. Majority: always the most frequent training class.",
            "",
        ]
        for _, r in result.table.iterrows():
            verdict = (
                f"**{-r['gap']:.2f} points below bag-of-words**"
                if r["below"]
                else f"{r['gap']:+.2f} points against bag-of-words"
            )
            chance = (
                " Bag-of-words is at chance here: the task needs word order, and every point "
                "above it was won by using positions."
                if r["at_chance"]
                else ""
            )
            lines.append(
                f"- {line_start(md(_where(r, keys)))}: bag-of-words {r['bag_of_words']:.2f} %, "
                f"majority {r['majority']:.2f} %; best operator {md_code(r['best_operator'])} "
                f"{r['best_acc']:.2f} % ({verdict}).{chance}"
            )
        return [*lines, ""]

    def record(self, result: ReferenceResult | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        return {"reference": {"below_points": BELOW_POINTS, "rows": records(result.table)}}


REFERENCE = ReferenceSection()
