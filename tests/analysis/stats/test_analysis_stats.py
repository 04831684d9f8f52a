"""Golden and property tests of analysis.stats (pure statistics, no MLflow)."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.stats import (
    StatsSettings,
    describe_deltas,
    finish_family,
    hl_interval_method,
    hodges_lehmann,
    holm,
    holm_min_attainable_p,
    integer_deltas,
    method_lines,
    min_attainable_p,
    seeds_needed,
    settings_record,
    sign_test,
    signed_rank_null_cdf,
    summary_cells,
    wilcoxon_signed_rank,
)

pytestmark = pytest.mark.unit

# Hollander & Wolfe (1973), p. 29; the paired example of R's ?wilcox.test
HW_X = np.array([1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30])
HW_Y = np.array([0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29])
# Darwin's Zea mays: cross- minus self-fertilised heights (eighths of an inch)
DARWIN = np.array([6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75])


def test_golden_hollander_wolfe_one_sided_matches_r():
    # R: wilcox.test(x, y, paired = TRUE, alternative = "greater") -> V = 40, p-value = 0.01953
    res = wilcoxon_signed_rank(HW_X - HW_Y, alternative="greater")
    assert res.statistic == 40
    assert res.pvalue == pytest.approx(0.01953, abs=5e-6)
    assert res.method == "exact"
    # two-sided is twice the one-sided tail here
    assert wilcoxon_signed_rank(HW_X - HW_Y).pvalue == pytest.approx(0.0390625)


def test_golden_hollander_wolfe_hodges_lehmann_estimate_matches_r():
    # R: wilcox.test(x, y, paired = TRUE, conf.int = TRUE) -> (pseudo)median 0.46
    hl = hodges_lehmann(HW_X - HW_Y)
    assert hl.estimate == pytest.approx(0.46)


def test_golden_darwin_two_sided_exact():
    # R: wilcox.test(d) -> V = 96, p-value = 0.04126 (exact); scipy's docs give 0.0413
    res = wilcoxon_signed_rank(DARWIN)
    assert res.statistic == 96
    assert res.pvalue == pytest.approx(0.04126, abs=5e-6)
    assert res.method == "exact"
    assert res.rank_biserial == pytest.approx((96 - 24) / 120)


def test_null_cdf_matches_brute_force_enumeration():
    for n in range(1, 9):
        counts = np.zeros(n * (n + 1) // 2 + 1)
        for signs in itertools.product((0, 1), repeat=n):
            counts[sum(r for r, s in zip(range(1, n + 1), signs, strict=True) if s)] += 1
        np.testing.assert_allclose(signed_rank_null_cdf(n), np.cumsum(counts) / 2**n)


@pytest.mark.parametrize("d", [HW_X - HW_Y, DARWIN.astype(float), np.arange(1, 7) * 1.5 - 2])
def test_hodges_lehmann_interval_inverts_the_exact_test(d):
    """The exact HL interval is the set of shifts the exact two-sided test does not reject."""
    hl = hodges_lehmann(d, 0.95)
    walsh = np.sort([(a + b) / 2 for a, b in itertools.combinations_with_replacement(d, 2)])
    eps = 1e-7 * (np.abs(walsh).max() + 1)
    gaps = np.diff(np.unique(walsh)).min()
    assert eps < gaps / 4

    def p_at(theta):
        return stats.wilcoxon(d - theta, method="exact").pvalue

    achieved_alpha = 1 - hl.confidence
    assert achieved_alpha <= 0.05 + 1e-12 or len(d) <= 5
    assert p_at(hl.low - eps) <= achieved_alpha + 1e-12  # just outside: rejected
    assert p_at(hl.low + eps) > achieved_alpha  # just inside: kept
    assert p_at(hl.high + eps) <= achieved_alpha + 1e-12
    assert p_at(hl.high - eps) > achieved_alpha


def test_hodges_lehmann_small_n_reports_achieved_level():
    hl = hodges_lehmann([1.0, 2.0, 3.0, 4.0, 5.0], 0.95)
    assert (hl.low, hl.high) == (1.0, 5.0)
    assert hl.confidence == pytest.approx(1 - 2 / 32)


@pytest.mark.parametrize("zero_method", ["wilcox", "pratt", "zsplit"])
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_ties_and_zeros_use_exact_conditional_distribution(zero_method, alternative):
    """With ties/zeros the p-value equals scipy's full permutation enumeration."""
    rng = np.random.default_rng(7)
    for _ in range(4):
        d = rng.integers(-3, 5, size=int(rng.integers(4, 10)))
        if not d.any():
            continue
        ours = wilcoxon_signed_rank(d, alternative, zero_method)
        ref = stats.wilcoxon(
            d,
            alternative=alternative,
            zero_method=zero_method,
            method=stats.PermutationMethod(n_resamples=10_000),
        )
        assert ours.pvalue == pytest.approx(ref.pvalue, abs=1e-12), d
        has_ties_or_zeros = (d == 0).any() or len(set(np.abs(d[d != 0]))) < (d != 0).sum()
        if has_ties_or_zeros:
            assert ours.method.startswith("exact conditional")


