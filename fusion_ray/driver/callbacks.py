"""The Ray Tune callbacks on the driver that record trials: one per sweep cell
(``MLflowSweepCallback``) on ``TrackingCallback``, whose one error policy the HPO phase's
tuning callback shares (``fusion_ray.hpo.tracking``). They write to MLflow only through
``tracking.Tracker``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune import Callback
from ray.tune.stopper import Stopper

from fusion_ray.driver.progress import (
    LINE_WIDTH,
    STATUS_EVERY,
    STATUS_SECONDS,
    duration,
    fit_line,
    time_left,
    trial_error_text,
)
from fusion_ray.driver.storage import checkpoint_uri
from fusion_ray.driver.store_faults import store_gone
from fusion_ray.driver.tracking import CellRun, Tracker
from fusion_ray.redact import redact
from fusion_ray.train.result import SetAside, TrialResult

if TYPE_CHECKING:
    from fusion_ray.driver.lease import SweepLease

log = logging.getLogger(__name__)


_LOST = re.compile(
    r"\b(ActorDiedError|NodeDiedError|RayActorError|ActorUnavailableError|WorkerCrashedError|"
    r"OwnerDiedError|LocalRayletDiedError|ObjectLostError|NodeLostError)\b|"
    r"The actor died unexpectedly|node .{0,80}(died|was removed|is dead|terminated)|"
    r"preempt(ed|ion)|spot instance|No space left on device",
    re.IGNORECASE,
)
"""What Ray says when a trial's process or node was lost, not its code: an actor or node that
died (a node removed, a spot instance preempted, a worker killed from outside), or a disk with
no space left for its checkpoint."""


def failure_kind(reason: str) -> str:
    """ "infrastructure" when a failed trial's traceback says its process or node was lost
    (Tune's retries included), else "trial" (its code raised: an out-of-memory error of the
    operator, a NaN loss, a bug). Only a trial's own failure counts in the decisions."""
    return "infrastructure" if _LOST.search(reason) else "trial"


_HOOKS = (
    "on_trial_start",
    "on_trial_result",
    "on_checkpoint",
    "on_trial_complete",
    "on_trial_error",
    "on_trial_recover",
)


