"""Contract checks for decision rules (``fusion_ray.decide.rules``, entry-point group
``fusion_ray.decision_rules``).

``check_decision_rule(rule)`` runs every check below and raises ``AssertionError`` naming the
first that fails; ``tests/fusion_ray/decide/test_rule_contract.py`` runs it over every registered rule, plug-ins
included.

The checks:
- validity under the null, exactly: given the magnitudes, the signs of the deltas are fair
  coins; over all 2^n sign vectors (n <= 12, several magnitude sets) the mean of each one-sided
  e-value is at most 1 at every seed;
- with a margin: for deltas symmetric about +margin or -margin (signs fair), the mean of the
  equivalence e-value is at most 1 at every seed;
- no look-ahead: from the first wave on, the evidence after k seeds does not change when later
  seeds are added; and, exactly over every sign vector, the two-sided e-value reaches 1 / alpha
  with probability at most alpha;
- the evidence has one value per seed, never negative, and is a function of the deltas only
  (the same deltas give the same values: a restarted driver recomputes the same states);
- a decision, once reached, persists as seeds are added (``fusion_ray.decide.sequential.run_family``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from fusion_ray.decide.rules import build_rule
from fusion_ray.decide.sequential import run_family

MAGNITUDE_SETS: tuple[tuple[float, ...], ...] = (
    (1.0,) * 12,
    (0.1, 3.0, 0.5, 2.0, 0.2, 1.0, 4.0, 0.3, 0.7, 1.5, 0.05, 2.5),
    (0.0, 1.0, 2.0, 0.0, 3.0, 1.0, 5.0, 0.5, 2.0, 0.0, 1.0, 4.0),  # zeros: ties carry no sign
    tuple(float(k) for k in range(1, 13)),
)
TOLERANCE = 1e-9


def _rule(rule):
    return build_rule(rule)


def _mean_over_signs(rule, magnitudes: Sequence[float], centre: float, margin, field: str):
    n = len(magnitudes)
    totals = [0.0] * n
    for signs in itertools.product((1.0, -1.0), repeat=n):
        row = [centre + s * a for s, a in zip(signs, magnitudes, strict=True)]
        ev = rule.evidence(row, first=min(6, n), margin=margin)
        values = (
            getattr(ev, field) if field != "equivalent" else [ev.equivalent(t) for t in range(n)]
        )
        assert len(values) == n, f"{field}: {len(values)} values for {n} seeds"
        assert all(v >= 0 for v in values), f"{field}: a negative e-value {min(values)}"
        totals = [t + v for t, v in zip(totals, values, strict=True)]
    return [t / 2**n for t in totals]


def check_null_validity(rule, n: int = 10) -> None:
    """The mean of each one-sided e-value over every sign vector is at most 1 at every seed."""
    the_rule = _rule(rule)
    for magnitudes in MAGNITUDE_SETS:
        for field in ("better", "worse"):
            means = _mean_over_signs(the_rule, magnitudes[:n], 0.0, None, field)
            worst = max(means)
            assert worst <= 1 + TOLERANCE, (
                f"decision rule {the_rule.name!r}: the mean of its '{field}' e-value over all sign "
                f"vectors is {worst:.6g} > 1 for magnitudes {magnitudes[:n]}: it is not valid "
                "under the null"
            )


def check_no_look_ahead(rule, n: int = 12, first: int = 6) -> None:
    """From the first wave on, the evidence after k seeds is the same whether or not later seeds
    exist: a value may not depend on a delta that has not happened yet."""
    the_rule = _rule(rule)
    for magnitudes in MAGNITUDE_SETS:
        row = [a if i % 3 else -a for i, a in enumerate(magnitudes[:n])]
        full = the_rule.evidence(row, first=first, margin=1.0)
        for k in range(first, n + 1):
            part = the_rule.evidence(row[:k], first=first, margin=1.0)
            for field in ("better", "worse", "below_upper", "above_lower"):
                a, b = getattr(part, field), getattr(full, field)
                if a is None and b is None:
                    continue
                assert all(
                    abs(x - y) <= TOLERANCE * max(1.0, abs(y))
                    for x, y in zip(a, b[:k], strict=True)
                ), (
                    f"decision rule {the_rule.name!r}: its '{field}' evidence after {k} seeds "
                    "changes when later seeds are added: it looks ahead"
                )


def check_anytime_crossing(rule, n: int = 10, alpha: float = 0.1) -> None:
    """Over every sign vector given the magnitudes, the chance that the two-sided e-value ever
    reaches 1 / alpha (from the first wave on) is at most alpha: Ville's inequality, exactly."""
    the_rule = _rule(rule)
    for magnitudes in MAGNITUDE_SETS:
        crossing = 0
        for signs in itertools.product((1.0, -1.0), repeat=n):
            row = [s * a for s, a in zip(signs, magnitudes[:n], strict=True)]
            ev = the_rule.evidence(row, first=6, margin=None)
            crossing += max(ev.two_sided(t) for t in range(5, n)) >= 1 / alpha
        assert crossing / 2**n <= alpha + TOLERANCE, (
            f"decision rule {the_rule.name!r}: its e-value reaches 1/{alpha:g} with probability "
            f"{crossing / 2**n:.4f} > {alpha:g} under sign flips of {magnitudes[:n]}"
        )


