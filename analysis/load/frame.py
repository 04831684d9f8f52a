"""The tidy frame of an experiment's trial runs: its columns, the grid's axis columns and levels,
the errors of loading, and ``Experiment``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fusion_ray.schema import (
    AXIS_TAG_PREFIX,
    DISPLAY_ORDER_TAG,
    EPOCH_METRICS,
    EVAL_LENGTH_METRIC_PREFIXES,
    FINAL_METRICS,
    GATED_TAG,
    GRID_AXES_TAG,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    LENGTH_QUARTER_METRICS,
    POSITION_ALIAS_TAG,
    REFERENCE_METRICS,
    RETURNED_TAG,
    ROLE_TAG,
    TRAINABLE_RUN_TAG,
    TRIAL_TAGS,
    axis_text,
)

#: Every param of a run becomes a column ``params.<name>`` (a string, as MLflow stores it).
PARAM_PREFIX = "params."
FINISHED = "FINISHED"
PAGE_SIZE = 50_000  # the largest page MLflow's stores accept
LOAD_METHODS = ("auto", "sql", "search_runs")
#: MLflow's own tag holding a run's name (the SQL path reads it when the runs table has none).
RUN_NAME_TAG = "mlflow.runName"
#: How far a logged test_acc may be from test_correct / test_total (round-off of a float).
ACC_TOLERANCE = 1e-6
#: How many runs an ImpossibleMetricsError lists before it only counts them.
SHOWN_RUNS = 25

METRICS = FINAL_METRICS + EPOCH_METRICS
#: Metrics that count something; they become nullable integers (after the metric check).
INTEGER_METRICS = ("best_epoch", "test_correct", "test_total", "num_params", "epochs_run")
#: Run info columns, in the order of the tidy frame.
INFO_COLUMNS = ["run_id", "run_name", "status", "start_time", "end_time", "artifact_uri"]
#: The tidy frame's leading columns; the params follow, sorted by name.
BASE_COLUMNS = [
    *INFO_COLUMNS,
    ROLE_TAG,
    "parent_run_id",
    "operator",
    *(t for t in TRIAL_TAGS if t != "fusion"),
    *METRICS,
]
#: Metrics and tags that only some sweeps log: a column of the tidy frame only when a run of
#: the experiment carries it, so that the frame of a sweep without them is unchanged.
OPTIONAL_METRICS = (
    *INIT_METRICS,
    LATENCY_RATIO_METRIC,
    *REFERENCE_METRICS,
    *LENGTH_QUARTER_METRICS,
)
OPTIONAL_TAGS = (POSITION_ALIAS_TAG, GATED_TAG, RETURNED_TAG, TRAINABLE_RUN_TAG)
"""Run tags a sweep may not write: the study's position alias and gate; a trainable's
returned metric names and name."""
OPTIONAL_COLUMNS = (*OPTIONAL_METRICS, *OPTIONAL_TAGS)


def eval_length_metric(name: str) -> tuple[str, int] | None:
    """(prefix, L) of a per-length metric name such as ``test_correct_at_128``, else None."""
    for prefix in EVAL_LENGTH_METRIC_PREFIXES:
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if rest.isdigit() and rest.isascii() and int(rest) > 0:
            return prefix, int(rest)
    return None


def eval_length_metrics(columns: Iterable[Any]) -> list[str]:
    """The per-length metric columns among ``columns``, by length, then in the order of
    ``EVAL_LENGTH_METRIC_PREFIXES`` (accuracy, correct, total)."""
    found = [(eval_length_metric(c), c) for c in columns if isinstance(c, str)]
    order = {p: i for i, p in enumerate(EVAL_LENGTH_METRIC_PREFIXES)}
    ranked = sorted((parsed[1], order[parsed[0]], c) for parsed, c in found if parsed is not None)
    return [c for _, _, c in ranked]


class AnalysisError(ValueError):
    """A problem with the logged runs that a user can fix; the message says how."""


class ExperimentNotFoundError(AnalysisError):
    """No experiment of that name at that tracking URI."""


class EmptyExperimentError(AnalysisError):
    """The experiment exists but holds no FINISHED trial runs."""


class ImpossibleMetricsError(AnalysisError):
    """FINISHED trial runs whose logged test counts or accuracy cannot be true."""


@dataclass
class Experiment:
    """The trial runs of one experiment (every status), its sweep parent run, and where from."""

    name: str
    experiment_id: str
    tracking_uri: str
    runs: pd.DataFrame
    """One row per trial run: run info, the tags (tag ``fusion`` as column ``operator``, the
    role and parent tags as ``role`` and ``parent_run_id``), the
    metrics and every param as a ``params.<name>`` column (strings, as MLflow stores them)."""
    parent_run_id: str | None = None
    parent_tags: dict[str, str] = field(default_factory=dict)
    """Tags of the sweep parent run (the sweep writes e.g. ``cells``, the grid's size)."""
    notes: list[str] = field(default_factory=list)
    """What the loader noticed (runs without a role tag, several parent runs, ...)."""
    sweep_cells: list[str] | None = None
    """The cell ids in the parent run's ``sweep_cells.json``; None when it has none, and then
    every trial run of the experiment is in ``runs``."""
    decisions: pd.DataFrame | None = None
    """An adaptive sweep's verdicts as its driver last logged them (the parent run's
    ``decisions.csv``: one row per hypothesis, in the family's order); None for a sweep of fixed
    seeds. ``analysis.compare(...).decisions`` recomputes the same rows from ``runs``."""
    other_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Trial runs (every status) whose ``cell_id`` is not in ``sweep_cells``: runs of other
    settings, never counted, paired or analysed. Same columns as ``runs``."""
    axis_levels: dict[str, list[str]] = field(default_factory=dict)
    """The grid's extra axes (dotted keys, columns of ``runs``) -> their levels as text, the
    reference level first (``axis_levels``); empty for a grid without extra axes."""

    @property
    def axes(self) -> list[str]:
        """The extra grid axes, in the sweep file's order."""
        return list(self.axis_levels)

    @property
    def finished(self) -> pd.DataFrame:
        """The FINISHED trial runs, the only ones analysed."""
        return self.runs[self.runs["status"] == FINISHED]


def tag_column(tag: str) -> str:
    """The frame column of a trial tag: tag ``fusion`` is the column ``operator``."""
    return "operator" if tag == "fusion" else tag


def axis_key(tag: str) -> str:
    """The grid axis of an ``axis.<dotted key>`` tag (its column in the tidy frame).

    Raises AnalysisError when the key would replace a column the analysis already has."""
    key = tag[len(AXIS_TAG_PREFIX) :]
    clashes = key in BASE_COLUMNS or key in OPTIONAL_COLUMNS or eval_length_metric(key) is not None
    if not key or clashes or key.startswith(PARAM_PREFIX):
        raise AnalysisError(
            f"a run carries the tag {tag!r}, whose axis name {key!r} clashes with a column the "
            "analysis reads; extra grid axes are dotted settings such as "
            f"{AXIS_TAG_PREFIX}model.scale_embeddings. Rename or delete the tag."
        )
    return key


def param_name(column: str) -> str:
    """``params.train.lr`` -> ``train.lr``."""
    return column[len(PARAM_PREFIX) :]


def param_columns(frame: pd.DataFrame) -> list[str]:
    """The ``params.*`` columns of a runs frame."""
    return [c for c in frame.columns if c.startswith(PARAM_PREFIX)]


def axis_columns(runs: pd.DataFrame) -> list[str]:
    """The extra grid axes of a tidy frame: its columns that came from ``axis.<key>`` tags
    (dotted names that are neither params nor schema columns) and hold a value in some run."""
    known = {*BASE_COLUMNS, *OPTIONAL_COLUMNS}
    return [
        c
        for c in runs.columns
        if isinstance(c, str)
        and "." in c
        and c not in known
        and not c.startswith(PARAM_PREFIX)
        and runs[c].notna().any()
    ]


def integer_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """The frame with its counting metrics (``INTEGER_METRICS``) as nullable integers."""
    out = runs.copy()
    for col in INTEGER_METRICS:
        out[col] = pd.to_numeric(out[col], errors="coerce").round().astype("Int64")
    return out


def natural_levels(values: Sequence[str]) -> list[str]:
    """Distinct levels in their natural order: false before true, numbers by value, then the
    rest as text (the order when the parent run does not give the sweep file's)."""

    def rank(v: str) -> tuple[int, float, str]:
        if v.lower() in ("false", "true"):
            return (0, float(v.lower() == "true"), v)
        try:
            number = float(v)
        except ValueError:
            return (2, 0.0, v)
        return (1, number, v) if math.isfinite(number) else (2, 0.0, v)

    return sorted(set(values), key=rank)


def parse_grid_axes(text: str | None, notes: list[str]) -> dict[str, list[str]]:
    """The parent run's ``grid_axes`` tag: {dotted key: [levels as text, sweep file order]}.
    An unreadable tag is noted and read as absent."""
    if text is None:
        return {}
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and all(isinstance(v, list) for v in payload.values()):
        return {str(k): [axis_text(v) for v in vals] for k, vals in payload.items()}
    notes.append(
        f"the sweep parent run's tag `{GRID_AXES_TAG}` is not JSON of the form "
        '{"model.scale_embeddings": ["true", "false"]}; grid axis levels are ordered naturally '
        "(false before true, numbers by value) and the first is each axis's reference level."
    )
    return {}


def recorded_order(parent_tags: Mapping[str, str]) -> dict[str, list[str]]:
    """The parent run's ``display_order`` tag: {"operator": [...], "dataset": [...]}, the order
    the report lists them in ({} without the tag, or for one that is not such JSON: the report
    then lists them by name)."""
    try:
        payload = json.loads(parent_tags.get(DISPLAY_ORDER_TAG, ""))
    except ValueError:
        return {}
    if not isinstance(payload, dict):
        return {}
    return {
        str(k): [str(v) for v in vals]
        for k, vals in payload.items()
        if isinstance(vals, list) and all(isinstance(v, str) for v in vals)
    }


def axis_levels(
    runs: pd.DataFrame, grid_axes: str | None = None, notes: list[str] | None = None
) -> dict[str, list[str]]:
    """Each extra grid axis of ``runs`` -> its levels, the reference level first.

    ``grid_axes`` is the parent run's ``grid_axes`` tag: its order (the sweep file's) comes
    first, levels it does not list follow in their natural order. Without it, or for an axis
    it does not name, levels are in their natural order (``natural_levels``). Axes come in the
    tag's order, then by name."""
    notes = notes if notes is not None else []
    declared = parse_grid_axes(grid_axes, notes)
    present = axis_columns(runs)
    ordered = [a for a in declared if a in present] + sorted(
        a for a in present if a not in declared
    )
    levels: dict[str, list[str]] = {}
    for axis in ordered:
        seen = [str(v) for v in runs[axis].dropna()]
        first = declared.get(axis, [])
        levels[axis] = first + natural_levels([v for v in seen if v not in first])
    return levels
