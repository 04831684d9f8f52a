"""MLflow -> a tidy frame of an experiment's trial runs.

This module reads only the MLflow schema (``fusion_ray.schema``, the one module of names both
sides share, listed on the docs' MLflow schema page); of fusion_ray it imports nothing else, so
it can analyse runs logged by anything that follows the schema.

Loading fetches all runs of the experiment with a few large ``search_runs`` pages (never one
client call per run), or, for a sqlite store, with a handful of SQL queries over MLflow's own
table definitions. A sweep's runs are its cells: when the sweep's parent run carries
``sweep_cells.json`` (the cell ids of the sweep file as it stands), only trial runs of those
cells are the experiment's runs, and the others are set aside as runs of other settings. The
FINISHED runs' test metrics are checked before anything uses them. Pairing the runs is
``analysis.stats.pairing``'s job.

A sweep's grid may have axes beyond dataset, position, attention position and fusion (any
dotted setting, e.g. ``model.scale_embeddings``): each trial run's tag ``axis.<key>`` becomes a
column named ``<key>`` (the value as text), and ``Experiment.axis_levels`` gives each axis's
levels, its reference level first (from the parent run's ``grid_axes`` tag when it has one).

Runs evaluated at several truncation lengths (``data.eval_lengths``: train short, test long) log
``test_acc_at_<L>``, ``test_correct_at_<L>`` and ``test_total_at_<L>`` per length L; each becomes
a float column of that name, after the optional columns, only when some run of the experiment
logged it (``eval_length_metrics``), so the frame of a sweep without them is unchanged. They are
checked where they are used (``analysis.sections.study.extrapolation``), not here.

The package: ``frame`` (the tidy frame's columns, the errors and ``Experiment``), ``store``
(``load_experiment``: search_runs pages or SQL over a sqlite store), ``artifacts`` (a run's
files through the tracking URI it was logged to; the sweep's cells) and ``checks`` (what cannot
be true in a FINISHED run's test metrics).
"""

from analysis.load.artifacts import (
    RunArtifacts,
    local_artifact_path,
    parse_sweep_cells,
    read_run_artifacts,
    read_run_parquet,
    read_sweep_cells,
    split_sweep_cells,
    unreadable_artifacts,
)
from analysis.load.checks import (
    check_metrics,
    metric_problems,
)
from analysis.load.frame import (
    ACC_TOLERANCE,
    BASE_COLUMNS,
    FINISHED,
    INFO_COLUMNS,
    INTEGER_METRICS,
    LOAD_METHODS,
    METRICS,
    OPTIONAL_COLUMNS,
    OPTIONAL_METRICS,
    OPTIONAL_TAGS,
    PAGE_SIZE,
    PARAM_PREFIX,
    RUN_NAME_TAG,
    SHOWN_RUNS,
    AnalysisError,
    EmptyExperimentError,
    Experiment,
    ExperimentNotFoundError,
    ImpossibleMetricsError,
    axis_columns,
    axis_key,
    axis_levels,
    eval_length_metric,
    eval_length_metrics,
    integer_counts,
    natural_levels,
    param_columns,
    param_name,
    parse_grid_axes,
    recorded_order,
    tag_column,
)
from analysis.load.store import (
    load_experiment,
)
from fusion_ray.store_errors import StoreAccessError  # the one type every command raises

__all__ = [
    "ACC_TOLERANCE",
    "AnalysisError",
    "BASE_COLUMNS",
    "EmptyExperimentError",
    "Experiment",
    "ExperimentNotFoundError",
    "FINISHED",
    "INFO_COLUMNS",
    "INTEGER_METRICS",
    "ImpossibleMetricsError",
    "LOAD_METHODS",
    "METRICS",
    "OPTIONAL_COLUMNS",
    "OPTIONAL_METRICS",
    "OPTIONAL_TAGS",
    "PAGE_SIZE",
    "PARAM_PREFIX",
    "RUN_NAME_TAG",
    "RunArtifacts",
    "SHOWN_RUNS",
    "StoreAccessError",
    "axis_columns",
    "recorded_order",
    "param_columns",
    "param_name",
    "axis_key",
    "axis_levels",
    "check_metrics",
    "eval_length_metric",
    "eval_length_metrics",
    "integer_counts",
    "load_experiment",
    "local_artifact_path",
    "metric_problems",
    "natural_levels",
    "parse_grid_axes",
    "parse_sweep_cells",
    "read_run_artifacts",
    "read_run_parquet",
    "read_sweep_cells",
    "split_sweep_cells",
    "tag_column",
    "unreadable_artifacts",
]
