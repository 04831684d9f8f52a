"""The seed pairing of every operator against a baseline, checked rather than assumed.

Inside each group (dataset, position, attention position and every extra grid axis, such as
``model.scale_embeddings``), every operator's FINISHED run of a seed is matched with the
baseline's FINISHED run of the same seed: a pair never crosses levels of an axis. Runs whose
configs differ in anything but the operator are refused (PairingError), and what cannot be
paired is listed: incomplete blocks, duplicate cells, runs missing a tag or metric, groups
without a baseline. A position that is another one under a second name (tag
``position_alias_of``) is compared once: its comparisons are set aside (``Pairing.aliases``)
where the position it repeats has the same comparison.

Why one module of this size: pairing and its checks (what cannot be paired, and why nothing
can be compared) are one decision each run passes through once; apart, a reason could be
checked in one place and reported in another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.load import (
    FINISHED,
    PARAM_PREFIX,
    AnalysisError,
    axis_columns,
    param_columns,
    param_name,
)
from fusion_ray.schema import (
    EXECUTION_PARAMS,
    OPERATOR_KWARGS_PREFIX,
    OPERATOR_PARAM,
    POSITION_ALIAS_TAG,
)

#: A comparison is made inside each combination of these tags (and of the extra grid axes).
GROUP_KEYS = ("dataset", "position", "attention_position")
#: What a FINISHED run needs to be paired (and a value of every extra grid axis).
NEEDED = (*GROUP_KEYS, "operator", "seed", "test_correct", "test_total")
#: The columns of ``Pairing.aliases`` after the group keys.
ALIAS_COLUMNS = ("operator", "alias_of", "n_pairs")
#: Per run of a pair: these columns, for the operator and (prefixed ``baseline_``) the baseline.
VALUE_COLUMNS = ("run_id", "test_correct", "test_total", "test_acc", "artifact_uri")
#: How many offending pairs a PairingError lists before it only counts them.
SHOWN_PROBLEMS = 25
#: How many cells, runs or groups a NothingToCompareError lists before it only counts them.
SHOWN_REASONS = 10


class PairingError(AnalysisError):
    """Runs that would be paired differ in something other than the operator."""


class NothingToCompareError(AnalysisError):
    """No operator has a seed pair with the baseline; the message says why and what to do."""


@dataclass
class Pairing:
    """Operators matched with the baseline by seed, inside each group, plus what could not be."""

    baseline: str
    keys: tuple[str, ...]
    """Columns that define a group: dataset, position, attention_position, the extra grid axes,
    then ``by`` params."""
    runs: pd.DataFrame
    """The FINISHED, unambiguous trial runs (duplicate cells removed), with the key columns."""
    pairs: pd.DataFrame
    """One row per (group, operator, seed) with both runs FINISHED: run ids, correct counts,
    test totals and accuracies of the operator and of the baseline."""
    incomplete: pd.DataFrame
    """One row per (group, seed) block missing operators that the group has elsewhere."""
    duplicates: pd.DataFrame
    """One row per cell with several FINISHED runs; those runs are left out."""
    no_baseline: pd.DataFrame
    """Groups without any FINISHED baseline run: their operators cannot be compared."""
    excluded: pd.DataFrame
    """FINISHED trial runs that lack a tag or metric the analysis needs."""
    set_aside: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Extra FINISHED runs of a cell id that already has one (same config): the run that
    finished first is kept (``kept_run_id``), these are not used."""
    notes: list[str] = field(default_factory=list)
    axes: tuple[str, ...] = ()
    """The extra grid axes among ``keys`` (columns from ``axis.<key>`` tags)."""
    aliases: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per comparison (group, operator) left out of ``pairs`` because its position is
    an alias (tag ``position_alias_of``) of a position that has the same comparison: keys,
    operator, ``alias_of`` and the number of pairs set aside. The same model is tested once."""


def is_operator_param(name: str) -> bool:
    """True for the params that define the operator (allowed to differ inside a pair):
    ``model.fusion``, ``model.fusion_kwargs.*``, and ``model.fusion_kwargs`` itself, which a
    flattened config keeps as ``{}`` for an operator without options."""
    return (
        name == OPERATOR_PARAM
        or name == OPERATOR_KWARGS_PREFIX.rstrip(".")
        or name.startswith(OPERATOR_KWARGS_PREFIX)
    )


def pair_runs(
    runs: pd.DataFrame,
    baseline: str = "add",
    *,
    by: Sequence[str] = (),
    ignore_params: Iterable[str] = (),
    axes: Sequence[str] | None = None,
) -> Pairing:
    """Match every operator's FINISHED runs with the baseline's by seed, inside each group.

    ``runs`` is ``Experiment.runs`` (any status; only FINISHED ones are paired, the others only
    explain what is missing). ``axes`` are the extra grid axes (columns of ``runs``; default:
    every ``axis.<key>`` column ``load`` made, ``analysis.load.axis_columns``): each level is a
    group of its own, so a pair never crosses levels. ``by`` adds params to the group key, for
    sweeps that vary a hyperparameter without an axis tag. ``ignore_params`` names params that
    may differ inside a pair (e.g. a cache directory). Raises PairingError listing every pair
    whose configs differ in anything but ``model.fusion`` and ``model.fusion_kwargs.*``.

    A comparison whose runs carry ``position_alias_of = X`` is left out of ``pairs`` (and
    listed in ``aliases``) when position X has the same comparison in the same group
    otherwise: the two names are one model, tested once.
    """
    axes = tuple(axis_columns(runs) if axes is None else axes)
    runs, keys = _key_columns(runs, axes, by)
    finished = runs[runs["status"] == FINISHED]
    usable, excluded = _exclude_incomplete_runs(finished, axes)
    usable, set_aside = _keep_first_of_same_cell(usable)
    clean, duplicates = _drop_duplicate_cells(usable, keys)
    base = clean[clean["operator"] == baseline]
    others = clean[clean["operator"] != baseline]
    compared = _compared_params(clean, ignore_params)
    pairs = _match_seeds(others, base, keys, baseline, compared)
    pairs, aliases = _set_aside_aliases(pairs, clean, keys)
    return Pairing(
        baseline=baseline,
        keys=keys,
        runs=clean.reset_index(drop=True),
        pairs=pairs,
        incomplete=_incomplete_blocks(runs, clean, duplicates, keys),
        duplicates=duplicates,
        no_baseline=_groups_without_baseline(others, base, keys),
        excluded=excluded.reset_index(drop=True),
        set_aside=set_aside,
        notes=_baseline_notes(clean, baseline),
        axes=axes,
        aliases=aliases,
    )


def _key_columns(
    runs: pd.DataFrame, axes: Sequence[str], by: Sequence[str]
) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The runs with one column per ``by`` param, and the group key columns: the tags, the
    extra grid axes, then the ``by`` params (one that is already an axis adds nothing)."""
    missing = [a for a in axes if a not in runs]
    if missing:
        raise AnalysisError(
            f"grid axes {', '.join(missing)}: no such column among the runs; the loader makes "
            "one per `axis.<key>` tag (axis columns here: "
            + (", ".join(axis_columns(runs)) or "none")
            + ")"
        )
    out = runs.copy()
    keys = [*GROUP_KEYS, *axes]
    for name in by:
        if name in axes:
            continue
        col = PARAM_PREFIX + name
        if col not in out:
            known = sorted(param_name(c) for c in param_columns(out))[:8]
            raise AnalysisError(
                f"--by {name!r}: no run has param {name!r}; params look like " + ", ".join(known)
            )
        out[name] = out[col].fillna("None")
        keys.append(name)
    return out, tuple(keys)


