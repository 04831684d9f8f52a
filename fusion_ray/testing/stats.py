"""Contract checks for the report's paired statistics (``analysis.stats.Statistic``, the
registry ``analysis.stats.statistics()``, entry-point group ``fusion_ray.statistics``). Each
raises ``AssertionError`` naming the statistic and what broke.

``check_statistic(name_or_statistic)``:
- its columns are named, and clash with no other registered statistic's;
- ``compute`` returns exactly its declared columns, as scalars, for many kinds of paired
  deltas (one pair, two, all wins, all losses, zeros, ties, a large spread) and every
  alternative and zero policy, and the same values for the same deltas (NaN equal to NaN);
- a family statistic (``family``) adds exactly its ``family_columns`` to a family of rows and
  keeps the rows;
- its ``record`` and ``method`` texts fill from the settings record (no unknown ``{field}``);
- its ``cells`` give report.md's compact table a mapping of column titles for every row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import (
    PairedDeltas,
    Statistic,
    StatsSettings,
    describe_deltas,
    settings_record,
    statistics,
)

DELTA_SETS: tuple[tuple[int, ...], ...] = (
    (3,),
    (2, -1),
    (1, 2, 3, 4, 5, 6),
    (-4, -2, -7, -1, -3, -5, -6),
    (0, 0, 3, -3, 2, 0, 5, 1),
    (2, 2, -2, 2, 4, 4, -4, 2, 2, 6),
    (40, -35, 12, 0, -80, 95, 3, -1, 7, 60, -22, 15),
)
"""Integer paired differences of correct counts, out of ``DENOMINATOR`` documents each."""
DENOMINATOR = 200
SETTINGS_GRID: tuple[dict[str, Any], ...] = (
    {},
    {"alternative": "greater"},
    {"alternative": "less", "zero_method": "pratt"},
    {"zero_method": "zsplit", "alpha": 0.1},
)
"""``StatsSettings`` keyword sets each statistic is computed under."""


def _resolve(statistic):
    if isinstance(statistic, Statistic):
        return statistic
    found = [s for s in statistics() if s.name == statistic]
    assert found, (
        f"statistic {statistic!r} is not registered (is it installed?); registered: "
        f"{', '.join(s.name for s in statistics())}"
    )
    return found[0]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, np.generic))


def check_statistic_columns(statistic) -> None:
    """Named columns that no other registered statistic has."""
    stat = _resolve(statistic)
    assert stat.name and isinstance(stat.name, str), f"statistic {stat!r}: it needs a name"
    own = (*stat.columns, *stat.family_columns)
    assert all(isinstance(c, str) and c for c in own), f"statistic {stat.name!r}: column names"
    assert stat.compute is not None or stat.family is not None, (
        f"statistic {stat.name!r}: it needs a compute function, a family function or both"
    )
    assert set(stat.headline) <= set(own), (
        f"statistic {stat.name!r}: headline columns {sorted(set(stat.headline) - set(own))} "
        "are not its columns"
    )
    for other in statistics():
        if other.name == stat.name:
            continue
        clash = set(own) & {*other.columns, *other.family_columns}
        assert not clash, f"statistic {stat.name!r}: columns {sorted(clash)} are {other.name!r}'s"


def _computed(stat, num: tuple[int, ...], settings) -> dict[str, Any]:
    deltas = PairedDeltas(np.asarray(num, dtype=np.int64), DENOMINATOR, settings, key="a vs b")
    return dict(stat.compute(deltas))


def check_statistic_compute(statistic) -> None:
    """``compute`` returns exactly its columns, as scalars, the same twice, for every delta set
    and settings of ``DELTA_SETS`` and ``SETTINGS_GRID``."""
    stat = _resolve(statistic)
    if stat.compute is None:
        return
    for options in SETTINGS_GRID:
        settings = StatsSettings(**options)
        for num in DELTA_SETS:
            where = f"statistic {stat.name!r} on deltas {num} with {options or 'the defaults'}"
            values = _computed(stat, num, settings)
            assert set(values) == set(stat.columns), (
                f"{where}: returned columns {sorted(values)}, declares {list(stat.columns)}"
            )
            wrong = {k: type(v).__name__ for k, v in values.items() if not _scalar(v)}
            assert not wrong, f"{where}: columns that are not scalars: {wrong}"
            again = _computed(stat, num, settings)
            differ = [k for k in values if not _same(values[k], again[k])]
            assert not differ, f"{where}: other values for the same deltas: {differ}"


def _family_table(stat, settings):
    rows = []
    for i, num in enumerate(DELTA_SETS):
        key = f"operator{i} vs baseline"
        row = {"comparison": key, **describe_deltas(np.asarray(num), DENOMINATOR, settings, key)}
        if stat.compute is not None:
            row.update(_computed(stat, num, settings))
        rows.append(row)
    return pd.DataFrame(rows)


def check_statistic_family(statistic) -> None:
    """A family statistic adds its ``family_columns`` to a family of comparisons, in place,
    keeping every row."""
    stat = _resolve(statistic)
    if stat.family is None:
        assert not stat.family_columns, (
            f"statistic {stat.name!r}: family_columns without a family function"
        )
        return
    settings = StatsSettings()
    table = _family_table(stat, settings)
    before = len(table)
    stat.family(table, settings)
    missing = [c for c in stat.family_columns if c not in table.columns]
    assert not missing, f"statistic {stat.name!r}: its family function did not add {missing}"
    assert len(table) == before, f"statistic {stat.name!r}: its family function changed the rows"


def _record(stat, m: int) -> dict[str, Any]:
    record = settings_record(StatsSettings(), m)
    fields = dict(record)
    for key, template in stat.record.items():
        try:
            record[key] = template.format(**fields)
        except (KeyError, IndexError) as err:
            raise AssertionError(
                f"statistic {stat.name!r}: its record entry {key!r} names {err}, which the "
                f"settings record does not have; fields: {', '.join(sorted(fields))}"
            ) from None
    return record


def check_statistic_texts(statistic) -> None:
    """Its ``record`` and ``method`` texts fill from the settings record, and its ``cells``
    give a mapping of column titles for every row of a family."""
    stat = _resolve(statistic)
    record = _record(stat, m=len(DELTA_SETS))
    try:
        line = stat.method.format(**record)
    except (KeyError, IndexError) as err:
        raise AssertionError(
            f"statistic {stat.name!r}: its method text names {err}, which the settings record "
            "does not have"
        ) from None
    assert line.strip(), f"statistic {stat.name!r}: an empty method text"
    if stat.cells is None:
        return
    settings = StatsSettings()
    table = _family_table(stat, settings)

    for other in statistics():  # the family columns every report row has
        if other.family is not None:
            other.family(table, settings)
    if stat.family is not None:
        stat.family(table, settings)
    for _, row in table.iterrows():
        cells = stat.cells(row, record)
        assert isinstance(cells, Mapping) and all(isinstance(k, str) for k in cells), (
            f"statistic {stat.name!r}: cells() must map column titles to values, got {cells!r}"
        )


def check_statistic(statistic) -> None:
    """Every contract check of a statistic: a registered name or an ``analysis.stats.Statistic``
    (one not registered yet is checked against the registered ones)."""
    check_statistic_columns(statistic)
    check_statistic_compute(statistic)
    check_statistic_family(statistic)
    check_statistic_texts(statistic)
