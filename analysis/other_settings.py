"""Runs of other settings: the trial runs of an experiment that are not its sweep's cells.

When the sweep's parent run carries ``sweep_cells.json``, ``load_experiment`` keeps only the
trial runs of those cells; the rest (``Experiment.other_runs``) were logged under the same sweep
name by another version of the sweep file (another number of epochs, a dataset dropped since).
They are never counted, paired or analysed. This module says how many there are and what they
differ in: each is compared with the sweep's run of the same dataset, position, attention
position, fusion and seed, and the most common param differences come first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from analysis.load import FINISHED, Experiment
from analysis.pairing import param_columns, param_name

#: Columns that find a left-out run's counterpart among the sweep's runs.
MATCH_COLUMNS = ("dataset", "position", "attention_position", "operator", "seed")
#: The same, as the tags are called.
MATCH_WORDS = "dataset, position, attention_position, fusion and seed"
#: How many param differences the sentence names before it only counts the rest.
SHOWN_DIFFERENCES = 4
ADVICE = "give the changed sweep a new name, or make the setting a grid axis"
#: How an absent param is shown.
UNSET = "unset"


def plural(n: int, noun: str) -> str:
    """``plural(1, "run")`` -> "1 run", ``plural(9, "run")`` -> "9 runs"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class OtherSettings:
    """How many trial runs belong to other settings, and what they differ in."""

    finished: int = 0
    """FINISHED trial runs whose cell is not in ``sweep_cells.json``."""
    unfinished: int = 0
    """Such runs in any other status."""
    differences: tuple[str, ...] = ()
    """'train.epochs 2 in 9 runs vs 1 in the sweep's runs', most common first (FINISHED runs)."""
    without_counterpart: int = 0
    """FINISHED left-out runs with no sweep run of the same dataset/position/fusion/seed."""
    same_params: int = 0
    """FINISHED left-out runs whose params equal their counterpart's (only the cell id differs)."""
    sweep_cells: int | None = None
    """How many cells ``sweep_cells.json`` lists; None without it."""

    @property
    def left_out(self) -> int:
        """Every trial run left out, whatever its status."""
        return self.finished + self.unfinished

    @property
    def details(self) -> list[str]:
        """The parts of the parenthesis of ``sentence``."""
        out = list(self.differences)
        for n, what in (
            (self.without_counterpart, f"no run of the same {MATCH_WORDS} among the sweep's runs"),
            (self.same_params, "the same params as the sweep's run of their cell"),
        ):
            if n:
                out.append(f"{plural(n, 'run')} {'has' if n == 1 else 'have'} {what}")
        return out

    @property
    def sentence(self) -> str:
        """The runs of other settings in words ('' when there are none)."""
        if not self.left_out:
            return ""
        head = self.finished or self.unfinished
        who = plural(head, "FINISHED run" if self.finished else "unfinished run")
        if self.finished and self.unfinished:
            who += f" (and {plural(self.unfinished, 'unfinished run')})"
        detail = f" ({'; '.join(self.details)})" if self.details else ""
        verb, state = ("belongs", "is") if head == 1 else ("belong", "are")
        return (
            f"{who} in this experiment {verb} to other settings{detail} and {state} not "
            f"analysed; {ADVICE}."
        )


def describe_other_settings(exp: Experiment) -> OtherSettings:
    """Count the experiment's runs of other settings and name what they differ in."""
    other = exp.other_runs
    if exp.sweep_cells is None or other.empty:
        cells = None if exp.sweep_cells is None else len(exp.sweep_cells)
        return OtherSettings(sweep_cells=cells)
    done = other[other["status"] == FINISHED]
    differences, without, same = compare_with_counterparts(done, exp.runs)
    return OtherSettings(
        finished=len(done),
        unfinished=len(other) - len(done),
        differences=tuple(differences),
        without_counterpart=without,
        same_params=same,
        sweep_cells=len(exp.sweep_cells),
    )


def counterparts(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per MATCH_COLUMNS key among the sweep's ``runs``: a FINISHED one if any, else
    the first by run id."""
    keyed = runs.dropna(subset=list(MATCH_COLUMNS))
    rank = (keyed["status"] != FINISHED).astype(int)
    ordered = keyed.assign(unfinished=rank).sort_values(["unfinished", "run_id"], kind="stable")
    return ordered.drop_duplicates(list(MATCH_COLUMNS)).drop(columns="unfinished")


def compare_with_counterparts(
    left_out: pd.DataFrame, sweep_runs: pd.DataFrame
) -> tuple[list[str], int, int]:
    """(param differences in words, most common first; runs without a counterpart; runs whose
    params equal their counterpart's) of ``left_out`` against ``sweep_runs``."""
    params = param_columns(left_out)
    keys = list(MATCH_COLUMNS)
    theirs = left_out.dropna(subset=keys)[[*keys, *params]]
    ours = counterparts(sweep_runs).reindex(columns=[*keys, *params])
    merged = theirs.merge(ours, on=keys, how="inner", suffixes=("", " sweep"))
    found: Counter[tuple[str, str, str]] = Counter()
    differing_runs = pd.Series(False, index=merged.index)
    for col in params:
        a = merged[col].astype(object).where(merged[col].notna(), UNSET)
        b = merged[f"{col} sweep"].astype(object).where(merged[f"{col} sweep"].notna(), UNSET)
        differ = a != b
        differing_runs |= differ
        found.update(
            (param_name(col), str(x), str(y)) for x, y in zip(a[differ], b[differ], strict=True)
        )
    without = len(left_out) - len(merged)
    return describe_differences(found), without, int((~differing_runs).sum())


def describe_differences(found: Counter[tuple[str, str, str]]) -> list[str]:
    """'key theirs in n runs vs ours in the sweep's runs', keys differing in most runs first."""
    per_key: Counter[str] = Counter()
    for (key, _, _), n in found.items():
        per_key[key] += n
    ranked = sorted(found.items(), key=lambda kv: (-per_key[kv[0][0]], -kv[1], kv[0]))
    lines = [
        f"{key} {theirs} in {plural(n, 'run')} vs {ours} in the sweep's runs"
        for (key, theirs, ours), n in ranked[:SHOWN_DIFFERENCES]
    ]
    if len(ranked) > SHOWN_DIFFERENCES:
        lines.append(f"{plural(len(ranked) - SHOWN_DIFFERENCES, 'other difference')}")
    return lines
