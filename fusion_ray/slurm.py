"""A SLURM batch script that runs a sweep on a Ray cluster of the job's own nodes:
``fusion-ray cluster slurm SWEEP.yaml [KEY=VALUE ...] --nodes 2 --gpus-per-node 4 ... > job.sh``
then ``sbatch job.sh``.

The script, in the order it runs: activate the environment; turn on Ray's token authentication
with a token of this job's own (``RAY_AUTH_TOKEN``, never written to disk); start the Ray head on
the job's first node (the batch host, which also runs the sweep driver) and one Ray worker on
each other node, each with ``srun`` and a Ray temp dir of its own on node-local disk; wait until
every node has joined (or fail saying which did not); run the sweep against that head; stop Ray
on every node whatever the exit path (a trap on EXIT).

Time limits and preemption: the job asks SLURM for ``SIGUSR1`` to the batch shell ``signal``
seconds before its time limit (``--signal=B:USR1@S``); the script passes it on to the driver as
SIGTERM, which stops the running trials, marks their runs and the parent run KILLED with the
reason, and exits 143. A cancel, requeue or preemption sends SIGTERM to every process of the job,
which the driver handles the same way. Run again (requeued, resubmitted, or the next job of a
chain), the same sweep skips finished cells and continues interrupted ones from their
checkpoints. ``--requeue-on-time-limit N`` makes the job requeue itself after the warning, up to
N times: a chain of runs of one job id, one driver at a time. (A job array would start several
drivers on one sweep at once; the sweep's lease lets only one of them run, so an array buys
nothing here.)

Every value reaches the script quoted where it is used, or is refused with an error naming its
flag (``render_slurm``); docs/how-to/slurm.md says what each option takes.

``python -m fusion_ray.slurm wait-for-nodes`` is the step of the script that waits for the
nodes; it is not meant to be run by hand.

Why one module of this size: the script's template, the checks of every value that reaches it
and the quoting where each is pasted make one guarantee (no value can add a command, a line or
a directive); apart, a value could be checked in one place and pasted unchecked in another.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fusion_ray.cluster import (
    DRIVER_RESOURCE,
    DRIVER_SLOTS,
    shell_join,
    shell_word,
    sweep_command_problems,
    text_problem,
)

#: Exit code of the script when the Ray nodes did not all join (or one stopped) in time.
JOIN_FAILED_EXIT = 11

_TIME = re.compile(
    r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?)"
    r"|(?:(?P<h>\d+):(?P<m>\d+):(?P<s>\d+))|(?:(?P<mm>\d+):(?P<ss>\d+))|(?P<min>\d+)",
    re.ASCII,
)
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_MEM = re.compile(r"\d+[KMGT]?", re.ASCII)
#: Words that sbatch takes, anywhere in a directive line, for the start of a heterogeneous job's
#: next component.
_HETJOB = ("hetjob", "packjob")


def time_limit_seconds(text: str) -> int | None:
    """SLURM's ``--time`` formats (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in
    seconds; None when ``text`` is none of them."""
    match = _TIME.fullmatch(text)
    if match is None:
        return None
    g = {k: int(v) if v is not None else 0 for k, v in match.groupdict().items()}
    if match.group("d") is not None:
        return g["d"] * 86400 + g["dh"] * 3600 + g["dm"] * 60 + g["ds"]
    if match.group("h") is not None:
        return g["h"] * 3600 + g["m"] * 60 + g["s"]
    if match.group("mm") is not None:
        return g["mm"] * 60 + g["ss"]
    return g["min"] * 60


@dataclass(frozen=True)
class SlurmJob:
    """What ``fusion-ray cluster slurm`` takes: the sweep, the allocation, the environment."""

    sweep_file: str
    """The sweep file, relative to ``workdir`` or absolute."""
    overrides: tuple[str, ...] = ()
    """``KEY=VALUE`` edits of the sweep file, as ``fusion-ray sweep`` takes them."""
    nodes: int = 1
    """Nodes of the job: the first runs the Ray head and the driver (and trials), one Ray worker
    on each other."""
    cpus_per_node: int = 8
    """CPUs of each node that Ray may use (``--cpus-per-task``, one task per node)."""
    gpus_per_node: int = 0
    """GPUs of each node (``--gres=gpu:N``); Ray counts exactly these."""
    time: str = "24:00:00"
    """The job's time limit, in any of SLURM's ``--time`` formats."""
    partition: str | None = None
    account: str | None = None
    mem: str | None = None
    """Memory per node (``--mem``, e.g. 64G); None: the partition's default."""
    activate: str | None = None
    """One shell line that puts the environment with Ray and this project first, e.g.
    ``source ~/venvs/fusion-ray/bin/activate`` or ``module load cuda; conda activate fr``. It is
    code on purpose and runs as written (``eval`` of it, one quoted word, in the script's shell);
    no newline or other control character."""
    workdir: str | None = None
    """The checkout to run in (absolute); None: the folder ``sbatch`` was run from."""
    job_name: str = "fusion-ray"
    output: str = "fusion-ray-%x-%j.out"
    """The job's log (``--output``; appended to across requeues): no spaces, quotes, '\\' or
    '#', which sbatch reads in a directive its own way."""
    signal_seconds: int = 300
    """Seconds before the time limit at which the sweep is told to stop (SLURM may send it up
    to a minute earlier); leave enough for an epoch's checkpoint and the runs' KILLED status."""
    requeue: bool = True
    """SLURM may requeue the job (node failure, preemption); it resumes where it stopped."""
    requeue_on_time_limit: int = 0
    """Requeue itself after the time-limit warning, up to this many times (0: never)."""
    node_tmp: str = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"
    """Node-local folder for Ray's per-job temp dir, expanded on each node: a path with
    ``$VAR``, ``${VAR}`` or ``${VAR:-DEFAULT}`` and nothing else a shell expands
    (``node_tmp_problem``). Keep it short: Ray's socket paths under it must stay below 107
    characters."""
    node_ip_command: str = "hostname --ip-address | awk '{print $1}'"
    """A shell command printing the address by which the other nodes reach this node; code on
    purpose, run as written (``eval``) on each node, one line."""
    port: int | None = None
    """The Ray head's port; None: 20000 + the job id modulo 20000 (jobs sharing a node differ)."""
    join_timeout_s: int = 300
    """How long to wait for every node to join the head."""
    report: bool = True
    """The sweep writes its analysis report at the end (False: ``--no-report``)."""

    def problems(self) -> list[str]:
        """Every reason the script could not work, each with its fix; empty when it can."""
        return self._time_problems() + self._number_problems() + self._text_problems()

    def _time_problems(self) -> list[str]:
        limit = time_limit_seconds(self.time)
        if limit is None:
            return [
                f"--time {self.time!r}: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                "D-HH:MM:SS (e.g. 24:00:00)"
            ]
        if not 0 < self.signal_seconds < limit:
            return [
                f"--signal-seconds {self.signal_seconds}: must be above 0 and below the time "
                f"limit ({limit} s), e.g. {min(300, limit // 4)}"
            ]
        return []

    def _number_problems(self) -> list[str]:
        out = []
        for what, value, least in [
            ("--nodes", self.nodes, 1),
            ("--cpus-per-node", self.cpus_per_node, 1),
            ("--gpus-per-node", self.gpus_per_node, 0),
            ("--join-timeout", self.join_timeout_s, 1),
            ("--requeue-on-time-limit", self.requeue_on_time_limit, 0),
        ]:
            if value < least:
                out.append(f"{what} {value}: must be {least} or more")
        if self.port is not None and not 1024 <= self.port <= 65000:
            out.append(f"--port {self.port}: from 1024 to 65000")
        if self.requeue_on_time_limit and not self.requeue:
            out.append("--requeue-on-time-limit needs --requeue (SLURM refuses to requeue it)")
        return out

    def _text_problems(self) -> list[str]:
        out = [
            problem
            for what, value in self._texts()
            if value is not None and (problem := text_problem(what, value))
        ]
        if out:
            return out
        for what, value in [
            ("--partition", self.partition),
            ("--account", self.account),
            ("--job-name", self.job_name),
        ]:
            if value is not None and not _NAME.fullmatch(value):
                out.append(f"{what} {value!r}: letters, digits, '.', '-' and '_' only")
        if self.mem is not None and not _MEM.fullmatch(self.mem):
            out.append(f"--mem {self.mem!r}: a number with an optional K, M, G or T (e.g. 64G)")
        out += self._directive_problems() + self._command_problems()
        if self.workdir is not None and not self.workdir.startswith("/"):
            out.append(f"--workdir {self.workdir!r}: an absolute path (the checkout on the nodes)")
        problem = node_tmp_problem(self.node_tmp)
        if problem:
            out.append(f"--node-tmp {self.node_tmp!r}: {problem}")
        return out

    def _texts(self) -> list[tuple[str, str | None]]:
        """Every text the script is made from, with the flag (or argument) that sets it."""
        return [
            ("the sweep file", self.sweep_file),
            *((f"override {i + 1}", override) for i, override in enumerate(self.overrides)),
            ("--time", self.time), ("--partition", self.partition),
            ("--account", self.account), ("--mem", self.mem), ("--activate", self.activate),
            ("--workdir", self.workdir), ("--job-name", self.job_name),
            ("--output", self.output), ("--node-tmp", self.node_tmp),
            ("--node-ip-command", self.node_ip_command),
        ]  # fmt: skip

    def _directive_problems(self) -> list[str]:
        """sbatch reads its directives split at whitespace, with quotes, '\\' and '#' of their
        own meaning, and a heterogeneous job's separator anywhere in a line: such text cannot
        be a directive's value."""
        out = []
        output = self.output
        if not output or not output.isprintable() or any(c in output for c in " '\"\\#"):
            out.append(
                f"--output {output!r}: a path without spaces, quotes, '\\', '#' or control "
                "characters (sbatch splits its directives there)"
            )
        for what, value in [
            ("--output", output),
            ("--job-name", self.job_name),
            ("--partition", self.partition),
            ("--account", self.account),
        ]:
            if value is not None and any(word in value.lower() for word in _HETJOB):
                out.append(
                    f"{what} {value!r}: sbatch reads 'hetjob' and 'packjob' in a directive as "
                    "the start of another job component; choose another name"
                )
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

    def argv(self) -> list[str]:
        """The command that renders this script (written into its header, quoted)."""
        args = ["fusion-ray", "cluster", "slurm", self.sweep_file, *self.overrides]
        defaults = SlurmJob(sweep_file=self.sweep_file)
        for name, (flag, _) in _FLAGS.items():
            value = getattr(self, name)
            if value == getattr(defaults, name):
                continue
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args.append(f"{flag}={value}")  # one word: a value may start with '-'
        return args


