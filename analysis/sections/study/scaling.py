"""The embedding-scale confound check, and the report section that shows it (``SCALING``).

``add`` (H = E + P) compared with token embeddings scaled by sqrt(d_model) and no unscaled arm
confounds the operator with the scale of E against P. ``scaling_check`` warns then, with the
measured (or implied) ratio; when both arms are present it gathers each operator's effect per
arm and the interaction test of the axis ``model.scale_embeddings`` (``analysis.sections.interaction``,
whose section runs before this one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.load import PARAM_PREFIX
from analysis.render.escape import md
from analysis.render.tables import column_label, fmt_p
from analysis.sections.base import Section, records
from analysis.sections.context import ReportContext
from analysis.sections.interaction import INTERACTION, Interactions
from fusion_ray.schema import INIT_METRICS

#: The setting whose two arms separate the operator from the scale of E against P.
SCALE_AXIS = "model.scale_embeddings"
SCALE_PARAM = PARAM_PREFIX + SCALE_AXIS
#: The sweep file that varies it.
CONFOUND_SWEEP = "sweeps/confound.yaml"
#: The baseline operator the confound concerns.
ADDITIVE = "add"
#: The RMS of a sinusoidal position signal (sin and cos of each frequency: sqrt(1/2)).
SINUSOIDAL_RMS = math.sqrt(0.5)


def as_bool(value: Any) -> bool | None:
    """``true``/``True``/``1`` -> True, ``false``/``False``/``0`` -> False, else None (a tag or
    param as logged: the axis tag writes ``true``, a param ``True``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    return None


def scale_arms(runs: pd.DataFrame) -> pd.Series:
    """Each run's ``model.scale_embeddings`` (True, False or None when unknown): the axis
    column when the run has it, else the logged param."""
    values = pd.Series([None] * len(runs), index=runs.index, dtype=object)
    if SCALE_PARAM in runs:
        values = runs[SCALE_PARAM].astype(object)
    if SCALE_AXIS in runs:
        values = runs[SCALE_AXIS].astype(object).where(runs[SCALE_AXIS].notna(), values)
    return values.map(as_bool).astype(object)


@dataclass
class ScalingCheck:
    """What the report says about the scale of the token embeddings against ``add``."""

    warning: str = ""
    """The confound warning: only scaled runs are compared with ``add`` ('' otherwise)."""
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)
    """When both arms are compared: one row per (other group keys, operator) with the median
    delta and Holm-adjusted p in each arm and the interaction test's result."""
    interaction_levels: tuple[str, str] | None = None
    """(level, reference) of the interaction columns, when the axis was tested."""

    @property
    def both_arms(self) -> bool:
        return not self.effects.empty


def scaling_check(
    pairing: Any, comparisons: pd.DataFrame, interactions: Interactions | None
) -> ScalingCheck:
    """The confound check of a report against ``add``: a warning when every compared run with
    an input-level position signal scales its token embeddings and none does not; each
    operator's effect per arm (and their interaction) when both arms are compared."""
    if pairing.baseline != ADDITIVE or pairing.pairs.empty:
        return ScalingCheck()
    used = set(pairing.pairs["run_id"]) | set(pairing.pairs["baseline_run_id"])
    runs = pairing.runs[pairing.runs["run_id"].isin(used) & (pairing.runs["position"] != "none")]
    arms = scale_arms(runs)
    present = set(arms.dropna())
    if present == {True}:
        return ScalingCheck(warning=confound_warning(runs[arms.map(lambda v: v is True)]))
    if present == {True, False}:
        return _effects_by_arm(pairing, comparisons, interactions, runs, arms)
    return ScalingCheck()


