"""The one MLflow writer on the fusion_ray side.

Workers never talk to MLflow: they report to Tune, and the Tune callbacks on the driver
(``fusion_ray.driver.callbacks``) write, through the ``Tracker`` here, runs that follow the
schema of docs/reference/mlflow-schema.md. One run per cell; a resumed or retried cell continues
its earlier run, so a cell never has two FINISHED runs. The sweep's lease keeps its state in the same store, through
``lease_store``.

Why one module of this size: it and ``fusion_ray.driver.store_faults`` (the store's faults as the
driver meets them) are the only modules of fusion_ray that import MLflow (an architecture test
holds that), so every read and write of the tracking store is here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from fusion_ray.decide.questions import VERDICTS, quarter_accuracy
from fusion_ray.driver.store_faults import STORE_ERRORS, access_errors, inode
from fusion_ray.redact import redact, split_credentials
from fusion_ray.schema import (
    CELLS_ARTIFACT,
    CHECKPOINT_SET_ASIDE_TAG,
    CHECKPOINT_TAG,
    DECISION_COLUMNS,
    DECISION_METRIC_PREFIX,
    DECISION_TAG_PREFIX,
    DECISIONS_FILE,
    DECISIONS_TAG_PREFIX,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    FAILURE_KIND_TAG,
    FAILURE_TAG,
    LEASE_TOKEN_TAG,
    PARENT_TAG,
    RETURNED_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
    ROLE_TRIAL,
    TRAINABLE_RUN_TAG,
    decided_metric,
    returned_metrics,
)
from fusion_ray.store_errors import sqlite_file
from fusion_ray.version import git_sha

log = logging.getLogger(__name__)


class TrackedCell(Protocol):
    """What a cell's run is opened from, whichever sweep it is of (the study's
    ``config.grid.Cell``, a trainable's ``config.trainable.TrainableCell``)."""

    @property
    def run_name(self) -> str: ...

    def tags(self, sweep: str, git_sha: str) -> dict[str, str]: ...

    def params(self) -> dict[str, str]: ...


