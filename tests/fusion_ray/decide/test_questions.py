"""The study's questions as one family (fusion_ray.decide.questions): which hypotheses a grid
makes, their values from runs (failed runs counted), the length contrast's and the interaction's
validity by exact enumeration, their futility stop, and what a decided hypothesis prints (e-BY
interval, estimates, notes)."""

from __future__ import annotations

import itertools
import math

import pytest

from fusion_ray.decide.questions import (
    FAILURE_SCALE,
    Arm,
    bucket_edges,
    failures,
    hypotheses,
    possible,
    quarter_accuracy,
    quarter_metrics,
    rows,
)
from fusion_ray.decide.rules import build_rule
from fusion_ray.decide.sequential import (
    decision_rows,
    decisions_text,
    family_evidence,
    fewest_seeds,
    run_family,
)

SCALE = "model.scale_embeddings"
REGIMES = ["short", "medium", "long"]


def _group(dataset: str, scale: str) -> tuple[tuple[str, str], ...]:
    return (
        ("dataset", dataset),
        ("position", "sinusoidal"),
        ("attention_position", "none"),
        (SCALE, scale),
    )


def _quickstart_arms() -> list[Arm]:
    return [
        Arm(_group(d, s), f) for d in REGIMES for s in ("true", "false") for f in ("add", "gate")
    ]


@pytest.mark.unit
def test_the_quickstart_grid_makes_six_comparisons_two_trends_and_three_interactions():
    family = hypotheses(_quickstart_arms(), "add", REGIMES, {SCALE: ["true", "false"]})
    kinds = [h.kind for h in family]
    assert kinds == ["operator"] * 6 + ["length"] * 2 + ["interaction"] * 3
    names = [h.name for h in family]
    assert names[0] == "short/sinusoidal/none/scale_embeddings=true: gate vs add"
    assert names[6] == "long-short/sinusoidal/none/scale_embeddings=true: gate vs add"
    assert names[8] == "short/sinusoidal/none/scale_embeddings=false-true: gate vs add"
    assert len(set(names)) == len(names)
    trend = family[6]
    assert {(a.group[0][1], a.fusion, sign) for a, sign, _ in trend.terms} == {
        ("long", "gate", 1),
        ("long", "add", -1),
        ("short", "gate", -1),
        ("short", "add", 1),
    }
    assert trend.verdict("better") == "grows" and family[8].verdict("worse") == "smaller"


@pytest.mark.unit
def test_decide_selects_questions_and_the_default_is_what_the_grid_allows():
    arms = _quickstart_arms()
    levels = {SCALE: ["true", "false"]}
    only = hypotheses(arms, "add", REGIMES, levels, decide=["length"])
    assert [h.kind for h in only] == ["length", "length"]
    one_regime = [a for a in arms if a.group[0][1] == "short"]
    # one regime: its length question is inside the dataset (its long and short documents)
    assert possible({a.group for a in one_regime}, REGIMES, levels) == (
        "operator",
        "length_within",
        "interaction",
    )
    assert possible({a.group for a in arms}, REGIMES, {SCALE: ["true"]}) == ("operator", "length")
    with pytest.raises(ValueError, match="unknown question"):
        hypotheses(arms, "add", REGIMES, levels, decide=["lenght"])


@pytest.mark.unit
def test_values_are_signed_sums_of_accuracies_and_a_failed_run_is_a_loss_of_its_scale():
    family = hypotheses(_quickstart_arms(), "add", REGIMES, {SCALE: ["true", "false"]})
    acc = {("short", "add"): 0.80, ("short", "gate"): 0.85, ("long", "add"): 0.70}
    acc[("long", "gate")] = 0.90
    failed = {(("long", "gate"), 1)}  # the long gate run of seed 1 failed

    def accuracy(arm: Arm, seed: int, part: str) -> float | None:
        key = (arm.group[0][1], arm.fusion)
        if (key, seed) in failed:
            return None
        return acc.get(key, 0.5)

    def resolved(arm: Arm, seed: int) -> bool:
        return seed < 2

    values = rows(family, resolved, accuracy, max_seeds=5)
    trend = "long-short/sinusoidal/none/scale_embeddings=true: gate vs add"
    # seed 0: (90 - 70) - (85 - 80) = 15; seed 1: the long gate run (the positive side) failed:
    # -FAILURE_SCALE x the RMS of the values before it (15); seed 2 unresolved
    assert values[trend] == [15.0, -FAILURE_SCALE * 15.0]
    long_gate = values["long/sinusoidal/none/scale_embeddings=true: gate vs add"]
    assert long_gate == [20.0, -FAILURE_SCALE * 20.0]
    counts = failures(family, accuracy, {h.name: 2 for h in family})
    assert (
        counts[trend] == 1
        and counts["short/sinusoidal/none/scale_embeddings=true: gate vs add"] == 0
    )


