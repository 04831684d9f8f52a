"""Paired-seed statistics of each operator against a baseline.

The tests themselves are scipy's and statsmodels': ``scipy.stats.wilcoxon`` (exact),
``scipy.stats.binomtest`` (sign test, Clopper-Pearson interval), ``scipy.stats.bootstrap``
(percentile interval of the mean delta); Holm's step-down is ``fusion_ray.decide.sequential.holm``
(the anytime family's too), tested equal to ``statsmodels.stats.multitest.multipletests`` with
``method="holm"`` (statsmodels' default, "hs", is Holm-Sidak, not Holm), which runs a full garbage
collection at every call. The glue written here is what they lack:

- deltas from correct counts (integers), so float round-off can neither create nor break ties;
- the exact null distribution of the signed-rank statistic conditional on tied ranks and zeros
  (scipy's exact method assumes neither; its permutation method enumerates 2^n sign vectors,
  seconds per comparison at n = 16); a shift-algorithm over doubled mid-ranks gives the same
  p-values in microseconds and is tested against scipy's permutation method;
- the Hodges-Lehmann estimate with its order-statistic confidence interval from Walsh averages,
  labelled exact or approximate from the data (``hl_ci_method``);
- the attainable-significance guard, counting only the non-zero deltas, whose signs are all
  the exact test permutes, and Holm's correction over comparisons with different floors.

The package, lowest first: ``exact`` (the tests and intervals: pure functions returning result
objects), ``statistic`` (what a statistic of a comparison is), ``builtin`` (the built-in
statistics), ``registry`` (the registry of statistics, plug-ins from the entry-point group
``fusion_ray.statistics`` loaded by ``fusion_ray.registry.Registry`` like every other
registry), ``present`` (the words: report.md's cells, the Method lines, the warnings) and
``family`` (``compare``: every statistic over a family of comparisons, with Holm and the
guard). Every public name is importable from ``analysis.stats``.
"""

from analysis.stats.builtin import (
    STATISTICS,
    hl_label,
    hl_marked,
)
from analysis.stats.exact import (
    ALTERNATIVES,
    ZERO_METHODS,
    HodgesLehmann,
    SignedRankResult,
    StatsSettings,
    hl_interval_method,
    hodges_lehmann,
    holm,
    holm_min_attainable_p,
    min_attainable_p,
    seeds_needed,
    sign_test,
    signed_rank_null_cdf,
    wilcoxon_signed_rank,
)
from analysis.stats.family import (
    ZERO_POLICIES,
    Comparisons,
    common_denominator,
    compare,
    describe_deltas,
    exact_family_warnings,
    exact_test_columns,
    finish_family,
    holm_columns,
    integer_deltas,
    settings_record,
)
from analysis.stats.present import (
    method_lines,
    summary_cells,
)
from analysis.stats.registry import (
    PLUGIN_GROUP,
    headline_columns,
    origin,
    register,
    statistics,
    unregister,
)
from analysis.stats.statistic import (
    PairedDeltas,
    Statistic,
)

__all__ = [
    "ALTERNATIVES",
    "Comparisons",
    "HodgesLehmann",
    "PLUGIN_GROUP",
    "PairedDeltas",
    "STATISTICS",
    "SignedRankResult",
    "Statistic",
    "StatsSettings",
    "ZERO_METHODS",
    "ZERO_POLICIES",
    "common_denominator",
    "compare",
    "describe_deltas",
    "exact_family_warnings",
    "exact_test_columns",
    "finish_family",
    "headline_columns",
    "hl_interval_method",
    "hl_label",
    "hl_marked",
    "hodges_lehmann",
    "holm",
    "holm_columns",
    "holm_min_attainable_p",
    "integer_deltas",
    "method_lines",
    "min_attainable_p",
    "origin",
    "register",
    "seeds_needed",
    "settings_record",
    "sign_test",
    "signed_rank_null_cdf",
    "statistics",
    "summary_cells",
    "unregister",
    "wilcoxon_signed_rank",
]
