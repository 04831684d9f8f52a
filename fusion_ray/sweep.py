"""The CLI: ``python -m fusion_ray.sweep SWEEP.yaml [--dry-run]``.

Validate the sweep file (every problem at once, before Ray starts) -> expand the grid into cells
-> drop cells that already have a FINISHED MLflow run -> run the rest as Ray Tune trials, seed-major
(one trial per cell; a multi-worker trial is a Ray Train TorchTrainer with DDP) -> summary and
report.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fusion_ray.config import (
    SweepFileError,
    SweepSpec,
    axis_text,
    load_sweep,
    resources_for,
    smoke_version,
)
from fusion_ray.grid import Cell, axis_counts, expand
from fusion_ray.job import OperatorRef, TrialJob
from fusion_ray.orchestrate import (
    HEAD_LOST_EXIT,
    DriverInterrupted,
    StorageFullError,
    init_ray,
    preflight,
    quiet_console,
    run_cell,
    stop_on_signals,
    storage_full,
    storage_full_message,
    storage_uri,
    trial_resources,
    tune_output,
    watch_head,
    within_storage,
)
from fusion_ray.plan import Plan, plan
from fusion_ray.redact import redact
from fusion_ray.schema import ADAPTIVE_TAG, CPU_REHEARSAL_TAG, GRID_AXES_TAG, OVERRIDES_TAG

log = logging.getLogger("fusion_ray.sweep")


def _job(spec: SweepSpec, cell: Cell, resume_from: str | None, tune_run: str) -> TrialJob:
    storage = storage_uri(spec.storage_path)
    return TrialJob(
        cell_id=cell.cell_id,
        sweep=spec.name,
        tune_run=tune_run,
        trial=cell.trial,
        resources=resources_for(spec, cell.dataset),
        train_storage=f"{storage.rstrip('/')}/{spec.name}-train",
        resume_from=resume_from,
        latency_baseline=_latency_baseline(spec),
    )


def _latency_baseline(spec: SweepSpec) -> OperatorRef:
    """The operator every trial times itself against (the report's baseline)."""
    label = spec.baseline or spec.grid.fusions[0].label
    entries = [spec.grid.fusions, *(sub.fusions or [] for sub in spec.include)]
    entry = next(e for group in entries for e in group if label in (e.name, e.label))
    return OperatorRef(entry.name, entry.kwargs)


# ----------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class SweepOutcome:
    cells: int
    already_finished: int
    ran: int
    finished: list[str]
    failed: dict[str, str]
    interrupted: list[str]
    other_settings: str | None = None
    """What the experiment holds beyond this sweep's cells (``Plan.other_settings_note``)."""
    decisions: list[dict[str, Any]] | None = None
    """An adaptive sweep's decisions (``analysis.sequential.decision_rows``) at its end."""


def run_sweep(
    spec: SweepSpec,
    sweep_file: str | None = None,
    *,
    address: str | None = None,
    verbose: int = 0,
    take_over: bool = False,
    smoke: bool = False,
    overrides: Sequence[str] = (),
) -> SweepOutcome:
    """Run every cell of ``spec`` without a FINISHED MLflow run; returns what happened.

    Holds the sweep's lease throughout (one driver per sweep: a second one is refused with
    ``LeaseHeldError``); if the driver itself fails, the sweep's parent run is marked FAILED
    with the reason (KILLED when interrupted), never left RUNNING. Before Tune starts, the
    cluster must be able to place every pending trial (``PlacementError`` otherwise); ``smoke``
    on a Ray without GPUs rehearses GPU trials on CPUs."""
    from fusion_ray.lease import SweepLease
    from fusion_ray.tracking import Tracker

    tracker = Tracker(spec.tracking_uri, spec.name)
    with SweepLease(tracker.lease_store(), spec.name, take_over=take_over) as lease:
        todo = plan(spec, tracker)
        rehearsal = False
        if cells_to_run(spec, todo):
            init_ray(address or spec.address)
            spec, rehearsal = _placed(spec, todo, smoke)
        parent_tags = {"seeds": str(spec.seeds), "cells": str(len(todo.cells))}
        if rehearsal:
            parent_tags[CPU_REHEARSAL_TAG] = "true"
        if overrides:
            parent_tags[OVERRIDES_TAG] = json.dumps(list(overrides))
        if spec.adaptive is not None:
            parent_tags[ADAPTIVE_TAG] = spec.adaptive.model_dump_json(exclude={"adaptive"})
        parent_tags[GRID_AXES_TAG] = json.dumps(
            {key: [axis_text(v) for v in values] for key, values in spec.grid.settings.items()}
        )
        parent_id = tracker.parent_run(sweep_file, params=parent_tags)
        tracker.log_cells(parent_id, [c.cell_id for c in todo.cells])
        signals: list[str] = []
        try:
            with stop_on_signals(signals), _head_watch(tracker, parent_id, spec):
                outcome = _run_cells(spec, tracker, todo, parent_id, address, verbose, lease)
            if spec.adaptive is not None:
                outcome.decisions = _log_decisions(spec, tracker, parent_id)
            return outcome
        except KeyboardInterrupt as exc:
            name = signals[0] if signals else "SIGINT"
            tracker.fail(parent_id, f"the sweep driver was stopped by {name}", status="KILLED")
            raise DriverInterrupted(name) from exc
        except BaseException as exc:
            from fusion_ray.tracking import TrackingStoreLostError

            # a store gone (or a server that stopped answering): nothing to mark, no lease to
            # delete; the next driver takes the lease over once its heartbeat is old
            if tracker.store_problem() is not None or isinstance(exc, TrackingStoreLostError):
                lease.abandon()
            else:
                tracker.fail(parent_id, f"the sweep driver failed: {type(exc).__name__}: {exc}")
            raise


@contextlib.contextmanager
def _head_watch(tracker: Any, parent_id: str, spec: SweepSpec) -> Iterator[None]:
    """``orchestrate.watch_head`` while Ray runs the sweep: a lost head fails the parent run
    with one message and ends the driver (exit 7) before Ray's own exit, which cleans nothing."""
    import ray

    if not ray.is_initialized():
        yield
        return

    def lost(why: str) -> None:
        message = (
            f"{why}. The sweep cannot go on: its parent run is marked FAILED; finished cells stay "
            "FINISHED and interrupted trials keep their checkpoints under "
            f"{redact(spec.storage_path)}. Start the head again (ray up cluster.yaml, or ray start "
            "--head) and run the same command: it resumes without running a finished cell again."
        )
        print(f"error: {message}", file=sys.stderr, flush=True)
        try:
            tracker.fail(parent_id, message)
        finally:
            os._exit(HEAD_LOST_EXIT)

    with watch_head(lost):
        yield


def _placed(spec: SweepSpec, todo: Plan, smoke: bool) -> tuple[SweepSpec, bool]:
    """``placement.fit`` for the pending cells, saying which datasets wait for the autoscaler."""
    from fusion_ray import placement

    spec, rehearse, check = placement.fit(spec, {c.dataset for c in todo.pending}, smoke=smoke)
    for dataset, request in check.later.items():
        pending = sum(c.dataset == dataset for c in todo.pending)
        print(
            f"waiting for the autoscaler to add a node for {dataset} ({request}); {pending} "
            f"trials pending (gives up after {placement.placement_timeout_s():g} s, "
            f"${placement.PLACEMENT_TIMEOUT_ENV})"
        )
    return spec, rehearse


TUNE_RUN_CELLS = 200
"""Cells per Ray Tune run. Tune's bookkeeping grows with the trials of one run (it rewrites its
experiment state after checkpoints and keeps every trial in memory), so a large sweep runs as
consecutive Tune runs of at most this many cells, seed-major as always: the driver's per-trial
overhead and memory stay flat (bench/scale.py, bench/RESULTS.md)."""


def _run_cells(
    spec: SweepSpec,
    tracker: Any,
    todo: Plan,
    parent_id: str,
    address: str | None,
    verbose: int,
    lease: Any,
) -> SweepOutcome:
    from fusion_ray.callbacks import MLflowSweepCallback

    _finish_ended_trials(spec, tracker, todo)
    cells, done, pending = todo.cells, todo.done, todo.pending
    note = todo.other_settings_note(spec.name)
    if not cells_to_run(spec, todo):
        what = (
            "every comparison is decided or at its cap"
            if spec.adaptive is not None
            else f"all {len(cells)} cells already have a FINISHED run"
        )
        print(f"sweep {spec.name}: {what}; nothing to do")
        tracker.end_parent(parent_id, {"cells_finished": len(done)})
        return SweepOutcome(len(cells), len(done), 0, [], {}, [], note)
    init_ray(address or spec.address)
    callback = MLflowSweepCallback(
        tracker,
        {c.cell_id: c for c in pending},
        todo.existing,
        parent_id,
        storage_uri(spec.storage_path),
        at_most=spec.adaptive is not None,
        lease=lease,
    )
    tune_run = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        if spec.adaptive is not None:
            ran = _run_adaptive(spec, todo, callback, tune_run, verbose)
        else:
            ran = _run_fixed(spec, todo, callback, tune_run, verbose)
    except Exception as exc:
        full = storage_full(spec.storage_path)  # Tune itself fails on a full disk
        if full is None:
            raise
        raise StorageFullError(storage_full_message(full, len(callback.finished))) from exc
    finally:
        interrupted = callback.close_unfinished()
    full = storage_full(spec.storage_path) if callback.failed else None
    if full is not None:
        raise StorageFullError(storage_full_message(full, len(callback.finished)))
    if callback.store_lost:
        from fusion_ray.tracking import TrackingStoreLostError, store_lost_message

        message = store_lost_message(callback.store_lost, len(callback.finished), spec.storage_path)
        raise TrackingStoreLostError(message)
    if not lease.holds():
        from fusion_ray.lease import LeaseLostError

        raise LeaseLostError(lease.lost_message())
    tracker.end_parent(
        parent_id,
        {
            "cells": len(cells),
            "cells_finished": len(done) + len(callback.finished),
            "cells_failed": len(callback.failed),
        },
    )
    return SweepOutcome(
        len(cells),
        len(done),
        ran,
        sorted(callback.finished),
        callback.failed,
        interrupted,
        note,
    )


def _log_decisions(spec: SweepSpec, tracker: Any, parent_id: str) -> list[dict[str, Any]]:
    """The adaptive sweep's decisions, recomputed from the FINISHED runs in the tracking store
    (as a restarted driver would), logged to the parent run."""
    from analysis.sequential import decision_rows, family_evidence

    schedule = adaptive_schedule(spec, plan(spec, tracker))
    rule = spec.adaptive
    evidence = family_evidence(
        schedule.deltas(),
        alpha=rule.alpha,
        margin=rule.margin,
        max_seeds=rule.max,
        first=rule.first,
        rule=rule.decision_rule(),
    )
    rows = decision_rows(evidence, rule.decision_rule(), rule.margin)
    tracker.log_decisions(parent_id, rows)
    return rows


def cells_to_run(spec: SweepSpec, todo: Plan) -> list[Cell]:
    """What this invocation would run now: every cell without a FINISHED run, or, for an
    adaptive sweep, the cells the evidence of the finished ones needs next."""
    if spec.adaptive is None:
        return todo.pending
    return adaptive_schedule(spec, todo).needed()


def _run_fixed(spec: SweepSpec, todo: Plan, callback: Any, tune_run: str, verbose: int) -> int:
    """Every pending cell, in consecutive Tune runs of at most TUNE_RUN_CELLS cells."""
    pending = todo.pending
    parts = [pending[i : i + TUNE_RUN_CELLS] for i in range(0, len(pending), TUNE_RUN_CELLS)]
    for number, part in enumerate(parts, start=1):
        if callback.lease is not None and callback.lease.lost.is_set():
            break
        name = tune_run if len(parts) == 1 else f"{tune_run}-part{number}"
        jobs = [_job(spec, c, _resume_point(spec, c, todo.existing), name) for c in part]
        with tune_output(verbose):
            _tuner(spec, part, jobs, callback, name, verbose).fit()
    return len(pending)


def _run_adaptive(spec: SweepSpec, todo: Plan, callback: Any, tune_run: str, verbose: int) -> int:
    """The cells the evidence needs, suggested as results arrive (one Tune run): the first wave,
    then the next seed of each comparison still open, up to the cap."""
    from fusion_ray.searcher import AdaptiveSeedSearcher

    schedule = adaptive_schedule(spec, todo)
    pending = [c for c in todo.cells if c.cell_id not in schedule.results]
    jobs = [_job(spec, c, _resume_point(spec, c, todo.existing), tune_run) for c in pending]
    searcher = AdaptiveSeedSearcher(schedule, _live_decisions(callback))
    searcher.on_change(schedule)  # what the finished runs already say
    with tune_output(verbose):
        _tuner(spec, pending, jobs, callback, tune_run, verbose, searcher=searcher).fit()
    return len(searcher.started)


def _live_decisions(callback: Any) -> Any:
    """After each result: every comparison's looks not logged yet, as metrics of the parent run
    (step = seeds so far), so the MLflow UI charts the decisions as they form. Stops writing
    once the lease is lost (another driver owns the sweep)."""
    logged: dict[str, int] = {}

    def log(schedule: Any) -> None:
        if callback.lease is not None and callback.lease.lost.is_set():
            return
        evidence = schedule.evidence()
        new = {name: looks[logged.get(name, 0) :] for name, looks in evidence.items()}
        new = {name: looks for name, looks in new.items() if looks}
        if not new:
            return
        try:
            callback.tracker.log_decision_looks(callback.parent_id, new)
        except Exception as exc:  # noqa: BLE001 - a chart is not worth the sweep; said, not raised
            log.warning("could not log the decisions' evidence to the parent run: %s", redact(exc))
            return
        logged.update({name: len(looks) for name, looks in evidence.items()})

    return log


def adaptive_schedule(spec: SweepSpec, todo: Plan) -> Any:
    """The adaptive sweep's schedule, with the results of its cells already FINISHED."""
    from fusion_ray.adaptive import SeedSchedule, finished_results

    assert spec.adaptive is not None
    baseline = spec.baseline or spec.grid.fusions[0].label
    results = finished_results(todo.cells, todo.existing)
    return SeedSchedule(todo.cells, baseline, spec.adaptive, results)


def _finish_ended_trials(spec: SweepSpec, tracker: Any, todo: Plan) -> None:
    """Cells whose trial ended (final metrics logged, final checkpoint with the predictions in
    storage) but whose run was never marked FINISHED, because the driver died in between: finish
    their runs from storage instead of training them again."""
    from fusion_ray.tracking import checkpoint_exists, stored_checkpoint

    for cid, run in todo.existing.items():
        path = stored_checkpoint(run.checkpoint_path or "", spec.storage_path)
        if run.status == "FINISHED" or not run.has_final or not path:
            continue
        if not checkpoint_exists(path, spec.storage_path):
            continue
        if tracker.log_predictions(run.run_id, path):
            tracker.finish(run.run_id)
            run.status = "FINISHED"
            todo.done.add(cid)
            log.info("cell %s: its trial had ended; its run is finished from storage", cid)


def _resume_point(spec: SweepSpec, cell: Cell, existing: dict[str, Any]) -> str | None:
    """The checkpoint a cell resumes from: its MLflow run's, while that checkpoint still exists
    and lies under this sweep's storage (a path read from the tracking store is trusted only
    there: checkpoints are loaded, and a path elsewhere may be anyone's file)."""
    from fusion_ray.tracking import checkpoint_exists, stored_checkpoint

    prior = existing.get(cell.cell_id)
    resume_from = prior.checkpoint_path if prior is not None else None
    if resume_from:
        resume_from = stored_checkpoint(resume_from, spec.storage_path)
    if resume_from and not within_storage(resume_from, storage_uri(spec.storage_path)):
        log.warning(
            "cell %s: its run names checkpoint %s, outside storage_path %s; the cell starts again",
            cell.cell_id,
            redact(resume_from),
            redact(spec.storage_path),
        )
        return None
    if resume_from and not checkpoint_exists(resume_from, spec.storage_path):
        log.warning(
            "cell %s: checkpoint %s is gone; the cell starts again",
            cell.cell_id,
            redact(resume_from),
        )
        resume_from = prior.checkpoint_path = None
    return resume_from


def _tuner(
    spec: SweepSpec,
    pending: list[Cell],
    jobs: list[TrialJob],
    callback: Any,
    tune_run: str,
    verbose: int,
    searcher: Any = None,
) -> Any:
    """The Ray Tune run of the pending cells: one trial per cell, each with its dataset's
    resources; all of them (a grid), or those a ``searcher`` suggests."""
    from ray import tune
    from ray.tune import PlacementGroupFactory

    from fusion_ray.callbacks import DriverStopper

    by_id = {c.cell_id: c for c in pending}
    resources_by_id = {
        c.cell_id: PlacementGroupFactory([trial_resources(resources_for(spec, c.dataset))])
        for c in pending
    }
    # The jobs go to the object store once (with_parameters); each trial picks its own by id.
    trainable = tune.with_parameters(_run_by_id, jobs={j.cell_id: j for j in jobs})
    return tune.Tuner(
        tune.with_resources(trainable, lambda config: resources_by_id[config["cell_id"]]),
        param_space={} if searcher else {"cell_id": tune.grid_search([j.cell_id for j in jobs])},
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=-1 if searcher else 1,
            max_concurrent_trials=spec.resources.max_concurrent_trials,
            # Start each trial in a warm actor when resources match: no new Python process per
            # trial. The loop sets every seed and RNG state itself, so nothing leaks between trials.
            reuse_actors=True,
            trial_name_creator=lambda t: _trial_name(by_id[t.config["cell_id"]]),
            trial_dirname_creator=lambda t: t.config["cell_id"],
        ),
        run_config=tune.RunConfig(
            name=tune_run,
            storage_path=storage_uri(spec.storage_path),
            stop=DriverStopper(callback),
            callbacks=[callback, _placement_callback()],
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            verbose=verbose,
        ),
    )


