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
``analysis.pairing``'s job.

A sweep's grid may have axes beyond dataset, position, attention position and fusion (any
dotted setting, e.g. ``model.scale_embeddings``): each trial run's tag ``axis.<key>`` becomes a
column named ``<key>`` (the value as text), and ``Experiment.axis_levels`` gives each axis's
levels, its reference level first (from the parent run's ``grid_axes`` tag when it has one).

Runs evaluated at several truncation lengths (``data.eval_lengths``: train short, test long) log
``test_acc_at_<L>``, ``test_correct_at_<L>`` and ``test_total_at_<L>`` per length L; each becomes
a float column of that name, after the optional columns, only when some run of the experiment
logged it (``eval_length_metrics``), so the frame of a sweep without them is unchanged. They are
checked where they are used (``analysis.extrapolation``), not here.
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd

from fusion_ray.redact import redact
from fusion_ray.schema import (
    AXIS_TAG_PREFIX,
    CELLS_ARTIFACT,
    EPOCH_METRICS,
    EVAL_LENGTH_METRIC_PREFIXES,
    FINAL_METRICS,
    GATED_TAG,
    GRID_AXES_TAG,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    PARENT_TAG,
    POSITION_ALIAS_TAG,
    REFERENCE_METRICS,
    ROLE_SWEEP,
    ROLE_TAG,
    ROLE_TRIAL,
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
OPTIONAL_METRICS = (*INIT_METRICS, LATENCY_RATIO_METRIC, *REFERENCE_METRICS)
OPTIONAL_TAGS = (POSITION_ALIAS_TAG, GATED_TAG)
OPTIONAL_COLUMNS = (*OPTIONAL_METRICS, *OPTIONAL_TAGS)


def eval_length_metric(name: str) -> tuple[str, int] | None:
    """(prefix, L) of a per-length metric name such as ``test_correct_at_128``, else None."""
    for prefix in EVAL_LENGTH_METRIC_PREFIXES:
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if rest.isdigit() and rest.isascii() and int(rest) > 0:
            return prefix, int(rest)
    return None


def eval_length_metrics(columns: Sequence[Any]) -> list[str]:
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


# ----------------------------------------------------------------------------- search_runs


def _available_experiments(client: Any) -> list[str]:
    names, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        names += [e.name for e in page]
        token = page.token
        if not token:
            return sorted(names)


def _search_all(client: Any, experiment_id: str) -> list[Any]:
    """All active runs of the experiment, a few 50,000-run pages at most.

    The Python garbage collector is paused while MLflow builds its run objects: with tens of
    thousands of ORM rows it otherwise runs hundreds of full collections and triples the time.
    """
    runs: list[Any] = []
    token = None
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        while True:
            page = client.search_runs([experiment_id], max_results=PAGE_SIZE, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs
    finally:
        if was_enabled:
            gc.enable()


def _frame_from_entities(runs: Sequence[Any]) -> pd.DataFrame:
    rows = []
    for run in runs:
        info, data = run.info, run.data
        row: dict[str, Any] = {
            "run_id": info.run_id,
            "run_name": info.run_name,
            "status": info.status,
            "start_time": info.start_time,
            "end_time": info.end_time,
            "artifact_uri": info.artifact_uri,
            ROLE_TAG: data.tags.get(ROLE_TAG),
            "parent_run_id": data.tags.get(PARENT_TAG),
        }
        for tag in TRIAL_TAGS:
            row[tag_column(tag)] = data.tags.get(tag)
        for name in METRICS:
            row[name] = data.metrics.get(name, math.nan)
        row.update((name, data.metrics[name]) for name in OPTIONAL_METRICS if name in data.metrics)
        row.update((name, data.metrics[name]) for name in eval_length_metrics(data.metrics))
        row.update((tag, data.tags[tag]) for tag in OPTIONAL_TAGS if tag in data.tags)
        for tag, value in data.tags.items():
            if tag.startswith(AXIS_TAG_PREFIX):
                row[axis_key(tag)] = value
        for name, value in data.params.items():
            row[PARAM_PREFIX + name] = value
        rows.append(row)
    return _tidy(pd.DataFrame(rows))


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes shared by both loading paths."""
    df = df.copy()
    for col in BASE_COLUMNS:
        if col not in df:
            df[col] = None
    params = sorted(c for c in df.columns if c.startswith(PARAM_PREFIX))
    optional = [c for c in OPTIONAL_COLUMNS if c in df and df[c].notna().any()]
    at_length = [c for c in eval_length_metrics(df.columns) if df[c].notna().any()]
    known = {*BASE_COLUMNS, *OPTIONAL_COLUMNS, *eval_length_metrics(df.columns), *params}
    axes = sorted(c for c in df.columns if c not in known)
    df = df[BASE_COLUMNS + optional + at_length + axes + params]
    for col in [*OPTIONAL_TAGS, *axes]:
        if col in df:
            df[col] = df[col].astype(object).where(df[col].notna(), None)
    for col in [*OPTIONAL_METRICS, *at_length]:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    for col in METRICS:  # counts stay floats here: check_metrics must see 150.5 as 150.5
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("start_time", "end_time"):
        df[col] = pd.to_datetime(pd.to_numeric(df[col], errors="coerce"), unit="ms", utc=True)
    for col in ["run_id", "run_name", "status", "artifact_uri", ROLE_TAG, "parent_run_id"]:
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df.sort_values("run_id", kind="stable").reset_index(drop=True)


def integer_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """The frame with its counting metrics (``INTEGER_METRICS``) as nullable integers."""
    out = runs.copy()
    for col in INTEGER_METRICS:
        out[col] = pd.to_numeric(out[col], errors="coerce").round().astype("Int64")
    return out


# ----------------------------------------------------------------------------- sqlite tables


def _is_sqlite(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


def _sql_queries(experiment_id: str) -> dict[str, tuple[Any, list[str]]]:
    """The four queries of the SQL path (run info, tags, params, latest metrics) and the
    columns of their results, through MLflow's own table definitions."""
    import sqlalchemy as sa
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag

    runs_t, tags_t = SqlRun.__table__, SqlTag.__table__
    params_t, metrics_t = SqlParam.__table__, SqlLatestMetric.__table__
    active = sa.and_(
        runs_t.c.experiment_id == int(experiment_id),
        runs_t.c.lifecycle_stage == LifecycleStage.ACTIVE,
    )
    ids = sa.select(runs_t.c.run_uuid).where(active).scalar_subquery()
    info_cols = ("run_uuid", "name", "status", "start_time", "end_time", "artifact_uri")
    info_q = sa.select(*(runs_t.c[c] for c in info_cols)).where(active)
    tags_q = sa.select(tags_t.c.run_uuid, tags_t.c.key, tags_t.c.value).where(
        tags_t.c.run_uuid.in_(ids),
        sa.or_(tags_t.c.key.in_(_wanted_tags()), tags_t.c.key.startswith(AXIS_TAG_PREFIX)),
    )
    params_q = sa.select(params_t.c.run_uuid, params_t.c.key, params_t.c.value).where(
        params_t.c.run_uuid.in_(ids)
    )
    at_length = [
        metrics_t.c.key.startswith(p, autoescape=True) for p in EVAL_LENGTH_METRIC_PREFIXES
    ]
    metrics_q = sa.select(
        metrics_t.c.run_uuid, metrics_t.c.key, metrics_t.c.value, metrics_t.c.is_nan
    ).where(
        metrics_t.c.run_uuid.in_(ids),
        sa.or_(metrics_t.c.key.in_([*METRICS, *OPTIONAL_METRICS]), *at_length),
    )
    long = ["run_id", "key", "value"]
    return {
        "info": (info_q, INFO_COLUMNS),
        "tags": (tags_q, long),
        "params": (params_q, long),
        "metrics": (metrics_q, [*long, "is_nan"]),
    }


def _wanted_tags() -> list[str]:
    return [*TRIAL_TAGS, ROLE_TAG, PARENT_TAG, RUN_NAME_TAG, *OPTIONAL_TAGS]


def _run_queries(uri: str, queries: dict[str, tuple[Any, list[str]]]) -> dict[str, pd.DataFrame]:
    """Each query's rows as a frame, fetched as plain DB-API tuples (SQLAlchemy Row objects
    cost more than the queries themselves)."""
    import sqlalchemy as sa

    engine = sa.create_engine(uri, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        out = {}
        for name, (query, columns) in queries.items():
            literal = {"literal_binds": True}
            cursor.execute(str(query.compile(dialect=engine.dialect, compile_kwargs=literal)))
            out[name] = pd.DataFrame.from_records(cursor.fetchall(), columns=columns)
        cursor.close()
        return out
    finally:
        raw.close()
        engine.dispose()


def _wide(long: pd.DataFrame, index: pd.Index, prefix: str = "") -> pd.DataFrame:
    """(run_id, key, value) rows -> one column per key, rows in ``index`` order."""
    if long.empty:
        return pd.DataFrame(index=index)
    out = long.pivot(index="run_id", columns="key", values="value")
    out.columns = [prefix + str(c) for c in out.columns]
    return out.reindex(index)


def _frame_from_sql(uri: str, experiment_id: str) -> pd.DataFrame:
    """The same frame as search_runs gives, read with a handful of SQL queries.

    It goes through MLflow's own table definitions (``mlflow.store.tracking.dbmodels``) with
    SQLAlchemy Core, which skips the ORM objects that make ``search_runs`` spend ~2 ms per run;
    10,000 runs load in seconds instead of tens of seconds. Only for sqlite stores; any
    mismatch with the installed MLflow's tables makes the caller fall back to ``search_runs``.
    """
    fetched = _run_queries(uri, _sql_queries(experiment_id))
    frame = fetched["info"].set_index("run_id")
    tags = _wide(fetched["tags"], frame.index)
    for key in _wanted_tags():
        if key not in tags:
            tags[key] = None
    missing_name = frame["run_name"].isna() | (frame["run_name"] == "")
    frame.loc[missing_name, "run_name"] = tags.loc[missing_name, RUN_NAME_TAG]
    frame[ROLE_TAG] = tags[ROLE_TAG]
    frame["parent_run_id"] = tags[PARENT_TAG]
    for tag in TRIAL_TAGS:
        frame[tag_column(tag)] = tags[tag]
    _add_sql_metrics(frame, fetched["metrics"])
    _add_sql_optional_tags(frame, tags)
    frame = pd.concat([frame, _wide(fetched["params"], frame.index, PARAM_PREFIX)], axis=1)
    return _tidy(frame.reset_index())


def _add_sql_metrics(frame: pd.DataFrame, metrics: pd.DataFrame) -> None:
    """The metric columns of ``frame`` (indexed by run id) from the metrics query, in place:
    every metric of ``METRICS`` (NaN when not logged), then the optional and per-length ones
    some run logged."""
    if not metrics.empty:
        metrics["value"] = metrics["value"].astype("float64").where(~metrics["is_nan"].astype(bool))
    metric_wide = _wide(metrics.drop(columns="is_nan"), frame.index)
    for name in METRICS:
        frame[name] = metric_wide[name] if name in metric_wide else math.nan
    for name in [*OPTIONAL_METRICS, *eval_length_metrics(metric_wide.columns)]:
        if name in metric_wide:
            frame[name] = metric_wide[name]


def _add_sql_optional_tags(frame: pd.DataFrame, tags: pd.DataFrame) -> None:
    """The optional tag columns some run carries, then a column per ``axis.*`` tag, in place."""
    for tag in OPTIONAL_TAGS:
        if tags[tag].notna().any():
            frame[tag] = tags[tag]
    for tag in tags.columns:
        if tag.startswith(AXIS_TAG_PREFIX):
            frame[axis_key(tag)] = tags[tag]


# ----------------------------------------------------------------------------- the experiment


def load_experiment(
    name: str, tracking_uri: str | None = None, *, method: str = "auto"
) -> Experiment:
    """Load the trial runs of experiment ``name`` (every status) and find its sweep parent run.

    ``method``: "search_runs" pages through ``MlflowClient.search_runs`` (any store);
    "sql" reads a sqlite store's tables through MLflow's table definitions (fast);
    "auto" (default) uses "sql" for sqlite URIs, falling back to "search_runs" on any error.

    Raises ExperimentNotFoundError (listing the experiments that do exist) for an unknown name,
    and EmptyExperimentError when it holds no FINISHED trial run. When the sweep's parent run
    has ``sweep_cells.json``, ``runs`` holds only the trial runs of those cells and
    ``other_runs`` the rest (``split_sweep_cells``). Raises ImpossibleMetricsError, naming
    each run, when a FINISHED run of ``runs`` logged test metrics that cannot be true
    (``check_metrics``).
    """
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    _require_store(uri)
    client = MlflowClient(uri)
    exp = _find_experiment(client, name, uri)
    if method not in LOAD_METHODS:
        raise ValueError(f"method must be 'auto', 'sql' or 'search_runs', not {method!r}")
    notes: list[str] = []
    all_runs = _load_runs(client, uri, exp.experiment_id, method, notes)
    trials, parents = _split_roles(all_runs, notes)
    parent_id = _choose_parent(trials, parents, notes)
    parent = client.get_run(parent_id) if parent_id else None
    _require_finished(trials, all_runs, name, uri)
    cells = read_sweep_cells(client, parent) if parent is not None else None
    runs, other = split_sweep_cells(trials, cells)
    check_metrics(runs, name)
    parent_tags = dict(parent.data.tags) if parent is not None else {}
    return Experiment(
        name=name,
        experiment_id=exp.experiment_id,
        tracking_uri=uri,
        runs=integer_counts(runs),
        parent_run_id=parent_id,
        parent_tags=parent_tags,
        notes=notes,
        sweep_cells=cells,
        other_runs=integer_counts(other),
        axis_levels=axis_levels(runs, parent_tags.get(GRID_AXES_TAG), notes),
    )


def _require_store(uri: str) -> None:
    """A sqlite store that does not exist is a mistyped path: say so instead of letting MLflow
    create an empty database there."""
    if _is_sqlite(uri) and "///" in uri:
        path = Path(uri.split("///", 1)[1])
        if not path.is_file():
            raise ExperimentNotFoundError(
                f"no MLflow store at {path} (tracking URI {uri!r}); pass the store the sweep "
                "logged to with --tracking-uri (or MLFLOW_TRACKING_URI)"
            )


def _find_experiment(client: Any, name: str, uri: str) -> Any:
    exp = client.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage == "active":
        return exp
    available = _available_experiments(client)
    shown = ", ".join(repr(n) for n in available) if available else "(none)"
    state = "" if exp is None else f" (it is {exp.lifecycle_stage})"
    raise ExperimentNotFoundError(
        f"experiment {name!r} not found{state} at tracking URI {uri!r}. Available "
        f"experiments: {shown}. Pass the sweep's name with --experiment and the store "
        "the sweep logged to with --tracking-uri (or MLFLOW_TRACKING_URI)."
    )


def _load_runs(
    client: Any, uri: str, experiment_id: str, method: str, notes: list[str]
) -> pd.DataFrame:
    """Every active run of the experiment, through the fast SQL path when it applies."""
    if method == "sql" or (method == "auto" and _is_sqlite(uri)):
        try:
            return _frame_from_sql(uri, experiment_id)
        except Exception as err:  # noqa: BLE001 - any mismatch: fall back to the public API
            if method == "sql":
                raise
            notes.append(f"fast sqlite loading failed ({err!r}); used search_runs instead.")
    return _frame_from_entities(_search_all(client, experiment_id))


def _split_roles(all_runs: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trial runs, sweep parent runs). Runs without a role tag that carry ``fusion`` and
    ``seed`` (logged before the tag existed) count as trial runs."""
    role = all_runs[ROLE_TAG]
    legacy = role.isna() & all_runs["operator"].notna() & all_runs["seed"].notna()
    if legacy.any():
        notes.append(
            f"{int(legacy.sum())} run(s) have no `{ROLE_TAG}` tag but carry `fusion` and `seed`; "
            "they are treated as trial runs."
        )
    trials = all_runs[(role == ROLE_TRIAL) | legacy].reset_index(drop=True)
    return trials, all_runs[role == ROLE_SWEEP]


def _choose_parent(trials: pd.DataFrame, parents: pd.DataFrame, notes: list[str]) -> str | None:
    """The sweep parent run the report goes to: the only one, or the parent of most trials."""
    if len(parents) == 1:
        return str(parents["run_id"].iloc[0])
    if len(parents) == 0:
        notes.append(
            f"no sweep parent run (tag {ROLE_TAG}={ROLE_SWEEP}) in this experiment: the report "
            "is written to disk only, not logged to MLflow."
        )
        return None
    children = trials["parent_run_id"].value_counts()
    ranked = parents.assign(children=parents["run_id"].map(children).fillna(0))
    ranked = ranked.sort_values(["children", "start_time"], ascending=False)
    parent_id = str(ranked["run_id"].iloc[0])
    notes.append(
        f"{len(parents)} runs carry {ROLE_TAG}={ROLE_SWEEP}; the report is logged to "
        f"{parent_id}, the parent of most trial runs (latest on a tie)."
    )
    return parent_id


def _require_finished(trials: pd.DataFrame, all_runs: pd.DataFrame, name: str, uri: str) -> None:
    """Raise EmptyExperimentError, saying what the experiment does hold, when no trial run
    FINISHED."""
    if (trials["status"] == FINISHED).any():
        return
    if len(trials):
        counts = trials["status"].value_counts().to_dict()
        found = ", ".join(f"{v} {k}" for k, v in counts.items())
        detail = f"its {len(trials)} trial run(s) are {found}"
    elif len(all_runs):
        detail = (
            f"it has {len(all_runs)} run(s) but none is a trial run (tag "
            f"{ROLE_TAG}={ROLE_TRIAL}, or tags fusion and seed)"
        )
    else:
        detail = "it has no runs"
    raise EmptyExperimentError(
        f"experiment {name!r} at tracking URI {uri!r} has no FINISHED trial runs to "
        f"analyse: {detail}. Run the sweep (or wait for its first trials) and try again."
    )


# ----------------------------------------------------------------------------- the sweep's cells


def local_artifact_path(artifact_uri: str) -> Path | None:
    """The folder of a local artifact store's URI (a path or ``file://``), else None."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and artifact_uri[1:3] == ":\\"):
        return Path(artifact_uri)
    return None


def read_run_parquet(
    artifact_uri: str,
    name: str,
    columns: Sequence[str],
    *,
    run_id: str | None = None,
    client: Any = None,
) -> pd.DataFrame | None:
    """The parquet artifact ``name`` of a run (``columns`` only), or None when the run has none.
    A local artifact store is read in place; any other (an MLflow server's
    ``mlflow-artifacts:``, S3, ...) is listed and downloaded through ``client``, an
    ``MlflowClient`` of the runs' tracking URI. An unreadable file, or a store that does not
    answer, raises: it is not a missing artifact."""
    import pyarrow.parquet as pq

    local = local_artifact_path(artifact_uri)
    if local is not None:
        path = local / name
        return pq.read_table(path, columns=list(columns)).to_pandas() if path.exists() else None
    if client is None or run_id is None:
        raise ValueError(
            "a remote artifact store needs the run id and a client of its tracking URI"
        )
    if name not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, name, tmp)
        return pq.read_table(path, columns=list(columns)).to_pandas()


@dataclass
class RunArtifacts:
    """One parquet artifact of each of a set of runs, as ``read_run_artifacts`` found it."""

    frames: dict[str, pd.DataFrame]
    """Run id -> the artifact, for the runs that have a readable one."""
    broken: dict[str, Exception]
    """Run id -> why its artifact could not be read."""
    missing: list[str]
    """Run ids without the artifact, sorted."""

    @property
    def runs(self) -> int:
        return len(self.frames) + len(self.broken) + len(self.missing)


def read_run_artifacts(
    runs: pd.DataFrame,
    name: str,
    columns: Sequence[str],
    max_workers: int = 8,
    tracking_uri: str | None = None,
) -> RunArtifacts:
    """The parquet artifact ``name`` (``columns`` only) of each run of ``runs`` (columns
    ``run_id`` and ``artifact_uri``), read once per run in a thread pool (the work is I/O),
    through the runs' ``tracking_uri`` where the store is not local. A run whose file cannot
    be read is reported in ``broken``, apart from the runs that have no such file."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)

    def read(run_id: str) -> pd.DataFrame | None | Exception:
        try:
            return read_run_parquet(uris[run_id], name, columns, run_id=run_id, client=client)
        except Exception as err:  # noqa: BLE001 - reported per run, the caller decides
            return err

    uris = dict(zip(runs["run_id"], runs["artifact_uri"], strict=True))
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        found = dict(zip(uris, pool.map(read, list(uris)), strict=True))
    return RunArtifacts(
        frames={r: f for r, f in found.items() if isinstance(f, pd.DataFrame)},
        broken={r: f for r, f in found.items() if isinstance(f, Exception)},
        missing=sorted(r for r, f in found.items() if f is None),
    )


def unreadable_artifacts(
    found: RunArtifacts, name: str, what: str, tracking_uri: str | None
) -> AnalysisError:
    """The error for artifacts that exist but could not be read: the run, the cause, the fix."""
    run_id, err = next(iter(found.broken.items()))
    return AnalysisError(
        f"{what}: {name} of {len(found.broken)} of {found.runs} runs could not be read (run "
        f"{run_id}: {redact(f'{type(err).__name__}: {err}')}). Check that the tracking store "
        f"{redact(tracking_uri or 'the default store')} and its artifact store answer and that "
        "the files are intact, then build the report again, or leave the analysis out "
        "(--no-lengths)."
    )


def read_sweep_cells(client: Any, parent: Any) -> list[str] | None:
    """The cell ids in ``sweep_cells.json`` of the sweep's parent run ``parent`` (an MLflow
    ``Run``), or None when it has no such artifact (an older sweep, or another tool's runs).

    A local artifact store is read in place; any other is listed once and the file downloaded
    once, through ``client``."""
    run_id, artifact_uri = parent.info.run_id, parent.info.artifact_uri
    local = local_artifact_path(artifact_uri) if artifact_uri else None
    if local is not None:
        path = local / CELLS_ARTIFACT
        return (
            parse_sweep_cells(path.read_text(encoding="utf-8"), run_id) if path.is_file() else None
        )
    if not any(a.path == CELLS_ARTIFACT for a in client.list_artifacts(run_id)):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(client.download_artifacts(run_id, CELLS_ARTIFACT, tmp))
        return parse_sweep_cells(path.read_text(encoding="utf-8"), run_id)


def parse_sweep_cells(text: str, run_id: str) -> list[str]:
    """The ``cells`` list of a ``sweep_cells.json`` text; AnalysisError when it is not one."""
    try:
        payload = json.loads(text)
        cells = payload["cells"] if isinstance(payload, dict) else None
    except (ValueError, KeyError) as err:
        cells, problem = None, f"{type(err).__name__}: {err}"
    else:
        problem = "no list of cell-id strings under 'cells'"
    if isinstance(cells, list) and all(isinstance(c, str) for c in cells):
        return cells
    raise AnalysisError(
        f"artifact {CELLS_ARTIFACT} of the sweep's parent run {run_id} is unreadable "
        f'({problem}); it should be {{"sweep": NAME, "cells": [CELL_ID, ...], "written": '
        "TIME}. Running the sweep again rewrites it; deleting it makes the analysis use every "
        "trial run of the experiment."
    )


def split_sweep_cells(
    trials: pd.DataFrame, cells: Sequence[str] | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the trial runs whose ``cell_id`` is in ``cells``, the others); every run is the
    sweep's when ``cells`` is None."""
    if cells is None:
        return trials, trials.iloc[:0]
    mine = trials["cell_id"].isin(set(cells))
    return trials[mine].reset_index(drop=True), trials[~mine].reset_index(drop=True)


# ----------------------------------------------------------------------------- grid axes


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


# ----------------------------------------------------------------------------- metric check


def metric_problems(runs: pd.DataFrame) -> dict[Any, list[str]]:
    """What cannot be true in each FINISHED run's test metrics: row label of ``runs`` -> the
    problems. A run lacking a metric is not judged here (pairing lists it as excluded)."""
    done = runs[runs["status"] == FINISHED]
    c, t, a = (
        pd.to_numeric(done[m], errors="coerce").astype("float64").to_numpy()
        for m in ("test_correct", "test_total", "test_acc")
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = c / t
        rules = [
            (_not_a_count(c), "test_correct {c} is not a whole number >= 0"),
            (_not_a_count(t), "test_total {t} is not a whole number >= 0"),
            (t == 0, "test_total is 0"),
            (c > t, "test_correct {c} > test_total {t}"),
            ((a < 0) | (a > 1), "test_acc {a} is outside [0, 1]"),
            (
                _valid_counts(c, t) & (np.abs(a - ratio) > ACC_TOLERANCE) & (a >= 0) & (a <= 1),
                "test_acc {a} disagrees with test_correct / test_total = {ratio}",
            ),
        ]
    problems: dict[Any, list[str]] = {}
    for mask, text in rules:
        for i in np.flatnonzero(mask):
            values = {"c": c[i], "t": t[i], "a": a[i], "ratio": ratio[i]}
            shown = {k: f"{v:.10g}" for k, v in values.items()}
            problems.setdefault(done.index[i], []).append(text.format(**shown))
    return problems


def _valid_counts(c: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whole numbers with 0 <= test_correct <= test_total and test_total > 0."""
    return ~_not_a_count(c) & ~_not_a_count(t) & (t > 0) & (c <= t) & (c >= 0)


def _not_a_count(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ~np.isnan(x) & (~np.isfinite(x) | (x < 0) | (np.mod(x, 1) != 0))


def check_metrics(runs: pd.DataFrame, experiment: str) -> None:
    """Raise ImpossibleMetricsError, listing each offending run, when a FINISHED run logged a
    test_correct above test_total, a negative or fractional count, a test_total of 0, or a
    test_acc outside [0, 1] or off test_correct / test_total by more than ACC_TOLERANCE."""
    problems = metric_problems(runs)
    if not problems:
        return
    lines = []
    for label, found in problems.items():
        r = runs.loc[label]
        lines.append(
            f"  run {r['run_id']} (cell_id {r['cell_id']}, dataset={r['dataset']}, "
            f"fusion={r['operator']}, seed={r['seed']}): " + "; ".join(found)
        )
    if len(lines) > SHOWN_RUNS:
        lines = [*lines[:SHOWN_RUNS], f"  ... and {len(lines) - SHOWN_RUNS} more"]
    raise ImpossibleMetricsError(
        f"{len(problems)} FINISHED trial run(s) of experiment {experiment!r} logged test "
        "metrics that cannot be true:\n" + "\n".join(lines) + "\nTheir logged metrics are "
        "inconsistent (test_correct must be a whole number from 0 to test_total, test_total at "
        "least 1, test_acc = test_correct / test_total), so nothing is analysed. Delete these "
        "runs (in the MLflow UI, or `mlflow runs delete --run-id RUN_ID` with "
        "MLFLOW_TRACKING_URI set) and re-run the sweep to train their cells again."
    )