def test_zero_policy_wilcox_drops_zeros():
    res = wilcoxon_signed_rank([0, 0, 1, 2, 3, 4, 5])
    assert res.n_zeros == 2
    assert res.pvalue == pytest.approx(0.0625)  # = exact test on the 5 non-zero deltas
    assert "2 zero(s) dropped" in res.method
    all_zero = wilcoxon_signed_rank([0, 0, 0])
    assert all_zero.pvalue == 1.0 and all_zero.method.startswith("none")


def test_integer_deltas_keep_ties_exact():
    # accuracies whose float differences are not equal although the counts differ equally
    correct = np.array([301, 702, 1103])
    base = np.array([300, 701, 1102])
    total = np.array([3000, 3000, 3000])
    float_d = correct / total - base / total
    assert len(set(float_d)) > 1  # round-off breaks the tie in floating point
    num, denom = integer_deltas(correct, base, total)
    assert list(num) == [1, 1, 1] and denom == 3000
    # different test-set sizes go over their least common multiple
    num, denom = integer_deltas([3, 5], [2, 3], [4, 6])
    assert denom == 12 and list(num) == [3, 4]


def test_holm_matches_statsmodels_holm_not_its_default():
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2])
    ours = holm(p)
    np.testing.assert_allclose(ours, multipletests(p, method="holm")[1])
    # Holm by hand: sorted p times (m, m-1, ...), running max, capped at 1
    order = np.argsort(p)
    manual = np.minimum(1, np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)))
    np.testing.assert_allclose(ours[order], manual)
    assert not np.allclose(ours, multipletests(p)[1])  # default 'hs' is Holm-Sidak


def test_holm_equals_statsmodels_on_ties_nans_and_random_families(monkeypatch):
    # multipletests runs gc.collect() at every call (why holm is ours), which changes no value:
    # a no-op here keeps 254 calls from costing minutes in a worker holding many tests' objects
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = np.random.default_rng(7)
    families = [
        np.array([0.02, 0.02, 0.02, 0.5]),  # ties
        np.array([0.4, np.nan, 0.001, 0.3]),  # a comparison without a p-value
        np.array([0.9]),
        np.array([0.3, 0.6, 0.8]),  # m * p above 1: capped
        *(rng.uniform(0, 0.2, size=rng.integers(2, 40)) for _ in range(200)),
        *(rng.choice([0.001, 0.01, 0.05, 0.2], size=12) for _ in range(50)),  # many ties
    ]
    for p in families:
        np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1], rtol=0, atol=0)
    assert holm([]).size == 0


def test_guard_five_seeds_cannot_reach_005():
    assert min_attainable_p(5) == 0.0625
    assert min_attainable_p(5, "greater") == 1 / 32
    assert seeds_needed(0.05) == 6
    assert seeds_needed(0.05, alternative="greater") == 5
    assert seeds_needed(0.05, m=4) == 8  # 4 * 2 / 2^n <= 0.05
    table = pd.DataFrame([describe_deltas(np.array([3, 4, 5, 6, 7]), 100, StatsSettings(), "only")])
    warns = finish_family(table, StatsSettings(), "test family")
    assert table.loc[0, "p_wilcoxon"] == pytest.approx(0.0625)
    assert not table.loc[0, "can_reach_alpha"] and table.loc[0, "seeds_needed"] == 6
    guard = [w for w in warns if "cannot reach" in w]
    assert guard and "0.0625" in guard[0] and "6 for a single comparison" in guard[0]
    assert any("under-cover" in w for w in warns)


