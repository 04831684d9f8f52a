"""The adaptive-seeds decisions (fusion_ray.decide: sequential and rules): the sign rule's exact
validity by enumeration of every sign sequence, known values, futility and equivalence; the
magnitude rule's closed test against a brute force over every intersection; persistence and
determinism for every registered rule (the contract itself is in fusion_ray.testing)."""

from __future__ import annotations

import itertools
import math

import pytest

from fusion_ray.decide.rules import RULES, MagnitudeRule
from fusion_ray.decide.sequential import (
    confidence_sequence,
    decisions,
    family_evidence,
    log_e,
    run_family,
    sign_e_values,
)

RULE_NAMES = RULES.names()


@pytest.mark.unit
def test_the_e_process_is_the_product_of_the_kt_predictive_bets():
    deltas = [1.0, -2.0, 0.5, None, 0.0, 3.0, 1.5, -0.5, 2.0]
    wins = n = 0
    wealth, expected = 1.0, []
    for d in deltas:
        if d is not None and d != 0:
            p_win = (wins + 0.5) / (n + 1)  # KT's predictive probability of a win
            wealth *= 2 * (p_win if d > 0 else 1 - p_win)
            n += 1
            wins += d > 0
        expected.append(wealth)
    assert sign_e_values(deltas) == pytest.approx(expected, rel=1e-12)


@pytest.mark.unit
def test_known_values_with_every_seed_won():
    assert [round(math.exp(log_e(n, n)), 1) for n in (8, 9, 10)] == [50.3, 95.0, 180.4]


@pytest.mark.unit
@pytest.mark.parametrize("n", range(1, 13))
def test_the_chance_of_ever_crossing_one_over_alpha_is_at_most_alpha(n):
    """Exactly, over every sequence of n fair signs: P(sup_t E_t >= 1/a) <= a (Ville)."""
    for alpha in (0.05, 0.1, 0.2):
        crossing = sum(
            max(sign_e_values(signs)) >= 1 / alpha
            for signs in itertools.product((1.0, -1.0), repeat=n)
        )
        assert crossing / 2**n <= alpha


@pytest.mark.unit
def test_run_family_rejects_with_probability_at_most_alpha_for_one_comparison():
    n, alpha = 12, 0.05
    rejected = 0
    for signs in itertools.product((1.0, -1.0), repeat=n):
        states = run_family({"c": list(signs)}, alpha=alpha, max_seeds=n, rule="sign")["c"]
        rejected += states[-1] in ("better", "worse")
    assert rejected / 2**n <= alpha


@pytest.mark.unit
def test_holm_over_two_independent_comparisons_keeps_the_family_wise_error():
    n, alpha = 7, 0.2
    sequences = list(itertools.product((1.0, -1.0), repeat=n))
    any_rejected = 0
    for a, b in itertools.product(sequences, repeat=2):
        states = run_family({"a": list(a), "b": list(b)}, alpha=alpha, max_seeds=n, rule="sign")
        any_rejected += any(s[-1] in ("better", "worse") for s in states.values())
    assert any_rejected / len(sequences) ** 2 <= alpha


@pytest.mark.unit
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_rejections_never_unhappen_as_seeds_are_added(rule):
    full = {"up": [2.0] * 12, "noise": [1.0, -1.0] * 6, "down": [-1.0] * 11 + [2.0]}
    previous = None
    for k in range(1, 13):
        states = run_family({name: row[:k] for name, row in full.items()}, max_seeds=20, rule=rule)
        last = {name: s[-1] for name, s in states.items()}
        if previous is not None:
            for name, state in previous.items():
                if state in ("better", "worse"):
                    assert last[name] == state
        previous = last
    assert previous["up"] == "better" and previous["down"] == "worse"


@pytest.mark.unit
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_decided_states_persist_along_a_comparison(rule):
    states = run_family({"a": [1.0] * 15, "b": [-1.0, 1.0] * 7}, max_seeds=15, rule=rule)
    for row in states.values():
        first = next((i for i, s in enumerate(row) if s != "open"), len(row))
        assert all(s != "open" for s in row[first:])
        assert len({s for s in row[first:]}) == 1


