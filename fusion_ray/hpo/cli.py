"""``python -m fusion_ray.hpo HPO.yaml``: validate, print the plan, tune, write the fragment."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fusion_ray.cli import add_file_arguments, common_options, run_command
from fusion_ray.config import SweepFileError, resources_for
from fusion_ray.config.grid import Cell, expand
from fusion_ray.driver.preflight import preflight
from fusion_ray.driver.session import quiet_console
from fusion_ray.hpo.fragment import exists_message, short
from fusion_ray.hpo.ranking import Ranking
from fusion_ray.hpo.run import run_hpo
from fusion_ray.hpo.spec import METRIC, HpoFileError, HpoPlan, load_hpo, smoke_plan
from fusion_ray.hpo.trainable import (
    found_text,
    is_trainable_hpo,
    load_trainable_hpo,
    print_trainable_plan,
)
from fusion_ray.redact import redact


def print_plan(plan: HpoPlan) -> None:
    t = plan.tune
    if t.fusions:
        how = (
            f"{t.num_samples} Optuna settings, each trained on {len(t.fusions)} operators "
            f"({', '.join(op.label for op in t.fusions)}) with seed {t.seed}, no early stopping; "
            "chosen by mean validation rank"
        )
    else:
        how = (
            f"{t.num_samples} Optuna trials of {t.fusion.label} alone (seed {t.seed}; the other "
            f"operators reuse its settings); ASHA grace {t.asha.grace_period}, reduction "
            f"{t.asha.reduction_factor}"
        )
    print(
        f"hpo {plan.spec.name}: {len(t.datasets)} dataset(s) x {how}; "
        f"metric {METRIC} (validation only); MLflow at {redact(plan.spec.tracking_uri)}"
    )
    first: dict[str, Cell] = {}
    for cell in expand(plan.spec):
        first.setdefault(cell.dataset, cell)
    for cell in first.values():
        res = resources_for(plan.spec, cell.dataset)
        print(
            f"  {cell.dataset}: up to {cell.trial.train.epochs} epochs; {res.cpus_per_worker:g} CPU"
            + (f", {res.gpus_per_worker:g} GPU" if res.use_gpu else "")
            + " per trial"
        )
        for key, dist in t.space.items():
            section, _, name = key.partition(".")
            now = getattr(getattr(cell.trial, section), name)
            bounds = (
                dist.values if dist.type == "choice" else f"[{short(dist.low)}, {short(dist.high)}]"
            )
            print(f"    {key:<22} {dist.type:<10} {bounds}   (preset: {now})")
    print(f"  writes {plan.output}")
    for name, seeds in plan.sweeps.items():
        print(f"  for {name} (seeds {seeds}; tuning seed {t.seed} is none of them)")


def build_parser(prog: str = "python -m fusion_ray.hpo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Tune the shared settings before the paired grid (Optuna on Ray Tune).",
        parents=[common_options()],
    )
    add_file_arguments(
        parser,
        "hpo_file",
        "an HPO YAML, e.g. sweeps/hpo/fusion_matters.yaml",
        "tune.num_samples=8 train.epochs=3",
        "and recorded on the parent run",
    )
    parser.add_argument(
        "--output", default=None, help="write the fragment here instead of the file's output:"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing fragment")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="two trials of one epoch on 64 documents, experiment NAME-smoke, fragment NAME-smoke.yaml",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m fusion_ray.hpo") -> int:
    args = build_parser(prog).parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_console(args.verbose)

    if _names_a_trainable(args.hpo_file):
        return trainable_main(args)
    try:
        plan = load_hpo(args.hpo_file, args.overrides)
    except (HpoFileError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.smoke:
        plan = smoke_plan(plan)
    if args.output:
        plan.output = Path(args.output).resolve()
    problems = preflight(plan.spec.storage_path, plan.spec.tracking_uri, remote=not args.dry_run)
    if problems:
        print(HpoFileError(plan.path, problems), file=sys.stderr)
        return 2
    if args.dry_run:
        print_plan(plan)
        return 0
    if plan.output.exists() and not args.overwrite:  # looked at again under the lease
        print(exists_message(plan.output), file=sys.stderr)
        return 2

    print_plan(plan)
    best = tuned(
        plan.spec.name,
        lambda: run_hpo(
            plan,
            address=args.address,
            verbose=args.verbose,
            take_over=args.take_over,
            overwrite=args.overwrite,
        ),
    )
    if isinstance(best, int):
        return best
    print_found(plan, best)
    return 0


def print_found(plan: HpoPlan, best: dict) -> None:
    """What was chosen per dataset, and where the fragment went."""
    print()
    for dataset, found in best.items():
        if isinstance(found, Ranking):
            chosen = found.settings[0]
            scores = ", ".join(f"{op} {100 * chosen.scores[op]:.2f}%" for op in found.operators)
            score = f"mean validation rank {chosen.mean_rank:.2f} of {len(found.settings)} settings (val_acc {scores})"
        else:
            score = f"best val_acc {100 * found.value:.2f}%"
        print(f"{dataset}: {score} with " + ", ".join(f"{k}={v}" for k, v in found.config.items()))
    print(
        f"\nwrote {plan.output}\nadd it to a sweep file's extends: after the presets, e.g. "
        f"extends: [_study_datasets.yaml, tuned/{plan.output.name}]"
    )


def _names_a_trainable(path: str) -> bool:
    """Whether the file names a trainable (a file that cannot be read is the study loader's to
    refuse, with its message)."""
    try:
        return is_trainable_hpo(path)
    except (SweepFileError, OSError):
        return False


def trainable_main(args: argparse.Namespace) -> int:
    """A trainable's tuning (``fusion_ray.hpo.trainable``): validate, print the plan, tune,
    write the fragment."""
    try:
        plan = load_trainable_hpo(args.hpo_file, args.overrides)
    except SweepFileError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.smoke:
        print(
            "--smoke: a trainable's tuning has none; run it with tune.num_samples=2",
            file=sys.stderr,
        )
        return 2
    if args.output:
        plan.output = Path(args.output).resolve()
    spec = plan.spec
    problems = preflight(spec.storage_path, spec.tracking_uri, remote=not args.dry_run)
    if problems:
        print(SweepFileError(plan.path, problems), file=sys.stderr)
        return 2
    print_trainable_plan(plan)
    if args.dry_run:
        return 0
    if plan.output.exists() and not args.overwrite:  # looked at again under the lease
        print(exists_message(plan.output), file=sys.stderr)
        return 2
    # lazy: the tuning run imports Ray Tune, MLflow and torch (~3 s); kept out of --dry-run
    from fusion_ray.hpo.trainable_run import run_trainable_hpo

    best = tuned(
        spec.name,
        lambda: run_trainable_hpo(
            plan,
            address=args.address,
            verbose=args.verbose,
            take_over=args.take_over,
            overwrite=args.overwrite,
        ),
    )
    if isinstance(best, int):
        return best
    print(found_text(plan, best))
    return 0


def tuned(name: str, run: Callable[[], Any]) -> Any:
    """``run()`` (a tuning) as the command runs it: what it found, or an exit status (1: nothing
    finished, which its parent run says too; a signal's, its parent run KILLED)."""
    try:
        return run_command(
            run,
            stopped=lambda signal_name: (
                f"\nhpo {name}: stopped by {signal_name}; the HPO parent run is marked KILLED "
                "and no fragment was written. Run the same command again to tune from the start."
            ),
        )
    except RuntimeError as exc:  # nothing finished: the parent run says so too
        print(exc, file=sys.stderr)
        return 1
