"""MLflow -> a tidy frame of trial runs, and the seed pairing of operators against a baseline.

This module reads only the MLflow schema written down in DESIGN.md (and the precisions agreed
with the sweep side, repeated in the README's Analysis section); it never imports fusion_ray,
so it can analyse runs logged by anything that follows the schema.

Loading fetches all runs of the experiment with a few large ``search_runs`` pages (never one
client call per run). Pairing matches, inside each (dataset, position, attention position),
every operator's FINISHED run of a seed with the baseline's FINISHED run of the same seed, and
refuses to pair runs whose configs differ in anything but the operator.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: Tags every trial run carries.
TRIAL_TAGS = (
    "cell_id",
    "dataset",
    "position",
    "attention_position",
    "fusion",
    "seed",
    "sweep",
    "git_sha",
)
#: Final (step-less) metrics of a trial run.
FINAL_METRICS = (
    "test_acc",
    "best_val_acc",
    "best_epoch",
    "test_correct",
    "test_total",
    "latency_ms_per_sample",
    "num_params",
    "train_seconds",
)
#: Per-epoch metrics (step = epoch); search_runs returns their last value.
EPOCH_METRICS = ("train_loss", "val_loss", "val_acc")
#: A comparison is made inside each combination of these tags.
GROUP_KEYS = ("dataset", "position", "attention_position")
#: Params that define the operator; the only ones allowed to differ inside a pair.
OPERATOR_PARAM = "model.fusion"
OPERATOR_KWARGS_PREFIX = "model.fusion_kwargs."
PARAM_PREFIX = "params."
FINISHED = "FINISHED"
ROLE_TAG = "role"
PARENT_TAG = "mlflow.parentRunId"
PAGE_SIZE = 50_000  # the largest page MLflow's stores accept


class AnalysisError(ValueError):
    """A problem with the logged runs that a user can fix; the message says how."""


class ExperimentNotFoundError(AnalysisError):
    """No experiment of that name at that tracking URI."""


class EmptyExperimentError(AnalysisError):
    """The experiment exists but holds no FINISHED trial runs."""


class PairingError(AnalysisError):
    """Runs that would be paired differ in something other than the operator."""


@dataclass
class Experiment:
    """The trial runs of one experiment (every status), its sweep parent run, and where from."""

    name: str
    experiment_id: str
    tracking_uri: str
    runs: pd.DataFrame
    """One row per trial run: run info, the tags (tag ``fusion`` as column ``operator``), the
    final metrics and every param as a ``params.<name>`` column (strings, as MLflow stores them)."""
    parent_run_id: str | None = None
    parent_tags: dict[str, str] = field(default_factory=dict)
    """Tags of the sweep parent run (the sweep writes e.g. ``cells``, the grid's size)."""
    notes: list[str] = field(default_factory=list)
    """What the loader noticed (runs without a role tag, several parent runs, ...)."""

    @property
    def finished(self) -> pd.DataFrame:
        """The FINISHED trial runs, the only ones analysed."""
        return self.runs[self.runs["status"] == FINISHED]


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
            "role": data.tags.get(ROLE_TAG),
            "parent_run_id": data.tags.get(PARENT_TAG),
        }
        for tag in TRIAL_TAGS:
            row["operator" if tag == "fusion" else tag] = data.tags.get(tag)
        metrics = data.metrics
        for name in FINAL_METRICS + EPOCH_METRICS:
            row[name] = metrics.get(name, math.nan)
        for name, value in data.params.items():
            row[PARAM_PREFIX + name] = value
        rows.append(row)
    return _tidy(pd.DataFrame(rows))


