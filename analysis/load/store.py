"""``load_experiment``: every run of an experiment from its tracking store, with a few large
``search_runs`` pages (never one client call per run) or, for a sqlite store, a handful of SQL
queries over MLflow's own tables; the sweep's cells and parent run chosen, metrics checked.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load.artifacts import read_logged_decisions, read_sweep_cells, split_sweep_cells
from analysis.load.checks import check_metrics
from analysis.load.frame import (
    BASE_COLUMNS,
    FINISHED,
    INFO_COLUMNS,
    LOAD_METHODS,
    METRICS,
    OPTIONAL_COLUMNS,
    OPTIONAL_METRICS,
    OPTIONAL_TAGS,
    PAGE_SIZE,
    PARAM_PREFIX,
    RUN_NAME_TAG,
    EmptyExperimentError,
    Experiment,
    ExperimentNotFoundError,
    axis_key,
    axis_levels,
    eval_length_metrics,
    integer_counts,
    tag_column,
)
from fusion_ray.schema import (
    AXIS_TAG_PREFIX,
    EVAL_LENGTH_METRIC_PREFIXES,
    GRID_AXES_TAG,
    PARENT_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
    ROLE_TRIAL,
    TRIAL_TAGS,
)
from fusion_ray.store_errors import StoreAccessError, access_error, each_request_once

FIRST_CONTACT_S = 10
"""Seconds the report waits for a tracking server's answer to its first request, sent once:
a server that is down is one message in seconds, not after MLflow's retries (about 4 minutes).
Once the server has answered, every later request gets MLflow's retries."""


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


def _is_sqlite(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


def _is_http(uri: str) -> bool:
    return uri.split(":", 1)[0].lower() in ("http", "https")


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
    first_contact = (
        each_request_once(FIRST_CONTACT_S) if _is_http(uri) else contextlib.nullcontext()
    )
    with store_access(uri), first_contact:
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
        decisions=read_logged_decisions(client, parent) if parent is not None else None,
        other_runs=integer_counts(other),
        axis_levels=axis_levels(runs, parent_tags.get(GRID_AXES_TAG), notes),
    )


def _require_store(uri: str) -> None:
    """A sqlite store that does not exist is a mistyped path: say so instead of letting MLflow
    create an empty database there; a file that is not a database is said to be one."""
    if _is_sqlite(uri) and "///" in uri:
        path = Path(uri.split("///", 1)[1])
        if not path.is_file():
            raise ExperimentNotFoundError(
                f"no MLflow store at {path} (tracking URI {uri!r}); pass the store the sweep "
                "logged to with --tracking-uri (or MLFLOW_TRACKING_URI)"
            )
        try:
            with path.open("rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise StoreAccessError("store", f"{path} cannot be read ({exc.strerror})") from None
        if head and head != b"SQLite format 3\x00":
            raise StoreAccessError(
                "store",
                f"{path} is not an SQLite database (it begins with {head!r}); pass the store "
                "the sweep logged to with --tracking-uri (or MLFLOW_TRACKING_URI)",
            )


def access_problem(exc: BaseException, uri: str) -> StoreAccessError | None:
    """What an error of MLflow on first contact says about reaching the store, worded for the
    report by the table every command shares (``fusion_ray.store_errors.FAULTS``); None:
    something else."""
    return access_error(exc, uri, "report", FIRST_CONTACT_S)


@contextlib.contextmanager
def store_access(uri: str) -> Iterator[None]:
    """MLflow's errors on first contact with the store as ``StoreAccessError`` where they mean
    that it refused, did not answer or is no store; anything else as it was."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except (MlflowException, SQLAlchemyError) as exc:
        problem = access_problem(exc, uri)
        if problem is None:
            raise
        raise problem from None


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
