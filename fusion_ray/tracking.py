"""The one MLflow writer on the fusion_ray side: a Ray Tune callback on the sweep driver.

Workers never talk to MLflow: they report to Tune, and this callback, running in the driver,
writes runs that follow the schema in DESIGN.md. One run per cell; a resumed or retried cell
continues its earlier run, so a cell never has two FINISHED runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from fusion_ray.grid import Cell
from fusion_ray.train.loop import PREDICTIONS_FILE

log = logging.getLogger(__name__)

EPOCH_METRICS = ("train_loss", "val_loss", "val_acc", "epoch_seconds")
FINAL_METRICS = (
    "test_acc",
    "best_val_acc",
    "best_epoch",
    "test_correct",
    "test_total",
    "test_loss",
    "epochs_run",
    "latency_ms_per_sample",
    "num_params",
    "train_seconds",
    "loop_seconds",
)


def git_sha() -> str:
    """The commit of the checkout this package runs from (with ``+dirty`` if modified), else
    $FUSION_RAY_GIT_SHA (for installs without git metadata), else ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10, cwd=here
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10, cwd=here,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FUSION_RAY_GIT_SHA", "unknown")


def artifact_root(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts beside a local sqlite store (``<db dir>/mlartifacts/<experiment>``), not in
    whatever directory the driver happens to run from; servers keep their own default."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    return (db.resolve().parent / "mlartifacts" / experiment).as_uri()


@dataclass
class CellRun:
    """What MLflow already holds for a cell."""

    run_id: str
    status: str
    checkpoint_path: str | None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Tracker:
    """MLflow access for one sweep: its experiment, its parent run, and one run per cell."""

    def __init__(self, tracking_uri: str, sweep: str) -> None:
        self.tracking_uri, self.sweep = tracking_uri, sweep
        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(sweep)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(sweep, artifact_location=artifact_root(tracking_uri, sweep))
        else:
            if experiment.lifecycle_stage == "deleted":
                self.client.restore_experiment(experiment.experiment_id)
            self.experiment_id = experiment.experiment_id

    # --- reading
    def cell_runs(self) -> dict[str, CellRun]:
        """The best existing run of every cell: FINISHED first, else the most recent one."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string="tags.role = 'trial'", max_results=50000
        )
        rank = {"FINISHED": 0, "RUNNING": 1, "KILLED": 2, "FAILED": 3, "SCHEDULED": 4}
        best: dict[str, CellRun] = {}
        for run in sorted(runs, key=lambda r: (rank.get(r.info.status, 9), -r.info.start_time)):
            cid = run.data.tags.get("cell_id")
            if cid and cid not in best:
                best[cid] = CellRun(run.info.run_id, run.info.status, run.data.tags.get("checkpoint_path"))
        return best

    # --- the sweep's parent run
    def parent_run(self, sweep_file: str | None = None, params: dict[str, str] | None = None) -> str:
        """The sweep's parent run (reused across invocations); it carries the sweep file and reports."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string="tags.role = 'sweep'", max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        if runs:
            run_id = runs[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=f"{self.sweep} (sweep)",
                tags={"role": "sweep", "sweep": self.sweep, "git_sha": git_sha()},
            )
            run_id = run.info.run_id
        if sweep_file:
            self.client.log_artifact(run_id, sweep_file)
        if params:  # tags, not params: they change when the sweep file grows
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in params.items()])
        return run_id

    def end_parent(self, run_id: str, summary: dict[str, float]) -> None:
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), _now_ms(), 0) for k, v in summary.items()])
        self.client.set_terminated(run_id, "FINISHED")

    # --- one run per cell
    def open_cell_run(self, cell: Cell, parent_id: str | None, existing: CellRun | None, resume: bool) -> str:
        """Continue the cell's earlier run when resuming from its checkpoint, else replace it."""
        if existing is not None and existing.status != "FINISHED" and resume:
            self.client.update_run(existing.run_id, status="RUNNING")
            run = self.client.get_run(existing.run_id)
            if "failure_reason" in run.data.tags:
                self.client.delete_tag(existing.run_id, "failure_reason")
            self.client.set_tag(existing.run_id, "git_sha", git_sha())
            return existing.run_id
        if existing is not None and existing.status != "FINISHED":
            self.client.delete_run(existing.run_id)  # restarting from scratch: replace, never duplicate
        tags = cell.tags(self.sweep, git_sha())
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        name = f"{cell.dataset}/{cell.position}/{cell.attention_position}/{cell.fusion}/seed{cell.seed}"
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
        metrics = [Metric(k, float(result[k]), _now_ms(), step) for k in EPOCH_METRICS if k in result]
        self.client.log_batch(run_id, metrics=metrics)

    def log_final(self, run_id: str, result: dict[str, Any]) -> None:
        metrics = [Metric(k, float(result[k]), _now_ms(), 0) for k in FINAL_METRICS if k in result]
        self.client.log_batch(run_id, metrics=metrics)

    def set_checkpoint(self, run_id: str, path: str) -> None:
        self.client.set_tag(run_id, "checkpoint_path", path)

    def log_predictions(self, run_id: str, checkpoint_uri: str) -> bool:
        """Copy ``test_predictions.parquet`` from the final checkpoint into the run's artifacts."""
        from ray.train import Checkpoint

        with Checkpoint(checkpoint_uri).as_directory() as directory:
            path = Path(directory, PREDICTIONS_FILE)
            if not path.exists():
                return False
            self.client.log_artifact(run_id, str(path))
        return True

    def finish(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "FINISHED")

    def fail(self, run_id: str, reason: str, status: str = "FAILED") -> None:
        self.client.set_tag(run_id, "failure_reason", reason[-4900:])
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