class PlacementWatch:
    """Ends the sweep with ``PlacementError`` when trials stay pending while none runs for longer
    than the placement timeout (an autoscaler that never adds the node they need)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s, self.since = timeout_s, time.monotonic()

    def __call__(self, trials: list) -> None:
        from fusion_ray.placement import PlacementError

        statuses = {t.status for t in trials}
        if "RUNNING" in statuses or "PENDING" not in statuses:
            self.since = time.monotonic()
        elif time.monotonic() - self.since > self.timeout_s:
            raise PlacementError(
                f"no trial could be placed for {self.timeout_s:g} s: the cluster never offered "
                "the resources the pending trials ask for; check the autoscaler (ray status), "
                "ask for less under resources:, or raise $FUSION_RAY_PLACEMENT_TIMEOUT_S"
            )


def _placement_callback() -> Any:
    from ray.tune import Callback

    from fusion_ray.placement import placement_timeout_s

    watch = PlacementWatch(placement_timeout_s())

    class _Watch(Callback):
        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            watch(trials)

    return _Watch()


def _run_by_id(config: dict[str, Any], jobs: dict[str, TrialJob]) -> None:
    run_cell(jobs[config["cell_id"]])


def _trial_name(cell: Cell) -> str:
    return f"{cell.dataset}-{cell.fusion}-{cell.position}-s{cell.seed}-{cell.cell_id[:6]}"


# ----------------------------------------------------------------------------- output


def existing_tracker(spec: SweepSpec) -> Any:
    """The sweep's tracker if its store and experiment exist (None, without importing MLflow,
    when a local store is not there yet)."""
    if spec.tracking_uri.startswith("sqlite:///"):
        if not Path(spec.tracking_uri.removeprefix("sqlite:///")).is_file():
            return None
    from fusion_ray.tracking import Tracker

    return Tracker.existing(spec.tracking_uri, spec.name)


def dry_run_text(spec: SweepSpec, todo: Plan) -> str:
    """What ``--dry-run`` prints: the cells, how many each axis has, which are FINISHED, and
    for an adaptive sweep its first wave, cap and worst case."""
    cells, done = todo.cells, todo.done
    out = [
        f"sweep {spec.name}: {len(cells)} cells ({len(done)} already FINISHED in MLflow at {redact(spec.tracking_uri)})"
    ]
    if spec.adaptive is not None:
        out += _adaptive_plan_lines(spec, todo)
    for axis, counts in axis_counts(cells).items():
        out.append(f"  {axis:<19} " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    note = todo.other_settings_note(spec.name)
    if note:
        out.append(f"  note: {note}")
    axes = list(spec.grid.settings)
    columns = ", ".join(["seed", "dataset", "position", "attention_position", "fusion", *axes])
    out.append(f"  {'seed-major order':<19} ({columns}, status, cell_id):")
    for cell in cells:
        status = "FINISHED" if cell.cell_id in done else "pending"
        settings = "".join(f"{text:<8} " for _, text in cell.axes)
        out.append(
            f"    {cell.seed:>4}  {cell.dataset:<12} {cell.position:<16} {cell.attention_position:<12} {cell.fusion:<22} {settings}{status:<8} {cell.cell_id}"
        )
    return "\n".join(out)


def _adaptive_plan_lines(spec: SweepSpec, todo: Plan) -> list[str]:
    """The adaptive sweep's first wave, cap and worst case, and what it would run next."""
    rule, schedule = spec.adaptive, adaptive_schedule(spec, todo)
    first = len(schedule.first_wave())
    return [
        f"  adaptive seeds: first wave seeds 0-{rule.first - 1} ({first} cells), then the next seed "
        f"of each undecided comparison up to {rule.max} seeds; {len(schedule.comparisons)} "
        f"comparisons vs {schedule.baseline}, alpha {rule.alpha} for every decision "
        f"(rule {rule.decision_rule().describe()})"
        + (f", equivalence margin +-{rule.margin} points" if rule.margin else ""),
        f"  worst case {schedule.worst_case()} cells (every comparison undecided to seed "
        f"{rule.max - 1}); {len(schedule.needed())} needed now given the finished ones",
    ]


