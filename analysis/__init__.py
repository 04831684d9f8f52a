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

A trainable's sweep (``trainable: NAME``): ``compare_trainable(exp)`` gives its paired
statistics per comparison (``.paired``) and its decisions recomputed from the runs
(``.decisions``).

The packages, by role, each importing only the ones before it here: ``load`` (what was run:
MLflow -> tidy frame of the sweep's cells, metrics checked, runs of other settings described),
``stats`` (seed pairs against the baseline, the paired statistics and their registry, the
verdicts of the sweep's family with ``fusion_ray.decide``), ``render`` (escaping, tables as
Markdown, LaTeX and CSV, matplotlib drawing), ``sections`` (the report's sections, their
registry and the paired core they are given; ``sections.study`` holds the study's own) and
``report`` (``build_report``, report.md, report.html, the CLI). This module is the Python API.
"""

from analysis.load import (
    AnalysisError,
    EmptyExperimentError,
    Experiment,
    ExperimentNotFoundError,
    ImpossibleMetricsError,
    load_experiment,
)
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
from analysis.stats.pairing import NothingToCompareError, Pairing, PairingError, pair_runs
from analysis.stats.trainable import TrainableComparison, compare_trainable
from analysis.stats.verdicts import compare, verdicts
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
    "TrainableComparison",
    "compare",
    "compare_trainable",
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