def _error_text(trial: Any) -> str:
    try:
        error_file = trial.error_file
        if error_file and Path(error_file).exists():
            text = Path(error_file).read_text().strip().splitlines()
            return "\n".join(text[-15:])
    except OSError:
        pass
    return "the trial raised an error; see the Ray Tune logs"


def _guarded(method):
    """Tune does not catch callback errors: one MLflow or storage hiccup would abort every running
    trial. A failing callback marks that cell's run FAILED with the reason and the sweep goes on."""

    @functools.wraps(method)
    def wrapper(self: MLflowSweepCallback, iteration: int, trials: list, trial: Any, *args: Any, **info: Any) -> None:
        try:
            method(self, iteration, trials, trial, *args, **info)
        except Exception as exc:  # noqa: BLE001 - reported, and the sweep continues
            cid = trial.config.get("cell_id", "?")
            log.error("MLflow tracking of cell %s failed in %s: %s", cid, method.__name__, exc)
            self.failed.setdefault(cid, f"tracking error in {method.__name__}: {exc}")
            run_id = self.run_ids.get(cid)
            if run_id is not None:
                with contextlib.suppress(Exception):
                    self.tracker.fail(run_id, f"tracking error in {method.__name__}: {exc}")

    return wrapper


class MLflowSweepCallback(Callback):
    """Ray Tune callback that writes every trial of a sweep to MLflow (the only writer)."""

    def __init__(self, tracker: Tracker, cells: dict[str, Cell], existing: dict[str, CellRun], parent_id: str, storage_path: str) -> None:
        self.tracker, self.cells, self.existing = tracker, cells, existing
        self.parent_id, self.storage_path = parent_id, storage_path
        self.run_ids: dict[str, str] = {}
        self.logged_until: dict[str, int] = {}
        self.checkpoints: dict[str, str] = {}
        self.finished: set[str] = set()
        self.failed: dict[str, str] = {}
        self.started_at: dict[str, float] = {}

    def _progress(self, cid: str, outcome: str) -> None:
        """One line per ended trial, so a long sweep can be followed without Tune's tables."""
        cell = self.cells[cid]
        done = len(self.finished) + len(self.failed)
        seconds = time.monotonic() - self.started_at.get(cid, time.monotonic())
        print(
            f"[{done}/{len(self.cells)}] {cell.dataset}/{cell.position}/{cell.attention_position}/"
            f"{cell.fusion} seed {cell.seed}: {outcome} ({seconds:.1f} s)",
            flush=True,
        )

    @staticmethod
    def _cell_id(trial: Any) -> str:
        return trial.config["cell_id"]

    @_guarded
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self._cell_id(trial)
        self.started_at.setdefault(cid, time.monotonic())
        if cid in self.run_ids:  # a retry of a trial already tracked
            return
        prior = self.existing.get(cid)
        resume = prior is not None and bool(prior.checkpoint_path)  # the trial resumes from it too
        run_id = self.tracker.open_cell_run(self.cells[cid], self.parent_id, prior, resume)
        self.run_ids[cid] = run_id
        self.logged_until[cid] = self.tracker.last_logged_epoch(run_id) if resume else -1

    @_guarded
    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        cid = self._cell_id(trial)
        run_id = self.run_ids[cid]
        if result.get("final"):
            self.tracker.log_final(run_id, result)
        elif "epoch" in result and result["epoch"] > self.logged_until[cid]:
            self.tracker.log_epoch(run_id, result)
            self.logged_until[cid] = int(result["epoch"])
        # Only after the epoch's metrics are logged: a resume from this checkpoint logs later epochs.
        if result.get("checkpoint_path"):  # reported by Ray Train's TuneReportCallback
            self._remember_checkpoint(trial, result["checkpoint_path"])

    @_guarded
    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        self._remember_checkpoint(trial, checkpoint.path)

    def _remember_checkpoint(self, trial: Any, path: str) -> None:
        cid = self._cell_id(trial)
        uri = _uri(path, self.storage_path)
        self.checkpoints[cid] = uri
        self.tracker.set_checkpoint(self.run_ids[cid], uri)

    @_guarded
    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self._cell_id(trial)
        if cid in self.failed:  # a tracking error already marked it
            return
        run_id = self.run_ids[cid]
        if not (trial.last_result or {}).get("final"):
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

    @_guarded
    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self._cell_id(trial)
        if cid not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = _error_text(trial)
        self.tracker.fail(self.run_ids[cid], reason)
        self.failed[cid] = reason
        self._progress(cid, "FAILED: " + (reason.splitlines()[-1] if reason else "see the Ray Tune logs"))

    def close_unfinished(self) -> list[str]:
        """Mark runs this driver opened but never ended as KILLED (driver interrupted); resumable later."""
        open_cells = [c for c in self.run_ids if c not in self.finished and c not in self.failed]
        for cid in open_cells:
            try:
                self.tracker.client.set_terminated(self.run_ids[cid], "KILLED")
            except mlflow.exceptions.MlflowException:
                log.warning("could not mark run of cell %s as KILLED", cid)
        return open_cells


def log_report_artifacts(tracker: Tracker, parent_id: str, directory: str) -> None:
    """Attach a report directory to the sweep's parent run."""
    tracker.client.log_artifacts(parent_id, directory, artifact_path="report")


