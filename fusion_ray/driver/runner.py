"""The sweep driver: a sweep's cells run as Ray Tune trials, recorded in MLflow.

Validate (done by loading) -> plan the cells against the tracking store (``plan``) -> ask the
seed policy what runs now (``seed_policy``) -> inside one driver session (``driver``: the
lease, Ray, the parent run, signals, the lost head, full storage) run the policy's Tune runs, one
trial per cell (a multi-worker trial is a Ray Train TorchTrainer with DDP), each recorded by the
tracking callback -> the policy's end (an adaptive sweep's decisions) -> ``SweepOutcome``.

Nothing here prints the report or parses a command line: that is the application layer
(``fusion_ray.api``, ``fusion_ray.sweep``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from fusion_ray.config.workload import AnySweep
from fusion_ray.driver import placement
from fusion_ray.driver.placement import PlacementError, placement_timeout_s
from fusion_ray.driver.session import DriverSession, tune_output
from fusion_ray.driver.storage import finish_ended_trials, resume_point, storage_uri
from fusion_ray.driver.trial import trial_resources
from fusion_ray.driver.workload import Workload, workload_for
from fusion_ray.policy.plan import Plan, plan
from fusion_ray.policy.seed_policy import SeedPolicy, TuneRun, policy_for
from fusion_ray.schema import (
    CPU_REHEARSAL_TAG,
    GRID_AXES_TAG,
    OVERRIDES_TAG,
)

log = logging.getLogger("fusion_ray.sweep")


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
    """An adaptive sweep's decisions (``fusion_ray.decide.sequential.decision_rows``) at its end."""
    closing: list[str] = dataclasses.field(default_factory=list)
    """What the seed policy says after the sweep (an adaptive sweep's decisions, as text)."""
    lost: set[str] = dataclasses.field(default_factory=set)
    """The failed cells whose process or node was lost (not scored; they run again)."""


def run_sweep(
    spec: AnySweep,
    sweep_file: str | None = None,
    *,
    address: str | None = None,
    verbose: int = 0,
    take_over: bool = False,
    smoke: bool = False,
    overrides: Sequence[str] = (),
) -> SweepOutcome:
    """Run what the sweep's seed policy needs of the cells without a FINISHED MLflow run.

    Inside one ``DriverSession``: one driver per sweep (a second one is refused with
    ``LeaseHeldError``); the parent run is marked FAILED with the reason if the driver fails
    (KILLED when interrupted), never left RUNNING. Before Tune starts, the cluster must be able
    to place every pending trial (``PlacementError`` otherwise); ``smoke`` on a Ray without GPUs
    rehearses GPU trials on CPUs."""
    with DriverSession(
        "sweep", spec.name, spec.tracking_uri, spec.storage_path, take_over=take_over
    ) as session:
        todo = plan(spec, session.tracker)
        policy, rehearsal = policy_for(spec, todo), False
        if policy.needed():
            session.start_ray(address or spec.address)
            spec, rehearsal = _placed(spec, todo, smoke)
            if rehearsal:  # the policy runs the spec rehearsed on CPUs
                policy = policy_for(spec, todo)
        parent_id = session.open_parent(
            sweep_file, _parent_params(spec, todo, policy, rehearsal, overrides)
        )
        session.tracker.log_cells(parent_id, [c.cell_id for c in todo.cells])
        with session.driving():
            outcome = _run_cells(spec, session, todo, policy, verbose)
            outcome.decisions = policy.finish(session.tracker, parent_id)
            ran = outcome.already_finished + len(outcome.finished)
            outcome.closing = policy.closing_lines(outcome.decisions, ran, outcome.cells)
        return outcome


def _parent_params(
    spec: AnySweep, todo: Plan, policy: SeedPolicy, rehearsal: bool, overrides: Sequence[str]
) -> dict[str, str]:
    """What the parent run records of this invocation."""
    params = {"seeds": str(spec.seeds), "cells": str(len(todo.cells))}
    if spec.description:  # MLflow's run description; the report repeats it on the experiment
        params["mlflow.note.content"] = spec.description
    if rehearsal:
        params[CPU_REHEARSAL_TAG] = "true"
    if overrides:
        params[OVERRIDES_TAG] = json.dumps(list(overrides))
    params.update(policy.parent_params())
    params[GRID_AXES_TAG] = json.dumps(spec.grid_levels())
    params.update(workload_for(spec).parent_params(todo.cells))
    return params


def _placed(spec: AnySweep, todo: Plan, smoke: bool) -> tuple[AnySweep, bool]:
    """``placement.fit`` for the pending cells, saying which of their resource groups (the
    study's datasets) wait for the autoscaler."""
    groups = list(dict.fromkeys(c.resource_group for c in todo.pending))  # in the sweep's order
    placed = placement.fit(spec, groups, smoke=smoke)
    for dataset, request in placed.check.later.items():
        pending = sum(c.resource_group == dataset for c in todo.pending)
        print(
            f"waiting for the autoscaler to add a node for {dataset} ({request}); {pending} "
            f"trials pending (gives up after {placement.placement_timeout_s():g} s, "
            f"${placement.PLACEMENT_TIMEOUT_ENV})"
        )
    return placed.spec, placed.rehearsed_on_cpus


