"""What a launch target is, and their registry (entry-point group ``fusion_ray.launchers``).

A launch target turns its own command-line options into the one file that runs sweeps on some
kind of cluster: a ``ray up`` file (``aws``, ``onprem``), a batch script (``slurm``), a
Kubernetes manifest (``k8s``). ``fusion-ray cluster NAME ...`` finds the target in ``LAUNCHERS``
by name, parses the options it declares (``add_arguments``; a target that ``runs_sweep`` gets
the sweep file and its ``KEY=VALUE`` edits first) and prints ``render(args)``.

A package adds a target with an entry point in the group ``fusion_ray.launchers`` naming a
``LaunchTarget`` subclass; ``fusion-ray list`` shows every target with the package it comes
from, and ``fusion_ray.testing.check_launcher(name)`` is the contract its tests call.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from fusion_ray.registry import Registry

#: The Ray every node installs: the laptop's (its launcher, the head's autoscaler and the nodes
#: must agree).
RAY_VERSION = "2.60.0"
PYTHON_VERSION = "3.11"
#: The custom resource a sweep file's ``resources.driver_resource`` asks for: one unit per DDP
#: trial, offered by the head only, so at most this many DDP trials run at once.
DRIVER_RESOURCE = "fusion_ray_driver"
DRIVER_SLOTS = 64


class LaunchTarget:
    """One kind of file that runs sweeps on a cluster: subclass it, set the class attributes,
    implement ``add_arguments`` and ``render``."""

    summary: ClassVar[str] = ""
    """One line: what the file is (``fusion-ray cluster --help``, ``fusion-ray list``)."""
    output: ClassVar[Literal["shell", "yaml"]] = "shell"
    """What ``render`` writes: a bash script, or YAML (``documents`` of them)."""
    documents: ClassVar[int] = 1
    """The number of YAML documents of the output (``output = "yaml"``)."""
    runs_sweep: ClassVar[bool] = True
    """The target takes ``SWEEP_FILE [KEY=VALUE ...]`` and its file runs
    ``python -m fusion_ray.sweep SWEEP_FILE KEY=VALUE ...`` with them, as given. False: a file
    that makes a cluster for ``ray submit`` or ``ray job submit`` (``aws``, ``onprem``)."""
    directive: ClassVar[str | None] = None
    """The prefix of a batch scheduler's directive lines (``#SBATCH``), which must come before
    any command of the script."""
    code_options: ClassVar[tuple[str, ...]] = ()
    """The options whose value is shell code by design: it runs, or is expanded, as written on
    the nodes (an activation line, a command printing the node's address). Every other option's
    value must reach the file's commands as the exact word given (``check_launcher``)."""
    shell_keys: ClassVar[tuple[str, ...]] = ()
    """The keys of a YAML file whose strings (or lists of strings) a shell runs on the cluster
    (``setup_commands``, a RayJob's ``entrypoint``): ``check_launcher`` runs them too."""
    example_environment: ClassVar[dict[str, str]] = {}
    """What the scheduler sets in the environment of the script it runs (job id, node name):
    ``check_launcher`` runs the script with these, every command replaced by a recorder."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the target's options on ``parser``, each with its help text."""

    def render(self, args: argparse.Namespace) -> str:
        """The file for the parsed options (``args.sweep_file`` and ``args.overrides`` too, with
        ``runs_sweep``). Raises ValueError listing every problem, each naming its option."""
        raise NotImplementedError

    def example_args(self) -> list[str]:
        """Options (after the sweep file and its edits) with which ``render`` succeeds: the
        contract suite and the docs render with them."""
        return []


def _accept(loaded: Any, origin: str) -> type[LaunchTarget]:
    if isinstance(loaded, type) and issubclass(loaded, LaunchTarget):
        return loaded
    raise TypeError(
        f"{origin}: the entry point in group fusion_ray.launchers loads {loaded!r}; it must name "
        "a subclass of fusion_ray.launch.LaunchTarget"
    )


LAUNCHERS: Registry[type[LaunchTarget]] = Registry(
    "launch target", group="fusion_ray.launchers", accept=_accept
)


def target_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``fusion-ray cluster NAME``: the sweep file and its edits (for a target
    that runs one), then the target's own options."""
    target = LAUNCHERS.get(name)()
    parser = argparse.ArgumentParser(prog=f"fusion-ray cluster {name}", description=target.summary)
    if target.runs_sweep:
        parser.add_argument("sweep_file", help="the sweep file, e.g. sweeps/full_grid.yaml")
        parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="sweep file edits")
    target.add_arguments(parser)
    return parser


def options(name: str) -> list[argparse.Action]:
    """The options a target declares (not ``--help``, not the sweep file and its edits)."""
    return [
        action
        for action in target_parser(name)._actions
        if action.option_strings and action.dest != "help"
    ]


def render(name: str, argv: list[str]) -> str:
    """``fusion-ray cluster NAME ARGV...``'s output. Raises ValueError listing every problem
    (argparse exits on options it cannot parse, as on the command line)."""
    target = LAUNCHERS.get(name)()
    return target.render(target_parser(name).parse_intermixed_args(argv))


def run(name: str, argv: Sequence[str]) -> int:
    """``fusion-ray cluster NAME ARGV...``: print the file, or every problem (exit code 2)."""
    try:
        sys.stdout.write(render(name, list(argv)))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


MOST_COUNT = 2**31 - 1
"""The largest count a scheduler's or Kubernetes' field holds (a 32-bit signed integer)."""


def count_problems(counts: Sequence[tuple[str, int, int]]) -> list[str]:
    """A problem for each (option, value, least) whose value is below its least or above
    ``MOST_COUNT`` (the scheduler would refuse, or wrap, a larger one), naming the option and
    the bound."""
    out = []
    for what, value, least in counts:
        if value < least:
            out.append(f"{what} {value}: must be {least} or more")
        elif value > MOST_COUNT:
            out.append(f"{what} {value}: must be at most {MOST_COUNT:,} (a 32-bit count)")
    return out
