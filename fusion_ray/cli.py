"""The ``fusion-ray`` command: one entry point for every job of the package.

    fusion-ray sweep sweeps/quickstart.yaml [KEY=VALUE ...] [--dry-run] [--smoke] ...
    fusion-ray hpo sweeps/hpo/agnews.yaml ...
    fusion-ray report --experiment quickstart ...
    fusion-ray train TRIAL.yaml ...
    fusion-ray cluster TARGET ...          (aws, onprem, slurm, k8s, plug-ins: --help lists them)
    fusion-ray list
    fusion-ray completion bash|zsh         (eval "$(fusion-ray completion bash)" in ~/.bashrc)

Each subcommand takes the options of the module it runs (``fusion-ray sweep --help`` shows
them; ``--dry-run``, ``--address`` and ``--verbose`` are one parser, ``common_options``, shared
by ``sweep`` and ``hpo``); ``python -m fusion_ray.sweep ...`` and the other module commands keep
working as they are.
``list`` prints every entry of every registry, with its options and the package it comes from.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fusion_ray.checks import address_problem
from fusion_ray.redact import redact
from fusion_ray.version import describe

if TYPE_CHECKING:
    from fusion_ray.registry import Registry

T = TypeVar("T")

#: subcommand -> (module whose ``main(argv)`` runs it, one line of help)
COMMANDS = {
    "sweep": ("fusion_ray.sweep", "run a sweep file's cells on Ray (or --dry-run / --smoke)"),
    "plan": (
        "fusion_ray.planner",
        "forecast an adaptive sweep's seeds, trials and card-hours (from a pilot or stated effects)",
    ),
    "hpo": ("fusion_ray.hpo.cli", "tune a sweep's shared settings with Optuna on Ray Tune"),
    "report": ("analysis.report", "the paired-statistics report of a sweep's MLflow runs"),
    "train": ("fusion_ray.train.__main__", "train one trial config locally (no Ray)"),
    "cluster": (
        "fusion_ray.launch",
        "render the file that runs sweeps on a cluster, for one launch target (see its --help)",
    ),
    "list": ("fusion_ray.cli", "every registry entry with its options and origin"),
    "completion": (
        "fusion_ray.completion",
        "print the shell completion of fusion-ray for bash or zsh (see its --help)",
    ),
}


def _address(text: str) -> str:
    """``--address`` as argparse checks it (a refusal is argparse's one message and exit 2)."""
    problem = address_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def common_options() -> argparse.ArgumentParser:
    """The options the commands that start Ray share (``sweep``, ``hpo``), as a parent parser:
    the same names, defaults and meaning in each."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dry-run", action="store_true", help="validate and print the plan; start nothing"
    )
    common.add_argument(
        "--address",
        default=None,
        type=_address,
        help="Ray cluster address: auto, local or HOST:PORT (default: the file's address, "
        "$RAY_ADDRESS, else local)",
    )
    common.add_argument(
        "--verbose",
        type=int,
        default=0,
        choices=[0, 1, 2],
        help="Ray Tune's own output and the libraries' start-up lines (0: one line per "
        "finished trial)",
    )
    common.add_argument(
        "--take-over",
        action="store_true",
        help="run even though another driver holds this file's lease (only when that driver is "
        "gone)",
    )
    return common


def add_file_arguments(
    parser: argparse.ArgumentParser, name: str, file_help: str, example: str, recorded: str
) -> None:
    """The file a command runs and its ``key=value`` overrides, as ``sweep`` and ``hpo`` both
    take them (``recorded``: what becomes of the overrides)."""
    parser.add_argument(name, help=file_help)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help=f"edits of the file, e.g. {example} (data.X, model.X and train.X set X in every "
        f"dataset's preset); checked like the file, {recorded}",
    )


def run_command(run: Callable[[], T], stopped: Callable[[str], str]) -> T | int:
    """``run()`` for a command that drives trials (``sweep``, ``hpo``) or looks at its store (a
    dry run): its value, or, when the driver stopped, the exit code of
    ``fusion_ray.driver.session.EXIT_CODES`` (``exit_code``) after one message saying why and
    what to do (``stopped(signal name)`` when a signal stopped it)."""
    # lazy: the driver session imports the config, torch and the trial (~2.5 s); fusion-ray
    # --help stays fast (~0.07 s)
    from fusion_ray.driver.session import DriverInterrupted, exit_code

    try:
        return run()
    except BaseException as exc:
        code = exit_code(exc)
        if code is None:
            raise
        if isinstance(exc, KeyboardInterrupt):
            name = exc.signal_name if isinstance(exc, DriverInterrupted) else "SIGINT"
            print(stopped(name), file=sys.stderr)
        else:
            print(f"error: {redact(exc)}", file=sys.stderr)
        return code


def registries() -> dict[str, Registry[Any]]:
    """Every registry a sweep file selects from by name."""
    # lazy: the model and data registries import torch (~1.5 s); fusion-ray --help stays fast
    from fusion_ray.data.sources import SOURCES
    from fusion_ray.data.tokenizer import TOKENIZERS
    from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS

    return {
        "fusions": FUSIONS,
        "positions": POSITIONS,
        "attention_positions": ATTENTION_POSITIONS,
        "data sources": SOURCES,
        "tokenizers": TOKENIZERS,
    }


def _option_text(param: inspect.Parameter) -> str:
    if param.default is inspect.Parameter.empty:
        return f"{param.name} (required)"
    return f"{param.name}={param.default!r}"


def _broken_lines(registry: Registry[Any]) -> list[str]:
    """One line per plug-in of ``registry`` that cannot be loaded: its name, its package, why,
    and the fix, so ``fusion-ray list`` shows it instead of failing."""
    return [
        f"  {b.name:<20} [{b.package}]  BROKEN: {b.reason} ({b.error}): {b.fix}"
        for b in registry.broken()
    ]


def list_entries() -> str:
    """Every entry of every registry: name, origin, options (with defaults); a plug-in that
    cannot be loaded is listed as broken, with its package and the fix."""
    lines = []
    for title, registry in registries().items():
        lines.append(f"{title} (entry-point group {registry.group}):")
        for name in registry.names():
            options = ", ".join(map(_option_text, registry.user_kwargs(name).values()))
            alias = registry.same_as(name)
            extra = f" = {alias}" if alias else ""
            lines.append(
                f"  {name:<20} [{registry.origin(name)}]{extra}  options: {options or 'none'}"
            )
        lines += _broken_lines(registry)
    # lazy: scipy (~0.2 s) and the report's statistics (~0.9 s); fusion-ray --help stays fast
    from analysis.stats import PLUGIN_GROUP, origin, statistics
    from analysis.stats.registry import REGISTRY as STATISTICS
    from fusion_ray.decide.rules import RULES

    lines.append(f"decision rules (entry-point group {RULES.group}; seeds: {{rule: NAME}}):")
    for name in RULES.names():
        options = ", ".join(map(_option_text, RULES.user_kwargs(name).values()))
        null = RULES.get(name).null
        lines.append(f"  {name:<20} [{RULES.origin(name)}]  options: {options or 'none'}")
        lines.append(f"  {'':<20} null: {null}")
    lines += _broken_lines(RULES)

    lines.append(f"report statistics (entry-point group {PLUGIN_GROUP}):")
    for stat in statistics():
        lines.append(f"  {stat.name:<20} [{origin(stat.name)}]  columns: {', '.join(stat.columns)}")
    lines += _broken_lines(STATISTICS)
    # lazy: the launch targets load yaml and their entry points (~0.04 s, --help takes ~0.07 s)
    from fusion_ray.launch import LAUNCHERS
    from fusion_ray.launch import options as launch_options

    lines.append(f"launch targets (entry-point group {LAUNCHERS.group}; fusion-ray cluster NAME):")
    for name in LAUNCHERS.names():
        flags = ", ".join(action.option_strings[0] for action in launch_options(name))
        lines.append(f"  {name:<20} [{LAUNCHERS.origin(name)}]  {LAUNCHERS.get(name).summary}")
        lines.append(f"  {'':<20} options: {flags or 'none'}")
    lines += _broken_lines(LAUNCHERS)
    # lazy: the trainables' entry points are read only where they are listed
    from fusion_ray.trainables import TRAINABLES

    lines.append(f"trainables (entry-point group {TRAINABLES.group}; a sweep's trainable: NAME):")
    for name in TRAINABLES.names():
        entry = TRAINABLES.get(name)
        kind = "deterministic" if entry.deterministic else "not declared deterministic"
        lines.append(f"  {name:<20} [{TRAINABLES.origin(name)}]  {entry.qualname} ({kind})")
    lines += _broken_lines(TRAINABLES)
    # lazy: the driver's workloads import Ray Train's trial code (~0.2 s beyond torch)
    from fusion_ray.driver.workload import WORKLOADS

    lines.append(f"kinds of sweep (entry-point group {WORKLOADS.group}; what the driver runs):")
    for name in WORKLOADS.names():
        kind = WORKLOADS.get(name)
        summary = plain((kind.__doc__ or "").strip().split("\n")[0])
        where = f"{kind.__module__}.{kind.__qualname__}"
        lines.append(f"  {name:<20} [{WORKLOADS.origin(name)}]  {where}")
        lines.append(f"  {'':<20} {summary}")
    lines += _broken_lines(WORKLOADS)
    return "\n".join(lines)


def usage() -> str:
    width = max(map(len, COMMANDS))
    commands = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
    summary = plain(__doc__.split("\n\n")[0])
    return (
        f"usage: fusion-ray COMMAND [options]   (fusion-ray COMMAND --help: its options)\n\n"
        f"{summary}\n\ncommands:\n{commands}\n\n  --version  print the version\n"
    )


def plain(text: str) -> str:
    """Help text as a terminal shows it: the docstrings' ``code`` marks removed."""
    return text.replace("``", "")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(usage(), end="")
        return 0
    if args[:1] in (["-V"], ["--version"]):
        print(describe())
        return 0
    if not args or args[0] not in COMMANDS:
        print(usage(), file=sys.stderr, end="")
        if not args:
            print("\nerror: name a command", file=sys.stderr)
        else:
            close = difflib.get_close_matches(args[0], COMMANDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            print(f"\nerror: unknown command {args[0]!r}{hint}", file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    if command == "list":
        if rest[:1] in (["-h"], ["--help"]):
            print(f"usage: fusion-ray list\n\n{COMMANDS['list'][1]}, plug-ins included")
            return 0
        print(list_entries())
        return 0
    module = importlib.import_module(COMMANDS[command][0])
    if "prog" in inspect.signature(module.main).parameters:  # its usage says `fusion-ray NAME`
        return int(module.main(rest, prog=f"fusion-ray {command}") or 0)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