def print_outcome(spec: SweepSpec, outcome: SweepOutcome, note: bool = True) -> None:
    """What the sweep did; ``note``: also what the experiment holds beyond its cells (the
    report says it too, so the CLI leaves it to the report when there is one)."""
    print()
    print(
        f"sweep {spec.name}: {outcome.cells} cells; {outcome.already_finished} were already finished, "
        f"{len(outcome.finished)} finished now, {len(outcome.failed)} failed, {len(outcome.interrupted)} interrupted"
    )
    if note and outcome.other_settings:
        print(f"  note: {outcome.other_settings}")
    for cid, reason in outcome.failed.items():
        print(f"  FAILED {cid}: {reason.splitlines()[-1] if reason else ''}")
    if outcome.failed or outcome.interrupted:
        print(
            "  re-run the same command to retry failed cells and resume interrupted ones from their checkpoints"
        )
    print()


def summary_table(spec: SweepSpec) -> str:
    """Mean test accuracy and finished seeds per grid point (dataset, position, attention
    position, fusion and setting-axis values), over this sweep's cells only (runs of other
    settings in the experiment are left out)."""
    from fusion_ray.tracking import Tracker

    tracker = Tracker.existing(spec.tracking_uri, spec.name)
    if tracker is None:
        return "no runs yet"
    cells = {c.cell_id: c for c in expand(spec)}
    accuracies: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for run in tracker.trial_runs():
        cell = cells.get(run.data.tags.get("cell_id", ""))
        if cell is None or run.info.status != "FINISHED" or "test_acc" not in run.data.metrics:
            continue
        key = (cell.dataset, cell.position, cell.attention_position, cell.fusion)
        accuracies[key + tuple(text for _, text in cell.axes)].append(run.data.metrics["test_acc"])
    axes = [key.rsplit(".", 1)[-1] for key in spec.grid.settings]
    head = f"{'dataset':<12} {'position':<16} {'attention':<12} {'fusion':<22} "
    lines = [head + "".join(f"{a:<17} " for a in axes) + f"{'seeds':>5} {'test_acc':>9}"]
    for key in sorted(accuracies):
        accs = accuracies[key]
        settings = "".join(f"{text:<17} " for text in key[4:])
        lines.append(
            f"{key[0]:<12} {key[1]:<16} {key[2]:<12} {key[3]:<22} {settings}{len(accs):>5} {100 * sum(accs) / len(accs):>8.2f}%"
        )
    return "\n".join(lines)