_VARIABLE = r"[A-Za-z_][A-Za-z0-9_]*"
#: Characters ``--node-tmp`` may hold as themselves: printable, and nothing that a shell reads
#: inside double quotes (``$`` only as a variable reference, below).
_TMP_LITERAL = re.compile(r"""[^$`\\"'{}]""")
_TMP_REFERENCE = re.compile(
    rf"\$(?:(?P<bare>{_VARIABLE})|\{{(?P<name>{_VARIABLE})(?P<default>:?-)?)"
)


def node_tmp_problem(text: str) -> str | None:
    """Why ``text`` is no ``--node-tmp``, or None: a path of printable characters (no quotes,
    backquote, '\\', '{' or '}'), with ``$VAR``, ``${VAR}`` and ``${VAR:-DEFAULT}`` (``DEFAULT``
    of the same form) expanded on each node, and nothing else a shell would run or expand."""
    if not text.isprintable() or not text.strip():
        return "one non-empty line without control characters"
    at, depth, wrong = 0, 0, None  # depth: the ${VAR:-... open around ``at``
    while at < len(text) and wrong is None:
        at, depth, wrong = _node_tmp_step(text, at, depth)
    if wrong is None and depth:
        wrong = "a '${' not closed"
    if wrong is None:
        return None
    return (
        f"{wrong}: a path, with only $VAR, ${{VAR}} or ${{VAR:-DEFAULT}} expanded on the node (no "
        "quotes, '\\', backquotes or $(...); ~ is not expanded: write $HOME)"
    )