@pytest.mark.unit
def test_missing_pairs_and_zeros_carry_no_sign():
    with_gaps = [1.0, None, 0.0, 1.0, None, 1.0]
    assert sign_e_values(with_gaps)[-1] == pytest.approx(math.exp(log_e(3, 3)))
    ev = family_evidence({"c": with_gaps}, rule="sign")["c"]
    assert [(lk.n_used, lk.wins, lk.losses) for lk in ev][-1] == (4, 3, 0)


@pytest.mark.unit
def test_an_undecided_comparison_at_the_cap_stays_open():
    # six wins (E 14.4) could still reach 1/alpha = 20 with a seventh (26.8): open until the
    # cap; the seventh is lost, and at the cap the comparison is undecided, not futile
    states = run_family({"c": [1.0] * 6 + [-1.0]}, max_seeds=7, rule="sign")["c"]
    assert states == ["open"] * 7
    assert (
        run_family({"c": [1.0] * 6}, max_seeds=6, rule="sign")["c"] == ["futile"] * 6
    )  # 6 seeds: E <= 14.4


@pytest.mark.unit
def test_futility_fires_only_when_the_cap_makes_rejection_impossible():
    alpha, cap = 0.05, 10
    for row in itertools.product((1.0, -1.0), repeat=6):
        states = run_family({"c": list(row)}, alpha=alpha, max_seeds=cap, rule="sign")["c"]
        for seed, state in enumerate(states):
            wins = sum(d > 0 for d in row[: seed + 1])
            losses = seed + 1 - wins
            remaining = cap - seed - 1
            best = max(log_e(wins + remaining, cap), log_e(losses + remaining, cap))
            reached = max(math.log(e) for e in sign_e_values(row[: seed + 1]))
            possible = max(best, reached) >= math.log(1 / alpha)
            if state == "futile":
                assert not possible
            if not possible and state == "open":
                pytest.fail(f"{row[: seed + 1]} cannot be rejected by seed {cap} but is open")


@pytest.mark.unit
def test_equivalence_when_the_confidence_sequence_lies_inside_the_margin():
    tight = [0.3, -0.2, 0.1, -0.4, 0.2, -0.1, 0.3, -0.3, 0.1, -0.2, 0.2, -0.1]
    states = run_family({"c": tight}, margin=1.0, max_seeds=20, rule="sign")["c"]
    assert states[-1] == "equivalent"
    assert run_family({"c": tight}, max_seeds=20, rule="sign")["c"][-1] in ("open", "futile")
    low, high = confidence_sequence(tight, 0.05)
    assert -1.0 <= low < high <= 1.0


@pytest.mark.unit
def test_the_confidence_sequence_covers_the_median_and_only_shrinks():
    row = [2.0, 1.0, 3.0, -1.0, 2.5, 1.5, 2.0, 0.5, 3.5, 1.0]
    intervals = [confidence_sequence(row[:k], 0.05) for k in range(1, len(row) + 1)]
    for (lo1, hi1), (lo2, hi2) in itertools.pairwise(intervals):
        assert lo2 >= lo1 and hi2 <= hi1
    assert intervals[-1][0] < 1.75 < intervals[-1][1]


@pytest.mark.unit
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_the_same_deltas_give_the_same_states_and_summaries(rule):
    deltas = {"a": [2.0, 1.0, None, 3.0] * 3, "b": [0.5, -0.5, 0.0] * 4}
    first = family_evidence(deltas, margin=1.0, max_seeds=20, rule=rule)
    again = family_evidence(
        dict(reversed(list(deltas.items()))), margin=1.0, max_seeds=20, rule=rule
    )
    assert first == again  # a restarted driver reading the runs back in another order
    summary = {d.name: (d.state, d.seeds_used, d.decided_at) for d in decisions(first)}
    assert summary["a"][1] == 12


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 1.5}, "alpha must be in"),
        ({"margin": -1.0}, "margin must be a positive"),
        ({"max_seeds": 2}, "more than max_seeds 2"),
    ],
)
def test_bad_inputs_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_family({"c": [1.0, 2.0, 3.0]}, **kwargs)
    with pytest.raises(ValueError, match="finite"):
        run_family({"c": [1.0, math.nan]})