_BASE_COLS = ["run_id", "run_name", "status", "start_time", "end_time", "artifact_uri"]
_BASE_COLS += ["role", "parent_run_id", "operator"]
_BASE_COLS += [t for t in TRIAL_TAGS if t != "fusion"] + list(FINAL_METRICS + EPOCH_METRICS)


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes shared by both loading paths."""
    base_cols = _BASE_COLS
    df = df.copy()
    for col in base_cols:
        if col not in df:
            df[col] = None
    params = sorted(c for c in df.columns if c.startswith(PARAM_PREFIX))
    df = df[base_cols + params]
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    for col in ("test_correct", "test_total", "best_epoch", "num_params"):
        df[col] = pd.to_numeric(df[col], errors="coerce").round().astype("Int64")
    for col in FINAL_METRICS + EPOCH_METRICS:
        if col not in ("test_correct", "test_total", "best_epoch", "num_params"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("start_time", "end_time"):
        df[col] = pd.to_datetime(pd.to_numeric(df[col], errors="coerce"), unit="ms", utc=True)
    for col in ["run_id", "run_name", "status", "artifact_uri", "role", "parent_run_id"]:
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df.sort_values("run_id", kind="stable").reset_index(drop=True)


def _is_sqlite(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


def _frame_from_sql(uri: str, experiment_id: str) -> pd.DataFrame:
    """The same frame as search_runs gives, read with a handful of SQL queries.

    It goes through MLflow's own table definitions (``mlflow.store.tracking.dbmodels``) with
    SQLAlchemy Core, which skips the ORM objects that make ``search_runs`` spend ~2 ms per run;
    10,000 runs load in seconds instead of tens of seconds. Only for sqlite stores; any
    mismatch with the installed MLflow's tables makes the caller fall back to ``search_runs``.
    """
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
    wanted_tags = [*TRIAL_TAGS, ROLE_TAG, PARENT_TAG, "mlflow.runName"]
    info_q = sa.select(
        runs_t.c.run_uuid,
        runs_t.c.name,
        runs_t.c.status,
        runs_t.c.start_time,
        runs_t.c.end_time,
        runs_t.c.artifact_uri,
    ).where(active)
    tags_q = sa.select(tags_t.c.run_uuid, tags_t.c.key, tags_t.c.value).where(
        tags_t.c.run_uuid.in_(ids), tags_t.c.key.in_(wanted_tags)
    )
    params_q = sa.select(params_t.c.run_uuid, params_t.c.key, params_t.c.value).where(
        params_t.c.run_uuid.in_(ids)
    )
    metrics_q = sa.select(
        metrics_t.c.run_uuid, metrics_t.c.key, metrics_t.c.value, metrics_t.c.is_nan
    ).where(
        metrics_t.c.run_uuid.in_(ids),
        metrics_t.c.key.in_([*FINAL_METRICS, *EPOCH_METRICS]),
    )

    engine = sa.create_engine(uri, poolclass=sa.pool.NullPool)

    def fetch(cursor: Any, query: Any, columns: list[str]) -> pd.DataFrame:
        # plain DB-API tuples: SQLAlchemy Row objects cost more than the query itself
        sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        cursor.execute(sql)
        return pd.DataFrame.from_records(cursor.fetchall(), columns=columns)

    long = ["run_id", "key", "value"]
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        info = fetch(cursor, info_q, [*_BASE_COLS[:6]])
        tags = fetch(cursor, tags_q, long)
        params = fetch(cursor, params_q, long)
        metrics = fetch(cursor, metrics_q, [*long, "is_nan"])
        cursor.close()
    finally:
        raw.close()
        engine.dispose()
    frame = info.set_index("run_id")

    def wide(long: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
        if long.empty:
            return pd.DataFrame(index=frame.index)
        out = long.pivot(index="run_id", columns="key", values="value")
        out.columns = [prefix + str(c) for c in out.columns]
        return out.reindex(frame.index)

    tag_wide = wide(tags)
    for key in wanted_tags:
        if key not in tag_wide:
            tag_wide[key] = None
    missing_name = frame["run_name"].isna() | (frame["run_name"] == "")
    frame.loc[missing_name, "run_name"] = tag_wide.loc[missing_name, "mlflow.runName"]
    frame["role"] = tag_wide[ROLE_TAG]
    frame["parent_run_id"] = tag_wide[PARENT_TAG]
    for tag in TRIAL_TAGS:
        frame["operator" if tag == "fusion" else tag] = tag_wide[tag]
    if not metrics.empty:
        metrics["value"] = metrics["value"].astype("float64").where(~metrics["is_nan"].astype(bool))
    metric_wide = wide(metrics.drop(columns="is_nan"))
    for name in FINAL_METRICS + EPOCH_METRICS:
        frame[name] = metric_wide[name] if name in metric_wide else math.nan
    frame = pd.concat([frame, wide(params, PARAM_PREFIX)], axis=1)
    return _tidy(frame.reset_index())


def load_experiment(
    name: str, tracking_uri: str | None = None, *, method: str = "auto"
) -> Experiment:
    """Load the trial runs of experiment ``name`` (every status) and find its sweep parent run.

    ``method``: "search_runs" pages through ``MlflowClient.search_runs`` (any store);
    "sql" reads a sqlite store's tables through MLflow's table definitions (fast);
    "auto" (default) uses "sql" for sqlite URIs, falling back to "search_runs" on any error.

    Raises ExperimentNotFoundError (listing the experiments that do exist) for an unknown name,
    and EmptyExperimentError when it holds no FINISHED trial run.
    """
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None or exp.lifecycle_stage != "active":
        available = _available_experiments(client)
        shown = ", ".join(repr(n) for n in available) if available else "(none)"
        state = "" if exp is None else f" (it is {exp.lifecycle_stage})"
        raise ExperimentNotFoundError(
            f"experiment {name!r} not found{state} at tracking URI {uri!r}. Available "
            f"experiments: {shown}. Pass the sweep's name with --experiment and the store "
            "the sweep logged to with --tracking-uri (or MLFLOW_TRACKING_URI)."
        )
    notes: list[str] = []
    all_runs = None
    if method not in ("auto", "sql", "search_runs"):
        raise ValueError(f"method must be 'auto', 'sql' or 'search_runs', not {method!r}")
    if method == "sql" or (method == "auto" and _is_sqlite(uri)):
        try:
            all_runs = _frame_from_sql(uri, exp.experiment_id)
        except Exception as err:  # noqa: BLE001 - any mismatch: fall back to the public API
            if method == "sql":
                raise
            notes.append(f"fast sqlite loading failed ({err!r}); used search_runs instead.")
    if all_runs is None:
        all_runs = _frame_from_entities(_search_all(client, exp.experiment_id))

    role = all_runs["role"]
    legacy = role.isna() & all_runs["operator"].notna() & all_runs["seed"].notna()
    if legacy.any():
        notes.append(
            f"{int(legacy.sum())} run(s) have no `role` tag but carry `fusion` and `seed`; "
            "they are treated as trial runs."
        )
    trials = all_runs[(role == "trial") | legacy].reset_index(drop=True)
    parents = all_runs[role == "sweep"]

    parent_id: str | None = None
    if len(parents) == 1:
        parent_id = str(parents["run_id"].iloc[0])
    elif len(parents) > 1:
        children = trials["parent_run_id"].value_counts()
        ranked = parents.assign(children=parents["run_id"].map(children).fillna(0))
        ranked = ranked.sort_values(["children", "start_time"], ascending=False)
        parent_id = str(ranked["run_id"].iloc[0])
        notes.append(
            f"{len(parents)} runs carry role=sweep; the report is logged to {parent_id}, the "
            "parent of most trial runs (latest on a tie)."
        )
    else:
        notes.append(
            "no sweep parent run (tag role=sweep) in this experiment: the report is written "
            "to disk only, not logged to MLflow."
        )

    parent_tags = dict(client.get_run(parent_id).data.tags) if parent_id else {}
    n_finished = int((trials["status"] == FINISHED).sum())
    if n_finished == 0:
        if len(trials):
            counts = trials["status"].value_counts().to_dict()
            found = ", ".join(f"{v} {k}" for k, v in counts.items())
            detail = f"its {len(trials)} trial run(s) are {found}"
        elif len(all_runs):
            detail = (
                f"it has {len(all_runs)} run(s) but none is a trial run (tag role=trial, or "
                "tags fusion and seed)"
            )
        else:
            detail = "it has no runs"
        raise EmptyExperimentError(
            f"experiment {name!r} at tracking URI {uri!r} has no FINISHED trial runs to "
            f"analyse: {detail}. Run the sweep (or wait for its first trials) and try again."
        )
    return Experiment(
        name=name,
        experiment_id=exp.experiment_id,
        tracking_uri=uri,
        runs=trials,
        parent_run_id=parent_id,
        parent_tags=parent_tags,
        notes=notes,
    )


# ----------------------------------------------------------------------------- pairing


def is_operator_param(name: str) -> bool:
    """True for the params that define the operator (allowed to differ inside a pair):
    ``model.fusion``, ``model.fusion_kwargs.*``, and ``model.fusion_kwargs`` itself, which a
    flattened config keeps as ``{}`` for an operator without options."""
    return (
        name == OPERATOR_PARAM
        or name == OPERATOR_KWARGS_PREFIX.rstrip(".")
        or name.startswith(OPERATOR_KWARGS_PREFIX)
    )


@dataclass
class Pairing:
    """Operators matched with the baseline by seed, inside each group, plus what could not be."""

    baseline: str
    keys: tuple[str, ...]
    """Columns that define a group: dataset, position, attention_position, then ``by`` params."""
    runs: pd.DataFrame
    """The FINISHED, unambiguous trial runs (duplicate cells removed), with the key columns."""
    pairs: pd.DataFrame
    """One row per (group, operator, seed) with both runs FINISHED: run ids, correct counts,
    test totals and accuracies of the operator and of the baseline."""
    incomplete: pd.DataFrame
    """One row per (group, seed) block missing operators that the group has elsewhere."""
    duplicates: pd.DataFrame
    """One row per cell with several FINISHED runs; those runs are left out."""
    no_baseline: pd.DataFrame
    """Groups without any FINISHED baseline run: their operators cannot be compared."""
    excluded: pd.DataFrame
    """FINISHED trial runs that lack a tag or metric the analysis needs."""
    notes: list[str] = field(default_factory=list)


def _fmt_group(row: Any, keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={row[k]}" for k in keys)


def _key_columns(runs: pd.DataFrame, by: Sequence[str]) -> tuple[pd.DataFrame, tuple[str, ...]]:
    out = runs.copy()
    keys = list(GROUP_KEYS)
    for name in by:
        col = PARAM_PREFIX + name
        if col not in out:
            raise AnalysisError(
                f"--by {name!r}: no run has param {name!r}; params look like "
                + ", ".join(
                    sorted(c[len(PARAM_PREFIX) :] for c in out if c.startswith(PARAM_PREFIX))[:8]
                )
            )
        out[name] = out[col].fillna("None")
        keys.append(name)
    return out, tuple(keys)


def pair_runs(
    runs: pd.DataFrame,
    baseline: str = "add",
    *,
    by: Sequence[str] = (),
    ignore_params: Iterable[str] = (),
) -> Pairing:
    """Match every operator's FINISHED runs with the baseline's by seed, inside each group.

    ``runs`` is ``Experiment.runs`` (any status; only FINISHED ones are paired, the others only
    explain what is missing). ``by`` adds params to the group key, for sweeps that vary a
    hyperparameter. ``ignore_params`` names params that may differ inside a pair (e.g. a cache
    directory). Raises PairingError listing every pair whose configs differ in anything but
    ``model.fusion`` and ``model.fusion_kwargs.*``.
    """
    runs, keys = _key_columns(runs, by)
    cell = [*keys, "operator", "seed"]
    finished = runs[runs["status"] == FINISHED]
    needed = [*GROUP_KEYS, "operator", "seed", "test_correct", "test_total"]
    bad = finished[needed].isna().any(axis=1) | (finished["test_total"] <= 0).fillna(True)
    excluded = finished.loc[bad, ["run_id", "run_name", *needed]].copy()
    if len(excluded):
        excluded["missing"] = [
            ", ".join(c for c in needed if pd.isna(r[c])) or "test_total <= 0"
            for _, r in excluded.iterrows()
        ]
    ok = finished[~bad]

    # duplicate cells: several FINISHED runs of one (group, operator, seed); none is used
    sizes = ok.groupby(cell, sort=False, dropna=False)["run_id"].transform("size")
    dup_rows = ok[sizes > 1]
    dup_records = []
    for key, grp in dup_rows.groupby(cell, sort=True):
        params = [c for c in grp.columns if c.startswith(PARAM_PREFIX)]
        differing = [
            c[len(PARAM_PREFIX) :]
            for c in params
            if grp[c].fillna("\0").nunique() > 1 and not is_operator_param(c[len(PARAM_PREFIX) :])
        ]
        dup_records.append(
            {
                **dict(zip(cell, key, strict=True)),
                "run_ids": ", ".join(grp["run_id"]),
                "cell_ids": ", ".join(sorted(set(grp["cell_id"].fillna("?")))),
                "differing_params": ", ".join(differing),
            }
        )
    duplicates = pd.DataFrame(
        dup_records, columns=[*cell, "run_ids", "cell_ids", "differing_params"]
    )
    clean = ok[sizes == 1]

    # incomplete blocks: a (group, seed) seen in any run (any status) that lacks a FINISHED,
    # unambiguous run of an operator the group has
    unfinished = runs[runs["status"] != FINISHED]
    by_status = unfinished.groupby(cell, dropna=False)["status"].agg(
        lambda s: "/".join(sorted(set(s)))
    )
    dup_cells = set(duplicates[cell].itertuples(index=False, name=None))
    known = runs.dropna(subset=[*keys, "operator", "seed"])
    group_ops: dict[tuple, set] = {}
    group_seeds: dict[tuple, set] = {}
    for *gkey, op, seed in known[[*keys, "operator", "seed"]].itertuples(index=False, name=None):
        group_ops.setdefault(tuple(gkey), set()).add(op)
        group_seeds.setdefault(tuple(gkey), set()).add(int(seed))
    present: dict[tuple, set] = {}
    for *gkey, op, seed in clean[[*keys, "operator", "seed"]].itertuples(index=False, name=None):
        present.setdefault((*gkey, int(seed)), set()).add(op)
    incomplete_records = []
    for gkey in sorted(group_ops, key=lambda k: tuple(map(str, k))):
        for seed in sorted(group_seeds[gkey]):
            have = present.get((*gkey, seed), set())
            described = []
            for op in sorted(group_ops[gkey] - have):
                if (*gkey, op, seed) in dup_cells:
                    described.append(f"{op} (duplicate runs)")
                else:
                    status = by_status.get((*gkey, op, seed))
                    described.append(f"{op} ({status})" if status else f"{op} (no run)")
            if described:
                incomplete_records.append(
                    {
                        **dict(zip(keys, gkey, strict=True)),
                        "seed": seed,
                        "present": ", ".join(sorted(have)),
                        "missing": ", ".join(described),
                    }
                )
    incomplete = pd.DataFrame(incomplete_records, columns=[*keys, "seed", "present", "missing"])

    # pairs
    base = clean[clean["operator"] == baseline]
    others = clean[clean["operator"] != baseline]
    groups_with_ops = others[list(keys)].drop_duplicates()
    groups_with_base = base[list(keys)].drop_duplicates()
    no_baseline = groups_with_ops.merge(groups_with_base, how="left", indicator=True)
    no_baseline = no_baseline[no_baseline["_merge"] == "left_only"].drop(columns="_merge")
    no_baseline = no_baseline.reset_index(drop=True)

    param_cols = [
        c
        for c in clean.columns
        if c.startswith(PARAM_PREFIX)
        and not is_operator_param(c[len(PARAM_PREFIX) :])
        and c[len(PARAM_PREFIX) :] not in set(ignore_params)
    ]
    value_cols = ["run_id", "test_correct", "test_total", "test_acc", "artifact_uri"]
    merged = others[[*keys, "operator", "seed", *value_cols, *param_cols]].merge(
        base[[*keys, "seed", *value_cols, *param_cols]],
        on=[*keys, "seed"],
        suffixes=("", "_base"),
        how="inner",
    )
    _check_params(merged, keys, baseline, param_cols)
    pairs = merged[[*keys, "operator", "seed"]].copy()
    pairs.insert(len(keys) + 1, "baseline", baseline)
    for col in value_cols:
        pairs[col] = merged[col].to_numpy()
        pairs[f"baseline_{col}"] = merged[f"{col}_base"].to_numpy()
    pairs = pairs.rename(
        columns={"test_correct": "correct", "baseline_test_correct": "baseline_correct"}
    )
    pairs = pairs.sort_values([*keys, "operator", "seed"], kind="stable").reset_index(drop=True)

    notes = []
    if baseline not in set(clean["operator"]):
        present = ", ".join(sorted(set(clean["operator"])))
        notes.append(
            f"baseline {baseline!r} has no FINISHED run; operators present: {present}. "
            "Choose one with --baseline."
        )
    return Pairing(
        baseline=baseline,
        keys=keys,
        runs=clean.reset_index(drop=True),
        pairs=pairs,
        incomplete=incomplete,
        duplicates=duplicates,
        no_baseline=no_baseline,
        excluded=excluded.reset_index(drop=True),
        notes=notes,
    )


def _check_params(
    merged: pd.DataFrame, keys: Sequence[str], baseline: str, param_cols: Sequence[str]
) -> None:
    """Raise PairingError naming every pair whose non-operator params (or test set) differ."""
    if merged.empty:
        return
    problems: dict[int, list[str]] = {}
    for col in param_cols:
        a = merged[col].to_numpy(dtype=object)
        b = merged[f"{col}_base"].to_numpy(dtype=object)
        a_na, b_na = pd.isna(a), pd.isna(b)
        differ = np.where(a_na | b_na, a_na != b_na, a != b)
        for i in np.flatnonzero(differ):
            shown_a = "<absent>" if a_na[i] else repr(a[i])
            shown_b = "<absent>" if b_na[i] else repr(b[i])
            problems.setdefault(int(i), []).append(
                f"{col[len(PARAM_PREFIX) :]}: {shown_a} vs {shown_b}"
            )
    totals = merged["test_total"].to_numpy() != merged["test_total_base"].to_numpy()
    for i in np.flatnonzero(totals):
        problems.setdefault(int(i), []).append(
            f"test_total: {merged['test_total'].iloc[i]} vs {merged['test_total_base'].iloc[i]}"
        )
    if not problems:
        return
    lines = []
    for i, diffs in sorted(problems.items()):
        row = merged.iloc[i]
        lines.append(
            f"  {_fmt_group(row, keys)}, seed={row['seed']}: {row['operator']} (run "
            f"{row['run_id']}) vs {baseline} (run {row['run_id_base']}) differ in "
            + "; ".join(diffs)
        )
    names = sorted({d.split(":")[0] for ds in problems.values() for d in ds})
    shown = lines[:25] + ([f"  ... and {len(lines) - 25} more"] if len(lines) > 25 else [])
    raise PairingError(
        f"{len(lines)} seed pair(s) differ in more than the operator (only model.fusion and "
        "model.fusion_kwargs.* may differ), so they cannot be paired:\n"
        + "\n".join(shown)
        + f"\nDiffering params: {', '.join(names)}. If the sweep varies one of them on purpose, "
        "pass it with --by so each value is compared separately; if it cannot change results "
        "(e.g. a cache path), pass --ignore-param NAME."
    )