def _exclude_incomplete_runs(
    finished: pd.DataFrame, axes: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(usable runs, excluded runs with a ``missing`` column naming what they lack): a run
    without a grid axis's tag cannot be placed at one of its levels."""
    needed = [*NEEDED, *axes]
    bad = finished[needed].isna().any(axis=1) | (finished["test_total"] <= 0).fillna(True)
    excluded = finished.loc[bad, ["run_id", "run_name", *needed]].copy()
    if len(excluded):
        excluded["missing"] = [
            ", ".join(c for c in needed if pd.isna(r[c])) or "test_total <= 0"
            for _, r in excluded.iterrows()
        ]
    return finished[~bad], excluded


def _keep_first_of_same_cell(usable: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Several FINISHED runs of one cell id (one config: two drivers ran it, or a store written
    before the lease fenced its writes): the run that finished first is kept, the others are
    set aside, so no cell counts twice. Returns (the runs kept, one row per run set aside with
    the run kept in its place)."""
    with_id = usable[usable["cell_id"].notna()]
    order = ["end_time", "run_id"] if "end_time" in usable else ["run_id"]
    ranked = with_id.sort_values(order, kind="stable", na_position="last")
    first = ranked.groupby("cell_id", sort=False)["run_id"].transform("first")
    extra = ranked[ranked["run_id"] != first]
    aside = pd.DataFrame(
        {
            "cell_id": extra["cell_id"],
            "run_id": extra["run_id"],
            "kept_run_id": first[extra.index],
        }
    ).reset_index(drop=True)
    return usable[~usable["run_id"].isin(extra["run_id"])], aside


def _drop_duplicate_cells(
    usable: pd.DataFrame, keys: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cells (group, operator, seed) whose FINISHED runs have different configs (different
    cell ids): none of their runs is used, since which one the cell is cannot be told.

    Returns (the other runs, one row per duplicate cell naming its runs and the params in which
    they differ, a hint at a hyperparameter the sweep varies)."""
    cell = [*keys, "operator", "seed"]
    sizes = usable.groupby(cell, sort=False, dropna=False)["run_id"].transform("size")
    records = []
    for key, grp in usable[sizes > 1].groupby(cell, sort=True):
        differing = [
            param_name(c)
            for c in param_columns(grp)
            if grp[c].fillna("\0").nunique() > 1 and not is_operator_param(param_name(c))
        ]
        records.append(
            {
                **dict(zip(cell, key, strict=True)),
                "run_ids": ", ".join(grp["run_id"]),
                "cell_ids": ", ".join(sorted(set(grp["cell_id"].fillna("?")))),
                "differing_params": ", ".join(differing),
            }
        )
    duplicates = pd.DataFrame(records, columns=[*cell, "run_ids", "cell_ids", "differing_params"])
    return usable[sizes == 1], duplicates


def _incomplete_blocks(
    runs: pd.DataFrame, clean: pd.DataFrame, duplicates: pd.DataFrame, keys: Sequence[str]
) -> pd.DataFrame:
    """Blocks (group, seed) seen in any run (any status) that lack a FINISHED, unambiguous run
    of an operator the group has, each missing operator with why: its status, duplicate runs,
    or no run."""
    cols = [*keys, "operator", "seed"]
    group_ops: dict[tuple, set] = {}
    group_seeds: dict[tuple, set] = {}
    known = runs.dropna(subset=cols)
    for *gkey, op, seed in known[cols].itertuples(index=False, name=None):
        group_ops.setdefault(tuple(gkey), set()).add(op)
        group_seeds.setdefault(tuple(gkey), set()).add(int(seed))
    present: dict[tuple, set] = {}
    for *gkey, op, seed in clean[cols].itertuples(index=False, name=None):
        present.setdefault((*gkey, int(seed)), set()).add(op)
    why = _missing_reasons(runs, duplicates, cols)
    records = []
    for gkey in sorted(group_ops, key=lambda k: tuple(map(str, k))):
        for seed in sorted(group_seeds[gkey]):
            have = present.get((*gkey, seed), set())
            missing = sorted(group_ops[gkey] - have)
            if missing:
                described = [f"{op} ({why.get((*gkey, op, seed), 'no run')})" for op in missing]
                records.append(
                    {
                        **dict(zip(keys, gkey, strict=True)),
                        "seed": seed,
                        "present": ", ".join(sorted(have)),
                        "missing": ", ".join(described),
                    }
                )
    return pd.DataFrame(records, columns=[*keys, "seed", "present", "missing"])


def _missing_reasons(
    runs: pd.DataFrame, duplicates: pd.DataFrame, cols: Sequence[str]
) -> dict[tuple, str]:
    """Why a cell has no usable run: 'duplicate runs', or the statuses of its unfinished runs."""
    unfinished = runs[runs["status"] != FINISHED]
    reasons = (
        unfinished.groupby(list(cols), dropna=False)["status"]
        .agg(lambda s: "/".join(sorted(set(s))))
        .to_dict()
    )
    for cell in duplicates[list(cols)].itertuples(index=False, name=None):
        reasons[cell] = "duplicate runs"
    return reasons


def _groups_without_baseline(
    others: pd.DataFrame, base: pd.DataFrame, keys: Sequence[str]
) -> pd.DataFrame:
    groups_with_ops = others[list(keys)].drop_duplicates()
    groups_with_base = base[list(keys)].drop_duplicates()
    merged = groups_with_ops.merge(groups_with_base, how="left", indicator=True)
    merged = merged[merged["_merge"] == "left_only"].drop(columns="_merge")
    return merged.reset_index(drop=True)


def _compared_params(clean: pd.DataFrame, ignore_params: Iterable[str]) -> list[str]:
    """The param columns that must agree inside a pair (never the execution-only ones)."""
    ignored = {*ignore_params, *EXECUTION_PARAMS}
    return [
        c
        for c in param_columns(clean)
        if not is_operator_param(param_name(c)) and param_name(c) not in ignored
    ]


def _match_seeds(
    others: pd.DataFrame,
    base: pd.DataFrame,
    keys: Sequence[str],
    baseline: str,
    compared: Sequence[str],
) -> pd.DataFrame:
    """One row per (group, operator, seed) that has a baseline run of the same seed, after
    checking that the two runs agree on every compared param."""
    values = list(VALUE_COLUMNS)
    merged = others[[*keys, "operator", "seed", *values, *compared]].merge(
        base[[*keys, "seed", *values, *compared]],
        on=[*keys, "seed"],
        suffixes=("", "_base"),
        how="inner",
    )
    _check_params(merged, keys, baseline, compared)
    pairs = merged[[*keys, "operator", "seed"]].copy()
    pairs.insert(len(keys) + 1, "baseline", baseline)
    for col in values:
        pairs[col] = merged[col].to_numpy()
        pairs[f"baseline_{col}"] = merged[f"{col}_base"].to_numpy()
    pairs = pairs.rename(
        columns={"test_correct": "correct", "baseline_test_correct": "baseline_correct"}
    )
    return pairs.sort_values([*keys, "operator", "seed"], kind="stable").reset_index(drop=True)


def _set_aside_aliases(
    pairs: pd.DataFrame, clean: pd.DataFrame, keys: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the pairs to test, one row per comparison set aside as an alias of another).

    A comparison (group, operator) whose runs carry ``position_alias_of = X`` is the same model
    as the comparison with position X and every other key equal; when that one has pairs, the
    alias's pairs leave the family (they would test the same model twice). When X has no such
    comparison, the alias is tested as any other position."""
    empty = pd.DataFrame(columns=[*keys, *ALIAS_COLUMNS])
    if POSITION_ALIAS_TAG not in clean or pairs.empty:
        return pairs, empty
    alias = clean.set_index("run_id")[POSITION_ALIAS_TAG]
    alias_of = pairs["run_id"].map(alias).fillna(pairs["baseline_run_id"].map(alias))
    cols = [*keys, "operator"]
    present = set(pairs[cols].drop_duplicates().itertuples(index=False, name=None))
    at = cols.index("position")
    aside = np.zeros(len(pairs), dtype=bool)
    for i, (row, target) in enumerate(
        zip(pairs[cols].itertuples(index=False, name=None), alias_of, strict=True)
    ):
        if pd.notna(target) and target != row[at]:
            aside[i] = (*row[:at], target, *row[at + 1 :]) in present
    if not aside.any():
        return pairs, empty
    dropped = pairs[aside].assign(alias_of=alias_of[aside].to_numpy())
    aliases = (
        dropped.groupby([*cols, "alias_of"], sort=True, dropna=False)
        .size()
        .rename("n_pairs")
        .reset_index()
    )
    return pairs[~aside].reset_index(drop=True), aliases[[*keys, *ALIAS_COLUMNS]]


def _baseline_notes(clean: pd.DataFrame, baseline: str) -> list[str]:
    operators = set(clean["operator"])
    if baseline in operators:
        return []
    return [
        f"baseline {baseline!r} has no FINISHED run; operators present: "
        f"{', '.join(sorted(operators))}. Choose one with --baseline."
    ]


# ----------------------------------------------------------------------------- param checks


def _check_params(
    merged: pd.DataFrame, keys: Sequence[str], baseline: str, compared: Sequence[str]
) -> None:
    """Raise PairingError naming every pair whose compared params (or test set) differ."""
    if merged.empty:
        return
    problems = _param_differences(merged, compared)
    if not problems:
        return
    lines = []
    for i, diffs in sorted(problems.items()):
        row = merged.iloc[i]
        group = ", ".join(f"{k}={row[k]}" for k in keys)
        lines.append(
            f"  {group}, seed={row['seed']}: {row['operator']} (run {row['run_id']}) vs "
            f"{baseline} (run {row['run_id_base']}) differ in " + "; ".join(diffs)
        )
    names = sorted({d.split(":")[0] for ds in problems.values() for d in ds})
    shown = lines[:SHOWN_PROBLEMS]
    if len(lines) > SHOWN_PROBLEMS:
        shown.append(f"  ... and {len(lines) - SHOWN_PROBLEMS} more")
    raise PairingError(
        f"{len(lines)} seed pair(s) differ in more than the operator (only {OPERATOR_PARAM} "
        f"and {OPERATOR_KWARGS_PREFIX}* may differ), so they cannot be paired:\n"
        + "\n".join(shown)
        + f"\nDiffering params: {', '.join(names)}. If the sweep varies one of them on purpose, "
        "pass it with --by so each value is compared separately; if it cannot change results "
        "(e.g. a cache path), pass --ignore-param NAME."
    )


def _param_differences(merged: pd.DataFrame, compared: Sequence[str]) -> dict[int, list[str]]:
    """Row of ``merged`` -> 'name: operator's value vs baseline's value' for each difference."""
    problems: dict[int, list[str]] = {}
    for col in compared:
        a = merged[col].to_numpy(dtype=object)
        b = merged[f"{col}_base"].to_numpy(dtype=object)
        a_na, b_na = pd.isna(a), pd.isna(b)
        differ = np.where(a_na | b_na, a_na != b_na, a != b)
        for i in np.flatnonzero(differ):
            shown_a = "<absent>" if a_na[i] else repr(a[i])
            shown_b = "<absent>" if b_na[i] else repr(b[i])
            problems.setdefault(int(i), []).append(f"{param_name(col)}: {shown_a} vs {shown_b}")
    totals = merged["test_total"].to_numpy() != merged["test_total_base"].to_numpy()
    for i in np.flatnonzero(totals):
        a, b = merged["test_total"].iloc[i], merged["test_total_base"].iloc[i]
        problems.setdefault(int(i), []).append(f"test_total: {a} vs {b}")
    return problems


# ----------------------------------------------------------------------------- nothing to compare


def why_nothing_to_compare(pairing: Pairing) -> str:
    """Why ``pairing`` has no seed pair, with what to do ('' when it has pairs): no usable
    FINISHED run (every cell duplicated, every run lacking a tag or metric), only one operator,
    the baseline absent, or no seed the baseline shares with another operator in a group."""
    if len(pairing.pairs):
        return ""
    if pairing.runs.empty:
        return _no_usable_run(pairing)
    operators = sorted(set(pairing.runs["operator"]))
    base = pairing.baseline
    if len(operators) == 1:
        alone = operators[0]
        reason = f"only one operator, {alone!r}, has FINISHED runs: no other to compare with it"
        if alone != base:
            reason += f" (and the baseline {base!r} has none)"
        return reason + ". Add another fusion to the sweep's grid, or wait for its runs to finish."
    if base not in operators:
        return (
            f"the baseline operator {base!r} has no FINISHED run; operators present: "
            f"{', '.join(operators)}. Choose one of them as the baseline (--baseline)."
            + _duplicates_hint(pairing)
        )
    return _no_common_seed(pairing)


def _listed(lines: list[str]) -> str:
    shown = lines[:SHOWN_REASONS]
    if len(lines) > SHOWN_REASONS:
        shown.append(f"  ... and {len(lines) - SHOWN_REASONS} more")
    return "\n".join(shown)


def _no_usable_run(pairing: Pairing) -> str:
    dups, excluded = pairing.duplicates, pairing.excluded
    if len(dups):
        cell = [*pairing.keys, "operator", "seed"]
        lines = [
            "  " + ", ".join(f"{k}={r[k]}" for k in cell) + f": runs {r['run_ids']}"
            for _, r in dups.iterrows()
        ]
        differing = sorted({p for d in dups["differing_params"] for p in d.split(", ") if p})
        by = (
            f" If the sweep varies {', '.join(differing)} on purpose, pass it with --by."
            if differing
            else ""
        )
        return (
            f"every cell's runs are duplicated: each of the {len(dups)} cell(s) with FINISHED "
            "runs has several FINISHED runs, so none is used:\n"
            + _listed(lines)
            + "\nKeep one FINISHED run per cell (delete the others)."
            + by
        )
    if len(excluded):
        lines = [f"  run {r['run_id']} lacks {r['missing']}" for _, r in excluded.iterrows()]
        return (
            f"none of the {len(excluded)} FINISHED trial run(s) has every tag and metric the "
            f"analysis needs ({', '.join(NEEDED)}):\n"
            + _listed(lines)
            + "\nLog them as the schema says, or delete them."
        )
    return "no selected trial run FINISHED; wait for the sweep's trials to finish."


def _duplicates_hint(pairing: Pairing) -> str:
    dups = pairing.duplicates
    if dups.empty:
        return ""
    ops = ", ".join(sorted(set(dups["operator"])))
    return (
        f" Besides, {len(dups)} cell(s) of {ops} have several FINISHED runs each, so none of "
        "their runs is used; keep one FINISHED run per cell."
    )


def _no_common_seed(pairing: Pairing) -> str:
    runs, keys, base = pairing.runs, list(pairing.keys), pairing.baseline
    lines = []
    for gkey, grp in runs.groupby(keys, sort=True, dropna=False):
        # agg keeps a list per group (an object Series); pandas-stubs allow only scalar results
        seeds = grp.groupby("operator")["seed"].agg(lambda s: sorted(int(x) for x in s))  # type: ignore[type-var]
        parts = [f"{base}: {'seeds ' + _seeds(seeds[base]) if base in seeds else 'no run'}"]
        parts += [f"{op}: seeds {_seeds(v)}" for op, v in seeds.items() if op != base]
        values = gkey if isinstance(gkey, tuple) else (gkey,)
        group = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
        lines.append(f"  {group}: " + "; ".join(parts))
    return (
        f"no seed in common between the baseline {base!r} and any other operator within any "
        f"group ({' x '.join(keys)}); a comparison needs both runs of a seed in one group:\n"
        + _listed(lines)
        + "\nRun the same seeds for every operator in each group, or wait for the missing runs "
        "to finish." + _duplicates_hint(pairing)
    )


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds))
