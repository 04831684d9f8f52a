"""fusion-ray from Python (notebooks, scripts): the core the ``fusion-ray`` commands call, with
exceptions instead of exit codes.

    from fusion_ray import api
    spec = api.load("sweeps/quickstart.yaml", ["train.epochs=3"])  # SweepFileError if invalid
    print(api.dry_run_text(spec))                                    # what --dry-run prints
    outcome = api.run(spec)                                          # SweepOutcome
    result = api.report(spec, "reports/quickstart")                  # the analysis report

The same validation, cells and ids, driver session (lease, placement check, signals), tracking
and report as the commands: ``fusion_ray.sweep`` parses the command line and calls these.
This is the one place where the engine (``fusion_ray.driver.runner``) and the analysis
(``analysis``) meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusion_ray.config import SweepFileError, SweepSpec, resources_for
from fusion_ray.config.workload import (
    AnySweep,
    decision_metric,
    is_trainable,
    load_any,
    smoke_of,
)
from fusion_ray.console import dry_run_text as _dry_run_text
from fusion_ray.driver import placement
from fusion_ray.driver.preflight import preflight
from fusion_ray.driver.runner import SweepOutcome, run_sweep
from fusion_ray.policy.plan import Plan, plan

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fusion_ray.study.forecast import Forecast

__all__ = [
    "SweepFileError",
    "check_stores",
    "dry_run",
    "dry_run_text",
    "forecast",
    "load",
    "report",
    "run",
    "smoke_version",
]


def load(path: str | Path, overrides: Sequence[str] = ()) -> AnySweep:
    """The sweep file validated, with ``key=value`` overrides applied as edits of the file: the
    study's ``SweepSpec``, or a ``TrainableSweep`` for a file that names a trainable; raises
    ``SweepFileError`` listing every problem, ``FileNotFoundError`` for a missing file."""
    return load_any(path, overrides)


def smoke_version(spec: AnySweep) -> AnySweep:
    """The ``--smoke`` copy of a sweep (``config.workload.smoke_of``): one seed, shrunk, as
    experiment NAME-smoke."""
    return smoke_of(spec)


def check_stores(spec: AnySweep, *, remote: bool = True, source: str | Path | None = None) -> None:
    """Raises ``SweepFileError`` when the storage path cannot be written or the tracking store
    cannot be reached (what would fail only after Ray starts); ``source``: the sweep file the
    message names (default: the sweep's name)."""
    problems = preflight(spec.storage_path, spec.tracking_uri, remote=remote)
    if problems:
        raise SweepFileError(source or f"sweep {spec.name}", problems)


DRY_RUN_WAIT_S = 5
"""Seconds a dry run waits for a tracking server's answer to each request, sent once (a run
waits out MLflow's retries: minutes)."""


def dry_run(spec: AnySweep) -> Plan:
    """The sweep's cells and which of them already have a FINISHED run; starts nothing. A
    tracking server that does not answer within ``DRY_RUN_WAIT_S`` is a
    ``fusion_ray.store_errors.StoreAccessError`` ("unreachable"), as one that refuses the
    credentials ("auth")."""
    check_stores(spec, remote=False)
    if not spec.tracking_uri.startswith(("http://", "https://")):
        return plan(spec, existing_tracker(spec))
    # lazy: store_faults imports mlflow (~1.3 s); a dry run of a local store stays fast
    from fusion_ray.driver.store_faults import answer_within

    with answer_within(spec.tracking_uri, DRY_RUN_WAIT_S):
        return plan(spec, existing_tracker(spec))


def dry_run_text(
    spec: AnySweep, todo: Plan | None = None, *, address: str | None = None, smoke: bool = False
) -> str:
    """What ``--dry-run`` prints: the cells, how many each axis has, which are FINISHED, what
    the seed policy would run, and whether the pending trials fit (``placement.dry_run_check``
    against this machine for a local Ray: trials it cannot hold are a warning, after the plan;
    ``smoke``: GPU trials rehearsed on CPUs, as ``--smoke`` runs them)."""
    todo = todo if todo is not None else dry_run(spec)
    pending = list(dict.fromkeys(c.resource_group for c in todo.pending))  # the sweep's order
    fits = placement.dry_run_check(spec, pending, address, smoke=smoke)
    return _dry_run_text(spec, todo) + "\n" + fits


def run(
    spec: AnySweep,
    sweep_file: str | None = None,
    *,
    address: str | None = None,
    smoke: bool = False,
    take_over: bool = False,
    overrides: Sequence[str] = (),
    verbose: int = 0,
) -> SweepOutcome:
    """Run the cells without a FINISHED run on Ray (``smoke``: ``spec`` should be
    ``smoke_version(spec)``; on a Ray without GPUs its GPU trials run on CPUs). Raises
    ``LeaseHeldError`` when another driver runs this sweep and ``PlacementError`` when the
    cluster cannot place its trials. ``overrides`` are only recorded on the parent run: apply
    them with ``load``."""
    check_stores(spec)
    return run_sweep(
        spec,
        sweep_file,
        address=address,
        verbose=verbose,
        take_over=take_over,
        smoke=smoke,
        overrides=overrides,
    )


def report(spec: AnySweep, out_dir: str | Path | None = None) -> Any:
    """The analysis report of the sweep's runs, written to ``out_dir`` (default
    ``reports/<name>``) and logged to the sweep's parent run; raises ``analysis.AnalysisError``
    when there is nothing to analyse."""
    # lazy: the report takes ~1.3 s to import; only report() needs it
    from analysis.report import ReportOptions, build_report

    out = str(out_dir or Path("reports") / spec.name)
    if is_trainable(spec):
        # lazy: as above
        from analysis.report.trainable import build_trainable_report

        return build_trainable_report(spec.name, spec.tracking_uri, out)
    return build_report(
        spec.name, spec.tracking_uri, ReportOptions(baseline=spec.baseline_label, out=out)
    )


def existing_tracker(spec: AnySweep) -> Any:
    """The sweep's tracker if its store and experiment exist (None, without importing MLflow,
    when a local store is not there yet)."""
    if spec.tracking_uri.startswith("sqlite:///"):
        if not Path(spec.tracking_uri.removeprefix("sqlite:///")).is_file():
            return None
    # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.tracking import Tracker

    return Tracker.existing(spec.tracking_uri, spec.name)


def forecast(
    spec: SweepSpec,
    *,
    pilot: str | None = None,
    pilot_seeds: int | None = None,
    effects: Mapping[str, float] | None = None,
    spread: float = 3.5,
    shared: float = 0.0,
    base: float = 80.0,
    trial_hours: Mapping[str, float] | None = None,
    chip: str | None = None,
    replays: int | None = None,
    seed: int = 0,
    smoothing: float = 1.0,
) -> Forecast:
    """What an adaptive sweep will take (``fusion-ray plan``): its own schedule and rule run
    ``replays`` times on results from ``pilot`` (an experiment in the sweep's tracking store
    holding its first wave: its runs of the first ``pilot_seeds`` seeds, or of every seed, are
    kept and its seeds drawn again; trial times from its runs) or from stated ``effects``
    (points against the baseline by ``OPERATOR`` or ``DATASET/OPERATOR``; each run's SD
    ``spread``, a per-seed part ``shared`` by a group; ``trial_hours``: card-hours of one trial
    per dataset; ``chip``: from the epoch times measured on that card for the study's presets,
    ``fusion_ray.study.forecast.measured_trial_hours``). Raises
    ``fusion_ray.study.forecast.ForecastInputError`` saying what to give instead."""
    # lazy: the forecast runs the schedule (the decision rules: scipy); kept out of --help
    from fusion_ray.config.grid import expand
    from fusion_ray.study import forecast as fc

    if spec.adaptive is None:
        raise fc.ForecastInputError(
            f"sweep {spec.name}: seeds: a fixed list runs exactly its seeds; plan forecasts "
            "adaptive seeds (seeds: {adaptive: true, first: 6, max: 14})"
        )
    if (pilot is None) == (effects is None):
        raise fc.ForecastInputError("give a pilot experiment or stated effects (one of them)")
    cells = expand(spec)
    known: dict[str, Any] = {}
    source, unit = "", "card-hours"
    if pilot is not None:
        world, known, trial_hours, source = _pilot_world(spec, cells, pilot, pilot_seeds, smoothing)
        if not any(resources_for(spec, d).use_gpu for d in spec.datasets):
            unit = "trial-hours"
    else:
        assert effects is not None
        problems = _effect_problems(cells, effects)
        if problems:
            raise fc.ForecastInputError("\n".join(problems))
        world = fc.StatedWorld(dict(effects), spread=spread, shared=shared, base=base)
        source = "the hours of one trial given" if trial_hours else ""
    if chip is not None:
        trial_hours, source = fc.measured_trial_hours(chip, _one_trial_each(spec, cells))
    return fc.forecast(
        cells,
        spec.baseline_label,
        spec.adaptive,
        world,
        regimes=list(spec.grid.datasets),
        known=known,
        replays=replays or fc.DEFAULT_REPLAYS,
        seed=seed,
        trial_hours=trial_hours,
        hours_source=source,
        hours_unit=unit,
    )


def _effect_problems(cells: list[Any], effects: Mapping[str, float]) -> list[str]:
    """Stated effects that name no operator (or dataset) of the sweep's cells."""
    fusions = sorted({c.fusion for c in cells})
    datasets = sorted({c.dataset for c in cells})
    return [
        f"effects: {key!r} names no operator of the sweep (OPERATOR or DATASET/OPERATOR; "
        f"operators: {', '.join(fusions)}; datasets: {', '.join(datasets)})"
        for key in effects
        if key.rpartition("/")[2] not in fusions
        or (key.rpartition("/")[0] and key.rpartition("/")[0] not in datasets)
    ]


def _one_trial_each(spec: SweepSpec, cells: list[Any]) -> dict[str, tuple[int, Any]]:
    """Per dataset: its trials' epochs and resources (what measured hours scale with)."""
    out = {}
    for cell in cells:
        if cell.dataset not in out:
            out[cell.dataset] = (cell.trial.train.epochs, resources_for(spec, cell.dataset))
    return out


def _cards(spec: SweepSpec, dataset: str) -> float:
    """The GPUs one trial of ``dataset`` holds (1 for a CPU trial: an hour is a trial-hour)."""
    res = resources_for(spec, dataset)
    return res.workers * res.gpus_per_worker if res.use_gpu else 1.0


def _pilot_world(
    spec: SweepSpec, cells: list[Any], pilot: str, seeds: int | None, smoothing: float
) -> tuple[Any, dict[str, Any], dict[str, float] | None, str]:
    """The pilot's world, its kept results, the card-hours of one trial per dataset from its
    runs' times, and where those hours come from."""
    # lazy: tracking imports mlflow (~1.3 s), the forecast the decision rules (scipy); only a
    # forecast from a pilot needs them
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.policy.schedule import finished_results
    from fusion_ray.study import forecast as fc

    tracker = Tracker.existing(spec.tracking_uri, pilot)
    if tracker is None:
        first = spec.adaptive.first if spec.adaptive else 6
        raise fc.ForecastInputError(
            f"pilot: no experiment {pilot!r} in {spec.tracking_uri}: run the first wave first "
            f"(fusion-ray sweep FILE seeds.max={first}), or name the experiment that holds it"
        )
    runs = tracker.cell_runs(*decision_metric(spec))
    rows, known = fc.pilot_rows(cells, finished_results(cells, runs), seeds)
    try:
        world = fc.PilotWorld(rows, smoothing=smoothing)
    except fc.ForecastInputError as exc:
        raise fc.ForecastInputError(f"pilot {pilot!r}: {exc}") from None
    by_dataset: dict[str, list[float]] = {}
    for cell in cells:
        run = runs.get(cell.cell_id)
        if cell.cell_id in known and run is not None and run.seconds and run.status == "FINISHED":
            by_dataset.setdefault(cell.dataset, []).append(run.seconds)
    hours: dict[str, float] = {}
    gpu = False
    for dataset, seconds in by_dataset.items():
        gpu = gpu or resources_for(spec, dataset).use_gpu
        hours[dataset] = sum(seconds) / len(seconds) / 3600 * _cards(spec, dataset)
    text = (
        "the pilot's own trial times: "
        + ", ".join(f"{d} {h * 3600 / max(_cards(spec, d), 1):.0f} s" for d, h in hours.items())
        + (" per trial, x its cards" if gpu else " per trial")
    )
    return world, known, (hours or None), text