def _contrast_family(signs_short, signs_long, mags_short, mags_long, effect=0.0):
    """Operator deltas in two regimes and their contrast (long minus short), the deltas' noise
    flipped by the given signs around a common effect."""
    short = [effect + s * m for s, m in zip(signs_short, mags_short, strict=True)]
    long = [effect + s * m for s, m in zip(signs_long, mags_long, strict=True)]
    return {
        "short": short,
        "long": long,
        "trend": [b - a for a, b in zip(short, long, strict=True)],
    }


@pytest.mark.unit
@pytest.mark.parametrize("effect", [0.0, 3.0])
def test_the_length_contrast_in_the_closure_is_valid_by_exact_enumeration(effect):
    """Two regimes' deltas symmetric about one centre (0: every hypothesis true; 3: only the
    contrast true): over every sign pattern of the noise given its sizes, the chance of a false
    rejection in the family (closed test over 2 comparisons + the contrast) is at most alpha."""
    n, alpha = 6, 0.25
    mags_short = [1.0, 2.5, 0.5, 1.5, 3.0, 0.8]
    mags_long = [2.0, 0.7, 1.2, 3.5, 0.4, 1.1]
    kinds = {"short": "operator", "long": "operator", "trend": "length"}
    false = 0
    patterns = list(itertools.product((1.0, -1.0), repeat=n))
    for signs_short in patterns:
        for signs_long in patterns:
            rows_ = _contrast_family(signs_short, signs_long, mags_short, mags_long, effect)
            states = run_family(rows_, alpha=alpha, max_seeds=n, first=n, kinds=kinds)
            true_nulls = ["trend"] if effect else list(rows_)
            false += any(states[h][-1] in ("better", "worse") for h in true_nulls)
    assert false / len(patterns) ** 2 <= alpha


@pytest.mark.unit
def test_a_contrast_is_not_stopped_by_the_operators_heuristic_futility():
    """Values leaning neither way (e = 0.020 after 8 seeds) stop an operator comparison (its
    heuristic: below 0.3 after 8 seeds), never a contrast while its remaining seeds could still
    reach 1 / alpha (2^12 x 0.020 > 1 / 0.05)."""
    flat = [3.0, -1.0, -1.0, 1.0, 2.0, -2.0, 0.5, -0.5]
    rows_ = {"op": flat, "trend": flat}
    states = run_family(rows_, max_seeds=20, kinds={"op": "operator", "trend": "length"})
    assert states["op"][-1] == "futile" and states["trend"][-1] == "open"
    # 4 seeds left with e = 1 (2^4 = 16 < 20): no longer reachable, futile for any kind
    late = run_family({"trend": [0.0] * 16}, max_seeds=20, kinds={"trend": "length"})
    assert late["trend"][-1] == "futile"


@pytest.mark.unit
def test_fewest_seeds_for_a_bounded_interval_come_from_the_rules_ceiling():
    magnitude, sign = build_rule("magnitude"), build_rule("sign")
    # (1 + tanh 1.5)^n / 2 reaches 6 / 0.05 = 120 at n = 9; the KT sign e-value at n = 10
    assert fewest_seeds(magnitude, 6, 0.05) == 9
    assert fewest_seeds(magnitude, 12, 0.05) == 10
    assert fewest_seeds(sign, 6, 0.05) == 10
    row = [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]  # the ceiling's own path: 8 seeds short
    assert math.isinf(magnitude.interval(row, level=0.05 / 6, first=6)[0])
    assert math.isfinite(magnitude.interval([*row, 5.0], level=0.05 / 6, first=6)[0])


