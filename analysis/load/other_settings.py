"""Runs of other settings: the trial runs of an experiment that are not its sweep's cells.

When the sweep's parent run carries ``sweep_cells.json``, ``load_experiment`` keeps only the
trial runs of those cells; the rest (``Experiment.other_runs``) were logged under the same sweep
name by another version of the sweep file (another number of epochs, a dataset dropped since).
They are never counted, paired or analysed. This module says how many there are and what they
differ in: each is compared with the sweep's run of the same dataset, position, attention
position, fusion and seed (and the same level of each extra grid axis the left-out run has),
and the most common param differences come first (worded by ``fusion_ray.other_settings``, which
the driver's note uses too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis.load.frame import FINISHED, Experiment, param_columns, param_name
from fusion_ray.other_settings import UNSET, describe_differences, plural

#: Columns that find a left-out run's counterpart among the sweep's runs.
MATCH_COLUMNS = ("dataset", "position", "attention_position", "operator", "seed")
#: The same, as the tags are called.
MATCH_WORDS = "dataset, position, attention_position, fusion and seed"
ADVICE = "give the changed sweep a new name, or make the setting a grid axis"


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
    axes: tuple[str, ...] = ()
    """The extra grid axes a counterpart must also match (by level)."""

    @property
    def left_out(self) -> int:
        """Every trial run left out, whatever its status."""
        return self.finished + self.unfinished

    @property
    def details(self) -> list[str]:
        """The parts of the parenthesis of ``sentence``."""
        out = list(self.differences)
        words = MATCH_WORDS
        if self.axes:
            words = words.replace(" and seed", ", seed and " + ", ".join(self.axes))
        for n, what in (
            (self.without_counterpart, f"no run of the same {words} among the sweep's runs"),
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
    axes = [a for a in exp.axes if a in other]
    differences, without, same = compare_with_counterparts(done, exp.runs, axes)
    return OtherSettings(
        finished=len(done),
        unfinished=len(other) - len(done),
        differences=tuple(differences),
        without_counterpart=without,
        same_params=same,
        sweep_cells=len(exp.sweep_cells),
        axes=tuple(axes),
    )


def counterparts(runs: pd.DataFrame, keys: Sequence[str] = MATCH_COLUMNS) -> pd.DataFrame:
    """One run per ``keys`` combination among the sweep's ``runs``: a FINISHED one if any, else
    the first by run id."""
    keyed = runs.dropna(subset=list(keys))
    rank = (keyed["status"] != FINISHED).astype(int)
    ordered = keyed.assign(unfinished=rank).sort_values(["unfinished", "run_id"], kind="stable")
    return ordered.drop_duplicates(list(keys)).drop(columns="unfinished")


def _matched(
    left_out: pd.DataFrame, sweep_runs: pd.DataFrame, params: list[str], axes: Sequence[str]
) -> pd.DataFrame:
    """Each left-out run (with a value in every MATCH_COLUMNS) next to its counterpart's
    params (columns suffixed `` sweep``). A counterpart also matches the grid-axis levels the
    left-out run has; an axis the run has no tag for (an older sweep file) is not matched."""
    keys = list(MATCH_COLUMNS)
    theirs = left_out.dropna(subset=keys)
    tagged = theirs[list(axes)].notna()
    patterns = list(tagged.drop_duplicates().itertuples(index=False, name=None))
    if not axes or not patterns:
        patterns = [(False,) * len(axes)]
    parts = []
    for pattern in patterns:
        rows = (tagged == list(pattern)).all(axis=1) if axes else slice(None)
        on = keys + [a for a, has in zip(axes, pattern, strict=True) if has]
        ours = counterparts(sweep_runs, on).reindex(columns=[*on, *params])
        mine = theirs.loc[rows, [*on, *params]]
        parts.append(mine.merge(ours, on=on, how="inner", suffixes=("", " sweep")))
    return pd.concat(parts, ignore_index=True)


def compare_with_counterparts(
    left_out: pd.DataFrame, sweep_runs: pd.DataFrame, axes: Sequence[str] = ()
) -> tuple[list[str], int, int]:
    """(param differences in words, most common first; runs without a counterpart; runs whose
    params equal their counterpart's) of ``left_out`` against ``sweep_runs``."""
    params = param_columns(left_out)
    merged = _matched(left_out, sweep_runs, params, axes)
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