def check_equivalence_validity(rule, n: int = 10, margin: float = 1.0) -> None:
    """For deltas symmetric about +-margin, the equivalence e-value's mean is at most 1."""
    the_rule = _rule(rule)
    probe = the_rule.evidence([0.0, 1.0], first=1, margin=margin)
    if probe.below_upper is None:
        return  # the rule decides equivalence another way (its confidence sequence)
    for magnitudes in MAGNITUDE_SETS:
        for centre in (margin, -margin):
            means = _mean_over_signs(the_rule, magnitudes[:n], centre, margin, "equivalent")
            assert max(means) <= 1 + TOLERANCE, (
                f"decision rule {the_rule.name!r}: its equivalence e-value has mean "
                f"{max(means):.6g} > 1 for deltas symmetric about {centre:+g}"
            )


def check_determinism_and_persistence(rule) -> None:
    """Same deltas, same evidence and states; decisions persist as seeds are added."""
    the_rule = _rule(rule)
    full = {
        "up": [3.0, 2.5, 4.0, 3.5, 2.0, 3.0, 2.8, 3.2, 4.1, 2.9, 3.3, 3.7, 2.6, 3.1],
        "flat": [0.5, -0.4, 0.3, -0.6, 0.2, -0.1, 0.4, -0.3, 0.1, -0.2, 0.3, -0.5, 0.2, -0.4],
        "down": [-2.0, -1.5, -2.5, 0.5, -3.0, -2.2, -1.8, -2.4, -2.6, -1.9, -2.1, -2.3, -1.7, -2.0],
    }
    row = full["up"]
    assert the_rule.evidence(row, first=6, margin=1.0) == the_rule.evidence(
        list(row), first=6, margin=1.0
    )
    previous: dict[str, str] = {}
    for k in range(1, 15):
        states = run_family(
            {n: r[:k] for n, r in full.items()}, margin=1.0, max_seeds=20, rule=the_rule
        )
        again = run_family(
            {n: r[:k] for n, r in reversed(full.items())}, margin=1.0, max_seeds=20, rule=the_rule
        )
        assert states == again, f"decision rule {the_rule.name!r}: states depend on the order"
        for name, state in previous.items():
            if state in ("better", "worse"):
                assert states[name][-1] == state, (
                    f"decision rule {the_rule.name!r}: {name} was {state} and became "
                    f"{states[name][-1]} when a seed was added"
                )
        previous = {n: s[-1] for n, s in states.items()}


def check_interval(rule) -> None:
    """The confidence sequence is an interval that only shrinks as seeds are added."""
    the_rule = _rule(rule)
    row = [2.0, 1.0, 3.0, -1.0, 2.5, 1.5, 2.0, 0.5, 3.5, 1.0, 2.2, 1.8]
    previous = (-math.inf, math.inf)
    for k in range(1, len(row) + 1):
        low, high = the_rule.interval(row[:k], level=0.05, first=6)
        assert low <= high, f"decision rule {the_rule.name!r}: interval ({low}, {high})"
        assert low >= previous[0] - TOLERANCE and high <= previous[1] + TOLERANCE, (
            f"decision rule {the_rule.name!r}: its confidence sequence grew at seed {k}"
        )
        previous = (low, high)


def check_decision_rule(rule) -> None:
    """Every decision-rule check above, for a registered name or an instance."""
    check_null_validity(rule)
    check_no_look_ahead(rule)
    check_anytime_crossing(rule)
    check_equivalence_validity(rule)
    check_determinism_and_persistence(rule)
    check_interval(rule)