@pytest.mark.unit
def test_the_e_by_interval_inverts_the_last_e_value_at_alpha_r_over_m():
    rule = build_rule("magnitude")
    row = [6.0, 4.0, 7.5, 5.0, 3.0, 6.5, 5.5]
    low, high = rule.selective_interval(row, level=0.05, first=6)
    assert low < sum(row) / len(row) < high and math.isfinite(low) and math.isfinite(high)

    def last_e(mu: float) -> float:
        ev = rule.evidence([d - mu for d in row], first=6, margin=None)
        return ev.two_sided(len(row) - 1)

    assert last_e(low) >= 20 - 1e-6 and last_e(high) >= 20 - 1e-6
    assert last_e(low + 0.05) < 20 and last_e(high - 0.05) < 20
    wider = rule.selective_interval(row, level=0.05 / 6, first=6)  # R = 1 of m = 6
    assert wider[0] <= low and high <= wider[1]


@pytest.mark.unit
def test_decision_rows_bound_every_decided_hypothesis_and_say_what_disagrees():
    values = {
        "clear": [9.0, 11.0, 10.0, 12.0, 8.0, 10.5, 9.5, 11.5, 10.0],
        "skewed": [1.0, 1.5, 1.2, 0.8, 1.1, -30.0, 1.3, 0.9],
        "null": [1.0, -1.0, 0.5, -0.5, 2.0, -2.0],
    }
    evidence = family_evidence(values, max_seeds=14)
    failed = {"skewed": {"gate": (1, 8), "add": (0, 8)}, "clear": {"gate": (2, 9), "add": (1, 9)}}
    rows_ = decision_rows(evidence, "magnitude", values=values, failed=failed)
    by = {r["comparison"]: r for r in rows_}
    assert by["clear"]["state"] == "better"
    assert math.isfinite(by["clear"]["ci_low"]) and by["clear"]["ci_low"] > 0
    decided = sum(r["state"] in ("better", "worse") for r in rows_)
    assert by["clear"]["ci_level"] == pytest.approx(0.05 * decided / 3)
    assert math.isnan(by["null"]["ci_low"])  # not decided: no e-BY interval
    assert by["skewed"]["mean"] < 0 < by["skewed"]["median"]
    assert "differ in sign" in by["skewed"]["note"] and by["skewed"]["failed_runs"] == 1
    # a decided row with failures says whose runs failed and how they counted
    assert (
        by["clear"]["failed_runs"] == 3 and by["clear"]["failed_by_operator"] == "gate 2/9; add 1/9"
    )
    assert by["clear"]["note"].startswith(
        "better with failed runs counted as losses of their arm: 2 of 9 runs of gate failed; "
        "1 of 9 runs of add failed"
    )
    assert by["null"]["failed_runs"] == 0 and "failed" not in by["null"]["note"]
    text = decisions_text(rows_)
    assert "e-BY interval" in text and "differ in sign" in text


@pytest.mark.unit
def test_the_length_within_a_dataset_contrasts_its_longest_and_shortest_quarter():
    group = _group("short", "true")
    arms = [Arm(group, "add"), Arm(group, "gate")]
    (op, within) = hypotheses(arms, "add", ["short"], {}, decide=["operator", "length_within"])
    assert within.kind == "length_within" and within.verdict("better") == "grows"
    assert (
        within.name == "short:longest-shortest/sinusoidal/none/scale_embeddings=true: gate vs add"
    )
    parts = {"add": {"all": 0.8, "shortest": 0.9, "longest": 0.6}}
    parts["gate"] = {"all": 0.85, "shortest": 0.9, "longest": 0.75}

    def accuracy(arm: Arm, seed: int, part: str) -> float | None:
        return parts[arm.fusion].get(part, math.nan) if seed < 2 else math.nan

    values = rows([op, within], lambda a, s: True, accuracy, max_seeds=4)
    # (75 - 60) - (90 - 90) = 15 on both seeds; a run without its quarters ends the row
    assert values[within.name] == [15.0, 15.0] and values[op.name] == [5.0, 5.0]