def _report(spec: SweepSpec, out_dir: str) -> None:
    """The analysis report of the sweep's experiment, written to ``out_dir`` and logged to its
    parent run; a report that cannot be made says why and how to run it by hand."""
    from analysis.load import AnalysisError
    from analysis.report import ReportOptions, build_report, print_summary

    options = ReportOptions(baseline=spec.baseline or spec.grid.fusions[0].label, out=out_dir)
    try:
        result = build_report(spec.name, spec.tracking_uri, options)
    except (AnalysisError, ValueError) as err:
        print(
            f"analysis report did not complete: {err}\nrun it by hand: python -m analysis.report "
            f"--experiment {spec.name} --tracking-uri {redact(spec.tracking_uri)}"
        )
        return
    print_summary(result, options.settings.alpha)


def _parser() -> argparse.ArgumentParser:
    from fusion_ray.cli import common_options

    parser = argparse.ArgumentParser(
        prog="python -m fusion_ray.sweep",
        description=__doc__.splitlines()[0],
        parents=[common_options()],
    )
    parser.add_argument("sweep_file", help="a sweep YAML, e.g. sweeps/quickstart.yaml")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="edits of the file, e.g. train.epochs=3 seeds=[0,1] resources.workers=2 (data.X, "
        "model.X and train.X set X in every dataset's preset); checked like the file, recorded "
        "on the parent run, and part of the cells' configs",
    )
    parser.add_argument(
        "--report-dir",
        default=None,
        help="where the analysis report goes (default reports/<sweep name>)",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="skip the analysis report at the end"
    )
    parser.add_argument(
        "--take-over",
        action="store_true",
        help="run even though another driver holds this sweep's lease (only when that driver is gone)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run a shrunk copy (one seed, one epoch, 64 training documents) as experiment NAME-smoke",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_console(args.verbose)
    # Keeping only the last checkpoints makes Tune snapshot its state after each one, which it
    # then warns about on every trial; the snapshots are cheap here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Trials that cannot be placed are checked before Tune starts and watched while it runs
    # (fusion_ray.placement): Tune's own every-minute warning would only repeat it.
    for name in (
        "TUNE_WARN_INSUFFICENT_RESOURCE_THRESHOLD_S",
        "TUNE_WARN_INSUFFICENT_RESOURCE_THRESHOLD_S_AUTOSCALER",
    ):
        os.environ.setdefault(name, "1e9")

    try:
        spec = load_sweep(args.sweep_file, args.overrides)
    except (SweepFileError, FileNotFoundError) as exc:
        print(redact(exc), file=sys.stderr)
        return 2

    if args.smoke:
        spec = smoke_version(spec)
    problems = preflight(spec.storage_path, spec.tracking_uri, remote=not args.dry_run)
    if problems:
        print(redact(SweepFileError(args.sweep_file, problems)), file=sys.stderr)
        return 2

    if args.dry_run:
        print(dry_run_text(spec, plan(spec, existing_tracker(spec))))
        return 0

    print(
        f"sweep {spec.name}: {len(expand(spec))} cells; MLflow at {redact(spec.tracking_uri)}, "
        f"checkpoints in {redact(spec.storage_path)}"
    )
    outcome = _run_or_exit_code(spec, args)
    if isinstance(outcome, int):
        return outcome
    print_outcome(spec, outcome, note=args.no_report)
    print(summary_table(spec))
    if outcome.decisions is not None:
        from analysis.sequential import decisions_text

        print(
            f"\ndecisions (anytime-valid over the {len(outcome.decisions)} comparisons; "
            "CS = the effect's confidence sequence, simultaneous):"
        )
        print(decisions_text(outcome.decisions, spec.adaptive.alpha))
        ran = outcome.already_finished + len(outcome.finished)
        print(
            f"adaptive seeds: {ran} trials of the {outcome.cells} this grid has at the cap of "
            f"{spec.adaptive.max} fixed seeds ({ran / max(outcome.cells, 1):.0%}); trial time in the report"
        )
    if not args.no_report:
        _report(spec, args.report_dir or str(Path("reports") / spec.name))
    print(
        f"\nmlflow ui --backend-store-uri {redact(spec.tracking_uri)}   # then open http://127.0.0.1:5000"
    )
    return 1 if outcome.failed or outcome.interrupted else 0


ACCESS_EXIT_CODES = {"auth": 8, "locked": 9, "unreachable": 10}
"""Exit codes of a tracking store that refused or did not answer (``TrackingAccessError``)."""


def _run_or_exit_code(spec: SweepSpec, args: argparse.Namespace) -> SweepOutcome | int:
    """``run_sweep`` for the command line: its outcome, or the exit code of a driver that
    stopped, after one message saying why and what to do."""
    from fusion_ray.lease import LeaseHeldError, LeaseLostError
    from fusion_ray.placement import PlacementError
    from fusion_ray.tracking import TrackingAccessError, TrackingStoreLostError

    try:
        return run_sweep(
            spec,
            args.sweep_file,
            address=args.address,
            verbose=args.verbose,
            take_over=args.take_over,
            smoke=args.smoke,
            overrides=args.overrides,
        )
    except KeyboardInterrupt as exc:
        name = exc.signal_name if isinstance(exc, DriverInterrupted) else "SIGINT"
        print(
            f"\nsweep {spec.name}: stopped by {name}: its running trials were stopped and their "
            "runs and the sweep's parent run marked KILLED; finished cells stay finished. Re-run "
            "the same command to resume (interrupted trials continue from their last checkpoint).",
            file=sys.stderr,
        )
        return 128 + getattr(signal, name, signal.SIGINT)
    except TrackingAccessError as exc:
        print(f"error: {redact(exc)}", file=sys.stderr)
        return ACCESS_EXIT_CODES[exc.kind]
    except (
        LeaseHeldError,
        LeaseLostError,
        PlacementError,
        TrackingStoreLostError,
        StorageFullError,
    ) as exc:
        print(f"error: {redact(exc)}", file=sys.stderr)
        # 3: another driver runs the sweep; 4: it took over from this one; 5: the tracking
        # store vanished; 6: the storage is full; 2: the trials cannot be placed (7, a lost
        # Ray head, ends the process from the head watch)
        codes = {
            LeaseHeldError: 3,
            LeaseLostError: 4,
            TrackingStoreLostError: 5,
            StorageFullError: 6,
        }
        return codes.get(type(exc), 2)


if __name__ == "__main__":
    sys.exit(main())
