"""Launch targets: the files that run sweeps on a cluster, a registry (``LAUNCHERS``, entry-point
group ``fusion_ray.launchers``) like every other pluggable family.

Built in: ``aws`` and ``onprem`` (``ray up`` files, ``fusion_ray.launch.rayup``), ``slurm`` (a
batch script on the batch-scheduler base, ``fusion_ray.launch.batch``), ``k8s`` (a KubeRay
RayJob). ``fusion-ray cluster NAME ...`` renders one (``main``); ``fusion-ray cluster --help``
and ``fusion-ray list`` show every target, plug-ins included, with the package it comes from.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from fusion_ray.launch import k8s, rayup, slurm
from fusion_ray.launch.batch import BatchJob, BatchTarget
from fusion_ray.launch.target import (
    LAUNCHERS,
    LaunchTarget,
    options,
    render,
    run,
    target_parser,
)
from fusion_ray.registry import BUILT_IN

BUILT_IN_TARGETS: tuple[tuple[str, type[LaunchTarget]], ...] = (
    ("aws", rayup.AwsTarget),
    ("onprem", rayup.OnpremTarget),
    ("slurm", slurm.SlurmTarget),
    ("k8s", k8s.KubeTarget),
)
"""The built-in launch targets in the order ``fusion-ray cluster --help`` and ``fusion-ray list``
show them; plug-ins follow by name."""
for _name, _target in BUILT_IN_TARGETS:
    LAUNCHERS.register(_name)(_target)

__all__ = [
    "LAUNCHERS",
    "BatchJob",
    "BatchTarget",
    "LaunchTarget",
    "k8s",
    "main",
    "options",
    "rayup",
    "render",
    "run",
    "slurm",
    "target_parser",
]


def _overview() -> argparse.ArgumentParser:
    """``fusion-ray cluster --help``: every target, with its summary and origin."""
    parser = argparse.ArgumentParser(
        prog="fusion-ray cluster",
        description="print the file that runs sweeps on a cluster, for one launch target "
        "(fusion-ray cluster TARGET --help: its options)",
    )
    sub = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name in LAUNCHERS.names():
        target = LAUNCHERS.get(name)
        origin = LAUNCHERS.origin(name)
        extra = "" if origin == BUILT_IN else f" [{origin}]"
        sub.add_parser(name, help=f"{target.summary}{extra}", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in LAUNCHERS:
        if args and not args[0].startswith("-"):
            close = difflib.get_close_matches(args[0], LAUNCHERS.names(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            _overview().print_usage(sys.stderr)
            print(
                f"error: no launch target {args[0]!r}{hint} (targets: "
                f"{', '.join(LAUNCHERS.names())})",
                file=sys.stderr,
            )
            return 2
        _overview().parse_args(args)  # --help, or the usage error
        return 2
    return run(args[0], args[1:])