@pytest.mark.unit
def test_the_quarters_are_the_shortest_and_longest_length_buckets_of_the_test_split():
    lengths = [10, 20, 30, 40, 50, 60, 70, 80]
    correct = [1, 1, 0, 0, 0, 0, 1, 0]
    assert list(bucket_edges(lengths)) == [30, 50, 70]  # quartiles: 2 documents a bucket
    assert quarter_metrics(lengths, correct) == {
        "test_correct_shortest": 2,
        "test_total_shortest": 2,
        "test_correct_longest": 1,
        "test_total_longest": 2,
    }
    assert quarter_accuracy(quarter_metrics(lengths, correct)) == {"shortest": 1.0, "longest": 0.5}
    # every document of one length: one bucket, shortest and longest are the same documents
    same = quarter_metrics([5] * 6, [1, 0, 1, 0, 1, 1])
    assert same["test_total_shortest"] == same["test_total_longest"] == 6


@pytest.mark.unit
def test_a_slash_in_a_name_keeps_every_hypothesis_name_whole():
    """A dataset named ``lab/short`` and a setting value holding ``/``: each slot of the group
    is named as it is, none dropped or cut at the ``/``."""
    from fusion_ray.decide.questions import operator_hypothesis, within_hypothesis

    group = (
        ("dataset", "lab/short"),
        ("position", "sinusoidal"),
        ("attention_position", "none"),
        ("data.tokenizer", "bpe/v2"),
    )
    within = within_hypothesis(group, "gate_scalar", "add")
    assert within.name == (
        "lab/short:longest-shortest/sinusoidal/none/tokenizer=bpe/v2: gate_scalar vs add"
    )
    plain = operator_hypothesis(group, "gate_scalar", "add")
    assert plain.name == "lab/short/sinusoidal/none/tokenizer=bpe/v2: gate_scalar vs add"


@pytest.mark.unit
def test_a_failure_is_a_loss_for_its_side_a_gain_for_the_other_and_a_tie_when_both_fail():
    from fusion_ray.decide.questions import failure_value

    before = [3.0, -4.0]  # RMS sqrt(12.5)
    c = FAILURE_SCALE * math.sqrt(12.5)
    assert failure_value([1], before) == pytest.approx(-c)  # the operator's run failed
    assert failure_value([-1], before) == pytest.approx(c)  # the baseline's
    assert failure_value([1, -1], before) == 0.0  # both
    assert failure_value([1, 1], before) == pytest.approx(-c)  # two runs of the positive side
    assert failure_value([1], []) == 0.0  # nothing to scale by yet: a tie


@pytest.mark.unit
def test_the_failure_rule_keeps_the_null_symmetric_exactly_by_enumeration():
    """Brute force over every arm swap of a small family: on 4 seeds of one operator comparison
    with failures anywhere, swapping the two runs of any set of seeds (with their failures)
    gives the values negated at those seeds and unchanged elsewhere, so every sign pattern is
    as likely as its mirror: the null's symmetry given the past holds whatever fails."""
    family = hypotheses([Arm((("dataset", "d"),), "op"), Arm((("dataset", "d"),), "add")], "add",
                        ["d"], {})  # fmt: skip
    (h,) = [h for h in family if h.kind == "operator"]
    base = {0: (0.80, 0.70), 1: (None, 0.75), 2: (0.60, None), 3: (None, None), 4: (0.9, 0.5)}
    for swaps in itertools.product([False, True], repeat=len(base)):
        runs = {
            seed: (b, a) if swap else (a, b)
            for (seed, (a, b)), swap in zip(base.items(), swaps, strict=True)
        }

        def accuracy(arm: Arm, seed: int, part: str, runs=runs) -> float | None:
            return runs[seed][0 if arm.fusion == "op" else 1]

        values = rows(family, lambda arm, seed: seed < len(base), accuracy, len(base))[h.name]
        plain = rows(family, lambda arm, seed: seed < len(base),
                     lambda arm, seed, part: base[seed][0 if arm.fusion == "op" else 1],
                     len(base))[h.name]  # fmt: skip
        # the scale comes from the magnitudes of earlier completed values, which swaps keep
        expected = [-v if swap else v for v, swap in zip(plain, swaps, strict=True)]
        assert values == pytest.approx(expected), swaps
