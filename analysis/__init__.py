"""Paired-seed analysis of fusion-ray sweeps, read from MLflow.

The package reads only the MLflow schema (docs/reference/mlflow-schema.md), whose names it
imports from ``fusion_ray.schema`` (standard library only), and the decision code on paired
seeds from ``fusion_ray.decide`` (numpy and scipy, shared with the adaptive seed policy); it
imports nothing else of ``fusion_ray``. Entry point: ``python -m analysis.report --experiment NAME``.

    from analysis import load_experiment, pair_runs, compare, StatsSettings
    exp = load_experiment("full_grid", "sqlite:///mlflow.db")
    exp.decisions      # an adaptive sweep's verdicts as its driver logged them (None: fixed seeds)
    pairing = pair_runs(exp.runs, baseline="add")
    result = compare(pairing, StatsSettings(alpha=0.05), experiment=exp)
    result.table       # fixed-n tests per comparison (descriptive after adaptive seeds)
    result.decisions   # the anytime-valid verdicts of every hypothesis, as decisions.csv

The paired core: ``load`` (MLflow -> tidy frame of the sweep's cells, metrics checked),
``other_settings`` (the runs left out as other settings, described), ``pairing`` (seed pairs
against the baseline, checked; why nothing can be compared), ``stats`` (the paired statistics
and their registry), ``sequential`` and ``rules`` (the names here of ``fusion_ray.decide``:
anytime-valid decisions on the per-seed deltas in seed order, ``run_family``). The report: ``context`` (its options and paired core), ``section`` (the
protocol of a report section), ``tables`` (Tables 1-3 and the other DataFrame tables, written
as Markdown, LaTeX and CSV), ``drawing`` (how each kind of figure is drawn with matplotlib),
``figures`` (the core's figures), ``report_md`` (report.md), ``report`` (``SECTIONS``,
``build_report`` and the CLI). The sections, one module each: ``interaction`` (does an operator
effect depend on a grid axis), ``scaling`` (the embedding-scale confound check), ``lengths``
(per-document length analysis), ``extrapolation`` (train short, test long: the operator effect
at each evaluation length, its slope against log2 of the length, the truncation ladder),
``gates`` (the gated operators' weight on E by position), ``reproduction`` (the study's
published numbers beside ours). And ``synthetic`` (schema-conformant fake sweeps for tests,
benchmarks and demos).
"""

from analysis.load import (
    AnalysisError,
    EmptyExperimentError,
    Experiment,
    ExperimentNotFoundError,
    ImpossibleMetricsError,
    load_experiment,
)
from analysis.pairing import NothingToCompareError, Pairing, PairingError, pair_runs
from analysis.stats import (
    Comparisons,
    Statistic,
    StatsSettings,
    hodges_lehmann,
    holm,
    min_attainable_p,
    register,
    seeds_needed,
    unregister,
    wilcoxon_signed_rank,
)
from analysis.verdicts import compare, verdicts
from fusion_ray.decide.sequential import family_evidence, run_family

__all__ = [
    "family_evidence",
    "run_family",
    "AnalysisError",
    "Comparisons",
    "EmptyExperimentError",
    "Experiment",
    "ExperimentNotFoundError",
    "ImpossibleMetricsError",
    "NothingToCompareError",
    "Pairing",
    "PairingError",
    "Statistic",
    "StatsSettings",
    "compare",
    "hodges_lehmann",
    "holm",
    "load_experiment",
    "min_attainable_p",
    "pair_runs",
    "register",
    "seeds_needed",
    "unregister",
    "verdicts",
    "wilcoxon_signed_rank",
]
