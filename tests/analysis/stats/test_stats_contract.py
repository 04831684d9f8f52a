"""Every registered report statistic (built-ins and installed plug-ins) keeps the contract of
``fusion_ray.testing``: exactly its columns, as scalars, the same for the same deltas, its
family columns, texts that fill from the settings record."""

from __future__ import annotations

import pytest

from analysis.stats import Statistic, statistics
from fusion_ray.testing import check_statistic

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", [s.name for s in statistics()])
def test_every_registered_statistic_keeps_the_contract(name):
    check_statistic(name)


def test_an_unregistered_statistic_is_checked_against_the_registered_ones():
    good = Statistic(
        name="positive_share",
        columns=("positive_share",),
        compute=lambda d: {"positive_share": float((d.num > 0).mean())},
        method="**Positive share**: the share of seeds won, over m = {m} comparisons.",
        cells=lambda r, rec: {"won": f"{r['positive_share']:.0%}"},
    )
    check_statistic(good)
    with pytest.raises(AssertionError, match="returned columns"):
        check_statistic(Statistic("extra", ("a",), lambda d: {"a": 1, "b": 2}, "**Extra**."))
    with pytest.raises(AssertionError, match="are 'wilcoxon'"):
        check_statistic(Statistic("clash", ("p_wilcoxon",), lambda d: {"p_wilcoxon": 1}, "x"))
    with pytest.raises(AssertionError, match="method text names"):
        check_statistic(Statistic("bad_text", ("c",), lambda d: {"c": 1}, "{no_such_field}"))
