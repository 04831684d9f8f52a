"""Every registered decision rule (built-ins and installed plug-ins) keeps the contract of
``fusion_ray.testing``: valid under sign flips given the magnitudes (exact enumeration),
a valid equivalence e-value, deterministic, persistent decisions, a shrinking interval."""

from __future__ import annotations

import pytest

from fusion_ray.decide.rules import RULES, DecisionRule, Evidence
from fusion_ray.testing import check_decision_rule, check_no_look_ahead, check_null_validity

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", RULES.names())
def test_every_registered_rule_keeps_the_contract(name):
    check_decision_rule(name)


class _Overbetting(DecisionRule):
    """Doubles its wealth on every positive delta and keeps it on a negative one: invalid."""

    name = "overbetting"

    def evidence(self, row, *, first, margin):
        wealth, out = 1.0, []
        for d in row:
            wealth *= 2.0 if d is not None and d > 0 else 1.0
            out.append(wealth)
        return Evidence(tuple(out), tuple(out))

    def interval(self, row, *, level, first):
        return (-1.0, 1.0)


def test_the_contract_catches_a_rule_that_is_not_valid():
    with pytest.raises(AssertionError, match="not valid under the null"):
        check_null_validity(_Overbetting())


class _Peeking(DecisionRule):
    """Bets each seed at the scale of the whole row, later seeds included: it looks ahead."""

    name = "peeking"

    def evidence(self, row, *, first, margin):
        scale = max((abs(d) for d in row if d is not None), default=1.0) or 1.0
        up, ups, downs, down = 1.0, [], [], 1.0
        for d in row:
            step = 0.5 * (d or 0.0) / scale
            up, down = up * (1 + step), down * (1 - step)
            ups.append(up)
            downs.append(down)
        return Evidence(tuple(ups), tuple(downs))

    def interval(self, row, *, level, first):
        return (-1.0, 1.0)


def test_the_contract_catches_a_rule_that_looks_ahead():
    with pytest.raises(AssertionError, match="looks ahead"):
        check_no_look_ahead(_Peeking())