def _node_tmp_step(text: str, at: int, depth: int) -> tuple[int, int, str | None]:
    """One step of ``node_tmp_problem`` at ``at``: the next position and depth, or what is
    wrong there."""
    reference = _TMP_REFERENCE.match(text, at)
    if _TMP_LITERAL.match(text, at):
        return at + 1, depth, None
    if text[at] == "}" and depth:
        return at + 1, depth - 1, None
    if reference is None:
        return at, depth, f"{text[at]!r} at character {at + 1}"
    if reference.group("default") is not None:
        return reference.end(), depth + 1, None
    if reference.group("name") is None:
        return reference.end(), depth, None
    if text.startswith("}", reference.end()):
        return reference.end() + 1, depth, None
    return at, depth, f"no '}}' at character {reference.end() + 1}"


_FLAGS = {
    "nodes": ("--nodes", "nodes of the job (the first runs the head and the driver)"),
    "cpus_per_node": ("--cpus-per-node", "CPUs of each node for Ray (--cpus-per-task)"),
    "gpus_per_node": ("--gpus-per-node", "GPUs of each node (--gres=gpu:N)"),
    "time": ("--time", "the time limit, in SLURM's formats (e.g. 24:00:00, 2-00:00)"),
    "partition": ("--partition", "the SLURM partition"),
    "account": ("--account", "the SLURM account"),
    "mem": ("--mem", "memory per node (e.g. 64G); default: the partition's"),
    "activate": ("--activate", "one shell line activating the environment (Ray, this project)"),
    "workdir": ("--workdir", "the checkout on the nodes (default: where sbatch runs)"),
    "job_name": ("--job-name", "the job's name"),
    "output": ("--output", "the job's log (appended to across requeues)"),
    "signal_seconds": ("--signal-seconds", "seconds before the time limit to stop the sweep"),
    "requeue": ("--requeue", "SLURM may requeue the job (preemption, node failure)"),
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


def _directives(job: SlurmJob) -> list[str]:
    lines = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_node}",
    ]
    if job.gpus_per_node:
        lines.append(f"--gres=gpu:{job.gpus_per_node}")
    if job.mem:
        lines.append(f"--mem={job.mem}")
    lines.append(f"--time={job.time}")
    if job.partition:
        lines.append(f"--partition={job.partition}")
    if job.account:
        lines.append(f"--account={job.account}")
    lines += [
        f"--signal=B:USR1@{job.signal_seconds}",
        "--requeue" if job.requeue else "--no-requeue",
        "--open-mode=append",
        f"--output={job.output}",
    ]
    return [f"#SBATCH {line}" for line in lines]