def artifact_root(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts beside a local sqlite store (``<db dir>/mlartifacts/<experiment>``), not in
    whatever directory the driver happens to run from; servers keep their own default."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    return (db.resolve().parent / "mlartifacts" / experiment).as_uri()


def _store_init_lock(tracking_uri: str) -> Any:
    """A lock beside a local sqlite store: MLflow creates and migrates its tables on first use,
    which is not safe when two processes do it at once; servers need no lock."""
    if not tracking_uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    from filelock import FileLock

    db = Path(tracking_uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock")


USERNAME_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
"""Where MLflow's client reads a tracking server's basic-auth credentials (every request)."""
RUN_LINKS_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
"""MLflow's switch for the ``View run ... at: URL`` lines its client prints when a run ends."""


def client_uri(tracking_uri: str) -> str:
    """The tracking URI as this process's MLflow client gets it: without the password.

    A ``user:password@`` in an ``http(s)`` URI moves into ``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD`` of this process (over any values there: the URI names the
    store's user), which MLflow's client sends as basic auth with every request, as it sent the
    URI's. So no client, run link, error message or pickled object holds the password, only this
    process's environment. MLflow's own ``View run`` lines are off too (the driver prints its own
    progress), unless ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` is set."""
    bare, user, password = split_credentials(tracking_uri)
    if password is not None:
        os.environ[USERNAME_ENV], os.environ[PASSWORD_ENV] = user or "", password
    os.environ.setdefault(RUN_LINKS_ENV, "true")
    return bare


@dataclass
class CellRun:
    """What MLflow already holds for a cell."""

    run_id: str
    status: str
    checkpoint_path: str | None
    has_final: bool = False
    """The run already holds the trial's final metrics (its trial ended; maybe not its run): a
    trainable's its ``metrics_returned`` tag, the study's its test accuracy."""
    score: float | None = None
    """Its final value of the sweep's decision metric, signed so that more is better (the
    study's test accuracy; a trainable's ``metric:``, negated for ``mode: min``), when logged:
    what adaptive seeds decide from."""
    parts: dict[str, float] = field(default_factory=dict)
    """Its accuracy on the shortest and longest length quarter of its test split, when logged
    (``fusion_ray.decide.questions.quarter_accuracy``)."""
    infrastructure: bool = False
    """A FAILED run whose process or node was lost (``FAILURE_KIND_TAG``): not scored."""
    seconds: float | None = None
    """How long the run ran (its start to its end), when it has ended."""


def _seconds(info: Any) -> float | None:
    """A run's duration from its MLflow run info; None while it has no end."""
    if not info.end_time or not info.start_time:
        return None
    return (info.end_time - info.start_time) / 1000.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Tracker:
    """MLflow access for one sweep: its experiment, its parent run, and one run per cell."""

    @classmethod
    def existing(cls, tracking_uri: str, sweep: str) -> Tracker | None:
        """The sweep's tracker when its store and experiment exist, else None; creates nothing
        (for looking, as ``--dry-run`` does)."""
        if tracking_uri.startswith("sqlite:///"):
            if not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
                return None
        with access_errors(tracking_uri):
            client = MlflowClient(tracking_uri=client_uri(tracking_uri))
            experiment = client.get_experiment_by_name(sweep)
        if experiment is None or experiment.lifecycle_stage == "deleted":
            return None
        return cls(tracking_uri, sweep)

    def __init__(self, tracking_uri: str, sweep: str) -> None:
        self.tracking_uri, self.sweep = client_uri(tracking_uri), sweep
        self._given_uri = tracking_uri
        self._experiment_id: str | None = None
        with access_errors(tracking_uri):
            with _store_init_lock(tracking_uri):  # the first access creates a sqlite store's tables
                self.client = MlflowClient(tracking_uri=self.tracking_uri)
                experiment = self.client.get_experiment_by_name(sweep)
            self._store_file = sqlite_file(tracking_uri)
            self._store_inode = inode(self._store_file)
            if self._store_file is not None:
                STORE_ERRORS.watch(self)
            if experiment is not None:
                if experiment.lifecycle_stage == "deleted":
                    self.client.restore_experiment(experiment.experiment_id)
                self._experiment_id = experiment.experiment_id
                if EXPERIMENT_KIND_TAG not in experiment.tags:  # made before the tag existed
                    self.client.set_experiment_tag(
                        self._experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                    )

    @property
    def experiment_id(self) -> str:
        """The sweep's experiment, made on the first write: a sweep refused before it writes
        (its trials fit no node, another driver holds it) leaves no empty experiment."""
        if self._experiment_id is None:
            with access_errors(self._given_uri):
                self._experiment_id = self._create_experiment(self.sweep, self._given_uri)
        return self._experiment_id

    def _create_experiment(self, sweep: str, tracking_uri: str) -> str:
        """Create the sweep's experiment; when another driver (a second machine, a second
        submission of the same job) created it between our read and our write, the store
        refuses ours as RESOURCE_ALREADY_EXISTS and theirs is the sweep's: use it."""
        try:
            return self.client.create_experiment(
                sweep,
                artifact_location=artifact_root(tracking_uri, sweep),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        except mlflow.exceptions.MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = self.client.get_experiment_by_name(sweep)
            if experiment is None:
                raise
            return experiment.experiment_id

    def store_problem(self) -> str | None:
        """How the tracking store is gone, when it is: a sqlite file deleted, replaced or
        emptied since this tracker opened it (its writes would go to a file no one can read
        again, or fail); None while it is there (and for servers, whose client retries)."""
        if self._store_file is None:
            return None
        if self._store_inode is None:  # not written yet when this tracker opened it
            self._store_inode = inode(self._store_file)
            return None
        if not self._store_file.exists():
            return f"the tracking store {self._store_file} disappeared"
        if inode(self._store_file) != self._store_inode:
            return f"the tracking store {self._store_file} was replaced by another file"
        if self._store_file.stat().st_size == 0:
            return f"the tracking store {self._store_file} was emptied (0 bytes)"
        return None

    # --- reading
    def trial_runs(self) -> list[Any]:
        """Every trial run of the experiment (MLflow ``Run`` entities), all pages of them."""
        if self._experiment_id is None:  # not made yet: nothing has run
            return []
        runs, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.{ROLE_TAG} = '{ROLE_TRIAL}'",
                max_results=50000,
                page_token=token,
            )
            runs += list(page)
            token = page.token
            if not token:
                return runs

    @staticmethod
    def best_runs(runs: list[Any], metric: str | None, mode: str = "max") -> dict[str, CellRun]:
        """The best run of every cell id among ``runs``: FINISHED first, else the most recent;
        ``metric`` and ``mode``: the sweep's decision metric (None: the first metric each run's
        trainable returned, ``RETURNED_TAG``)."""
        rank = {"FINISHED": 0, "RUNNING": 1, "KILLED": 2, "FAILED": 3, "SCHEDULED": 4}
        best: dict[str, CellRun] = {}
        for run in sorted(runs, key=lambda r: (rank.get(r.info.status, 9), -r.info.start_time)):
            cid = run.data.tags.get("cell_id")
            if cid and cid not in best:
                name = decided_metric(metric, returned_metrics(run.data.tags))
                value = run.data.metrics.get(name) if name else None
                # a trainable's run holds its final metrics once it has their names (they are
                # written after them); another's (the study's) once its decision metric is
                # logged, which its trials log once, at the end
                returned = RETURNED_TAG in run.data.tags
                trainable = TRAINABLE_RUN_TAG in run.data.tags
                best[cid] = CellRun(
                    run.info.run_id,
                    run.info.status,
                    run.data.tags.get(CHECKPOINT_TAG),
                    returned if trainable else value is not None,
                    None if value is None else (value if mode == "max" else -value),
                    quarter_accuracy(run.data.metrics),
                    run.data.tags.get(FAILURE_KIND_TAG) == "infrastructure",
                    _seconds(run.info),
                )
        return best

    def cell_runs(self, metric: str | None, mode: str = "max") -> dict[str, CellRun]:
        """The best existing run of every cell: FINISHED first, else the most recent one
        (``best_runs``, scored by ``metric``)."""
        return self.best_runs(self.trial_runs(), metric, mode)

    # --- the sweep's parent run
    def parent_run(
        self, sweep_file: str | None = None, params: dict[str, str] | None = None
    ) -> str:
        """The sweep's parent run (reused across invocations); it carries the sweep file (with
        any credential in it blanked out) and reports. A server that refuses the write (a user
        who may only read) is a ``StoreAccessError``."""
        with access_errors(self.tracking_uri):
            return self._parent_run(sweep_file, params)

    def _parent_run(self, sweep_file: str | None, params: dict[str, str] | None) -> str:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.{ROLE_TAG} = '{ROLE_SWEEP}'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        if runs:
            run_id = runs[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"{self.sweep} (sweep)",
                tags={ROLE_TAG: ROLE_SWEEP, "sweep": self.sweep, "git_sha": git_sha()},
            )
            run_id = run.info.run_id
        if sweep_file:
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp, Path(sweep_file).name)
                copy.write_text(redact(Path(sweep_file).read_text(encoding="utf-8")))
                self.client.log_artifact(run_id, str(copy))
        if params:  # tags, not params: they change when the sweep file grows
            tags = [RunTag(k, redact(v)) for k, v in params.items()]
            self.client.log_batch(run_id, tags=tags)
        return run_id

    def log_cells(self, parent_id: str, cell_ids: list[str]) -> None:
        """Record which cells make up the sweep now (the analysis uses only their runs)."""
        import datetime as dt

        payload = {
            "sweep": self.sweep,
            "cells": cell_ids,
            "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        with tempfile.TemporaryDirectory() as tmp, access_errors(self.tracking_uri):
            path = Path(tmp, CELLS_ARTIFACT)
            path.write_text(json.dumps(payload))
            self.client.log_artifact(parent_id, str(path))

    def log_decisions(self, parent_id: str, rows: list[dict[str, Any]]) -> None:
        """An adaptive sweep's decisions on its parent run: DECISIONS_FILE, and one tag per
        verdict (``decisions.better``, ``decisions.smaller``, ``decisions.open`` ...: every
        verdict a hypothesis of the sweep can reach, 0 where none did) with how many hypotheses
        reached it, as the console's table says them (the MLflow UI shows them)."""
        import csv
        from collections import Counter

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, DECISIONS_FILE)
            with path.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(DECISION_COLUMNS))
                writer.writeheader()
                writer.writerows(rows)
            self.client.log_artifact(parent_id, str(path))
        counts = Counter(str(r["verdict"]) for r in rows)
        kinds = {str(r.get("kind", "operator")) for r in rows}
        every = {"open", "futile", "equivalent", *counts}
        every |= {word for kind in kinds for word in VERDICTS.get(kind, {}).values()}
        tags = [RunTag(f"{DECISIONS_TAG_PREFIX}{v}", str(counts[v])) for v in sorted(every)]
        self.client.log_batch(parent_id, tags=tags)

    def log_decision_looks(
        self, parent_id: str, looks: dict[str, list[Any]], family: Sequence[str], alpha: float
    ) -> None:
        """Each hypothesis's evidence at the given looks (``fusion_ray.decide.sequential.Look``)
        as metrics of the parent run, step = seeds so far, under its short key in the family's
        order (``decision_key``; its full name and state are tags ``decision.hNN`` and
        ``decision.hNN.state``): log10 of its e-values, its family p, 1 once decided; and the
        thresholds the e-value must cross, log10(1/alpha) (the least) and log10(m/alpha)
        (always enough), beside them."""
        stamp = int(time.time() * 1000)
        index = {name: i for i, name in enumerate(family)}
        m = max(len(family), 1)
        metrics, tags, last = [], [], 0
        for name, rows in looks.items():
            key = decision_key(index[name], m)
            tags.append(RunTag(f"{DECISION_TAG_PREFIX}{key}", name[:5000]))
            for look in rows:
                values = {
                    "log10_e_value": _log10(look.e_value),
                    "log10_e_equivalent": _log10(look.e_equivalent),
                    "p_family": look.p_family,
                    "decided": float(look.state != "open"),
                }
                metrics += [
                    Metric(f"{DECISION_METRIC_PREFIX}{key}.{k}", float(v), stamp, look.seed + 1)
                    for k, v in values.items()
                    if v == v  # nan (no margin): not logged
                ]
                last = max(last, look.seed + 1)
            if rows:
                tags.append(RunTag(f"{DECISION_TAG_PREFIX}{key}.state", rows[-1].state))
        if last:
            for k, v in (("least", 1 / alpha), ("enough", m / alpha)):
                metrics.append(
                    Metric(
                        f"{DECISION_METRIC_PREFIX}log10_threshold_{k}", math.log10(v), stamp, last
                    )
                )
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(parent_id, metrics=metrics[start : start + 1000])
        for start in range(0, len(tags), 100):
            self.client.log_batch(parent_id, tags=tags[start : start + 100])

    def lease_store(self) -> LeaseStore:
        """Where the sweep's lease lives: the same tracking store."""
        return LeaseStore(self.client)

    def kill(self, run_id: str) -> bool:
        """Mark a run KILLED (its trial was interrupted; a re-run resumes it); False when the
        store could not be written."""
        try:
            self.client.set_terminated(run_id, "KILLED")
        except mlflow.exceptions.MlflowException:
            return False
        return True

    def end_parent(self, run_id: str, summary: dict[str, float]) -> None:
        self.client.log_batch(
            run_id, metrics=[Metric(k, float(v), _now_ms(), 0) for k, v in summary.items()]
        )
        self.client.set_terminated(run_id, "FINISHED")

    # --- one run per cell
    def open_cell_run(
        self, cell: TrackedCell, parent_id: str | None, existing: CellRun | None, resume: bool
    ) -> str:
        """Continue the cell's earlier run when resuming from its checkpoint, else replace it."""
        if existing is not None and existing.status != "FINISHED" and resume:
            self.client.update_run(existing.run_id, status="RUNNING")
            run = self.client.get_run(existing.run_id)
            if FAILURE_TAG in run.data.tags:
                self.client.delete_tag(existing.run_id, FAILURE_TAG)
            self.client.set_tag(existing.run_id, "git_sha", git_sha())
            return existing.run_id
        if existing is not None and existing.status != "FINISHED":
            self.client.delete_run(
                existing.run_id
            )  # restarting from scratch: replace, never duplicate
        tags = cell.tags(self.sweep, git_sha())
        if parent_id:
            tags[PARENT_TAG] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=cell.run_name, tags=tags)
        params = [Param(k, redact(v)[:6000]) for k, v in cell.params().items()]
        for chunk in _chunks(params, 100):
            self.client.log_batch(run.info.run_id, params=chunk)
        return run.info.run_id

    def last_logged_epoch(self, run_id: str, metric: str) -> int:
        """The highest step of ``metric`` a run already has (the workload's ``step_metric``;
        -1 for none), so a resumed run logs each epoch once."""
        steps = [m.step for m in self.client.get_metric_history(run_id, metric)]
        return max(steps, default=-1)

    def log_epoch(self, run_id: str, result: dict[str, Any], names: Sequence[str]) -> None:
        """An epoch's metrics: those of ``names`` in ``result``, at its ``epoch`` as the step."""
        step = int(result["epoch"])
        metrics = [Metric(k, float(result[k]), _now_ms(), step) for k in names if k in result]
        self.client.log_batch(run_id, metrics=metrics)

    def log_final(
        self,
        run_id: str,
        result: dict[str, Any],
        names: Sequence[str],
        tags: dict[str, str] | None = None,
    ) -> None:
        """The final metrics: those of ``names`` in ``result`` (step 0), after ``tags``."""
        for key, value in (tags or {}).items():
            self.client.set_tag(run_id, key, value)
        metrics = [Metric(k, float(result[k]), _now_ms(), 0) for k in names if k in result]
        self.client.log_batch(run_id, metrics=metrics)

    def log_parent_metrics(self, parent_id: str, metrics: dict[str, float]) -> None:
        """Metrics of the sweep's parent run (step 0), e.g. the study's reference baselines."""
        batch = [Metric(k, float(v), _now_ms(), 0) for k, v in metrics.items()]
        if batch:
            self.client.log_batch(parent_id, metrics=batch)

    def set_checkpoint(self, run_id: str, path: str) -> None:
        # a storage query holding a secret (secret_key=...) is not written into the tag: the
        # driver puts the sweep's own query back when it reads it (``stored_checkpoint``)
        self.client.set_tag(
            run_id, CHECKPOINT_TAG, path.split("?", 1)[0] if redact(path) != path else path
        )

    def set_checkpoint_aside(self, run_id: str, note: str) -> None:
        """Tag a run whose trial set aside the checkpoint it could not load, and why."""
        self.client.set_tag(run_id, CHECKPOINT_SET_ASIDE_TAG, redact(note)[:4900])

    def log_checkpoint_files(self, run_id: str, checkpoint_uri: str, names: Sequence[str]) -> bool:
        """Copy the files ``names`` of a checkpoint folder (``own_copy``: regular files of the
        folder itself) into the run's artifacts, those that are there; the first is required:
        False, and nothing logged, when it is missing."""
        from ray.train import Checkpoint

        with Checkpoint(checkpoint_uri).as_directory() as directory:
            with tempfile.TemporaryDirectory(prefix="fusion-ray-artifacts-") as copies:
                kept = [own_copy(Path(directory), name, Path(copies)) for name in names]
                if kept[0] is None:
                    return False
                for path in kept:
                    if path is not None:
                        self.client.log_artifact(run_id, str(path))
        return True

    def finish(self, run_id: str, lease_token: str | None = None) -> None:
        """Mark a cell's run FINISHED; ``lease_token``: the lease of the driver that finished it
        (tag ``lease_token``), written first, so a FINISHED run names its driver."""
        if lease_token is not None:
            self.client.set_tag(run_id, LEASE_TOKEN_TAG, lease_token)
        self.client.set_terminated(run_id, "FINISHED")

    def fail(
        self, run_id: str, reason: str, status: str = "FAILED", kind: str | None = None
    ) -> None:
        """End a run FAILED (or KILLED) with ``reason``; ``kind`` ("trial" or "infrastructure",
        ``FAILURE_KIND_TAG``) says whether a trial's failure counts in the decisions."""
        self.client.set_tag(run_id, FAILURE_TAG, redact(reason)[-4900:])
        if kind is not None:
            self.client.set_tag(run_id, FAILURE_KIND_TAG, kind)
        self.client.set_terminated(run_id, status)


