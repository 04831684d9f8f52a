"""Every registered launch target (built-ins and installed plug-ins) keeps the contract of
``fusion_ray.testing.launch``: declared and documented options, a well-formed file with default
and hostile values, and a sweep command whose words are exactly the sweep file and its edits.
The contract catches a target that breaks it; ``fusion-ray cluster`` dispatches through the
registry."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import yaml

from fusion_ray.cli import list_entries
from fusion_ray.launch import LAUNCHERS, BatchJob, BatchTarget, LaunchTarget, main, render
from fusion_ray.launch.join import JOIN_FAILED_EXIT
from fusion_ray.launch.shell import shell_join, shell_word
from fusion_ray.testing.launch import check_launcher
from tests.conftest import ROOT


@pytest.mark.process  # bash -n and bash reading the sweep command's words
@pytest.mark.parametrize("name", LAUNCHERS.names())
def test_every_registered_launch_target_keeps_the_contract(name):
    check_launcher(name)


class _Unquoted(LaunchTarget):
    """Pastes the sweep file into its script as it is: a file with a space becomes two words."""

    summary = "a script that forgets to quote"

    def render(self, args: argparse.Namespace) -> str:
        words = " ".join([args.sweep_file, *args.overrides])
        return f"#!/bin/bash\npython -m fusion_ray.sweep {words}\n"


@pytest.mark.process
def test_the_contract_catches_a_target_that_does_not_quote_the_sweep_command():
    LAUNCHERS.register("unquoted", origin="tests")(_Unquoted)
    try:
        with pytest.raises(AssertionError, match="'unquoted' .*the sweep command gives"):
            check_launcher("unquoted")
    finally:
        LAUNCHERS.unregister("unquoted")


class _Pasted(LaunchTarget):
    """Quotes the sweep command but pastes ``--partition`` into a command as it is; refuses
    what would add a line, so the file keeps its shape whatever the value (the contract's shape
    check alone passes it)."""

    summary = "a script that pastes an option into a command"
    directive = "#JOB"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--partition", default="main", type=self.option_type, help="where")

    option_type: ClassVar = str

    def render(self, args: argparse.Namespace) -> str:
        if not str(args.partition).isprintable():
            raise ValueError(f"--partition {args.partition!r}: one line")
        sweep = shell_join([args.sweep_file, *args.overrides])
        return (
            f"#!/bin/bash\n#JOB --name=x\nreserve --partition={args.partition}\n"
            f"python -m fusion_ray.sweep {sweep}\n"
        )


class _PastedTyped(_Pasted):
    """The same, with the option read through a ``type=`` of its own (the old contract skipped
    such options)."""

    option_type: ClassVar = staticmethod(lambda text: text.strip())


class _Split(_Pasted):
    """Quotes the option, but only its first word: the value does not arrive as given."""

    def render(self, args: argparse.Namespace) -> str:
        args.partition = (args.partition.split() or [""])[0]
        return (
            super()
            .render(args)
            .replace(f"--partition={args.partition}", f"--partition={shell_word(args.partition)}")
        )


class _PastedEntrypoint(LaunchTarget):
    """A YAML file whose shell entrypoint gets ``--queue`` as it is."""

    summary = "a manifest that pastes an option into its entrypoint"
    output = "yaml"
    shell_keys = ("entrypoint",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queue", default="main", help="the queue")

    def render(self, args: argparse.Namespace) -> str:
        if not args.queue.isprintable():
            raise ValueError(f"--queue {args.queue!r}: one line")
        sweep = shell_join([args.sweep_file, *args.overrides])
        command = f"queue-select {args.queue} && python -m fusion_ray.sweep {sweep}"
        return yaml.safe_dump({"entrypoint": command, "queue": args.queue})


@pytest.mark.process  # bash runs each rendered file with its commands recorded
@pytest.mark.parametrize(
    ("target", "flag", "value", "says"),
    [
        (_Pasted, "--partition", "$(fusion_ray_probe)", "runs a command of its own"),
        (_Pasted, "--partition", "x|fusion_ray_probe", "runs a command of its own"),
        (_PastedTyped, "--partition", "`fusion_ray_probe`", "runs a command of its own"),
        (_Split, "--partition", "two words", "does not reach the file as the text given"),
        (_PastedEntrypoint, "--queue", "x; fusion_ray_probe", "runs a command of its own"),
    ],
)
def test_the_contract_catches_a_value_that_runs_or_does_not_arrive_as_given(
    target, flag, value, says
):
    """Each naive target fails ``check_launcher``, and the literal-arrival check alone names
    the value that ran as code or did not arrive (the shape and sweep-command checks pass it)."""
    from fusion_ray.testing.launch import _parsed, check_literal_arrival

    LAUNCHERS.register("naive", origin="tests")(target)
    try:
        with pytest.raises(AssertionError, match=f"'naive' .*{flag}="):
            check_launcher("naive")
        args = _parsed("naive")
        setattr(args, flag.removeprefix("--"), value)
        text = target().render(args)
        with pytest.raises(AssertionError) as failed:
            check_literal_arrival("naive", text, flag, value)
    finally:
        LAUNCHERS.unregister("naive")
    assert f"{flag}={value!r} {says}" in str(failed.value), str(failed.value)


@pytest.mark.unit
def test_a_plugin_entry_that_is_no_launch_target_is_refused_saying_what_it_must_be():
    with pytest.raises(TypeError, match="must name a subclass of fusion_ray.launch.LaunchTarget"):
        LAUNCHERS.accept(print, "some-package")


@pytest.mark.unit
def test_the_cluster_command_lists_every_target_and_suggests_a_close_name(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in LAUNCHERS.names():
        assert f"    {name} " in out, name
    assert main(["slrum", "x.yaml"]) == 2
    assert "did you mean 'slurm'?" in capsys.readouterr().err


@pytest.mark.unit
def test_fusion_ray_list_shows_each_target_with_its_origin_and_options():
    text = list_entries()
    assert "launch targets (entry-point group fusion_ray.launchers" in text
    for name in LAUNCHERS.names():
        assert f"  {name:<20} [{LAUNCHERS.origin(name)}]  {LAUNCHERS.get(name).summary}" in text
    assert "--requeue-on-time-limit" in text and "--ssh-proxy-command" in text


@dataclass(frozen=True)
class _ToyJob(BatchJob):
    """A made-up scheduler ("toy": ``#TOY`` directives, ``toyrun`` steps): what a second
    scheduler on the batch base supplies, and nothing else."""

    time: str = "1440"

    target: ClassVar[str] = "toy"
    submit: ClassVar[str] = "toysub"
    node_dir: ClassVar[str] = "fr-$TOY_JOB-$TOY_NODE"
    default_port: ClassVar[str] = "$((20000 + TOY_JOB % 20000))"
    time_formats: ClassVar[str] = "whole minutes"
    job_lines: ClassVar[str] = """
job_id=$TOY_JOB
run=${TOY_RUN:-0}
head_node=$TOY_NODE
mapfile -t nodes < "$TOY_NODEFILE"
"""
    step_lines: ClassVar[str] = """
every_node=(toyrun --all)
head_step=(toyrun --on "$head_node" --cpus @CPUS@)
worker_steps=(toyrun --on "$(IFS=,; echo "${workers[*]}")" --cpus @CPUS@)
requeue=(toyrequeue "$TOY_JOB")
"""

    def time_limit_seconds(self) -> int | None:
        return int(self.time) * 60 if self.time.isdigit() else None

    def directives(self) -> list[str]:
        return [
            f"#TOY nodes={self.nodes} minutes={self.time} warn={self.signal_seconds} "
            f"name={self.job_name} log={self.output}"
        ]


class _ToyTarget(BatchTarget):
    """A batch script for the made-up toy scheduler."""

    summary = "a toy scheduler's batch script"
    directive = "#TOY"
    job = _ToyJob
    example_environment = {"TOY_JOB": "7", "TOY_NODE": "t1", "TOY_NODEFILE": "/dev/null"}


@pytest.mark.process
def test_a_second_scheduler_on_the_batch_base_keeps_the_contract():
    """The base's script, checks and options serve another scheduler given only its pieces."""
    LAUNCHERS.register("toy", origin="tests")(_ToyTarget)
    try:
        check_launcher("toy")
        text = render("toy", ["s.yaml", "--nodes", "3", "--time", "60"])
    finally:
        LAUNCHERS.unregister("toy")
    assert "#TOY nodes=3 minutes=60 warn=300 name=fusion-ray log=" in text
    assert '"${head_step[@]}" bash -c' in text and "head_step=(toyrun --on" in text
    assert "python -m fusion_ray.launch.join wait-for-nodes" in text


@pytest.mark.process
def test_the_modules_a_rendered_script_names_run():
    """The node-wait step a rendered SLURM script calls runs through the module the script names
    (``fusion_ray.launch.join``), and ``python -m fusion_ray.launch TARGET`` is ``fusion-ray
    cluster TARGET``."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
        )

    (module,) = set(re.findall(r"python -m (\S+) wait-for-nodes", render("slurm", ["s.yaml"])))
    waited = run(module, "wait-for-nodes", "--address", "127.0.0.1:9", "--nodes",
                 "1", "--timeout", "30", "--pids", "999999999")  # fmt: skip
    assert waited.returncode == JOIN_FAILED_EXIT, waited.stderr
    assert "a Ray start step (pid 999999999) ended before every node joined" in waited.stderr
    rayjob = run("fusion_ray.launch", "k8s", "s.yaml", "--image", "img:1")
    assert rayjob.returncode == 0 and "kind: RayJob" in rayjob.stdout, rayjob.stderr
    launched = run("fusion_ray.launch", "slurm", "s.yaml")
    assert launched.returncode == 0 and "#SBATCH --nodes=1" in launched.stdout, launched.stderr