_BODY = r"""
set -uo pipefail
log() { echo "[fusion-ray $(date -u +%H:%M:%S)] $*"; }
@ACTIVATE@
cd -- @WORKDIR@ || { log "cannot enter the checkout on $(hostname)"; exit 2; }

# Ray's token authentication, with a token of this job's own: in the environment of this script
# and of its srun steps only, never on disk.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))') ||
    { log "no python on PATH: fix the activation line"; exit 2; }
export RAY_AUTH_TOKEN
unset RAY_ADDRESS

node_ip() { eval -- @NODE_IP@; }
# This node's Ray temp dir, on node-local disk (--node-tmp, expanded on the node), in $dir.
ray_tmp_dir() { dir="@NODE_TMP@/fr-$SLURM_JOB_ID-$SLURMD_NODENAME"; }
# One Ray node, in the foreground of its srun step until stopped, with a temp dir of its own
# (removed when the job stops Ray).
ray_node() {
    local dir
    ray_tmp_dir
    mkdir -p -- "$dir" || exit 1
    ray start --node-ip-address="$(node_ip)" --temp-dir="$dir" --num-cpus=@CPUS@ \
        --num-gpus=@GPUS@ --disable-usage-stats --block "$@"
}
export -f node_ip ray_tmp_dir ray_node

port=@PORT@
head_node=$SLURMD_NODENAME  # the batch host: the job's first node
address="$(node_ip):$port"
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
workers=()
for node in "${nodes[@]}"; do [ "$node" = "$head_node" ] || workers+=("$node"); done
log "job $SLURM_JOB_ID, run ${SLURM_RESTART_COUNT:-0}: ${#nodes[@]} node(s), Ray head on" \
    "$head_node at $address"

steps=()
driver=""
stopped_by=""
stop_ray() {
    trap - EXIT TERM USR1
    if [ -n "$driver" ] && kill -0 "$driver" 2> /dev/null; then
        kill -TERM "$driver" 2> /dev/null
        wait "$driver" 2> /dev/null
    fi
    for step in "${steps[@]}"; do kill -TERM "$step" 2> /dev/null; done
    for step in "${steps[@]}"; do wait "$step" 2> /dev/null; done
    [ "${#steps[@]}" -eq 0 ] && return
    # the temp dirs (srun's stop ends the Ray steps with SIGKILL, before their own clean-up)
    srun --overlap --nodes=${#nodes[@]} --ntasks=${#nodes[@]} --ntasks-per-node=1 \
        bash -c 'ray_tmp_dir && rm -rf -- "$dir"'
    log "Ray stopped on every node"
}
trap stop_ray EXIT
on_signal() {
    stopped_by=$1
    if [ "$1" = USR1 ]; then
        log "the job's time limit is near (SIGUSR1 from --signal): stopping the sweep; running" \
            "cells are marked KILLED and continue from their checkpoints in the next run"
    else
        log "stopped by SIG$1 (cancelled, requeued or preempted): stopping the sweep"
    fi
    [ -n "$driver" ] || exit $((128 + $(kill -l "$1")))
    kill -TERM "$driver" 2> /dev/null
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM

srun --overlap --nodes=1 --ntasks=1 --cpus-per-task=@CPUS@ @GRES@--nodelist="$head_node" \
    bash -c 'ray_node --head "$@"' _ --port="$port" \
    --resources='{"@DRIVER_RESOURCE@": @DRIVER_SLOTS@}' --include-dashboard=false &
steps+=($!)
if [ "${#workers[@]}" -gt 0 ]; then
    srun --overlap --nodes=${#workers[@]} --ntasks=${#workers[@]} --ntasks-per-node=1 \
        --cpus-per-task=@CPUS@ @GRES@--nodelist="$(IFS=,; echo "${workers[*]}")" \
        bash -c 'ray_node --address="$1"' _ "$address" &
    steps+=($!)
fi
python -m fusion_ray.slurm wait-for-nodes --address "$address" --nodes ${#nodes[@]} \
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
if [ "$stopped_by" = USR1 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt @REQUEUES@ ]; then
    stop_ray
    log "requeueing job $SLURM_JOB_ID to go on (run $((${SLURM_RESTART_COUNT:-0} + 1)) of" \
        "at most @REQUEUES@ more)"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


def _header(job: SlurmJob) -> str:
    """Comment lines only, in printable characters: the command that renders the script (each
    word quoted for bash, no line break in any), what it needs."""
    gpus = f", {job.gpus_per_node} GPU(s)" if job.gpus_per_node else ""
    lines = [
        "#!/bin/bash",
        "# fusion-ray: a sweep on a Ray cluster of this job's nodes. Rendered by",
        f"#   {shell_join(job.argv())}",
        "# (fusion_ray/slurm.py); render it again rather than editing. Submit from the checkout:",
        "#   sbatch THIS_FILE",
        f"# {job.nodes} node(s) of {job.cpus_per_node} CPU(s){gpus}: the Ray head, the sweep",
        "# driver and trials on the first, a Ray worker on each other. The sweep file's",
        "# storage_path must be on a file system every node shares, and its tracking_uri a",
        "# store every run of the job reaches (an MLflow server for more than one node).",
    ]
    return "\n".join(lines) + "\n"


_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


def render_slurm(job: SlurmJob) -> str:
    """The batch script for ``job``. Raises ValueError listing every problem of ``job``.

    Every value of ``job`` reaches the script quoted for the shell where it is used (one word,
    in printable characters: ``shell_word``), or checked where it cannot be quoted: the
    directives' values, and ``--node-tmp``, which is expanded on each node inside double
    quotes. ``--activate`` and ``--node-ip-command`` are shell code by design: each is one
    word given to ``eval``, so it runs as written and cannot change the script around it."""
    problems = job.problems()
    if problems:
        raise ValueError("cannot render the SLURM script:\n  " + "\n  ".join(problems))
    driver_args = "" if job.report else " --no-report"
    gres = f"--gres=gpu:{job.gpus_per_node} " if job.gpus_per_node else ""
    port = str(job.port) if job.port else "$((20000 + SLURM_JOB_ID % 20000))"
    activate = (
        f"eval -- {shell_word(job.activate)}"
        if job.activate
        else "# (no activation line: the submitting shell's PATH)"
    )
    replacements = {
        "@ACTIVATE@": activate,
        "@WORKDIR@": shell_word(job.workdir) if job.workdir else '"$SLURM_SUBMIT_DIR"',
        "@NODE_IP@": shell_word(job.node_ip_command),
        "@NODE_TMP@": job.node_tmp,  # checked by node_tmp_problem: inside "..." as it is
        "@CPUS@": str(job.cpus_per_node),
        "@GPUS@": str(job.gpus_per_node),
        "@GRES@": gres,
        "@PORT@": port,
        "@DRIVER_RESOURCE@": DRIVER_RESOURCE,
        "@DRIVER_SLOTS@": str(DRIVER_SLOTS),
        "@JOIN_TIMEOUT@": str(job.join_timeout_s),
        "@JOIN_FAILED@": str(JOIN_FAILED_EXIT),
        "@SWEEP@": shell_join([job.sweep_file, *job.overrides]),
        "@DRIVER_ARGS@": driver_args,
        "@REQUEUES@": str(job.requeue_on_time_limit),
    }
    # one pass: a value that holds a placeholder's name stays as it is
    body = _PLACEHOLDER.sub(lambda match: replacements[match.group(0)], _BODY)
    return _header(job) + "\n".join(_directives(job)) + "\n" + body


# ----------------------------------------------------------------------------- joining


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _head_answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def wait_for_nodes(address: str, nodes: int, timeout_s: float, pids: Sequence[int]) -> str | None:
    """Wait until ``nodes`` Ray nodes are alive at ``address``; None then, else why not (a
    step in ``pids`` ended, or the time ran out)."""
    deadline = time.monotonic() + timeout_s
    joined = 0
    connected = False
    try:
        while time.monotonic() < deadline:
            ended = [pid for pid in pids if not _alive(pid)]
            if ended:
                return (
                    f"a Ray start step (srun pid {', '.join(map(str, ended))}) ended before every "
                    f"node joined ({joined} of {nodes}): see its lines above in this log"
                )
            if not connected and _head_answers(address):
                import ray

                ray.init(address=address, log_to_driver=False, logging_level="ERROR")
                connected = True
            if connected:
                import ray

                joined = sum(1 for node in ray.nodes() if node["Alive"])
                if joined >= nodes:
                    return None
            time.sleep(1)
    finally:
        if connected:
            import ray

            ray.shutdown()
    return (
        f"only {joined} of {nodes} Ray nodes joined the head at {address} within {timeout_s:g} "
        "s: see the Ray start lines above in this log (a node that cannot reach the head's "
        "address: set --node-ip-command; a slow file system: raise --join-timeout)"
    )


# ----------------------------------------------------------------------------- the CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusion-ray cluster slurm",
        description="print a SLURM batch script that runs a sweep on a Ray cluster of the "
        "job's nodes (submit it with sbatch from the checkout)",
    )
    parser.add_argument("sweep_file", help="the sweep file, e.g. sweeps/full_grid.yaml")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="sweep file edits")
    defaults = SlurmJob(sweep_file="")
    for name, (flag, text) in _FLAGS.items():
        default = getattr(defaults, name)
        if isinstance(default, bool):
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag, dest=name, action=action, default=default, help=text)
        else:
            kind = int if isinstance(default, int) or name == "port" else str
            parser.add_argument(flag, dest=name, type=kind, default=default, help=text)
    return parser


def _wait_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusion_ray.slurm wait-for-nodes")
    parser.add_argument("--address", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--pids", type=int, nargs="*", default=[])
    args = parser.parse_args(argv)
    problem = wait_for_nodes(args.address, args.nodes, args.timeout, args.pids)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return JOIN_FAILED_EXIT
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["wait-for-nodes"]:
        return _wait_main(args[1:])
    parsed = _parser().parse_intermixed_args(args)
    values = {name: getattr(parsed, name) for name in _FLAGS}
    job = SlurmJob(sweep_file=parsed.sweep_file, overrides=tuple(parsed.overrides), **values)
    try:
        sys.stdout.write(render_slurm(job))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
