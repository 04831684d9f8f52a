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
from typing import Any

from fusion_ray.config import SweepFileError, SweepSpec, load_sweep, smoke_version
from fusion_ray.console import dry_run_text as _dry_run_text
from fusion_ray.driver import placement
from fusion_ray.driver.preflight import preflight
from fusion_ray.driver.runner import SweepOutcome, run_sweep
from fusion_ray.policy.plan import Plan, plan

__all__ = [
    "SweepFileError",
    "check_stores",
    "dry_run",
    "dry_run_text",
    "load",
    "report",
    "run",
    "smoke_version",
]


def load(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """The sweep file validated, with ``key=value`` overrides applied as edits of the file;
    raises ``SweepFileError`` listing every problem, ``FileNotFoundError`` for a missing file."""
    return load_sweep(path, overrides)


def check_stores(spec: SweepSpec, *, remote: bool = True, source: str | Path | None = None) -> None:
    """Raises ``SweepFileError`` when the storage path cannot be written or the tracking store
    cannot be reached (what would fail only after Ray starts); ``source``: the sweep file the
    message names (default: the sweep's name)."""
    problems = preflight(spec.storage_path, spec.tracking_uri, remote=remote)
    if problems:
        raise SweepFileError(source or f"sweep {spec.name}", problems)


DRY_RUN_WAIT_S = 5
"""Seconds a dry run waits for a tracking server's answer to each request, sent once (a run
waits out MLflow's retries: minutes)."""


def dry_run(spec: SweepSpec) -> Plan:
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
    spec: SweepSpec, todo: Plan | None = None, *, address: str | None = None, smoke: bool = False
) -> str:
    """What ``--dry-run`` prints: the cells, how many each axis has, which are FINISHED, what
    the seed policy would run, and whether the pending trials fit (``placement.dry_run_check``
    against this machine for a local Ray: trials it cannot hold are a warning, after the plan;
    ``smoke``: GPU trials rehearsed on CPUs, as ``--smoke`` runs them)."""
    todo = todo if todo is not None else dry_run(spec)
    pending = list(dict.fromkeys(c.dataset for c in todo.pending))  # in the sweep's order
    fits = placement.dry_run_check(spec, pending, address, smoke=smoke)
    return _dry_run_text(spec, todo) + "\n" + fits


def run(
    spec: SweepSpec,
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


def report(spec: SweepSpec, out_dir: str | Path | None = None) -> Any:
    """The analysis report of the sweep's runs, written to ``out_dir`` (default
    ``reports/<name>``) and logged to the sweep's parent run; raises ``analysis.AnalysisError``
    when there is nothing to analyse."""
    # lazy: the report takes ~1.3 s to import; only report() needs it
    from analysis.report import ReportOptions, build_report

    out = str(out_dir or Path("reports") / spec.name)
    return build_report(
        spec.name, spec.tracking_uri, ReportOptions(baseline=spec.baseline_label, out=out)
    )


def existing_tracker(spec: SweepSpec) -> Any:
    """The sweep's tracker if its store and experiment exist (None, without importing MLflow,
    when a local store is not there yet)."""
    if spec.tracking_uri.startswith("sqlite:///"):
        if not Path(spec.tracking_uri.removeprefix("sqlite:///")).is_file():
            return None
    # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.tracking import Tracker

    return Tracker.existing(spec.tracking_uri, spec.name)