def confound_warning(scaled: pd.DataFrame) -> str:
    """The warning for comparisons against ``add`` whose runs all scale the token embeddings."""
    return (
        f"possible confound: every run compared with `{ADDITIVE}` scales its token embeddings "
        f"by sqrt(d_model) (`{SCALE_AXIS}` true) and none leaves them unscaled, so "
        f"{_ratio_text(scaled)}. Under `{ADDITIVE}` (H = E + P) the position signal is then a "
        "small perturbation of the token embeddings, and an operator's difference from "
        f"`{ADDITIVE}` may come from re-weighting E against P rather than from how it fuses "
        f"them. The grid axis `{SCALE_AXIS}: [true, false]` separates the two (see "
        f"{CONFOUND_SWEEP}); the report then tests whether each effect depends on it."
    )


def _ratio_text(scaled: pd.DataFrame) -> str:
    """The measured ratio init_token_rms / init_position_rms (median over runs, per input
    position when there are several), else the ratio the logged d_model implies."""
    token, position = INIT_METRICS
    if token in scaled and position in scaled:
        ok = scaled[token].notna() & (scaled[position] > 0)
        if ok.any():
            measured = scaled[ok].assign(_ratio=scaled[token] / scaled[position])
            text = (
                f"at initialisation the token embeddings are {measured['_ratio'].median():.3g}x "
                f"the position signal in RMS ({token} / {position}, median over "
                f"{int(ok.sum())} runs"
            )
            per = measured.groupby("position", sort=True)["_ratio"].median()
            if len(per) > 1:
                text += "; " + ", ".join(f"{p}: {r:.3g}x" for p, r in per.items())
            return text + ")"
    d_model = PARAM_PREFIX + "model.d_model"
    logged = pd.to_numeric(scaled[d_model], errors="coerce") if d_model in scaled else None
    d_models = [] if logged is None else sorted({int(d) for d in logged.dropna()})
    missing = f"{token} and {position} were not logged, so the ratio is not measured"
    if not d_models:
        return missing + " (and no model.d_model param gives the ratio it implies)"
    implied = ", ".join(
        f"d_model = {d} implies sqrt({d}) / sqrt(1/2) = {math.sqrt(d) / SINUSOIDAL_RMS:.3g}x"
        for d in d_models
    )
    return (
        f"{missing}; for a sinusoidal position signal (RMS sqrt(1/2)) and unit-variance token "
        f"embeddings, {implied} the position signal in RMS"
    )


def _effects_by_arm(
    pairing: Any,
    comparisons: pd.DataFrame,
    interactions: Interactions | None,
    runs: pd.DataFrame,
    arms: pd.Series,
) -> ScalingCheck:
    """Each operator's median delta and Holm-adjusted p in the scaled and the unscaled arm,
    side by side, with the interaction test of ``model.scale_embeddings`` when it ran."""
    keys = list(pairing.keys)
    arm_of = dict(zip(runs["run_id"], arms, strict=True))
    pairs = pairing.pairs.assign(_arm=pairing.pairs["run_id"].map(arm_of))
    per_comparison = (
        pairs.dropna(subset=["_arm"])
        .groupby([*keys, "operator"], sort=False, dropna=False)["_arm"]
        .agg(lambda s: s.iloc[0] if s.nunique() == 1 else None)
        .dropna()
        .reset_index()
    )
    table = comparisons.merge(per_comparison, on=[*keys, "operator"], how="inner")
    others = [k for k in keys if k != SCALE_AXIS]
    rows: dict[tuple, dict[str, Any]] = {}
    for _, r in table.iterrows():
        ident = tuple(r[k] for k in [*others, "operator"])
        row = rows.setdefault(ident, dict(zip([*others, "operator"], ident, strict=True)))
        arm = "scaled" if r["_arm"] else "unscaled"
        row[f"{arm}_median_delta"] = r["median_delta"]
        row[f"{arm}_p_holm"] = r["p_holm"]
        row[f"{arm}_significant"] = bool(r["significant"])
        row[f"{arm}_n_pairs"] = int(r["n_pairs"])
    effects = pd.DataFrame(list(rows.values()))
    levels = None
    tested = interactions.for_axis(SCALE_AXIS) if interactions is not None else pd.DataFrame()
    if len(tested) and len(effects):
        levels = (str(tested["level"].iloc[0]), str(tested["reference"].iloc[0]))
        inter = tested[[*others, "operator", "median_interaction", "p_holm", "significant"]]
        inter = inter.rename(
            columns={
                "median_interaction": "interaction_median",
                "p_holm": "interaction_p_holm",
                "significant": "interaction_significant",
            }
        )
        effects = effects.merge(inter, on=[*others, "operator"], how="left")
    return ScalingCheck(effects=effects, interaction_levels=levels)


