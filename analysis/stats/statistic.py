"""What one statistic of a comparison is (``Statistic``) and what it is computed from
(``PairedDeltas``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats.exact import SignedRankResult, StatsSettings, wilcoxon_signed_rank


@dataclass(frozen=True, eq=False)
class PairedDeltas:
    """One comparison's integer paired differences ``num / denom`` (of accuracy), with the
    settings and what several statistics share, computed once."""

    num: np.ndarray
    denom: int
    settings: StatsSettings
    key: str = ""
    """The comparison's name; with ``bootstrap_seed`` it seeds the bootstrap stream."""

    @property
    def n(self) -> int:
        return len(self.num)

    @functools.cached_property
    def pp(self) -> np.ndarray:
        """The deltas in percentage points."""
        return 100.0 * self.num / self.denom

    @functools.cached_property
    def signed_rank(self) -> SignedRankResult:
        """The Wilcoxon signed-rank test on the integers (ties stay exact)."""
        s = self.settings
        return wilcoxon_signed_rank(self.num, s.alternative, s.zero_method)


@dataclass(frozen=True)
class Statistic:
    """One statistic of a comparison: how its stats.csv columns are computed and how it is
    described. Register it with ``register``; stats.csv, stats.json, report.md's table and its
    Method section all follow the registry (``statistics()``)."""

    name: str
    columns: tuple[str, ...]
    """The columns ``compute`` returns, in stats.csv order."""
    compute: Callable[[PairedDeltas], Mapping[str, Any]] | None
    """The columns' values for one comparison (None for a statistic of the whole family)."""
    method: str
    """One line for report.md's Method section; ``{field}`` is filled from the settings record
    (``settings_record``: the settings, ``m``, ``confidence`` and every ``record`` entry)."""
    headline: tuple[str, ...] = ()
    """Columns that lead stats.csv, after the comparison's name (the rest follow)."""
    record: Mapping[str, str] = field(default_factory=dict)
    """Entries of the settings record (stats.json) stating its choices in words; ``{field}`` is
    filled from the settings, ``m`` and ``confidence``."""
    cells: Callable[[pd.Series, Mapping[str, Any]], Mapping[str, Any]] | None = None
    """Its cells in report.md's compact table (column title -> value), from a stats row and the
    settings record."""
    leads_table: bool = False
    """Its cells come before the others' in report.md's table (the effect estimates)."""
    family: Callable[[pd.DataFrame, StatsSettings], None] | None = None
    """Adds ``family_columns`` to a whole family of comparisons (e.g. Holm's correction)."""
    family_columns: tuple[str, ...] = ()