@pytest.mark.unit
def test_a_replay_stops_each_comparison_where_the_schedule_would():
    from fusion_ray.decide.sequential import replay_adaptive

    logged = {"clear": [2.0] * 20, "null": [1.0, -1.0] * 10, "late": [-1.0] * 4 + [1.0] * 16}
    states = replay_adaptive(logged, first=6, max_seeds=20, rule="sign")
    assert (
        states["clear"][-1] == "better" and len(states["clear"]) == 9
    )  # Holm over 3: E_9 95 >= 60
    assert states["null"][-1] == "futile" and len(states["null"]) < 20
    assert all(len(s) >= 6 for s in states.values())
    again = run_family(
        {k: logged[k][: len(v)] for k, v in states.items()}, max_seeds=20, rule="sign"
    )
    assert again == states  # the same rule on the seeds it used


# ----------------------------------------------------------------------------- magnitude


@pytest.mark.unit
def test_the_magnitude_bets_are_the_product_of_tanh_factors():
    """Six equal deltas: scale 1 at the first wave, each factor 1 + tanh(1.5) and 1 - tanh(1.5);
    a seventh of 2.0 is bet at the scale sqrt((6 + 4) / 7) that includes its own magnitude."""
    ev = MagnitudeRule().evidence([1.0] * 6 + [2.0], first=6, margin=None)
    up, down = 1 + math.tanh(1.5), 1 - math.tanh(1.5)
    assert ev.better[:5] == (1.0,) * 5  # nothing before the first wave is complete
    assert ev.better[5] == pytest.approx(up**6) and ev.worse[5] == pytest.approx(down**6)
    step = math.tanh(1.5 * 2.0 / math.sqrt(10 / 7))
    assert ev.better[6] == pytest.approx(up**6 * (1 + step))
    assert run_family({"c": [1.0] * 6}, max_seeds=20)["c"][-1] == "better"  # E_6 = 23.8 >= 20


@pytest.mark.unit
@pytest.mark.parametrize("n", [6, 9, 12])
@pytest.mark.parametrize(
    "magnitudes",
    [[1.0] * 12, [0.1, 3.0, 0.5, 2.0, 0.2, 1.0, 4.0, 0.3, 0.7, 1.5, 0.05, 2.5], list(range(1, 13))],
)
def test_the_magnitude_rule_crosses_one_over_alpha_with_probability_at_most_alpha(n, magnitudes):
    """Exactly, over every sign vector given the magnitudes: P(sup_t E_t >= 1/a) <= a."""
    rule = MagnitudeRule()
    for alpha in (0.05, 0.2):
        crossing = 0
        for signs in itertools.product((1.0, -1.0), repeat=n):
            ev = rule.evidence(
                [s * a for s, a in zip(signs, magnitudes, strict=False)], first=6, margin=None
            )
            crossing += max(ev.two_sided(t) for t in range(n)) >= 1 / alpha
        assert crossing / 2**n <= alpha


def _brute_force_closure(e: list[float], q: list[float] | None, i: int, kind: str) -> float:
    """1 / the smallest mean of current e-values over every intersection that holds comparison
    i's hypothesis (``kind`` "H" or "K") and at most one hypothesis of each other comparison."""
    m = len(e)
    options = [[None, "H"] + (["K"] if q is not None else []) for _ in range(m)]
    options[i] = [kind]
    worst = math.inf
    for choice in itertools.product(*options):
        values = [e[j] if c == "H" else q[j] for j, c in enumerate(choice) if c is not None]
        worst = min(worst, sum(values) / len(values))
    return min(1.0, 1.0 / worst)


@pytest.mark.unit
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_the_closed_test_shortcut_equals_a_brute_force_over_every_intersection(m):
    from fusion_ray.decide.sequential import closure_p

    rng = __import__("random").Random(m)
    for _ in range(200):
        e = [rng.choice([0.01, 0.5, 1.0, 3.0, 15.0, 40.0, 200.0]) * rng.random() for _ in range(m)]
        q = [rng.choice([0.1, 1.0, 30.0, 90.0]) * rng.random() for _ in range(m)]
        for i in range(m):
            floor = [min(e[j], q[j]) for j in range(m) if j != i]
            assert closure_p(e[i], floor) == pytest.approx(_brute_force_closure(e, q, i, "H"))
            assert closure_p(q[i], floor) == pytest.approx(_brute_force_closure(e, q, i, "K"))
            plain = [e[j] for j in range(m) if j != i]
            assert closure_p(e[i], plain) == pytest.approx(_brute_force_closure(e, None, i, "H"))


