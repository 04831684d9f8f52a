"""The command: ``fusion-ray plan SWEEP.yaml [KEY=VALUE ...] (--pilot [EXPERIMENT] | --effects
OP=POINTS,...)``: how many seeds, trials and card-hours an adaptive sweep will take.

The sweep's own schedule and decision rule run many times on simulated results
(``fusion_ray.study.forecast``): drawn again from a first wave already logged (``--pilot``; its
runs stay the sweep's own), or made from stated effects and spread in points (``--effects``).
Printed per hypothesis: the share of replays it was decided in within the cap, stopped as
futile, its seeds' mean, 90th percentile and 5-95 % band; for the sweep: trials and card-hours
(mean and 90th percentile). Starts no Ray; reads the tracking store only for a pilot.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fusion_ray.cli import add_file_arguments, plain
from fusion_ray.config.files import SweepFileError, check_file_shape
from fusion_ray.config.spec import SweepSpec
from fusion_ray.redact import redact

TRAINABLE_PLAN = (
    "trainable: the planner forecasts the study's sweeps (its pilot effects are by dataset and "
    "operator); for a trainable's sweep, run its first wave and read the decisions' evidence "
    "(fusion-ray sweep FILE seeds.max=FIRST)"
)


def _pairs(text: str, form: str, example: str) -> dict[str, float]:
    """``KEY=NUMBER,KEY=NUMBER`` as argparse checks it: an item without a key, an ``=`` or a
    number is refused, naming the item, the ``form`` and an ``example``; so is no item at all."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{item!r}: write {form}, e.g. {example}")
        out[key.strip()] = number
    if not out:
        raise argparse.ArgumentTypeError(f"name at least one {form.split(' or ')[0]}")
    return out


def _effects(text: str) -> dict[str, float]:
    """``OP=POINTS,DATASET/OP=POINTS`` as argparse checks it."""
    return _pairs(
        text, "OPERATOR=POINTS or DATASET/OPERATOR=POINTS", "gate_scalar=2,long/gate_scalar=5"
    )


def _hours(text: str) -> dict[str, float]:
    """``DATASET=HOURS,...`` as argparse checks it."""
    return _pairs(text, "DATASET=HOURS", "ag_news=0.05,arxiv=0.4")


def build_parser(prog: str = "python -m fusion_ray.planner") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=plain(__doc__.splitlines()[0]))
    add_file_arguments(
        parser,
        "sweep_file",
        "an adaptive sweep YAML, e.g. sweeps/quickstart.yaml",
        "seeds.max=20 tracking_uri=sqlite:///other.db",
        "the sweep forecast is the file so edited",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--pilot",
        nargs="?",
        const="",
        metavar="EXPERIMENT",
        help="draw results again from a first wave logged in the sweep's tracking store "
        "(default: the sweep's own experiment)",
    )
    source.add_argument(
        "--effects",
        type=_effects,
        metavar="OP=POINTS,...",
        help="stated effects against the baseline in points, per operator or DATASET/OPERATOR "
        "(e.g. gate_scalar=2,long/gate_scalar=5); operators not named: none",
    )
    parser.add_argument(
        "--pilot-seeds",
        type=int,
        default=None,
        metavar="N",
        help="keep only the pilot's first N seeds (what the planner would have said then)",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=3.5,
        metavar="POINTS",
        help="with --effects: the SD of one run's test accuracy, points (default 3.5)",
    )
    parser.add_argument(
        "--shared",
        type=float,
        default=0.0,
        metavar="POINTS",
        help="with --effects: the SD of a part a seed shares across a group's runs (default 0)",
    )
    parser.add_argument(
        "--trial-hours",
        type=_hours,
        default=None,
        metavar="DATASET=HOURS,...",
        help="card-hours of one trial per dataset (default: a pilot's own trial times; with "
        "--effects: no hours)",
    )
    parser.add_argument(
        "--chip",
        default=None,
        metavar="CARD",
        help="card-hours from the epoch times measured on this card for the study's presets "
        "(H100, H200; an upper bound: every trial runs all its epochs)",
    )
    parser.add_argument(
        "--replays", type=int, default=None, help="replays of the sweep (default 200)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the replays' random seed (default 0)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m fusion_ray.planner") -> int:
    args = build_parser(prog).parse_intermixed_args(argv)
    try:  # the file's own problems first: said before torch loads
        check_file_shape(args.sweep_file, args.overrides)
    except (SweepFileError, FileNotFoundError) as exc:
        print(redact(exc), file=sys.stderr)
        return 2
    # lazy: the API and the forecast import torch, Ray and MLflow (~2.5 s)
    from fusion_ray import api
    from fusion_ray.study.forecast import ForecastInputError

    try:
        spec = api.load(args.sweep_file, args.overrides)
        if not isinstance(spec, SweepSpec):
            raise SweepFileError(args.sweep_file, [TRAINABLE_PLAN])
        result = api.forecast(
            spec,
            pilot=(args.pilot or spec.name) if args.pilot is not None else None,
            pilot_seeds=args.pilot_seeds,
            effects=args.effects,
            spread=args.spread,
            shared=args.shared,
            trial_hours=args.trial_hours,
            chip=args.chip,
            replays=args.replays,
            seed=args.seed,
        )
    except (SweepFileError, FileNotFoundError) as exc:
        print(redact(exc), file=sys.stderr)
        return 2
    except ForecastInputError as exc:
        print(f"error: {redact(exc)}", file=sys.stderr)
        return 2
    where = (
        f"pilot {args.pilot or spec.name} ({result.done} trials kept)"
        if args.pilot is not None
        else "stated effects "
        + ", ".join(f"{k}={v:g}" for k, v in args.effects.items())
        + f", spread {args.spread:g}, shared {args.shared:g} points"
    )
    rule = spec.adaptive
    assert rule is not None  # api.forecast refuses fixed seeds
    print(
        f"plan {spec.name}: seeds {rule.first} to {rule.max}, alpha {rule.alpha:g}, "
        f"{len(result.hypotheses)} hypotheses; {result.replays} replays from {where}"
    )
    for line in result.lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