def scaling_markdown(check: ScalingCheck, ctx: ReportContext) -> list[str]:
    """With and without scaled token embeddings: each operator's effect against ``add`` per
    arm, and the interaction test (only when both arms are compared)."""
    if not check.both_arms:
        return []
    effects = check.effects
    others = [k for k in ctx.keys if k != SCALE_AXIS and k in effects]
    if check.interaction_levels is not None:
        level, ref = check.interaction_levels
        inter_head = f"difference {level} − {ref}: median (p Holm)"
        inter_text = (
            f"and whether the effect differs between the arms (per seed, the delta at "
            f"`{SCALE_AXIS}` = {md(level)} minus the delta at {md(ref)}; exact two-sided "
            "Wilcoxon, Holm "
            "over the interaction family)"
        )
    else:
        inter_head = None
        inter_text = (
            f"(no interaction test: `{SCALE_AXIS}` is not a grid axis of this sweep; make it "
            f"one, `{SCALE_AXIS}: [true, false]`, to test it)"
        )
    lines = [
        "## Operator effects with and without embedding scaling",
        "",
        f"Both arms of `{SCALE_AXIS}` are compared with `{ADDITIVE}`: each operator's effect in "
        "each arm (median per-seed delta in pp, Holm-adjusted p of the comparisons against "
        f"the baseline), {inter_text}.",
        "",
    ]
    heads = [
        *(column_label(k, ctx.axes) for k in others),
        "operator",
        "scaled: Δ median (p Holm)",
        "unscaled: Δ median (p Holm)",
        *([inter_head] if inter_head else []),
    ]
    lines += ["| " + " | ".join(map(md, heads)) + " |", "|" + "---|" * len(heads)]
    for _, r in effects.iterrows():
        cells = [md(r[k]) for k in others] + [md(r["operator"])]
        cells += [_effect(r, "scaled"), _effect(r, "unscaled")]
        if inter_head:
            cells.append(_effect(r, "interaction", median="interaction_median"))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _effect(row: pd.Series, arm: str, median: str | None = None) -> str:
    """``+1.25 (p Holm 0.031*)`` from an arm's columns of the scaling table ('–' if absent)."""
    value = row.get(median or f"{arm}_median_delta")
    p = row.get(f"{arm}_p_holm")
    if value is None or pd.isna(value):
        return "–"
    star = "*" if bool(row.get(f"{arm}_significant", False)) else ""
    return f"{value:+.2f} (p Holm {fmt_p(p)}{star})"


# ----------------------------------------------------------------------------- the section


class ScalingSection(Section):
    """The confound warning, or each operator's effect with and without scaled embeddings."""

    study = True
    name = "scaling"
    follows = "summary"
    warns_with = "start"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> ScalingCheck:
        interactions = ctx.results.get(INTERACTION.name)
        check = scaling_check(ctx.pairing, ctx.comparisons.table, interactions)
        if check.warning:
            warnings.append(check.warning)
        return check

    def markdown(self, result: ScalingCheck, ctx: ReportContext) -> list[str]:
        return scaling_markdown(result, ctx)

    def record(self, result: ScalingCheck | None, ctx: ReportContext) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if result is not None and result.warning:
            out["scaling_confound"] = result.warning
        if result is not None and result.both_arms:
            out["scaling_effects"] = records(result.effects)
        return out


SCALING = ScalingSection()
