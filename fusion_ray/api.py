"""fusion-ray from Python (notebooks, scripts): what ``fusion-ray sweep`` does, step by step,
with exceptions instead of exit codes.

    from fusion_ray import api
    spec = api.load("sweeps/quickstart.yaml", ["train.epochs=3"])  # SweepFileError if invalid
    print(api.dry_run_text(spec))                                    # what --dry-run prints
    outcome = api.run(spec)                                          # SweepOutcome
    result = api.report(spec, "reports/quickstart")                  # the analysis report

The steps are the CLI's own functions: the same validation, the same cells and ids, the same
lease, placement check, tracking and report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusion_ray.config import SweepFileError, SweepSpec, load_sweep
from fusion_ray.orchestrate import preflight
from fusion_ray.plan import Plan, plan
from fusion_ray.sweep import SweepOutcome, dry_run_text, existing_tracker, run_sweep

__all__ = ["SweepFileError", "check_stores", "dry_run", "dry_run_text", "load", "report", "run"]


def load(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """The sweep file validated, with ``key=value`` overrides applied as edits of the file;
    raises ``SweepFileError`` listing every problem, ``FileNotFoundError`` for a missing file."""
    return load_sweep(path, overrides)


def check_stores(spec: SweepSpec, *, remote: bool = True) -> None:
    """Raises ``SweepFileError`` when the storage path cannot be written or the tracking store
    cannot be reached (what would fail only after Ray starts)."""
    problems = preflight(spec.storage_path, spec.tracking_uri, remote=remote)
    if problems:
        raise SweepFileError(f"sweep {spec.name}", problems)


def dry_run(spec: SweepSpec) -> Plan:
    """The sweep's cells and which of them already have a FINISHED run; starts nothing."""
    check_stores(spec, remote=False)
    return plan(spec, existing_tracker(spec))


def run(
    spec: SweepSpec,
    *,
    address: str | None = None,
    smoke: bool = False,
    take_over: bool = False,
    overrides: Sequence[str] = (),
    verbose: int = 0,
) -> SweepOutcome:
    """Run the cells without a FINISHED run on Ray (``smoke``: ``spec`` should be
    ``config.smoke_version(spec)``; on a Ray without GPUs its GPU trials run on CPUs). Raises
    ``LeaseHeldError`` when another driver runs this sweep and ``PlacementError`` when the
    cluster cannot place its trials. ``overrides`` are only recorded on the parent run: apply
    them with ``load``."""
    check_stores(spec)
    return run_sweep(
        spec,
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
    from analysis.report import ReportOptions, build_report

    out = str(out_dir or Path("reports") / spec.name)
    options = ReportOptions(baseline=spec.baseline or spec.grid.fusions[0].label, out=out)
    return build_report(spec.name, spec.tracking_uri, options)
