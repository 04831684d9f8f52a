"""The SLURM launch target: a batch script that runs a sweep on a Ray cluster of the job's own
nodes: ``fusion-ray cluster slurm SWEEP.yaml [KEY=VALUE ...] --nodes 2 --gpus-per-node 4 ... >
job.sh`` then ``sbatch job.sh``.

The script is the batch base's (``fusion_ray.launch.batch``: Ray head and workers on the job's
nodes, the node wait, the sweep, requeue-safe stops); SLURM supplies its ``#SBATCH`` directives,
the node list (``scontrol show hostnames``), ``srun`` steps (``--overlap``, one task per node),
``scontrol requeue`` and the time-limit warning ``--signal=B:USR1@S`` (SIGUSR1 to the batch
shell ``signal_seconds`` before the limit). A job array would start several drivers on one sweep
at once; the sweep's lease lets only one of them run, so an array buys nothing here.

Every value reaches the script quoted where it is used, or is refused with an error naming its
flag; docs/how-to/slurm.md says what each option takes. The script's node-wait step is the
base's, ``python -m fusion_ray.launch.join wait-for-nodes``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from fusion_ray.launch.batch import BATCH_FLAGS, BatchJob, BatchTarget
from fusion_ray.launch.shell import node_tmp_problem
from fusion_ray.launch.target import run

__all__ = [
    "SlurmJob",
    "SlurmTarget",
    "main",
    "node_tmp_problem",
    "render_slurm",
    "time_limit_seconds",
]

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
class SlurmJob(BatchJob):
    """What ``fusion-ray cluster slurm`` takes: the batch base's options and SLURM's own."""

    partition: str | None = None
    account: str | None = None
    mem: str | None = None
    """Memory per node (``--mem``, e.g. 64G); None: the partition's default."""
    output: str = "fusion-ray-%x-%j.out"
    """The job's log (``--output``; appended to across requeues): no spaces, quotes, '\\' or
    '#', which sbatch reads in a directive its own way."""
    node_tmp: str = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"

    target: ClassVar[str] = "slurm"
    module: ClassVar[str] = "fusion_ray/launch/slurm.py"
    submit: ClassVar[str] = "sbatch"
    warning_signal: ClassVar[str] = "USR1"
    node_dir: ClassVar[str] = "fr-$SLURM_JOB_ID-$SLURMD_NODENAME"
    default_port: ClassVar[str] = "$((20000 + SLURM_JOB_ID % 20000))"
    submit_dir: ClassVar[str] = '"$SLURM_SUBMIT_DIR"'
    time_formats: ClassVar[str] = (
        "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 24:00:00)"
    )
    job_lines: ClassVar[str] = """
job_id=$SLURM_JOB_ID
run=${SLURM_RESTART_COUNT:-0}
head_node=$SLURMD_NODENAME  # the batch host: the job's first node
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
"""
    step_lines: ClassVar[str] = """
every_node=(srun --overlap --nodes=${#nodes[@]} --ntasks=${#nodes[@]} --ntasks-per-node=1)
head_step=(srun --overlap --nodes=1 --ntasks=1 --cpus-per-task=@CPUS@ @GRES@--nodelist="$head_node")
worker_steps=(srun --overlap --nodes=${#workers[@]} --ntasks=${#workers[@]} --ntasks-per-node=1
    --cpus-per-task=@CPUS@ @GRES@--nodelist="$(IFS=,; echo "${workers[*]}")")
requeue=(scontrol requeue "$SLURM_JOB_ID")
"""

    def time_limit_seconds(self) -> int | None:
        return time_limit_seconds(self.time)

    @classmethod
    def flags(cls) -> dict[str, tuple[str, str]]:
        flags = dict(BATCH_FLAGS)
        flags["cpus_per_node"] = ("--cpus-per-node", "CPUs of each node for Ray (--cpus-per-task)")
        flags["gpus_per_node"] = ("--gpus-per-node", "GPUs of each node (--gres=gpu:N)")
        flags["time"] = ("--time", "the time limit, in SLURM's formats (e.g. 24:00:00, 2-00:00)")
        flags["requeue"] = ("--requeue", "SLURM may requeue the job (preemption, node failure)")
        first = ("nodes", "cpus_per_node", "gpus_per_node", "time")
        return {
            **{name: flags.pop(name) for name in first},
            "partition": ("--partition", "the SLURM partition"),
            "account": ("--account", "the SLURM account"),
            "mem": ("--mem", "memory per node (e.g. 64G); default: the partition's"),
            **flags,
        }

    def scheduler_texts(self) -> list[tuple[str, str | None]]:
        return [("--partition", self.partition), ("--account", self.account), ("--mem", self.mem)]

    def scheduler_problems(self) -> list[str]:
        """sbatch reads its directives split at whitespace, with quotes, '\\' and '#' of their
        own meaning, and a heterogeneous job's separator anywhere in a line: such text cannot
        be a directive's value."""
        out = []
        for what, value in [("--partition", self.partition), ("--account", self.account)]:
            if value is not None and not _NAME.fullmatch(value):
                out.append(f"{what} {value!r}: letters, digits, '.', '-' and '_' only")
        if self.mem is not None and not _MEM.fullmatch(self.mem):
            out.append(f"--mem {self.mem!r}: a number with an optional K, M, G or T (e.g. 64G)")
        for what, value in [
            ("--output", self.output),
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

    def replacements(self) -> dict[str, str]:
        return {"@GRES@": f"--gres=gpu:{self.gpus_per_node} " if self.gpus_per_node else ""}

    def directives(self) -> list[str]:
        lines = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={self.cpus_per_node}",
        ]
        if self.gpus_per_node:
            lines.append(f"--gres=gpu:{self.gpus_per_node}")
        if self.mem:
            lines.append(f"--mem={self.mem}")
        lines.append(f"--time={self.time}")
        if self.partition:
            lines.append(f"--partition={self.partition}")
        if self.account:
            lines.append(f"--account={self.account}")
        lines += [
            f"--signal=B:{self.warning_signal}@{self.signal_seconds}",
            "--requeue" if self.requeue else "--no-requeue",
            "--open-mode=append",
            f"--output={self.output}",
        ]
        return [f"#SBATCH {line}" for line in lines]


def render_slurm(job: SlurmJob) -> str:
    """The batch script for ``job``. Raises ValueError listing every problem of ``job``."""
    return job.script()


class SlurmTarget(BatchTarget):
    """A SLURM batch script: a Ray cluster of the job's nodes runs the sweep (sbatch it from the
    checkout)."""

    summary = "print a SLURM batch script that runs a sweep on a Ray cluster of the job's nodes"
    directive = "#SBATCH"
    job = SlurmJob
    example_environment = {
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_SUBMIT_DIR": "/submitted/from",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``fusion-ray cluster slurm ARGV...``."""
    return run("slurm", list(sys.argv[1:] if argv is None else argv))