def own_copy(directory: Path, name: str, into: Path) -> Path | None:
    """A copy in ``into`` of ``directory/name`` when that is a regular file of the checkpoint
    folder itself, after resolving links; else None, with a warning when something else is
    there. A checkpoint folder under a shared ``storage_path`` may be written by others: a link
    planted there must not make the driver upload a file of its own user's (``~/.ssh/id_rsa``)
    to the tracking server, nor a FIFO block it. The copy is what is uploaded, read through a
    descriptor that follows no link, so the file checked is the file sent."""
    path = directory / name
    if not path.exists() and not path.is_symlink():
        return None
    real = path.resolve()
    try:
        if not real.is_relative_to(directory.resolve()):
            raise OSError("a link out of the folder")
        descriptor = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        with os.fdopen(descriptor, "rb") as source:
            if stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                copy = into / name
                with copy.open("wb") as out:
                    shutil.copyfileobj(source, out)
                return copy
        why = "not a regular file"
    log.warning(
        "checkpoint %s: %s is %s; it is not uploaded (the trial writes regular files there: "
        "something else put this one)",
        redact(str(directory)),
        name,
        why,
    )
    return None


def decision_key(index: int, m: int) -> str:
    """A hypothesis's short, stable key: ``h`` and its place in the family (``h01`` ...), as
    wide as the family needs; MLflow's charts neither split nor cut it."""
    return f"h{index + 1:0{max(2, len(str(m)))}d}"


