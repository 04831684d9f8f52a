"""Does an operator's effect depend on a grid axis? Interaction tests, and the embedding-scale
confound check that reads them.

For an extra grid axis (e.g. ``model.scale_embeddings: [true, false]``) with reference level r
(the first in the sweep file) and another level l, every seed paired at both levels gives,
inside each combination of the other group keys, the operator's delta against the baseline at
l minus its delta at r. The deltas are integer correct-count differences over a common
denominator (shown in percentage points), so ties are exact; the test is the exact two-sided
Wilcoxon signed-rank test of ``analysis.stats`` (two-sided whatever the report's alternative:
the direction of an interaction is not known in advance), and Holm's correction runs over every
interaction test of the report, a family apart from the main comparisons. An axis with more
than two levels gives one test per non-reference level, each against the reference.

The confound check: ``add`` (H = E + P) compared with token embeddings scaled by sqrt(d_model)
and no unscaled arm confounds the operator with the scale of E against P. ``scaling_check``
warns then, with the measured (or implied) ratio; when both arms are present it gathers each
operator's effect per arm and the interaction test of the axis ``model.scale_embeddings``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import PARAM_PREFIX
from analysis.stats import (
    StatsSettings,
    common_denominator,
    exact_family_warnings,
    exact_test_columns,
)
from fusion_ray.schema import INIT_METRICS

#: Name of the interaction family in warnings and in report.md.
FAMILY = "interaction tests"
#: The setting whose two arms separate the operator from the scale of E against P.
SCALE_AXIS = "model.scale_embeddings"
SCALE_PARAM = PARAM_PREFIX + SCALE_AXIS
#: The sweep file that varies it.
CONFOUND_SWEEP = "sweeps/confound.yaml"
#: The baseline operator the confound concerns.
ADDITIVE = "add"
#: The RMS of a sinusoidal position signal (sin and cos of each frequency: sqrt(1/2)).
SINUSOIDAL_RMS = math.sqrt(0.5)
#: Columns of the interaction table after the comparison's name (axis, levels, keys, operator).
RESULT_COLUMNS = (
    "baseline",
    "n_pairs",
    "seeds",
    "median_delta_reference",
    "median_delta_level",
    "mean_interaction",
    "median_interaction",
    "hl_estimate",
    "hl_ci_low",
    "hl_ci_high",
    "hl_confidence",
    "wins",
    "losses",
    "ties",
    "wilcoxon_stat",
    "p_wilcoxon",
    "wilcoxon_method",
    "n_zeros",
    "n_nonzero",
    "min_attainable_p",
    "p_holm",
    "significant",
    "min_attainable_p_holm",
    "can_reach_alpha",
)


@dataclass
class Interactions:
    """The interaction family of a report: one row per test, and what it could not test."""

    table: pd.DataFrame
    """One row per (axis, non-reference level, other group keys, operator): columns ``axis``,
    ``level``, ``reference``, every group key (the tested axis's own column empty), then
    ``RESULT_COLUMNS``; interaction values in pp, level minus reference."""
    levels: dict[str, list[str]]
    """The axes tested -> their levels, the reference first."""
    warnings: list[str] = field(default_factory=list)

    @property
    def m(self) -> int:
        """The size of the Holm family."""
        return len(self.table)

    def for_axis(self, axis: str) -> pd.DataFrame:
        """The rows testing ``axis``."""
        return self.table[self.table["axis"] == axis] if len(self.table) else self.table


def interaction_tests(
    pairing: Any, levels: Mapping[str, Sequence[str]], settings: StatsSettings | None = None
) -> Interactions:
    """Test, for every axis in ``levels`` (axis -> levels, the reference first), whether each
    operator's paired delta against the baseline differs between a level and the reference.

    ``pairing`` is an ``analysis.pairing.Pairing`` whose keys include the axes; only seeds
    paired at both levels, in the same combination of the other keys, enter a test."""
    settings = settings or StatsSettings()
    keys = list(pairing.keys)
    pairs = pairing.pairs
    tested = {a: list(v) for a, v in levels.items() if a in keys and len(v) >= 2}
    rows: list[dict[str, Any]] = []
    warns: list[str] = []
    for axis, axis_levels in tested.items():
        others = [k for k in keys if k != axis]
        reference = axis_levels[0]
        at_reference = pairs[pairs[axis].astype(str) == reference]
        for level in axis_levels[1:]:
            at_level = pairs[pairs[axis].astype(str) == level]
            merged = at_level.merge(
                at_reference, on=[*others, "operator", "seed"], suffixes=("", "_ref")
            )
            if merged.empty:
                if len(at_level) or len(at_reference):
                    warns.append(
                        f"{FAMILY}: no seed is paired at both {axis} = {level} and the reference "
                        f"level {reference} in any group, so that interaction is not tested."
                    )
                continue
            for gkey, grp in merged.groupby([*others, "operator"], sort=True, dropna=False):
                ident = dict(zip([*others, "operator"], gkey, strict=True))
                head = {"axis": axis, "level": level, "reference": reference, **ident}
                rows.append({**head, **_test(grp, pairing.baseline, settings)})
    columns = ["axis", "level", "reference", *keys, "operator", *RESULT_COLUMNS]
    table = pd.DataFrame(rows).reindex(columns=columns)
    warns += _finish_family(table, settings)
    return Interactions(table=table, levels=tested, warnings=warns)


def _test(grp: pd.DataFrame, baseline: str, settings: StatsSettings) -> dict[str, Any]:
    """The interaction statistics of one (axis level, group, operator) from its seed rows."""
    grp = grp.sort_values("seed")
    total = grp["test_total"].to_numpy(np.int64)
    total_ref = grp["test_total_ref"].to_numpy(np.int64)
    denom = common_denominator(np.concatenate([total, total_ref]))
    at_level = (grp["correct"].to_numpy(np.int64) - grp["baseline_correct"].to_numpy(np.int64)) * (
        denom // total
    )
    at_ref = (
        grp["correct_ref"].to_numpy(np.int64) - grp["baseline_correct_ref"].to_numpy(np.int64)
    ) * (denom // total_ref)
    num = at_level - at_ref
    pp = 100.0 * num / denom
    return {
        "baseline": baseline,
        "n_pairs": len(num),
        "seeds": ",".join(str(int(s)) for s in grp["seed"]),
        "median_delta_reference": float(np.median(100.0 * at_ref / denom)),
        "median_delta_level": float(np.median(100.0 * at_level / denom)),
        "mean_interaction": float(pp.mean()),
        "median_interaction": float(np.median(pp)),
        **exact_test_columns(num, settings, scale=100.0 / denom),
    }


def _finish_family(table: pd.DataFrame, settings: StatsSettings) -> list[str]:
    """Holm over the whole family and the attainable-significance guard (the floors count the
    non-zero differences only, as the main family's do), in place; returns the guard's
    warning."""
    return exact_family_warnings(
        table,
        settings.alpha,
        FAMILY,
        "seeds paired at both levels with a non-zero difference",
    )


# ----------------------------------------------------------------------------- the confound


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
