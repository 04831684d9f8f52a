"""The batch-scheduler base: a job script that makes a Ray cluster of the job's own nodes and runs
a sweep on it, for any scheduler that allocates nodes to a script (SLURM, PBS, LSF, ...).

The script, in the order it runs (``BatchJob.script``): the scheduler's directives; activate the
environment; turn on Ray's token authentication with a token of this job's own
(``RAY_AUTH_TOKEN``, never written to disk); start the Ray head on the job's first node (the
batch host, which also runs the sweep driver) and one Ray worker on each other node, each as a
step of the job with a Ray temp dir of its own on node-local disk; wait until every node has
joined, or fail saying which did not (``fusion_ray.launch.join``: ``python -m
fusion_ray.launch.join wait-for-nodes``); run the sweep against that head; stop Ray on every node whatever the exit path
(a trap on EXIT).

Requeue-safe: the scheduler's warning signal before the time limit is passed on to the driver as
SIGTERM, which stops the running trials, marks their runs and the parent run KILLED with the
reason, and exits 143; a cancel, requeue or preemption (SIGTERM) is handled the same way. Run
again (requeued, resubmitted, the next job of a chain), the same sweep skips finished cells and
continues interrupted ones from their checkpoints; a driver that finds the sweep's lease still
held by the job's previous run waits for it to expire and tries once more; with
``requeue_on_time_limit`` the job requeues itself after the warning, up to N times.

A scheduler is a ``BatchJob`` subclass (``fusion_ray.launch.slurm`` is one) that supplies only
what differs: its directives, how the script learns its job id, run count, head node and node
list (``job_lines``), the commands that start a step on every node, on the head and on the
workers (``step_lines``), its requeue command, its warning signal and how it writes a time
limit. Every value reaches the script quoted where it is used, or is refused with an error
naming its flag (``BatchJob.problems``).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from fusion_ray.launch.join import JOIN_FAILED_EXIT
from fusion_ray.launch.shell import (
    node_tmp_problem,
    shell_join,
    shell_word,
    sweep_command_problems,
    text_problem,
)
from fusion_ray.launch.target import DRIVER_RESOURCE, DRIVER_SLOTS, LaunchTarget, count_problems

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class BatchJob:
    """What every batch target takes: the sweep, the allocation, the environment."""

    sweep_file: str
    """The sweep file, relative to ``workdir`` or absolute."""
    overrides: tuple[str, ...] = ()
    """``KEY=VALUE`` edits of the sweep file, as ``fusion-ray sweep`` takes them."""
    nodes: int = 1
    """Nodes of the job: the first runs the Ray head and the driver (and trials), one Ray worker
    on each other."""
    cpus_per_node: int = 8
    """CPUs of each node that Ray may use."""
    gpus_per_node: int = 0
    """GPUs of each node; Ray counts exactly these."""
    time: str = "24:00:00"
    """The job's time limit, in one of the scheduler's formats."""
    activate: str | None = None
    """One shell line that puts the environment with Ray and this project first, e.g.
    ``source ~/venvs/fusion-ray/bin/activate`` or ``module load cuda; conda activate fr``. It is
    code on purpose and runs as written (``eval`` of it, one quoted word, in the script's shell);
    no newline or other control character."""
    workdir: str | None = None
    """The checkout to run in (absolute); None: the folder the job was submitted from."""
    job_name: str = "fusion-ray"
    output: str = "fusion-ray-%x-%j.out"
    """The job's log (appended to across requeues)."""
    signal_seconds: int = 300
    """Seconds before the time limit at which the sweep is told to stop (a scheduler may send it
    up to a minute earlier); leave enough for an epoch's checkpoint and the runs' KILLED status."""
    requeue: bool = True
    """The scheduler may requeue the job (node failure, preemption); it resumes where it stopped."""
    requeue_on_time_limit: int = 0
    """Requeue itself after the time-limit warning, up to this many times (0: never)."""
    node_tmp: str = "${TMPDIR:-/tmp}"
    """Node-local folder for Ray's per-job temp dir, expanded on each node: a path with
    ``$VAR``, ``${VAR}`` or ``${VAR:-DEFAULT}`` and nothing else a shell expands
    (``node_tmp_problem``). Keep it short: Ray's socket paths under it must stay below 107
    characters."""
    node_ip_command: str = "hostname --ip-address | awk '{print $1}'"
    """A shell command printing the address by which the other nodes reach this node; code on
    purpose, run as written (``eval``) on each node, one line."""
    port: int | None = None
    """The Ray head's port; None: derived from the job id (jobs sharing a node differ)."""
    join_timeout_s: int = 300
    """How long to wait for every node to join the head."""
    report: bool = True
    """The sweep writes its analysis report at the end (False: ``--no-report``)."""

    # ------------------------------------------------------------------ what a scheduler supplies

    target: ClassVar[str] = ""
    """The launch target's name (``fusion-ray cluster TARGET`` in the script's header)."""
    module: ClassVar[str] = "fusion_ray/launch/batch.py"
    """The file that renders it (named in the header)."""
    submit: ClassVar[str] = ""
    """How the script is submitted, e.g. ``sbatch``."""
    warning_signal: ClassVar[str] = "USR1"
    """The signal the scheduler sends the batch shell ``signal_seconds`` before the time limit."""
    node_dir: ClassVar[str] = ""
    """The name of a node's Ray temp dir under ``node_tmp``, expanded on that node (the job id
    and the node's name from the scheduler's environment)."""
    default_port: ClassVar[str] = ""
    """Bash arithmetic for the head's port when ``port`` is None."""
    job_lines: ClassVar[str] = ""
    """Bash setting ``job_id``, ``run`` (0 in the first run, +1 per requeue), ``head_node``
    (this batch host) and the array ``nodes`` (every node of the job)."""
    step_lines: ClassVar[str] = ""
    """Bash setting the arrays ``every_node``, ``head_step`` and ``worker_steps``: the command
    words that run a command as a step of the job on every node, on ``head_node`` and on each
    of ``workers`` (one task per node), and ``requeue``: the words that requeue this job.
    ``@CPUS@``, ``@GPUS@`` and the keys of ``replacements`` are filled in."""
    wait_module: ClassVar[str] = "fusion_ray.launch.join"
    """The module whose ``wait-for-nodes`` command the script runs."""
    submit_dir: ClassVar[str] = '"$PWD"'
    """Bash for the folder the job was submitted from (the default ``workdir``)."""
    time_formats: ClassVar[str] = ""
    """The formats ``time`` may take, for the error that refuses it."""

    def time_limit_seconds(self) -> int | None:
        """``time`` in seconds; None when it is in none of the scheduler's formats."""
        raise NotImplementedError

    def directives(self) -> list[str]:
        """The directive lines (checked values only: ``scheduler_problems``)."""
        raise NotImplementedError

    def scheduler_problems(self) -> list[str]:
        """Problems of the scheduler's own options and of values in its directives."""
        return []

    def replacements(self) -> dict[str, str]:
        """The scheduler's own placeholders in ``step_lines`` and their text."""
        return {}

    def scheduler_texts(self) -> list[tuple[str, str | None]]:
        """The scheduler's own text options, with their flags."""
        return []

    # ------------------------------------------------------------------ the checks

    def problems(self) -> list[str]:
        """Every reason the script could not work, each with its fix; empty when it can."""
        return self._time_problems() + self._number_problems() + self._text_problems()

    def _time_problems(self) -> list[str]:
        limit = self.time_limit_seconds()
        if limit is None:
            return [f"--time {self.time!r}: expected {self.time_formats}"]
        if not 0 < self.signal_seconds < limit:
            return [
                f"--signal-seconds {self.signal_seconds}: must be above 0 and below the time "
                f"limit ({limit} s), e.g. {min(300, limit // 4)}"
            ]
        return []

    def _number_problems(self) -> list[str]:
        out = count_problems(
            [
                ("--nodes", self.nodes, 1),
                ("--cpus-per-node", self.cpus_per_node, 1),
                ("--gpus-per-node", self.gpus_per_node, 0),
                ("--join-timeout", self.join_timeout_s, 1),
                ("--requeue-on-time-limit", self.requeue_on_time_limit, 0),
                ("--signal-seconds", self.signal_seconds, 1),
            ]
        )
        if self.port is not None and not 1024 <= self.port <= 65000:
            out.append(f"--port {self.port}: from 1024 to 65000")
        if self.requeue_on_time_limit and not self.requeue:
            out.append(
                "--requeue-on-time-limit needs --requeue (the scheduler refuses to requeue it)"
            )
        return out

    def texts(self) -> list[tuple[str, str | None]]:
        """Every text the script is made from, with the flag (or argument) that sets it."""
        return [
            ("the sweep file", self.sweep_file),
            *((f"override {i + 1}", override) for i, override in enumerate(self.overrides)),
            ("--time", self.time), *self.scheduler_texts(), ("--activate", self.activate),
            ("--workdir", self.workdir), ("--job-name", self.job_name),
            ("--output", self.output), ("--node-tmp", self.node_tmp),
            ("--node-ip-command", self.node_ip_command),
        ]  # fmt: skip

    def _text_problems(self) -> list[str]:
        out = [
            problem
            for what, value in self.texts()
            if value is not None and (problem := text_problem(what, value))
        ]
        if out:
            return out
        if not _NAME.fullmatch(self.job_name):
            out.append(f"--job-name {self.job_name!r}: letters, digits, '.', '-' and '_' only")
        output = self.output
        if not output or not output.isprintable() or any(c in output for c in " '\"\\#"):
            out.append(
                f"--output {output!r}: a path without spaces, quotes, '\\', '#' or control "
                "characters (the scheduler splits its directives there)"
            )
        out += self.scheduler_problems() + self._command_problems()
        if self.workdir is not None and not self.workdir.startswith("/"):
            out.append(f"--workdir {self.workdir!r}: an absolute path (the checkout on the nodes)")
        problem = node_tmp_problem(self.node_tmp)
        if problem:
            out.append(f"--node-tmp {self.node_tmp!r}: {problem}")
        return out

    def _command_problems(self) -> list[str]:
        out = sweep_command_problems(self.sweep_file, self.overrides)
        for what, value in [
            ("--activate", self.activate),
            ("--node-ip-command", self.node_ip_command),
        ]:
            if value is not None and (not value.isprintable() or not value.strip()):
                out.append(
                    f"{what} {value!r}: one non-empty line of shell without control characters "
                    "(it runs as written)"
                )
        return out

    # ------------------------------------------------------------------ the command line

    @classmethod
    def flags(cls) -> dict[str, tuple[str, str]]:
        """field -> (flag, help), in the order of ``--help`` and of the header's command."""
        return dict(BATCH_FLAGS)

    def argv(self) -> list[str]:
        """The command that renders this script (written into its header, quoted)."""
        args = ["fusion-ray", "cluster", self.target, self.sweep_file, *self.overrides]
        defaults = type(self)(sweep_file=self.sweep_file)
        for name, (flag, _) in self.flags().items():
            value = getattr(self, name)
            if value == getattr(defaults, name):
                continue
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args.append(f"{flag}={value}")  # one word: a value may start with '-'
        return args

    # ------------------------------------------------------------------ the script

    def header(self) -> str:
        """Comment lines only, in printable characters: the command that renders the script
        (each word quoted for bash, no line break in any), what it needs."""
        gpus = f", {self.gpus_per_node} GPU(s)" if self.gpus_per_node else ""
        lines = [
            "#!/bin/bash",
            "# fusion-ray: a sweep on a Ray cluster of this job's nodes. Rendered by",
            f"#   {shell_join(self.argv())}",
            f"# ({self.module}); render it again rather than editing. Submit from the checkout:",
            f"#   {self.submit} THIS_FILE",
            f"# {self.nodes} node(s) of {self.cpus_per_node} CPU(s){gpus}: the Ray head, the sweep",
            "# driver and trials on the first, a Ray worker on each other. The sweep file's",
            "# storage_path must be on a file system every node shares, and its tracking_uri a",
            "# store every run of the job reaches (an MLflow server for more than one node).",
        ]
        return "\n".join(lines) + "\n"

    def script(self) -> str:
        """The batch script. Raises ValueError listing every problem.

        Every value reaches the script quoted for the shell where it is used (one word, in
        printable characters: ``shell_word``), or checked where it cannot be quoted: the
        directives' values, and ``--node-tmp``, which is expanded on each node inside double
        quotes. ``--activate`` and ``--node-ip-command`` are shell code by design: each is one
        word given to ``eval``, so it runs as written and cannot change the script around it."""
        problems = self.problems()
        if problems:
            raise ValueError(f"cannot render the {self.target} script:\n  " + "\n  ".join(problems))
        template = _BODY.replace("@JOB_LINES@", self.job_lines.strip("\n"))
        template = template.replace("@STEP_LINES@", self.step_lines.strip("\n"))
        # one pass: a value that holds a placeholder's name stays as it is
        values = {**self._replacements(), **self.replacements()}
        body = _PLACEHOLDER.sub(lambda match: values[match.group(0)], template)
        return self.header() + "\n".join(self.directives()) + "\n" + body

    def _replacements(self) -> dict[str, str]:
        activate = (
            f"eval -- {shell_word(self.activate)}"
            if self.activate
            else "# (no activation line: the submitting shell's PATH)"
        )
        return {
            "@ACTIVATE@": activate,
            "@WORKDIR@": shell_word(self.workdir) if self.workdir else self.submit_dir,
            "@NODE_IP@": shell_word(self.node_ip_command),
            "@NODE_TMP@": self.node_tmp,  # checked by node_tmp_problem: inside "..." as it is
            "@NODE_DIR@": self.node_dir,
            "@CPUS@": str(self.cpus_per_node),
            "@GPUS@": str(self.gpus_per_node),
            "@PORT@": str(self.port) if self.port else self.default_port,
            "@DRIVER_RESOURCE@": DRIVER_RESOURCE,
            "@DRIVER_SLOTS@": str(DRIVER_SLOTS),
            "@WAIT_MODULE@": self.wait_module,
            "@JOIN_TIMEOUT@": str(self.join_timeout_s),
            "@JOIN_FAILED@": str(JOIN_FAILED_EXIT),
            "@SWEEP@": shell_join([self.sweep_file, *self.overrides]),
            "@DRIVER_ARGS@": "" if self.report else " --no-report",
            "@WARNING@": self.warning_signal,
            "@REQUEUES@": str(self.requeue_on_time_limit),
        }


BATCH_FLAGS: dict[str, tuple[str, str]] = {
    "nodes": ("--nodes", "nodes of the job (the first runs the head and the driver)"),
    "cpus_per_node": ("--cpus-per-node", "CPUs of each node for Ray"),
    "gpus_per_node": ("--gpus-per-node", "GPUs of each node"),
    "time": ("--time", "the time limit, in the scheduler's formats"),
    "activate": ("--activate", "one shell line activating the environment (Ray, this project)"),
    "workdir": ("--workdir", "the checkout on the nodes (default: where the job is submitted)"),
    "job_name": ("--job-name", "the job's name"),
    "output": ("--output", "the job's log (appended to across requeues)"),
    "signal_seconds": ("--signal-seconds", "seconds before the time limit to stop the sweep"),
    "requeue": ("--requeue", "the scheduler may requeue the job (preemption, node failure)"),
    "requeue_on_time_limit": (
        "--requeue-on-time-limit",
        "requeue the job after the time-limit warning, up to N times",
    ),
    "node_tmp": ("--node-tmp", "node-local folder for Ray's temp dir (expanded on the node)"),
    "node_ip_command": ("--node-ip-command", "shell command printing a node's address"),
    "port": ("--port", "the Ray head's port (default: derived from the job id)"),
    "join_timeout_s": ("--join-timeout", "seconds to wait for every node to join"),
    "report": ("--report", "write the analysis report at the end"),
}


# ----------------------------------------------------------------------------- the script

_BODY = r"""
set -uo pipefail
log() { echo "[fusion-ray $(date -u +%H:%M:%S)] $*"; }
@ACTIVATE@
cd -- @WORKDIR@ || { log "cannot enter the checkout on $(hostname)"; exit 2; }

# Ray's token authentication, with a token of this job's own: in the environment of this script
# and of its steps only, never on disk.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))') ||
    { log "no python on PATH: fix the activation line"; exit 2; }
export RAY_AUTH_TOKEN
unset RAY_ADDRESS

node_ip() { eval -- @NODE_IP@; }
# This node's Ray temp dir, on node-local disk (--node-tmp, expanded on the node), in $dir.
ray_tmp_dir() { dir="@NODE_TMP@/@NODE_DIR@"; }
# One Ray node, in the foreground of its step until stopped, with a temp dir of its own
# (removed when the job stops Ray).
ray_node() {
    local dir
    ray_tmp_dir
    mkdir -p -- "$dir" || exit 1
    ray start --node-ip-address="$(node_ip)" --temp-dir="$dir" --num-cpus=@CPUS@ \
        --num-gpus=@GPUS@ --disable-usage-stats --block "$@"
}
export -f node_ip ray_tmp_dir ray_node

# The job, as the scheduler tells it: job_id, run (0, then +1 per requeue), head_node (this
# batch host, the job's first node) and nodes (every node of the job).
@JOB_LINES@
port=@PORT@
address="$(node_ip):$port"
workers=()
for node in "${nodes[@]}"; do [ "$node" = "$head_node" ] || workers+=("$node"); done
log "job $job_id, run $run: ${#nodes[@]} node(s), Ray head on" \
    "$head_node at $address"
# How the scheduler runs a command as a step of the job: on every node, on the head, on each
# worker (one task per node); and how the job requeues itself.
@STEP_LINES@

steps=()
driver=""
stopped_by=""
stop_ray() {
    trap - EXIT TERM @WARNING@
    if [ -n "$driver" ] && kill -0 "$driver" 2> /dev/null; then
        kill -TERM "$driver" 2> /dev/null
        wait "$driver" 2> /dev/null
    fi
    for step in "${steps[@]}"; do kill -TERM "$step" 2> /dev/null; done
    for step in "${steps[@]}"; do wait "$step" 2> /dev/null; done
    [ "${#steps[@]}" -eq 0 ] && return
    # the temp dirs (a stopped step may end its Ray node before the node's own clean-up)
    "${every_node[@]}" bash -c 'ray_tmp_dir && rm -rf -- "$dir"'
    log "Ray stopped on every node"
}
trap stop_ray EXIT
on_signal() {
    stopped_by=$1
    if [ "$1" = @WARNING@ ]; then
        log "the job's time limit is near (SIG$1, asked for by the job's directives): stopping" \
            "the sweep; running cells are marked KILLED and continue from their checkpoints in" \
            "the next run"
    else
        log "stopped by SIG$1 (cancelled, requeued or preempted): stopping the sweep"
    fi
    [ -n "$driver" ] || exit $((128 + $(kill -l "$1")))
    kill -TERM "$driver" 2> /dev/null
}
trap 'on_signal @WARNING@' @WARNING@
trap 'on_signal TERM' TERM

"${head_step[@]}" bash -c 'ray_node --head "$@"' _ --port="$port" \
    --resources='{"@DRIVER_RESOURCE@": @DRIVER_SLOTS@}' --include-dashboard=false &
steps+=($!)
if [ "${#workers[@]}" -gt 0 ]; then
    "${worker_steps[@]}" bash -c 'ray_node --address="$1"' _ "$address" &
    steps+=($!)
fi
python -m @WAIT_MODULE@ wait-for-nodes --address "$address" --nodes ${#nodes[@]} \
    --timeout @JOIN_TIMEOUT@ --pids "${steps[@]}" || exit @JOIN_FAILED@
[ -z "$stopped_by" ] || exit $((128 + $(kill -l "$stopped_by")))

log "every node joined; the sweep starts"
for attempt in 1 2; do
    python -m fusion_ray.sweep @SWEEP@ --address "$address"@DRIVER_ARGS@ &
    driver=$!
    while :; do
        wait "$driver"
        status=$?
        kill -0 "$driver" 2> /dev/null || break  # a trapped signal interrupted the wait
    done
    driver=""
    log "the sweep driver exited with status $status"
    # 3: the sweep's lease is held, e.g. by this job's previous run, killed before it could
    # release it on another node: it expires after the lease's time to live
    [ "$status" -eq 3 ] && [ "$attempt" -eq 1 ] && [ -z "$stopped_by" ] || break
    wait_s=$((${FUSION_RAY_LEASE_TTL_S:-120} + 15))
    log "waiting ${wait_s} s for the lease to expire, then trying once more"
    sleep "$wait_s" & driver=$!
    wait "$driver"
    driver=""
    [ -z "$stopped_by" ] || break
done
if [ "$stopped_by" = @WARNING@ ] && [ "$run" -lt @REQUEUES@ ]; then
    stop_ray
    log "requeueing job $job_id to go on (run $((run + 1)) of at most @REQUEUES@ more)"
    "${requeue[@]}"
fi
exit "$status"
"""

_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


class BatchTarget(LaunchTarget):
    """A launch target whose file is a ``BatchJob`` subclass's script: its options are the
    job's fields (``flags()``), the sweep file and its edits first."""

    job: ClassVar[type[BatchJob]] = BatchJob
    output = "shell"
    code_options = ("--activate", "--node-ip-command", "--node-tmp")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        defaults = self.job(sweep_file="")
        for name, (flag, text) in self.job.flags().items():
            default = getattr(defaults, name)
            if isinstance(default, bool):
                action = argparse.BooleanOptionalAction
                parser.add_argument(flag, dest=name, action=action, default=default, help=text)
            else:
                kind = int if isinstance(default, int) or name == "port" else str
                parser.add_argument(flag, dest=name, type=kind, default=default, help=text)

    def job_of(self, args: argparse.Namespace) -> BatchJob:
        """The job the parsed options describe."""
        values: dict[str, Any] = {name: getattr(args, name) for name in self.job.flags()}
        return self.job(sweep_file=args.sweep_file, overrides=tuple(args.overrides), **values)

    def render(self, args: argparse.Namespace) -> str:
        return self.job_of(args).script()