@pytest.mark.unit
def test_an_undecided_comparison_always_has_zero_in_its_confidence_sequence():
    """Zero leaves the magnitude rule's sequence (at alpha / m) only when E >= m / alpha, where the
    closed test rejects too: no 'open' beside an interval that excludes zero."""
    rng = __import__("random").Random(7)
    for _ in range(40):
        deltas = {
            name: [rng.gauss(mu, 1.0) for _ in range(rng.randint(6, 14))]
            for name, mu in zip("abcd", (0.0, 0.4, 0.8, -0.6), strict=True)
        }
        evidence = family_evidence(deltas, max_seeds=14)
        for looks in evidence.values():
            last = looks[-1]
            if last.state in ("open", "futile"):
                assert last.cs_low < 0 < last.cs_high, last


@pytest.mark.unit
def test_equivalence_within_the_margin_and_only_with_one():
    tight = [0.3, -0.2, 0.1, -0.4, 0.2, -0.1, 0.3, -0.3, 0.1, -0.2, 0.2, -0.1]
    states = run_family({"c": tight}, margin=1.0, max_seeds=20)["c"]
    assert states[-1] == "equivalent"
    assert "equivalent" not in run_family({"c": tight}, max_seeds=20)["c"]
    far = [2.0 + d for d in tight]  # centred at +2: never equivalent within 1
    assert run_family({"c": far}, margin=1.0, max_seeds=20)["c"][-1] == "better"


@pytest.mark.unit
def test_the_magnitude_rule_uses_the_sizes_the_sign_rule_ignores():
    """Eleven wins of 14 with large wins and small losses: decided by the magnitudes, open for
    the sign rule (which needs more wins than that under Holm over two comparisons)."""
    row = [8.0, 12.0, -1.0, 15.0, 9.0, 11.0, -0.5, 14.0, 10.0, 13.0, -1.5, 12.0, 9.0, 16.0]
    family = {"a": row, "b": [-d for d in row]}
    assert {s[-1] for s in run_family(family, max_seeds=14).values()} == {"better", "worse"}
    assert run_family(family, max_seeds=14, rule="sign")["a"][-1] in ("open", "futile")


@pytest.mark.process
def test_the_shipped_replay_runs_without_a_store_and_the_default_rule_agrees_with_fixed_20():
    """bench/adaptive.py --replay on the quickstart's 20 logged seeds (a CSV in the repository):
    the magnitude rule at the quickstart's cap reaches every conclusion of 20 fixed seeds with
    exact Wilcoxon + Holm, with fewer comparison-seeds than the sign rule."""
    import subprocess
    import sys

    from tests.conftest import ROOT as root

    proc = subprocess.run(
        [sys.executable, str(root / "bench" / "adaptive.py"), "--replay", "--caps", "14"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    blocks = proc.stdout.split("  cap 14, rule ")
    seeds = {}
    for block in blocks[1:]:
        rule = block.split(":", 1)[0]
        line = next(x for x in block.splitlines() if "comparison-seeds" in x)
        seeds[rule] = int(line.split("comparison-seeds ")[1].split()[0])
        if rule == "magnitude":
            assert "agrees with fixed-20 on 6 of 6" in line
    assert seeds["magnitude"] < seeds["sign"]


@pytest.mark.unit
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_a_result_arriving_late_never_undoes_a_decision(rule):
    """In a running sweep rows grow at different paces (a comparison's next result is still on
    its way): a decision taken on the rows so far stays taken when any later result arrives."""
    rng = __import__("random").Random(11)
    for _ in range(150):
        rows = {
            str(i): [rng.gauss(mu, 1.0) for _ in range(rng.randint(6, 12))]
            for i, mu in enumerate(rng.sample([0.0, 0.0, 0.8, 1.5, -1.2, 2.5], 4))
        }
        before = run_family(rows, max_seeds=14, rule=rule)
        for name, states in before.items():
            if states[-1] != "open" or len(states) >= 14:
                continue  # stopped: it gets no more results
            grown = {**rows, name: [*rows[name], rng.gauss(0.0, 3.0)]}
            after = run_family(grown, max_seeds=14, rule=rule)
            for other, was in before.items():
                if was[-1] in ("better", "worse", "equivalent"):
                    assert after[other][-1] == was[-1], (rows, name, other)
