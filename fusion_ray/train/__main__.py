"""Run one trial locally without Ray: ``python -m fusion_ray.train TRIAL.yaml --out DIR``.

TRIAL.yaml holds a TrialConfig (dataset, data, model, train, seed); running the same command
again resumes from the last checkpoint in DIR.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml
from pydantic import TypeAdapter, ValidationError

from fusion_ray.train.loop import run_local
from fusion_ray.train.spec import TrialConfig


def build_parser(prog: str = "python -m fusion_ray.train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.splitlines()[0].replace("``", "")
    )
    parser.add_argument("trial_file", help="YAML with dataset, data, model, train and seed")
    parser.add_argument("--out", default="trial_out", help="checkpoints and metrics.jsonl go here")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m fusion_ray.train") -> int:
    args = build_parser(prog).parse_args(argv)
    with open(args.trial_file) as f:
        raw = yaml.safe_load(f) or {}
    try:
        trial = TypeAdapter(TrialConfig).validate_python(raw)
    except ValidationError as exc:
        print(f"{args.trial_file}: {exc}", file=sys.stderr)
        return 2
    final = run_local(trial, args.out)
    print(json.dumps(final, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
