"""Paired-seed analysis of fusion-ray sweeps, read from MLflow.

The package reads only the MLflow schema (DESIGN.md, "The MLflow schema"); it never imports
``fusion_ray``. Entry point: ``python -m analysis.report --experiment NAME``.

    from analysis import load_experiment, pair_runs, compare, StatsSettings
    exp = load_experiment("full_grid", "sqlite:///mlflow.db")
    pairing = pair_runs(exp.runs, baseline="add")
    stats = compare(pairing, StatsSettings(alpha=0.05)).table

Modules: ``load`` (MLflow -> tidy frame, pairing checks), ``paired`` (statistics), ``lengths``
(per-document length analysis), ``tables``, ``plots``, ``report`` (the CLI), ``synthetic``
(schema-conformant fake sweeps for tests, benchmarks and demos).
"""

from analysis.load import (
    AnalysisError,
    EmptyExperimentError,
    Experiment,
    ExperimentNotFoundError,
    Pairing,
    PairingError,
    load_experiment,
    pair_runs,
)
from analysis.paired import (
    Comparisons,
    StatsSettings,
    compare,
    hodges_lehmann,
    holm,
    min_attainable_p,
    seeds_needed,
    wilcoxon_signed_rank,
)

__all__ = [
    "AnalysisError",
    "Comparisons",
    "EmptyExperimentError",
    "Experiment",
    "ExperimentNotFoundError",
    "Pairing",
    "PairingError",
    "StatsSettings",
    "compare",
    "hodges_lehmann",
    "holm",
    "load_experiment",
    "min_attainable_p",
    "pair_runs",
    "seeds_needed",
    "wilcoxon_signed_rank",
]
