"""The one MLflow writer on the fusion_ray side: a Ray Tune callback on the sweep driver.

Workers never talk to MLflow: they report to Tune, and this callback, running in the driver,
writes runs that follow the schema in DESIGN.md. One run per cell; a resumed or retried cell
continues its earlier run, so a cell never has two FINISHED runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from fusion_ray.orchestrate import TRIAL_ERROR
from fusion_ray.schema import (
    CELLS_ARTIFACT,
    CHECKPOINT_TAG,
    DECISION_COLUMNS,
    DECISIONS_FILE,
    DECISIONS_TAG_PREFIX,
    EPOCH_METRICS,
    EVAL_LENGTH_METRIC_PREFIXES,
    FAILURE_TAG,
    FINAL_METRICS,
    GATES_FILE,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    LENGTH_PREDICTIONS_FILE,
    PARENT_TAG,
    PREDICTIONS_FILE,
    ROLE_SWEEP,
    ROLE_TAG,
    ROLE_TRIAL,
)

if TYPE_CHECKING:
    from fusion_ray.grid import Cell

log = logging.getLogger(__name__)


def git_sha() -> str:
    """The commit of the checkout this package runs from (with ``+dirty`` if modified), else
    $FUSION_RAY_GIT_SHA (for installs without git metadata), else ``unknown``."""

    def git(*args: str) -> str:
        here = Path(__file__).resolve().parent
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=10, cwd=here
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FUSION_RAY_GIT_SHA", "unknown")


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


@dataclass
class CellRun:
    """What MLflow already holds for a cell."""

    run_id: str
    status: str
    checkpoint_path: str | None
    has_final: bool = False
    """The run already holds the trial's final metrics (its trial ended; maybe not its run)."""
    test_acc: float | None = None
    """Its final test accuracy, when logged (what adaptive seeds decide from)."""


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
        experiment = MlflowClient(tracking_uri=tracking_uri).get_experiment_by_name(sweep)
        if experiment is None or experiment.lifecycle_stage == "deleted":
            return None
        return cls(tracking_uri, sweep)

    def __init__(self, tracking_uri: str, sweep: str) -> None:
        self.tracking_uri, self.sweep = tracking_uri, sweep
        with _store_init_lock(tracking_uri):  # the first access creates a sqlite store's tables
            self.client = MlflowClient(tracking_uri=tracking_uri)
            experiment = self.client.get_experiment_by_name(sweep)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(
                sweep, artifact_location=artifact_root(tracking_uri, sweep)
            )
        else:
            if experiment.lifecycle_stage == "deleted":
                self.client.restore_experiment(experiment.experiment_id)
            self.experiment_id = experiment.experiment_id

    # --- reading
    def trial_runs(self) -> list[Any]:
        """Every trial run of the experiment (MLflow ``Run`` entities), all pages of them."""
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
    def best_runs(runs: list[Any]) -> dict[str, CellRun]:
        """The best run of every cell id among ``runs``: FINISHED first, else the most recent."""
        rank = {"FINISHED": 0, "RUNNING": 1, "KILLED": 2, "FAILED": 3, "SCHEDULED": 4}
        best: dict[str, CellRun] = {}
        for run in sorted(runs, key=lambda r: (rank.get(r.info.status, 9), -r.info.start_time)):
            cid = run.data.tags.get("cell_id")
            if cid and cid not in best:
                best[cid] = CellRun(
                    run.info.run_id,
                    run.info.status,
                    run.data.tags.get(CHECKPOINT_TAG),
                    "test_acc" in run.data.metrics,
                    run.data.metrics.get("test_acc"),
                )
        return best

    def cell_runs(self) -> dict[str, CellRun]:
        """The best existing run of every cell: FINISHED first, else the most recent one."""
        return self.best_runs(self.trial_runs())

    # --- the sweep's parent run
    def parent_run(
        self, sweep_file: str | None = None, params: dict[str, str] | None = None
    ) -> str:
        """The sweep's parent run (reused across invocations); it carries the sweep file and reports."""
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
            self.client.log_artifact(run_id, sweep_file)
        if params:  # tags, not params: they change when the sweep file grows
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in params.items()])
        return run_id

    def log_cells(self, parent_id: str, cell_ids: list[str]) -> None:
        """Record which cells make up the sweep now (the analysis uses only their runs)."""
        import datetime as dt
        import json
        import tempfile

        payload = {
            "sweep": self.sweep,
            "cells": cell_ids,
            "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, CELLS_ARTIFACT)
            path.write_text(json.dumps(payload))
            self.client.log_artifact(parent_id, str(path))

    def log_decisions(self, parent_id: str, rows: list[dict[str, Any]]) -> None:
        """An adaptive sweep's decisions on its parent run: DECISIONS_FILE, and one tag per
        state with how many comparisons are in it (the MLflow UI shows them)."""
        import csv
        import tempfile
        from collections import Counter

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, DECISIONS_FILE)
            with path.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(DECISION_COLUMNS))
                writer.writeheader()
                writer.writerows(rows)
            self.client.log_artifact(parent_id, str(path))
        counts = Counter(str(r["state"]) for r in rows)
        tags = [RunTag(f"{DECISIONS_TAG_PREFIX}{state}", str(counts[state])) for state in counts]
        self.client.log_batch(parent_id, tags=tags)

    def end_parent(self, run_id: str, summary: dict[str, float]) -> None:
        self.client.log_batch(
            run_id, metrics=[Metric(k, float(v), _now_ms(), 0) for k, v in summary.items()]
        )
        self.client.set_terminated(run_id, "FINISHED")

    # --- one run per cell
    def open_cell_run(
        self, cell: Cell, parent_id: str | None, existing: CellRun | None, resume: bool
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
        name = f"{cell.label}/seed{cell.seed}"
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        params = [Param(k, v[:6000]) for k, v in cell.params().items()]
        for chunk in _chunks(params, 100):
            self.client.log_batch(run.info.run_id, params=chunk)
        return run.info.run_id

    def last_logged_epoch(self, run_id: str) -> int:
        """The highest epoch a run already has (-1 for none), so a resumed run logs each epoch once."""
        return max((m.step for m in self.client.get_metric_history(run_id, "val_acc")), default=-1)

    def log_epoch(self, run_id: str, result: dict[str, Any]) -> None:
        step = int(result["epoch"])
        metrics = [
            Metric(k, float(result[k]), _now_ms(), step) for k in EPOCH_METRICS if k in result
        ]
        self.client.log_batch(run_id, metrics=metrics)

    def log_final(self, run_id: str, result: dict[str, Any]) -> None:
        names = (*FINAL_METRICS, *INIT_METRICS, LATENCY_RATIO_METRIC)
        names += tuple(k for k in result if k.startswith(EVAL_LENGTH_METRIC_PREFIXES))
        metrics = [Metric(k, float(result[k]), _now_ms(), 0) for k in names if k in result]
        self.client.log_batch(run_id, metrics=metrics)

    def set_checkpoint(self, run_id: str, path: str) -> None:
        self.client.set_tag(run_id, CHECKPOINT_TAG, path)

    def log_predictions(self, run_id: str, checkpoint_uri: str) -> bool:
        """Copy ``test_predictions.parquet`` from the final checkpoint into the run's artifacts,
        and beside it ``gate_by_position.parquet`` (the loop writes it for gated operators only)
        and ``test_predictions_by_length.parquet`` (with data.eval_lengths only) when the
        checkpoint has them; False when the predictions are missing."""
        from ray.train import Checkpoint

        with Checkpoint(checkpoint_uri).as_directory() as directory:
            path = Path(directory, PREDICTIONS_FILE)
            if not path.exists():
                return False
            self.client.log_artifact(run_id, str(path))
            for name in (GATES_FILE, LENGTH_PREDICTIONS_FILE):
                if Path(directory, name).exists():
                    self.client.log_artifact(run_id, str(Path(directory, name)))
        return True

    def finish(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "FINISHED")

    def fail(self, run_id: str, reason: str, status: str = "FAILED") -> None:
        self.client.set_tag(run_id, FAILURE_TAG, reason[-4900:])
        self.client.set_terminated(run_id, status)


def _uri(path: str, storage_path: str) -> str:
    """A checkpoint path as a URI that ``ray.train.Checkpoint`` can open later (scheme and query,
    e.g. ``?endpoint_override=`` for MinIO, taken from the storage path)."""
    if "://" in path or "://" not in storage_path:
        return path
    parsed = urlparse(storage_path)
    return f"{parsed.scheme}://{path}" + (f"?{parsed.query}" if parsed.query else "")


def checkpoint_exists(uri: str) -> bool:
    """Whether a checkpoint directory (local path or URI) is still there."""
    import pyarrow.fs

    try:
        if "://" not in uri:
            return Path(uri).is_dir()
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        return fs.get_file_info(path).type == pyarrow.fs.FileType.Directory
    except (OSError, ValueError):
        return False


def trial_error_text(trial: Any) -> str:
    """The end of a failed Tune trial's traceback, for the run's failure_reason tag."""
    try:
        error_file = trial.error_file
        if error_file and Path(error_file).exists():
            text = Path(error_file).read_text().strip().splitlines()
            return "\n".join(text[-15:])
    except OSError:
        pass
    return "the trial raised an error; see the Ray Tune logs"


_HOOKS = (
    "on_trial_start",
    "on_trial_result",
    "on_checkpoint",
    "on_trial_complete",
    "on_trial_error",
)


def _guarded(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def wrapper(
        self: TrackingCallback, iteration: int, trials: list, trial: Any, *args: Any, **info: Any
    ) -> None:
        try:
            method(self, iteration, trials, trial, *args, **info)
        except Exception as exc:  # noqa: BLE001 - recorded on the trial's run, and Tune goes on
            self.tracking_failed(trial, method.__name__, exc)

    return wrapper


class TrackingCallback(Callback):
    """A Ray Tune callback writing trials to MLflow, with one error policy for all of them.

    Tune does not catch callback errors: one MLflow or storage hiccup would abort every running
    trial. Here every hook is guarded: a failing hook marks that trial's run FAILED with the
    reason, records the trial as failed, and the sweep goes on. Subclasses key their trials
    (``key``) and fill ``run_ids``.
    """

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.run_ids: dict[str, str] = {}
        self.failed: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook in _HOOKS:
            if hook in cls.__dict__:
                setattr(cls, hook, _guarded(cls.__dict__[hook]))

    def key(self, trial: Any) -> str:
        raise NotImplementedError

    def tracking_failed(self, trial: Any, hook: str, exc: Exception) -> None:
        key = self.key(trial)
        reason = f"tracking error in {hook}: {exc}"
        log.error("MLflow tracking of %s failed in %s: %s", key, hook, exc)
        self.failed.setdefault(key, reason)
        run_id = self.run_ids.get(key)
        if run_id is not None:
            with contextlib.suppress(Exception):
                self.tracker.fail(run_id, reason)


class MLflowSweepCallback(TrackingCallback):
    """Writes every trial of a sweep to MLflow (the only writer): one run per cell, keyed by cell id."""

    def __init__(
        self,
        tracker: Tracker,
        cells: dict[str, Cell],
        existing: dict[str, CellRun],
        parent_id: str,
        storage_path: str,
    ) -> None:
        super().__init__(tracker)
        self.cells, self.existing = cells, existing
        self.parent_id, self.storage_path = parent_id, storage_path
        self.logged_until: dict[str, int] = {}
        self.checkpoints: dict[str, str] = {}
        self.finished: set[str] = set()
        self.started_at: dict[str, float] = {}

    def _progress(self, cid: str, outcome: str) -> None:
        """One line per ended trial, so a long sweep can be followed without Tune's tables."""
        cell = self.cells[cid]
        done = len(self.finished) + len(self.failed)
        seconds = time.monotonic() - self.started_at.get(cid, time.monotonic())
        print(
            f"[{done}/{len(self.cells)}] {cell.label} seed {cell.seed}: {outcome} ({seconds:.1f} s)",
            flush=True,
        )

    def key(self, trial: Any) -> str:
        return trial.config.get("cell_id", "?")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        self.started_at.setdefault(cid, time.monotonic())
        if cid in self.run_ids:  # a retry of a trial already tracked
            return
        prior = self.existing.get(cid)
        resume = prior is not None and bool(prior.checkpoint_path)  # the trial resumes from it too
        run_id = self.tracker.open_cell_run(self.cells[cid], self.parent_id, prior, resume)
        self.run_ids[cid] = run_id
        self.logged_until[cid] = self.tracker.last_logged_epoch(run_id) if resume else -1

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        cid = self.key(trial)
        run_id = self.run_ids[cid]
        if TRIAL_ERROR in result:
            return
        if result.get("final"):
            prior = self.existing.get(cid)
            if not (prior is not None and prior.run_id == run_id and prior.has_final):
                # a run that already holds its final metrics (its trial ended before the driver
                # died) is only re-tested on resume, with the same weights: log them once
                self.tracker.log_final(run_id, result)
        elif "epoch" in result and result["epoch"] > self.logged_until[cid]:
            self.tracker.log_epoch(run_id, result)
            self.logged_until[cid] = int(result["epoch"])
        # Only after the epoch's metrics are logged: a resume from this checkpoint logs later epochs.
        if result.get("checkpoint_path"):  # reported by Ray Train's TuneReportCallback
            self._remember_checkpoint(trial, result["checkpoint_path"])

    def on_checkpoint(
        self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any
    ) -> None:
        self._remember_checkpoint(trial, checkpoint.path)

    def _remember_checkpoint(self, trial: Any, path: str) -> None:
        cid = self.key(trial)
        uri = _uri(path, self.storage_path)
        self.checkpoints[cid] = uri
        self.tracker.set_checkpoint(self.run_ids[cid], uri)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        if cid in self.failed:  # a tracking error already marked it
            return
        run_id = self.run_ids[cid]
        last = trial.last_result or {}
        if TRIAL_ERROR in last:
            self.tracker.fail(run_id, last[TRIAL_ERROR])
            self.failed[cid] = last[TRIAL_ERROR]
            self._progress(cid, "FAILED: " + last[TRIAL_ERROR].splitlines()[-2])
            return
        if not last.get("final"):
            reason = "the trial ended without reporting final metrics"
            self.tracker.fail(run_id, reason)
            self.failed[cid] = reason
            self._progress(cid, f"FAILED: {reason}")
            return
        checkpoint = self.checkpoints.get(cid)
        if checkpoint is None or not self.tracker.log_predictions(run_id, checkpoint):
            log.warning("cell %s: no test_predictions.parquet in its final checkpoint", cid)
        self.tracker.finish(run_id)
        self.finished.add(cid)
        self._progress(cid, f"test_acc {100 * trial.last_result['test_acc']:.2f}%")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        if cid not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = trial_error_text(trial)
        self.tracker.fail(self.run_ids[cid], reason)
        self.failed[cid] = reason
        self._progress(
            cid, "FAILED: " + (reason.splitlines()[-1] if reason else "see the Ray Tune logs")
        )

    def close_unfinished(self) -> list[str]:
        """Mark runs this driver opened but never ended as KILLED (driver interrupted); resumable later."""
        open_cells = [c for c in self.run_ids if c not in self.finished and c not in self.failed]
        for cid in open_cells:
            try:
                self.tracker.client.set_terminated(self.run_ids[cid], "KILLED")
            except mlflow.exceptions.MlflowException:
                log.warning("could not mark run of cell %s as KILLED", cid)
        return open_cells


@dataclass
class Best:
    """The best tuning trial of a study: its sampled settings, score, MLflow run, trials run."""

    config: dict[str, Any]
    value: float
    run_id: str
    trials: int


class MLflowTuningCallback(TrackingCallback):
    """Writes every tuning trial to MLflow (one run each, keyed by Tune's trial id) and keeps the
    best by ``metric``; a sample's run carries the config ``cell_for(sample)`` builds."""

    def __init__(
        self,
        tracker: Tracker,
        cell_for: Callable[[dict[str, Any]], Cell],
        parent_id: str,
        epochs: int,
        metric: str,
    ) -> None:
        super().__init__(tracker)
        self.cell_for, self.parent_id, self.epochs, self.metric = (
            cell_for,
            parent_id,
            epochs,
            metric,
        )
        self.last: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.ended = 0

    def key(self, trial: Any) -> str:
        return trial.trial_id

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.run_ids:  # a retry
            return
        self.configs[trial.trial_id] = dict(trial.config)
        cell = self.cell_for(self.configs[trial.trial_id])
        self.run_ids[trial.trial_id] = self.tracker.open_cell_run(
            cell, self.parent_id, None, resume=False
        )

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.last[trial.trial_id] = result
        self.tracker.log_epoch(self.run_ids[trial.trial_id], result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id, result = self.run_ids[trial.trial_id], self.last.get(trial.trial_id, {})
        self.tracker.log_final(run_id, result)
        self.tracker.finish(run_id)
        self.ended += 1
        config, cell = self.configs[trial.trial_id], self.cell_for(self.configs[trial.trial_id])
        stopped = "" if result.get("epochs_run", 0) >= self.epochs else ", stopped early"
        settings = ", ".join(  # without Tune's own keys (a Repeater's __trial_index__)
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in config.items()
            if not k.startswith("__")
        )
        print(
            f"  [{cell.dataset} {cell.fusion} {self.ended}] {settings}: best val_acc "
            f"{100 * result.get(self.metric, 0):.2f}% after {result.get('epochs_run', 0)} epoch(s){stopped}",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = trial_error_text(trial)
        self.failed[trial.trial_id] = reason
        self.ended += 1
        self.tracker.fail(self.run_ids[trial.trial_id], reason)

    def best(self) -> Best | None:
        done = [t for t in self.last if t not in self.failed and self.metric in self.last[t]]
        if not done:
            return None
        # Highest score; ties go to the lower validation loss, then the earlier trial.
        top = max(
            done, key=lambda t: (self.last[t][self.metric], -self.last[t].get("val_loss", math.inf))
        )
        return Best(
            self.configs[top],
            float(self.last[top][self.metric]),
            self.run_ids[top],
            len(self.run_ids),
        )


def log_report_artifacts(tracker: Tracker, parent_id: str, directory: str) -> None:
    """Attach a report directory to the sweep's parent run."""
    tracker.client.log_artifacts(parent_id, directory, artifact_path="report")