def _log10(value: float) -> float:
    """log10 of an e-value for the charts (nan stays nan; 0 is charted at -300)."""
    if value != value:
        return value
    return math.log10(value) if value > 0 else -300.0


class LeaseStore:
    """Named records with tags in the tracking store, for the sweep's lease
    (``fusion_ray.driver.lease``): MLflow registered models, which every tracking store has and every driver of the sweep
    reaches (so two drivers on two machines see the same lease)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client = client

    def create(self, name: str, tags: dict[str, str]) -> bool:
        """Create the record; False when it exists already (someone else holds it)."""
        try:
            self.client.create_registered_model(name, tags=tags)
            return True
        except mlflow.exceptions.MlflowException as exc:
            if exc.error_code == "RESOURCE_ALREADY_EXISTS":
                return False
            raise

    def tags(self, name: str) -> dict[str, str] | None:
        """The record's tags, or None when there is no record. A record read without a
        heartbeat tag (one being written, or by a writer that failed half-way) gets its
        creation time as the heartbeat: it is live for the TTL, never taken as dead at once."""
        try:
            record = self.client.get_registered_model(name)
            tags = dict(record.tags)
            tags.setdefault("heartbeat", repr((record.creation_timestamp or 0) / 1000))
            return tags
        except mlflow.exceptions.MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def set_tag(self, name: str, key: str, value: str) -> None:
        self.client.set_registered_model_tag(name, key, value)

    def delete(self, name: str) -> None:
        """Delete the record (nothing when it is already gone)."""
        with contextlib.suppress(mlflow.exceptions.MlflowException):
            self.client.delete_registered_model(name)


def log_report_artifacts(tracker: Tracker, parent_id: str, directory: str) -> None:
    """Attach a report directory to the sweep's parent run."""
    tracker.client.log_artifacts(parent_id, directory, artifact_path="report")