def test_guard_accounts_for_holm():
    rows = [describe_deltas(np.arange(1, 7), 100, StatsSettings(), str(i)) for i in range(3)]
    table = pd.DataFrame(rows)
    warns = finish_family(table, StatsSettings(), "three")
    # 6 seeds: 2/64 = 0.03125 alone, 3 * 0.03125 = 0.094 after Holm over 3
    assert table["min_attainable_p_holm"].iloc[0] == pytest.approx(3 * 0.03125)
    assert table["p_holm"].iloc[0] == pytest.approx(3 * 0.03125)
    assert "7 with Holm over m = 3" in " ".join(warns)


def _smallest_p_over_signs(d: np.ndarray, alternative: str, zero_method: str) -> float:
    """The smallest signed-rank p-value over every sign pattern of the non-zero deltas."""
    mags = np.abs(d[d != 0])
    zeros = np.zeros(int((d == 0).sum()), dtype=d.dtype)
    return min(
        wilcoxon_signed_rank(
            np.concatenate([mags * np.array(signs), zeros]), alternative, zero_method
        ).pvalue
        for signs in itertools.product((1, -1), repeat=len(mags))
    )


@pytest.mark.parametrize("zero_method", ["wilcox", "pratt", "zsplit"])
@pytest.mark.parametrize("alternative", ["two-sided", "greater"])
def test_guard_floor_counts_only_non_zero_deltas(zero_method, alternative):
    """Three zero deltas add pairs but no signs: the floor is the one of 5 pairs, not of 8."""
    d = np.array([1, 2, 3, 4, 5, 0, 0, 0])
    settings = StatsSettings(alternative=alternative, zero_method=zero_method)
    floor = 2 / 2**5 if alternative == "two-sided" else 1 / 2**5
    # the floor is what the test itself reaches at the most extreme data, and never less
    assert _smallest_p_over_signs(d, alternative, zero_method) == pytest.approx(floor)
    ref = stats.wilcoxon(
        d,
        alternative=alternative,
        zero_method=zero_method,
        method=stats.PermutationMethod(n_resamples=10_000),
    )
    assert ref.pvalue == pytest.approx(floor)

    table = pd.DataFrame([describe_deltas(d, 100, settings, "zeros")])
    warns = finish_family(table, settings, "zeros family")
    row = table.loc[0]
    assert (row["n_pairs"], row["n_nonzero"], row["n_zeros"]) == (8, 5, 3)
    assert row["min_attainable_p"] == pytest.approx(floor)
    assert row["p_wilcoxon"] == pytest.approx(floor)  # all positive: the floor is reached
    assert row["min_attainable_p_holm"] == pytest.approx(floor)  # m = 1
    reachable = floor <= 0.05
    assert bool(row["can_reach_alpha"]) is reachable
    guard = [w for w in warns if "cannot reach" in w]
    if alternative == "two-sided":
        assert not reachable and guard and "n = 5: 0.0625" in guard[0]
        assert "6 for a single comparison" in guard[0]
    else:
        assert reachable and not guard


def test_guard_floor_without_zeros_is_two_over_two_to_the_n():
    d = np.arange(1, 9)
    assert min_attainable_p(8) == 2 / 2**8
    assert stats.wilcoxon(d, method="exact").pvalue == pytest.approx(2 / 2**8)
    assert _smallest_p_over_signs(d, "two-sided", "wilcox") == pytest.approx(2 / 2**8)
    table = pd.DataFrame([describe_deltas(d, 100, StatsSettings(), "no zeros")])
    warns = finish_family(table, StatsSettings(), "no zeros")
    assert table.loc[0, "n_nonzero"] == 8
    assert table.loc[0, "min_attainable_p"] == pytest.approx(2 / 2**8)
    assert table.loc[0, "can_reach_alpha"]
    assert not [w for w in warns if "cannot reach" in w]