def _guarded(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def wrapper(
        self: TrackingCallback, iteration: int, trials: list, trial: Any, *args: Any, **info: Any
    ) -> None:
        if self.store_lost:
            return  # nothing can be written any more; the driver stops (DriverStopper)
        try:
            method(self, iteration, trials, trial, *args, **info)
        except Exception as exc:  # noqa: BLE001 - recorded on the trial's run, and Tune goes on
            problem = self.tracker.store_problem() or store_gone(exc, self.tracker.tracking_uri)
            if problem is not None:
                log.error("%s; stopping the sweep", problem)
                self.store_lost = problem
                return
            self.tracking_failed(trial, method.__name__, exc)

    return wrapper


class TrackingCallback(Callback):
    """A Ray Tune callback writing trials to MLflow, with one error policy for all of them.

    Tune does not catch callback errors: one MLflow or storage hiccup would abort every running
    trial. Here every hook is guarded: a failing hook marks that trial's run FAILED with the
    reason, records the trial as failed, and the sweep goes on. Subclasses key their trials
    (``key``) and fill ``run_ids``.
    """

    noun = "cell"
    """What ``key`` names, in messages."""

    def __init__(self, tracker: Tracker, lease: SweepLease | None = None) -> None:
        self.tracker = tracker
        self.lease = lease
        """The driver's lease: every write is fenced by it (``_holds``), so a driver that lost
        it (paused past the TTL while another took over) changes no run the new holder owns."""
        self.run_ids: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.finished: set[str] = set()
        self.store_lost: str | None = None
        """How the tracking store vanished, once it has: every hook then writes nothing."""
        self.set_aside: set[str] = set()
        """Trials that set aside a checkpoint they could not load and started again."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook in _HOOKS:
            if hook in cls.__dict__:
                setattr(cls, hook, _guarded(cls.__dict__[hook]))

    def key(self, trial: Any) -> str:
        raise NotImplementedError

    def __getstate__(self) -> dict:
        """Tune pickles its run config, callbacks included, under storage_path (``tuner.pkl``;
        an adaptive searcher's state holds this callback too) for a ``Tuner.restore`` no driver
        here does: the copy keeps no tracker and no lease, so no tracking URI or MLflow client
        reaches the storage, and a restored copy writes nothing (``store_lost`` is set)."""
        state = self.__dict__.copy()
        state.update(tracker=None, lease=None, store_lost="a copy restored from storage_path")
        return state

    def close_unfinished(self) -> list[str]:
        """Mark runs this driver opened but never ended as KILLED (driver interrupted: a sweep
        resumes them); the keys of those runs. A driver that lost its lease leaves them as they
        are: the new holder resumes them."""
        open_keys = [k for k in self.run_ids if k not in self.finished and k not in self.failed]
        if self.store_lost or (self.lease is not None and self.lease.lost.is_set()):
            return open_keys
        for key in open_keys:
            if not self.tracker.kill(self.run_ids[key]):
                log.warning("could not mark the run of %s as KILLED", key)
        return open_keys

    def _holds(self) -> bool:
        """Whether this driver may still write to its trials' runs: the lease read from the
        store just before (one read per write; a lost lease stays lost)."""
        return self.lease is None or self.lease.holds()

    def checkpoint_set_aside(self, key: str, note: SetAside) -> None:
        """Say once per trial, and tag its run, that it could not load its checkpoint, set it
        aside and started again from scratch (``note``)."""
        if key in self.set_aside:
            return
        self.set_aside.add(key)
        log.warning("%s %s: %s", self.noun, key, redact(note.sentence(self.noun)))
        self.tracker.set_checkpoint_aside(self.run_ids[key], note.text)

    def tracking_failed(self, trial: Any, hook: str, exc: Exception) -> None:
        key = self.key(trial)
        reason = f"tracking error in {hook}: {exc}"
        log.error("MLflow tracking of %s failed in %s: %s", key, hook, redact(exc))
        self.failed.setdefault(key, reason)
        run_id = self.run_ids.get(key)
        if run_id is not None:  # the driver's fault, not the trial's: not scored, runs again
            with contextlib.suppress(Exception):
                self.tracker.fail(run_id, reason, kind="infrastructure")


class MLflowSweepCallback(TrackingCallback):
    """Writes every trial of a sweep to MLflow (the only writer): one run per cell, keyed by cell id."""

    def __init__(
        self,
        tracker: Tracker,
        cells: dict[str, Any],
        existing: dict[str, CellRun],
        parent_id: str,
        storage_path: str,
        at_most: bool = False,
        lease: SweepLease | None = None,
        cells_left: Callable[[], tuple[int, int] | None] | None = None,
        hypotheses_open: Callable[[], tuple[int, int] | None] | None = None,
        workload: Any = None,
    ) -> None:
        super().__init__(tracker, lease)
        self.workload = workload
        """The sweep's kind (``fusion_ray.driver.workload.Workload``): told of each cell's final
        metrics and end, and says what a finished trial gave."""
        self.cells_left = cells_left
        """An adaptive sweep's (cells its open hypotheses need now, cells if they all ran to the
        cap), for the time-left estimate; None: every pending cell runs."""
        self.hypotheses_open = hypotheses_open
        """An adaptive sweep's (hypotheses open, hypotheses), for the status line."""
        self.last_status = time.monotonic()
        self.cells, self.existing = cells, existing
        self.parent_id, self.storage_path = parent_id, storage_path
        self.logged_until: dict[str, int] = {}
        self.checkpoints: dict[str, str] = {}
        self.started_at: dict[str, float] = {}
        self.began = time.monotonic()
        self.at_most = at_most
        self.lost: set[str] = set()
        """Cells whose trial's process or node was lost (``failure_kind``): not scored."""
        self.on_lost: Callable[[str], None] | None = None
        """Told each lost cell (an adaptive sweep's searcher unscores it)."""

    def __getstate__(self) -> dict:
        """As ``TrackingCallback``'s, and without the time-left estimate (it reads the seed
        policy, whose sweep spec holds the tracking URI)."""
        return super().__getstate__() | {
            "cells_left": None,
            "hypotheses_open": None,
            "on_lost": None,
            "workload": None,
        }

    def _progress(self, cid: str, outcome: str) -> None:
        """One line per ended trial, in ``LINE_WIDTH`` columns, so a long sweep can be followed
        without Tune's tables: how many ended of how many (``at_most``: the worst case of an
        adaptive sweep), the cell as its run is named, what it gave and how long it took; and
        every ``STATUS_EVERY`` trials (or ``STATUS_SECONDS``) a status line."""
        cell = self.cells[cid]
        done = len(self.finished) + len(self.failed)
        seconds = time.monotonic() - self.started_at.get(cid, time.monotonic())
        total = f"{'at most ' if self.at_most else ''}{len(self.cells)}"
        prefix, suffix = f"[{done}/{total}] ", f": {outcome} ({seconds:.1f} s)"
        name = cell.run_name
        if len(prefix) + len(name) + len(suffix) > LINE_WIDTH:  # the dataset says where enough
            name = f"{name.rsplit(' | ', 1)[0]} | {cell.resource_group}"
        line = fit_line(prefix, name, suffix)
        print(line, flush=True)
        now = time.monotonic()
        if done % STATUS_EVERY == 0 or now - self.last_status >= STATUS_SECONDS:
            self.last_status = now
            print(self.status_line(done, total), flush=True)

    def status_line(self, done: int, total: str) -> str:
        """``status 8 min: 52/at most 168 trials (1 failed), 7/11 hypotheses open; about 3 min
        left, at most 9 min``: the time since the sweep started, and the time left at the pace
        so far for the cells its open hypotheses need now (it moves as they are decided), at
        most that for every open one run to the cap."""
        elapsed = time.monotonic() - self.began
        pace = elapsed / max(done, 1)
        cells_left = self.cells_left() if self.cells_left is not None else None
        if cells_left is not None:
            left = time_left(cells_left[0], pace, cells_left[1])
        else:
            left = time_left(len(self.cells) - done, pace)
        failed = f" ({len(self.failed)} failed)" if self.failed else ""
        opened = self.hypotheses_open() if self.hypotheses_open is not None else None
        hypotheses = f", {opened[0]}/{opened[1]} hypotheses open" if opened else ""
        text = f"status {duration(elapsed)}: {done}/{total} trials{failed}{hypotheses}"
        return fit_line("", text, left)

    def key(self, trial: Any) -> str:
        return trial.config.get("cell_id", "?")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        if not self._holds():
            return
        self.started_at.setdefault(cid, time.monotonic())
        if cid in self.run_ids:  # a retry of a trial already tracked
            return
        prior = self.existing.get(cid)
        resume = prior is not None and bool(prior.checkpoint_path)  # the trial resumes from it too
        run_id = self.tracker.open_cell_run(self.cells[cid], self.parent_id, prior, resume)
        self.run_ids[cid] = run_id
        step_metric = self.workload.step_metric
        self.logged_until[cid] = (
            self.tracker.last_logged_epoch(run_id, step_metric) if resume else -1
        )

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        cid, reported = self.key(trial), TrialResult.of(result)
        if reported.error or cid not in self.run_ids or not self._holds():
            return
        run_id = self.run_ids[cid]
        if reported.set_aside is not None:  # it starts again from scratch: epochs from 0 again
            self.checkpoint_set_aside(cid, reported.set_aside)
            self.logged_until[cid] = -1
        if reported.final:
            prior = self.existing.get(cid)
            retrained = cid in self.set_aside  # not the weights of the final metrics logged
            if retrained or not (prior is not None and prior.run_id == run_id and prior.has_final):
                # a run that already holds its final metrics (its trial ended before the driver
                # died) is only re-tested on resume, with the same weights: log them once
                self.tracker.log_final(run_id, result, *self.workload.final_record(result))
            self.workload.final_metrics(self.tracker, self.parent_id, self.cells[cid], result)
        elif reported.epoch is not None and reported.epoch > self.logged_until[cid]:
            self.tracker.log_epoch(run_id, result, self.workload.epoch_metrics(result))
            self.logged_until[cid] = int(reported.epoch)
        # Only after the epoch's metrics are logged: a resume from this checkpoint logs later epochs.
        if reported.checkpoint_path:  # reported by Ray Train's TuneReportCallback
            self._remember_checkpoint(trial, reported.checkpoint_path)

    def on_checkpoint(
        self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any
    ) -> None:
        self._remember_checkpoint(trial, checkpoint.path)

    def _remember_checkpoint(self, trial: Any, path: str) -> None:
        cid = self.key(trial)
        if cid not in self.run_ids or not self._holds():
            return
        uri = checkpoint_uri(path, self.storage_path)
        self.checkpoints[cid] = uri
        self.tracker.set_checkpoint(self.run_ids[cid], uri)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        if cid in self.failed or cid not in self.run_ids:  # a tracking error already marked it
            return
        if not self._holds():
            return  # the new holder finishes this cell; its run stays as the holder expects
        self.store_lost = self.tracker.store_problem()
        if self.store_lost is not None:
            return  # a FINISHED written into a deleted file would be lost: stop instead
        run_id = self.run_ids[cid]
        last = TrialResult.of(trial.last_result)
        if last.error:
            self.tracker.fail(run_id, last.error, kind="trial")
            self.failed[cid] = last.error
            self._progress(cid, "FAILED: " + last.error.splitlines()[-2])
            return
        if not last.final:
            reason = "the trial ended without reporting final metrics"
            self.tracker.fail(run_id, reason, kind="trial")
            self.failed[cid] = reason
            self._progress(cid, f"FAILED: {reason}")
            return
        if self.workload is not None:  # what it keeps of the cell (the study: its predictions)
            self.workload.completed(
                self.tracker, self.cells[cid], run_id, self.checkpoints.get(cid)
            )
        self.tracker.finish(run_id, lease_token=self.lease.token if self.lease else None)
        self.finished.add(cid)
        self._progress(cid, self.workload.outcome(last) if self.workload else "finished")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Tune retries a failed trial (``retries``): one line, so a lost node is seen when it
        happens (Tune's own traceback is not printed at verbosity 0)."""
        cid = self.key(trial)
        if cid not in self.cells or not self._holds():
            return
        cell, reason = self.cells[cid], trial_error_text(trial)
        last = reason.splitlines()[-1] if reason else "see the Ray Tune logs"
        print(
            f"{cell.label} seed {cell.seed}: its trial failed ({redact(last)}); Ray Tune "
            "retries it from its last checkpoint",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        cid = self.key(trial)
        if not self._holds():
            return
        if cid not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = trial_error_text(trial)
        kind = failure_kind(reason)
        self.tracker.fail(self.run_ids[cid], reason, kind=kind)
        self.failed[cid] = reason
        last = reason.splitlines()[-1] if reason else "see the Ray Tune logs"
        if kind == "infrastructure":
            self.lost.add(cid)
            if self.on_lost is not None:
                self.on_lost(cid)
            self._progress(cid, f"LOST (its process or node; not scored, runs again): {last}")
            return
        self._progress(cid, "FAILED: " + last)


class DriverStopper(Stopper):
    """Stops every trial of the Tune run once the driver cannot or must not go on: its lease
    lost to another driver, its tracking store gone, or a signal received (``stopping``:
    ``DriverSession.stopping``). Tune asks at every step, between the callbacks' writes."""

    def __init__(
        self, callback: TrackingCallback, stopping: Callable[[], bool] | None = None
    ) -> None:
        self.callback: TrackingCallback | None = callback
        self.stopping = stopping

    def __getstate__(self) -> dict:
        return {}  # Tune pickles its run config; a restored copy never stops anything

    def __setstate__(self, state: dict) -> None:
        self.callback, self.stopping = None, None

    def _stop(self) -> bool:
        cb = self.callback
        if cb is None:
            return False
        if self.stopping is not None and self.stopping():
            return True
        return bool(cb.store_lost) or (cb.lease is not None and cb.lease.lost.is_set())

    def __call__(self, trial_id: str, result: dict) -> bool:
        return self._stop()

    def stop_all(self) -> bool:
        return self._stop()
