"""The command: ``python -m fusion_ray.sweep SWEEP.yaml [KEY=VALUE ...] [--dry-run] [--smoke]``.

Validate the sweep file (every problem at once, before Ray starts) and check its stores -> the
dry run's cells, or the sweep run by the driver (``fusion_ray.driver.runner`` through
``fusion_ray.api``) -> the outcome, the summary table, the seed policy's closing lines (an
adaptive sweep's decisions) -> the analysis report. Every stop is one message and an exit code
(``fusion_ray.driver.session.EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fusion_ray.cli import add_file_arguments, common_options, plain, run_command
from fusion_ray.config.files import SweepFileError, check_file_shape
from fusion_ray.redact import redact, split_credentials

if TYPE_CHECKING:
    from fusion_ray.config.workload import AnySweep


def build_parser(prog: str = "python -m fusion_ray.sweep") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=plain(__doc__.splitlines()[0]),
        parents=[common_options()],
    )
    add_file_arguments(
        parser,
        "sweep_file",
        "a sweep YAML, e.g. sweeps/quickstart.yaml",
        "train.epochs=3 seeds=[0,1] resources.workers=2",
        "recorded on the parent run, and part of the cells' configs",
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
        "--smoke",
        action="store_true",
        help="run a shrunk copy (one seed, one epoch, 64 training documents) as experiment NAME-smoke",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m fusion_ray.sweep") -> int:
    args = build_parser(prog).parse_intermixed_args(argv)
    try:  # the file's own problems first: said before torch, Ray or MLflow load
        check_file_shape(args.sweep_file, args.overrides)
    except (SweepFileError, FileNotFoundError) as exc:
        print(redact(exc), file=sys.stderr)
        return 2
    # lazy: the API, the grid and the driver import torch, Ray and MLflow (~2.5 s)
    from fusion_ray import api
    from fusion_ray.config.workload import cells_of
    from fusion_ray.console import print_outcome, summary_table
    from fusion_ray.driver.session import quiet_console

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_console(args.verbose)
    _quiet_tune()
    try:
        spec = api.load(args.sweep_file, args.overrides)
        if args.smoke:
            spec = api.smoke_version(spec)
        api.check_stores(spec, remote=not args.dry_run, source=args.sweep_file)
    except (SweepFileError, FileNotFoundError) as exc:
        print(redact(exc), file=sys.stderr)
        return 2
    if args.dry_run:  # a store that refuses or does not answer: one message, its exit code
        text = run_command(
            lambda: api.dry_run_text(spec, address=args.address, smoke=args.smoke),
            stopped=lambda name: f"sweep {spec.name}: dry run stopped by {name}",
        )
        if isinstance(text, int):
            return text
        print(text)
        return 0
    print(
        f"sweep {spec.name}: {len(cells_of(spec))} cells; MLflow at {redact(spec.tracking_uri)}, "
        f"checkpoints in {redact(spec.storage_path)}"
    )
    outcome = run_command(
        lambda: api.run(
            spec,
            args.sweep_file,
            address=args.address,
            verbose=args.verbose,
            take_over=args.take_over,
            smoke=args.smoke,
            overrides=args.overrides,
        ),
        stopped=lambda name: (
            f"\nsweep {spec.name}: stopped by {name}: its running trials were stopped and their "
            "runs and the sweep's parent run marked KILLED; finished cells stay finished. Re-run "
            "the same command to resume (interrupted trials continue from their last checkpoint)."
        ),
    )
    if isinstance(outcome, int):
        return outcome
    print_outcome(spec, outcome, note=args.no_report)
    print(summary_table(spec))
    for line in outcome.closing:
        print(line)
    if not args.no_report:
        _report(spec, args.report_dir or str(Path("reports") / spec.name))
    print("\n" + where_to_look(spec.tracking_uri))
    return 1 if outcome.failed or outcome.interrupted else 0


def where_to_look(tracking_uri: str) -> str:
    """The closing hint: a tracking server's UI is the server itself (open its address); a
    store MLflow opens directly (sqlite, a database) is shown by ``mlflow ui`` on it."""
    shown = redact(tracking_uri)
    if tracking_uri.lower().startswith(("http://", "https://")):
        bare = redact(split_credentials(tracking_uri)[0])
        return f"the runs are on the MLflow server: open {bare} in a browser"
    return f"mlflow ui --backend-store-uri {shown}   # then open http://127.0.0.1:5000"


def _quiet_tune() -> None:
    """Tune warnings the driver says better itself."""
    # Keeping only the last checkpoints makes Tune snapshot its state after each one, which it
    # then warns about on every trial; the snapshots are cheap here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Trials that cannot be placed are checked before Tune starts and watched while it runs
    # (fusion_ray.driver.placement): Tune's own every-minute warning would only repeat it.
    for name in (
        "TUNE_WARN_INSUFFICENT_RESOURCE_THRESHOLD_S",
        "TUNE_WARN_INSUFFICENT_RESOURCE_THRESHOLD_S_AUTOSCALER",
    ):
        os.environ.setdefault(name, "1e9")


def _report(spec: AnySweep, out_dir: str) -> None:
    """The analysis report of the sweep's experiment, written to ``out_dir`` and logged to its
    parent run; a report that cannot be made says why and how to run it by hand."""
    # lazy: the report takes ~1.3 s to import; only the end-of-sweep report needs it
    from analysis.load import AnalysisError, StoreAccessError
    from analysis.report import print_summary
    from analysis.report.trainable import TrainableReport
    from analysis.stats import StatsSettings
    from fusion_ray import api

    try:
        result = api.report(spec, out_dir)
    except (AnalysisError, StoreAccessError, ValueError) as err:
        print(
            f"analysis report did not complete: {err}\nrun it by hand: python -m analysis.report "
            f"--experiment {spec.name} --tracking-uri {redact(spec.tracking_uri)}"
        )
        return
    if isinstance(result, TrainableReport):
        print("\n".join(result.summary_lines()))
        return
    print_summary(result, StatsSettings().alpha)  # the alpha api.report uses


if __name__ == "__main__":
    sys.exit(main())