def test_holm_floor_is_the_smallest_adjusted_p_any_data_can_give():
    """Brute force over every attainable p-value of three comparisons whose floors differ
    because of zero deltas: the Holm floor is exactly the least adjusted p each can reach."""
    bases = [np.array([1, 2, 3, 4, 5, 6, 0, 0]), np.array([1, 2, 3, 4, 0]), np.arange(1, 6)]
    attainable = []
    for d in bases:
        mags, zeros = d[d != 0], d[d == 0]
        attainable.append(
            sorted(
                {
                    wilcoxon_signed_rank(np.concatenate([mags * np.array(signs), zeros])).pvalue
                    for signs in itertools.product((1, -1), repeat=len(mags))
                }
            )
        )
    floors = np.array([min_attainable_p(int(np.count_nonzero(d))) for d in bases])
    np.testing.assert_allclose(floors, [p[0] for p in attainable])
    combos = np.array(list(itertools.product(*attainable)))  # one family per row
    # Holm step-down per row, vectorised (statsmodels' multipletests takes ~50 ms a call)
    order = np.argsort(combos, axis=1, kind="stable")
    steps = np.take_along_axis(combos, order, axis=1) * np.arange(3, 0, -1)
    adjusted = np.empty_like(combos)
    np.put_along_axis(
        adjusted, order, np.minimum(1.0, np.maximum.accumulate(steps, axis=1)), axis=1
    )
    for row in (0, len(combos) // 2, len(combos) - 1):
        np.testing.assert_allclose(adjusted[row], holm(combos[row]))
    brute = adjusted.min(axis=0)
    ours = holm_min_attainable_p(floors)
    np.testing.assert_allclose(ours, brute)
    np.testing.assert_allclose(ours, [3 * 2 / 64, 2 / 16, 2 / 16])
    # m times the own floor would overstate the two comparisons with fewer non-zero deltas
    assert (ours < 3 * floors).sum() == 2
    # equal floors: Holm's floor is m times the floor
    np.testing.assert_allclose(holm_min_attainable_p([0.0625] * 4), [0.25] * 4)


def test_guard_in_a_family_names_the_comparison_with_zeros():
    s = StatsSettings()
    rows = [
        describe_deltas(np.arange(1, 9), 100, s, "eight"),
        describe_deltas(np.array([1, 2, 3, 4, 5, 6, 7, 0]), 100, s, "seven"),
        describe_deltas(np.array([1, 2, 3, 4, 5, 0, 0, 0]), 100, s, "five"),
    ]
    table = pd.DataFrame(rows)
    warns = finish_family(table, s, "mixed")
    assert list(table["n_nonzero"]) == [8, 7, 5]
    # floors 2/256, 2/128, 2/32; Holm floors 3 * 2/256, 2 * 2/128, 2/32
    np.testing.assert_allclose(table["min_attainable_p_holm"], [6 / 256, 4 / 128, 2 / 32])
    assert list(table["can_reach_alpha"]) == [True, True, False]
    guard = [w for w in warns if "cannot reach" in w]
    assert len(guard) == 1 and "1 of 3" in guard[0]
    assert "n = 5: 0.0625 (0.0625 after Holm)" in guard[0]
    assert any("n_nonzero" in w for w in warns if "zero deltas" in w)


@pytest.mark.parametrize(
    ("d", "expected"),
    [
        ([1, 2, 3, 4, 5, 6], "exact"),
        ([-3, 1, 2, 4, 5, 7], "exact"),
        ([1, 2, 2, 4, 5, 6], "approximate"),  # tied delta
        ([1, -2, 2, 4, 5, 6], "approximate"),  # tied |delta|
        ([0, 1, 2, 3, 4, 5], "approximate"),  # a zero
    ],
)
def test_hodges_lehmann_interval_is_exact_only_without_ties_and_zeros(d, expected):
    assert hl_interval_method(d) == expected
    assert hodges_lehmann(np.asarray(d, dtype=float)).method == expected
    out = describe_deltas(np.asarray(d), 100, StatsSettings(), "hl")
    assert out["hl_ci_method"] == expected


def test_hodges_lehmann_label_reaches_the_table_and_the_warnings():
    s = StatsSettings()
    table = pd.DataFrame(
        [
            describe_deltas(np.arange(1, 7), 100, s, "distinct"),
            describe_deltas(np.array([1, 2, 2, 3, 4, 5]), 100, s, "tied"),
            describe_deltas(np.array([0, 1, 2, 3, 4, 5]), 100, s, "zero"),
        ]
    )
    warns = finish_family(table, s, "hl family")
    assert list(table["hl_ci_method"]) == ["exact", "approximate", "approximate"]
    assert any("2 Hodges-Lehmann interval(s) are approximate" in w for w in warns)
    record = settings_record(s, len(table))
    cells = [summary_cells(r, record)["HL [95% CI]"] for _, r in table.iterrows()]
    assert not cells[0].endswith("(approx.)")
    assert cells[1].endswith("(approx.)") and cells[2].endswith("(approx.)")
    hl_line = next(line for line in method_lines(record) if "Hodges-Lehmann" in line)
    assert "hl_ci_method" in hl_line and "no tied |delta|" in hl_line


def test_describe_deltas_effect_sizes_and_sign_test():
    s = StatsSettings()
    num = np.array([2, 4, -1, 3, 0, 5])
    out = describe_deltas(num, 200, s, "k")
    pp = 100 * num / 200
    assert out["mean_delta"] == pytest.approx(pp.mean())
    assert out["d_z"] == pytest.approx(pp.mean() / pp.std(ddof=1))
    assert (out["wins"], out["losses"], out["ties"]) == (4, 1, 1)
    assert out["sign_p"] == pytest.approx(stats.binomtest(4, 5).pvalue)
    # rank-biserial from the ranks of the non-zero deltas (zeros dropped): 1 2 3 4 5
    assert out["rank_biserial"] == pytest.approx((14 - 1) / 15)
    assert out["ci_low"] < out["mean_delta"] < out["ci_high"]
    again = describe_deltas(num, 200, s, "k")
    assert (again["ci_low"], again["ci_high"]) == (out["ci_low"], out["ci_high"])  # seeded


def test_sign_test_clopper_pearson():
    p, low, high = sign_test(6, 0)
    assert p == pytest.approx(2 / 64)
    assert low == pytest.approx(stats.binomtest(6, 6).proportion_ci(0.95, "exact").low)
    assert high == 1.0


def test_settings_reject_unknown_choices():
    with pytest.raises(ValueError, match="alternative"):
        StatsSettings(alternative="bigger")
    with pytest.raises(ValueError, match="zero_method"):
        StatsSettings(zero_method="drop")
    with pytest.raises(ValueError, match="alpha"):
        StatsSettings(alpha=5)


def test_interaction_and_slope_intervals_carry_their_level_and_approximation():
    """The Hodges-Lehmann intervals of the interaction and slope families say their level and
    are marked approximate where zeros or tied differences make the coverage approximate."""
    import pandas as pd

    from analysis.render.tables import interaction_table
    from analysis.stats import StatsSettings, exact_test_columns

    settings = StatsSettings()
    untied = exact_test_columns(np.array([1.0, 2.5, 4.0, 7.5, 9.0, 12.0]), settings)
    tied = exact_test_columns(np.array([1.0, 1.0, 0.0, 3.0, -3.0, 5.0]), settings)
    assert (untied["hl_ci_method"], tied["hl_ci_method"]) == ("exact", "approximate")
    rows = []
    for level, columns in (("false", untied), ("0.5", tied)):
        rows.append(
            {
                **columns,
                "dataset": "short",
                "operator": "gate_scalar",
                "baseline": "add",
                "reference": "true",
                "level": level,
                "n_pairs": 6,
                "median_delta_reference": 1.0,
                "median_delta_level": 2.0,
                "median_interaction": columns["hl_estimate"],
                "p_holm": 0.5,
                "significant": False,
                "can_reach_alpha": True,
                "min_attainable_p_holm": 0.06,
            }
        )
    table = interaction_table(
        pd.DataFrame(rows),
        "model.scale_embeddings",
        ["dataset", "model.scale_embeddings"],
        {"alpha": 0.05, "confidence": 0.95},
        2,
        ["model.scale_embeddings"],
    )
    column = "difference: median [HL 95% CI]"
    cells = table.display[column].tolist()
    assert not cells[0].endswith("(approx.)") and cells[1].endswith("(approx.)")