def _run_cells(
    spec: AnySweep, session: DriverSession, todo: Plan, policy: SeedPolicy, verbose: int
) -> SweepOutcome:
    # lazy: callbacks import ray.tune and mlflow (~2.9 s); kept out of --dry-run and --help
    from fusion_ray.driver.callbacks import MLflowSweepCallback

    tracker, parent_id = session.tracker, session.parent
    workload = workload_for(spec)
    finish_ended_trials(spec, tracker, todo, workload, lease_token=session.lease.token)
    cells, done = todo.cells, todo.done
    note = todo.other_settings_note(spec.name)
    if not policy.needed():
        print(f"sweep {spec.name}: {policy.nothing_to_do()}; nothing to do")
        session.end({"cells_finished": len(done)})
        return SweepOutcome(len(cells), len(done), 0, [], {}, [], note)
    callback = MLflowSweepCallback(
        tracker,
        {c.cell_id: c for c in todo.pending},
        todo.existing,
        parent_id,
        storage_uri(spec.storage_path),
        at_most=policy.at_most,
        lease=session.lease,
        cells_left=policy.cells_left if policy.at_most else None,
        hypotheses_open=policy.hypotheses_open if policy.at_most else None,
        workload=workload,
    )
    try:
        with session.tune_run(lambda: len(callback.finished)):
            ran = _run_policy(spec, todo, (policy, workload), callback, session, verbose)
    finally:
        interrupted = callback.close_unfinished()
    session.after_tune(
        failed=bool(callback.failed),
        store_lost=callback.store_lost,
        finished_now=len(callback.finished),
    )
    session.end(
        {
            "cells": len(cells),
            "cells_finished": len(done) + len(callback.finished),
            "cells_failed": len(callback.failed),
        }
    )
    return SweepOutcome(
        len(cells),
        len(done),
        ran,
        sorted(callback.finished),
        callback.failed,
        interrupted,
        note,
        lost=set(callback.lost),
    )


def _run_policy(
    spec: AnySweep,
    todo: Plan,
    how: tuple[SeedPolicy, Workload],
    callback: Any,
    session: DriverSession,
    verbose: int,
) -> int:
    """The policy's Tune runs, one after the other (none once the lease is lost); the number of
    trials they started. ``how``: the sweep's seed policy and workload."""
    policy, workload = how
    ran = 0
    for run in policy.tune_runs(f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}", callback):
        if session.lease.lost.is_set() or session.stopping():
            break
        jobs = [
            _job(workload, spec, c, resume_point(spec, c, todo.existing), run.name)
            for c in run.cells
        ]
        with tune_output(verbose):
            _tuner(spec, run, (jobs, workload), callback, session.stopping, verbose).fit()
        ran += len(run.searcher.started) if run.searcher is not None else len(run.cells)
    return ran


def _job(
    workload: Workload, spec: AnySweep, cell: Any, resume_from: str | None, tune_run: str
) -> Any:
    storage = storage_uri(spec.storage_path)
    return workload.job(cell, resume_from, tune_run, f"{storage.rstrip('/')}/{spec.name}-train")


def _tuner(
    spec: AnySweep,
    run: TuneRun,
    work: tuple[list[Any], Workload],
    callback: Any,
    stopping: Callable[[], bool],
    verbose: int,
) -> Any:
    """The Ray Tune run of a policy's cells: one trial per cell, each with its dataset's
    resources; all of them (a grid), or those the run's searcher suggests; every trial stops
    once ``stopping()`` (a signal) or the callback's lease or store is lost."""
    # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
    from ray import tune
    from ray.tune import PlacementGroupFactory

    # lazy: callbacks import ray.tune and mlflow (~2.9 s); kept out of --dry-run and --help
    from fusion_ray.driver.callbacks import DriverStopper

    searcher, tune_run = run.searcher, run.name
    jobs, workload = work
    by_id = {c.cell_id: c for c in run.cells}
    resources_by_id = {
        c.cell_id: PlacementGroupFactory([trial_resources(spec.group_resources(c.resource_group))])
        for c in run.cells
    }
    # The jobs go to the object store once (with_parameters); each trial picks its own by id.
    trainable = tune.with_parameters(
        _run_by_id, jobs={j.cell_id: j for j in jobs}, run=workload.trial_function
    )
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
            trial_name_creator=lambda t: by_id[t.config["cell_id"]].trial_name,
            trial_dirname_creator=lambda t: t.config["cell_id"],
        ),
        run_config=tune.RunConfig(
            name=tune_run,
            storage_path=storage_uri(spec.storage_path),
            stop=DriverStopper(callback, stopping),
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
    # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
    from ray.tune import Callback

    watch = PlacementWatch(placement_timeout_s())

    class _Watch(Callback):
        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            watch(trials)

    return _Watch()


def _run_by_id(config: dict[str, Any], jobs: dict[str, Any], run: Callable[[Any], None]) -> None:
    run(jobs[config["cell_id"]])
