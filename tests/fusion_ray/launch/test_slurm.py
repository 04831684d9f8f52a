"""The SLURM batch script of ``fusion-ray cluster slurm``: rendered (every option, the multi-node
path, the refusals), and submitted with ``sbatch`` to a real SLURM on this machine.

The real scheduler: ``munged``, ``slurmctld`` and two ``slurmd`` (nodes n1 and n2, Debian's
SLURM is built with multiple-slurmd support) started by the test with configuration files,
a munge key and state folders of its own under a temporary folder, on free ports of 127.0.0.1;
no system configuration is read or changed (``SLURM_CONF`` points the client commands at the
test's file). Needs Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them); skipped,
saying why, without them or when a daemon does not start. Ray's nodes use 127.0.0.2 (loopback:
Ray replaces 127.0.0.1 by the machine's address, not other loopback addresses).

What is checked: a two-node job runs a sweep (one FINISHED run per cell, both Ray nodes joined);
a job requeued mid-sweep (``scontrol requeue``) finishes the rest without running a finished cell
again; a job reaching its time-limit warning stops the sweep (its parent run KILLED with the
reason, no half-written cell) and a resubmission completes it; with ``--requeue-on-time-limit``
the job requeues itself at the warning and its next run completes it. The times from job start to the
first finished trial and from a requeued job's restart to its first trial are printed.

Nothing waits on SLURM's or Ray's defaults: the test's slurm.conf gives a signalled job 5 s
before SIGKILL (``KillWait``, default 30 s) and a job past its time limit 5 more minutes before
SLURM kills it (``OverTimeLimit``), so a stop under load never races SLURM's clock; the job's
Ray nodes stop at once on SIGTERM (``_job_env``); a requeued job's hold is released as soon as
SLURM sets it (``Slurm.release``). The mid-sweep states are made, not waited for: the cells after
the first (``held_add``) wait after their first epoch until the test lets them go; the
time-limit tests then move the job's limit so that the warning is due at SLURM's next time-limit
check (every 30 s, fixed in SLURM), not a minute or two later.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from fusion_ray.launch.slurm import SlurmJob, main, render_slurm, time_limit_seconds
from tests.conftest import ROOT, tiny_sweep
from tests.helpers import install_held_add, wait_until_held

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "srun", "sinfo", "squeue", "scancel")
NODE_IP = "127.0.0.2"
#: Epochs of the held tests' cells: the held cell waits after the first, and its run must show
#: the rest continued from that epoch's checkpoint.
EPOCHS = 3
#: Training steps of one epoch of the held tests' cells (160 documents in batches of 32):
#: ``held_add`` waits after these, past its first checkpoint.
STEPS_PER_EPOCH = 5
#: --signal-seconds of the time-limit tests: with the limit moved 60 to 120 s ahead
#: (``_warning_due``), within this plus SLURM's 30 s check interval, so the next check sends it.
WARN_S = 100


# ----------------------------------------------------------------------------- rendering


@pytest.mark.process  # bash -n checks the script's syntax
def test_the_script_has_every_option_and_the_multi_node_path():
    job = SlurmJob(
        sweep_file="sweeps/full_grid.yaml",
        overrides=("train.epochs=3", "seeds=[0,1]"),
        nodes=4,
        cpus_per_node=16,
        gpus_per_node=4,
        time="2-00:00:00",
        partition="gpu",
        account="lab42",
        mem="128G",
        activate="source /scratch/me/venv/bin/activate",
        signal_seconds=600,
        requeue_on_time_limit=3,
    )
    text = render_slurm(job)
    for directive in (
        "--nodes=4", "--ntasks-per-node=1", "--cpus-per-task=16", "--gres=gpu:4",
        "--mem=128G", "--time=2-00:00:00", "--partition=gpu", "--account=lab42",
        "--signal=B:USR1@600", "--requeue", "--open-mode=append",
    ):  # fmt: skip
        assert f"#SBATCH {directive}\n" in text, directive
    assert "\neval -- 'source /scratch/me/venv/bin/activate'\n" in text  # runs as written
    assert "export RAY_AUTH_MODE=token" in text and "export RAY_AUTH_TOKEN" in text
    assert "secrets.token_hex(32)" in text  # a token per job, not a fixed one
    assert "--num-cpus=16" in text and "--num-gpus=4" in text
    # the head on the batch host, the workers on every other node, both through srun
    assert re.search(r'srun [^\n]*--nodelist="\$head_node"', text)
    assert re.search(r"srun [^\n]*--nodes=\$\{#workers\[@\]\}", text)
    assert 'fusion_ray_driver": 64' in text
    assert "python -m fusion_ray.launch.join wait-for-nodes" in text
    assert "python -m fusion_ray.sweep sweeps/full_grid.yaml train.epochs=3 'seeds=[0,1]'" in text
    assert "trap stop_ray EXIT" in text and "trap 'on_signal USR1' USR1" in text
    assert "-lt 3 ]" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/fr-$SLURM_JOB_ID-$SLURMD_NODENAME" in text
    if shutil.which("bash"):
        checked = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr


@pytest.mark.unit
def test_the_how_to_names_the_commands_the_script_runs():
    """docs/how-to/slurm.md's "What the script does" names each fusion-ray module the script runs,
    and only those."""
    doc = (ROOT / "docs" / "how-to" / "slurm.md").read_text()
    steps = doc.split("## What the script does")[1].split("\n## ")[0]
    text = render_slurm(SlurmJob(sweep_file="s.yaml", nodes=2, requeue_on_time_limit=1))
    said = set(re.findall(r"python -m (fusion_ray[\w.]*)", steps))
    run = set(re.findall(r"^\s*python -m (fusion_ray[\w.]*)", text, re.M))
    assert said == run and said, (said, run)
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text and "`scontrol requeue`" in steps


@pytest.mark.unit
def test_the_header_command_renders_the_same_script(capsys):
    job = SlurmJob(
        sweep_file="sweeps/quickstart.yaml",
        overrides=("train.epochs=1",),
        nodes=2,
        gpus_per_node=1,
        time="90",
        signal_seconds=120,
        activate="module load cuda && conda activate fr",
        requeue=False,
        report=False,
        port=23456,
    )
    text = render_slurm(job)
    command = re.search(r"^#   (fusion-ray cluster slurm .*)$", text, re.M).group(1)
    import shlex

    assert main(shlex.split(command)[3:]) == 0
    assert capsys.readouterr().out == text
    assert "#SBATCH --no-requeue" in text and "--no-report" in text and "port=23456" in text


@pytest.mark.unit
def test_every_problem_is_named_with_its_fix(capsys):
    code = main(
        ["s.yaml", "--time", "tomorrow", "--nodes", "0", "--partition", "gpu;rm",
         "--workdir", "relative/dir", "--mem", "lots", "--requeue-on-time-limit", "2",
         "--no-requeue"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    for text in (
        "--time 'tomorrow': expected minutes, MM:SS, HH:MM:SS",
        "--nodes 0: must be 1 or more",
        "--partition 'gpu;rm'",
        "--workdir 'relative/dir': an absolute path",
        "--mem 'lots'",
        "--requeue-on-time-limit needs --requeue",
    ):
        assert text in err, text
    assert main(["s.yaml", "--time", "10", "--signal-seconds", "600"]) == 2
    assert "below the time limit (600 s)" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("5:30", 330), ("02:00:00", 7200), ("1-12", 129600), ("2-01:30", 178200),
     ("1-00:00:10", 86410), ("soon", None), ("1:2:3:4", None)],
)  # fmt: skip
def test_slurm_time_formats(text, seconds):
    assert time_limit_seconds(text) == seconds


@pytest.mark.process
def test_the_cluster_command_dispatches_to_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fusion_ray.launch", "slurm", "x.yaml", "--nodes", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=3" in done.stdout


# ----------------------------------------------------------------------------- a real SLURM


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]
    pids: list[int]
    submitted: list[str] = field(default_factory=list)
    """Every job id ``sbatch`` returned, in order (the ``slurm`` fixture cancels a test's own)."""

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done.stdout

    def sbatch(self, script: Path, cwd: Path, env: dict[str, str]) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", str(script)], cwd=cwd, env={**self.env, **env},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def cancel(self, job_ids: list[str], timeout: float = 120) -> None:
        """Cancel ``job_ids`` (those that ended already are left as they are) and wait until none
        is queued or running, so the nodes are free for the next test."""
        self.run("scancel", *job_ids, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-o", "%i", "-j", ",".join(job_ids), check=False)
            if not out.split():
                return
            time.sleep(0.5)

    def job(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def logs(self) -> str:
        """The daemons' last lines, for a failing assertion's message."""
        return "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in self.root.glob("*.log"))

    def restarted(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """The job's info once SLURM has requeued it (``Restarts`` 1), pending or running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if int(info["Restarts"]) >= 1 and info["JobState"] in ("PENDING", "RUNNING"):
                return info
            time.sleep(0.5)
        pytest.fail(f"job {job_id} was not requeued: {info}\n{self.logs()}")

    def release(self, job_id: str, timeout: float = 300) -> None:
        """A requeued job that SLURM holds (``Reason=BeginTime``: the lifetime of its nodes'
        credentials, 120 s): start it now, as an administrator would. SLURM sets the hold once
        the job's last step has ended, so this waits for it (a release before that is
        overwritten); a job that has started meanwhile is left as it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] == "PENDING" and info["Reason"] == "BeginTime":
                self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
                return
            if info["JobState"] not in ("PENDING", "COMPLETING"):
                return
            time.sleep(0.2)
        pytest.fail(f"requeued job {job_id} neither held nor started: {info}\n{self.logs()}")

    def wait(self, job_id: str, states: set[str], timeout: float = 900) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] in states:
                return info
            time.sleep(1)
        pytest.fail(f"job {job_id} still {info['JobState']} after {timeout} s")


def _config(root: Path, ctld: int, nodes: dict[str, int]) -> Path:
    lines = [
        "ClusterName=frtest",
        f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
        f"SlurmctldPort={ctld}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/sock",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=5",  # SIGTERM to SIGKILL of a requeued or cancelled job (default 30 s)
        "OverTimeLimit=5",  # minutes past the limit before SLURM kills: a stop never races it
        "MinJobAge=3600",
        "SchedulerParameters=sched_interval=2",
    ]
    for name, port in nodes.items():
        lines.append(
            f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
            f"Port={port} CPUs=2 RealMemory=2000 State=UNKNOWN"
        )
    lines.append(
        f"PartitionName=test Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP"
    )
    path = root / "slurm.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _missing() -> str | None:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs Linux and root (SlurmUser=root runs the jobs as the test's user)"
    missing = [t for t in DAEMONS + CLIENTS if not shutil.which(t, path=SEARCH_PATH)]
    if missing:
        return f"needs {', '.join(missing)} (Debian: apt-get install slurm-wlm munge)"
    return None


def _start(root: Path) -> Slurm:
    """munged, slurmctld and two slurmd under ``root``; skips (after stopping what started)
    when one of them does not come up."""
    for folder in ("munge", "state", "spool-n1", "spool-n2"):
        (root / folder).mkdir(parents=True)
    (root / "munge").chmod(0o700)
    (root / "munge.key").write_bytes(secrets.token_bytes(1024))
    (root / "munge.key").chmod(0o400)
    ctld, n1, n2 = _free_ports(3)
    conf = _config(root, ctld, {"n1": n1, "n2": n2})
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": SEARCH_PATH}
    for key in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
        if key != "SLURM_CONF":
            env.pop(key)
    slurm = Slurm(root, env, [])
    which = {name: shutil.which(name, path=SEARCH_PATH) for name in DAEMONS}
    commands = [
        [which["munged"], f"--key-file={root}/munge.key", f"--socket={root}/munge/sock",
         f"--pid-file={root}/munge/pid", f"--log-file={root}/munge/log",
         f"--seed-file={root}/munge/seed", "--force"],
        [which["slurmctld"], "-f", str(conf), "-i"],
        [which["slurmd"], "-f", str(conf), "-N", "n1"],
        [which["slurmd"], "-f", str(conf), "-N", "n2"],
    ]  # fmt: skip
    pidfiles = [root / "munge/pid", root / "slurmctld.pid", root / "slurmd-n1.pid"]
    pidfiles.append(root / "slurmd-n2.pid")
    for command, pidfile in zip(commands, pidfiles, strict=True):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        deadline = time.monotonic() + 20
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if done.returncode != 0 or not pidfile.exists():
            _stop(slurm)
            logs = " ".join(p.read_text()[-600:] for p in root.glob("*.log"))
            pytest.skip(f"{Path(command[0]).name} did not start: {done.stderr[-600:]} {logs}")
        time.sleep(0.5)
        slurm.pids.append(int(pidfile.read_text().split()[0]))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = slurm.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).split()
        if states.count("idle") == 2:
            return slurm
        time.sleep(1)
    _stop(slurm)
    pytest.skip(f"the two slurmd did not register with slurmctld: {states}")


def _stop(slurm: Slurm) -> None:
    subprocess.run(["scancel", "--full", "-u", "root"], env=slurm.env, capture_output=True,
                   timeout=60, check=False)  # fmt: skip
    for pid in reversed(slurm.pids):  # slurmd, slurmctld, then munged
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture
def slurm(slurm_daemons: Slurm) -> Iterator[Slurm]:
    """The module's SLURM (``slurm_daemons``). The jobs a test submitted are cancelled when it
    ends: a test that failed while its job waits (a held trial) leaves the nodes free, rather
    than the next test's job pending behind it until that test's own deadline."""
    before = len(slurm_daemons.submitted)
    yield slurm_daemons
    mine = slurm_daemons.submitted[before:]
    if mine:
        slurm_daemons.cancel(mine)


@pytest.fixture(scope="module")
def slurm_daemons() -> Iterator[Slurm]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = Path(f"/tmp/frs-{secrets.token_hex(3)}")  # short: munge's socket path
    try:
        started = _start(root)
        yield started
        _stop(started)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # with the Ray temp dirs of a job killed hard


def _sweep(
    tmp_path: Path,
    name: str,
    epochs: int,
    concurrent: int,
    seeds: int = 2,
    n_train: int = 160,
    fusions: tuple[str, ...] = ("add", "gate_scalar"),
) -> Path:
    path = tiny_sweep(
        tmp_path, name=name, seeds=list(range(seeds)),
        grid={"datasets": ["short"], "fusions": list(fusions)},
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": concurrent},
    )  # fmt: skip
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = epochs
    raw["datasets"]["short"]["data"]["source_kwargs"]["n_train"] = n_train
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _script(slurm: Slurm, path: Path, **options) -> Path:
    """The job's script, beside the sweep file; ``options`` set or replace SlurmJob's fields."""
    fields = dict(
        sweep_file=str(path),
        cpus_per_node=1,
        activate=f". {Path(sys.executable).parent / 'activate'}"
        if (Path(sys.executable).parent / "activate").exists()
        else f'export PATH="{Path(sys.executable).parent}:$PATH"',
        workdir=str(ROOT),
        output=str(path.parent / "job-%j.out"),
        node_tmp=str(slurm.root / "nt"),  # short: Ray's socket paths go below it
        node_ip_command=f"echo {NODE_IP}",
        port=_free_ports(1)[0],
        report=False,
    )
    script = path.parent / "job.sh"
    script.write_text(render_slurm(SlurmJob(**{**fields, **options})))
    return script


def _job_env(data_cache: str, site: Path | None = None) -> dict[str, str]:
    """The job's environment; ``site``: a folder of plug-ins (``held_add``) on its path, the Ray
    nodes' workers included (the job starts them with this environment). A Ray node that gets
    SIGTERM (a requeue signals every process of the job) stops at once: by default it drains
    for up to 30 s (``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``), and its processes, which
    outlive SLURM's SIGKILL of ``ray start`` under proctrack/linuxproc, keep the job completing
    until then."""
    path = f"{site}:{ROOT}" if site is not None else str(ROOT)
    return {
        "FUSION_RAY_CACHE": data_cache,
        "PYTHONPATH": path,
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }


# A job queued or running. SIGNALING is a running job while SLURM sends it a signal (the
# time-limit warning among them): it shows between the signal and the job's log line.
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "SIGNALING")


def _held(tmp_path: Path) -> tuple[Path, Path]:
    """``held_add`` for a job: the trials after the first wait after their first epoch
    (``STEPS_PER_EPOCH``), checkpointed, until the file it returns exists. The plug-in folder
    (for ``_job_env``) and that file."""
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    return install_held_add(tmp_path / "site", release, hold_after=STEPS_PER_EPOCH), release


def _held_sweep(tmp_path: Path, name: str) -> Path:
    """Three one-at-a-time ``held_add`` cells of ``EPOCHS`` epochs: the first finishes, the
    second waits after its first checkpoint, the third has not started."""
    return _sweep(tmp_path, name, epochs=EPOCHS, concurrent=1, seeds=3, fusions=("held_add",))


def _warning_due(slurm: Slurm, job_id: str, log: Path) -> None:
    """Move the job's time limit 60 to 120 s ahead (its run time in whole minutes, rounded up,
    plus one; SLURM's limits are whole minutes), as an administrator shortens a job: within
    ``WARN_S`` plus SLURM's 30 s check interval, so its next time-limit check sends the
    warning. Returns once the job's log has it, printing how long it took."""
    elapsed = time_limit_seconds(slurm.job(job_id)["RunTime"]) // 60 + 1
    slurm.run("scontrol", "update", f"JobId={job_id}", f"TimeLimit={elapsed + 1}")
    moved = time.time()
    warned = _wait_for_line(log, r"the job's time limit is near \(SIGUSR1", (slurm, job_id))
    print(f"\nSLURM time limit moved -> warning in the job's log {warned - moved:.1f} s")


def _runs(path: Path) -> list:
    from mlflow.tracking import MlflowClient

    raw = yaml.safe_load(path.read_text())
    client = MlflowClient(raw["tracking_uri"])
    experiment = client.get_experiment_by_name(raw["name"])
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def _trials(path: Path, status: str | None = None) -> list:
    runs = [r for r in _runs(path) if r.data.tags.get("role") == "trial"]
    return [r for r in runs if status is None or r.info.status == status]


def _wait_for_line(log: Path, pattern: str, job: tuple[Slurm, str], after: int = 0) -> float:
    """Seconds since the epoch when ``pattern`` appeared in the log past ``after`` characters."""
    slurm, job_id = job
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        state = slurm.job(job_id)["JobState"]  # before reading: a line written by then is seen
        text = log.read_text() if log.exists() else ""
        if re.search(pattern, text[after:]):
            return time.time()
        assert state in (*LIVE_STATES, "REQUEUED", "COMPLETING"), (
            f"job {job_id} {state} before {pattern!r}: {text[-3000:]}"
        )
        time.sleep(0.25)
    pytest.fail(f"no {pattern!r} in {log}")


def _job_ended(job: tuple[Slurm, str]):
    """For ``wait_until_held``: None while the job is queued or running, else its state."""
    slurm, job_id = job

    def check() -> str | None:
        state = slurm.job(job_id)["JobState"]
        return None if state in LIVE_STATES else f"job {job_id} {state}"

    return check


def _one_finished_run_per_cell(path: Path, cells: int) -> list:
    finished = _trials(path, "FINISHED")
    assert len(finished) == len({r.data.tags["cell_id"] for r in finished}) == cells
    assert len(_trials(path)) == cells, "a cell has a second run"
    return finished


@pytest.mark.cluster
def test_a_two_node_job_runs_the_sweep(slurm, tmp_path, data_cache):
    """Also: the sweep file and the folder the job runs in have a space and a single quote in
    their paths (and so the script's path): quoted in the script, they reach the driver
    intact."""
    path = _sweep(tmp_path, "slurm_two", epochs=2, concurrent=2)
    hostile = tmp_path / "it's a sweep" / path.name
    hostile.parent.mkdir()
    path = path.rename(hostile)
    workdir = tmp_path / "the job's folder"  # the package comes from PYTHONPATH (_job_env)
    workdir.mkdir()
    script = _script(
        slurm, path, nodes=2, workdir=str(workdir), output=str(tmp_path / "job-%j.out")
    )
    submitted = time.time()
    job_id = slurm.sbatch(script, tmp_path, _job_env(data_cache))
    log = tmp_path / f"job-{job_id}.out"
    started = _wait_for_line(log, r"run 0: 2 node\(s\)", (slurm, job_id))
    first = _wait_for_line(log, r"\[1/4\]", (slurm, job_id))
    info = slurm.wait(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-4000:]
    assert info["NodeList"] == "n[1-2]"
    assert "every node joined" in text and "Ray stopped on every node" in text
    _one_finished_run_per_cell(path, 4)
    assert not list(slurm.root.glob(f"nt/fr-{job_id}-*")), "a Ray temp dir was left"
    print(
        f"\nSLURM two-node job: submit -> start {started - submitted:.1f} s, "
        f"job start -> first finished trial {first - started:.1f} s"
    )


@pytest.mark.cluster
def test_a_requeued_job_finishes_the_rest_without_duplicates(slurm, tmp_path, data_cache):
    """``scontrol requeue`` while the first cell has finished and the second waits after its
    first checkpoint (``held_add``): the requeued run finishes the other two, and the first not
    again."""
    path = _held_sweep(tmp_path, "slurm_requeue")
    site, release = _held(tmp_path)
    script = _script(slurm, path)
    job_id = slurm.sbatch(script, tmp_path, _job_env(data_cache, site))
    log = tmp_path / f"job-{job_id}.out"
    _wait_for_line(log, r"\[1/3\]", (slurm, job_id))
    wait_until_held(release, _job_ended((slurm, job_id)), timeout=600)
    before = {r.info.run_id for r in _trials(path, "FINISHED")}
    assert len(before) == 1, before
    slurm.run("scontrol", "requeue", job_id)
    requeued_at = time.time()
    slurm.restarted(job_id)
    released = time.time()
    release.touch()
    slurm.release(job_id)
    restarted = _wait_for_line(log, r"run 1: 1 node", (slurm, job_id))
    offset = log.read_text().find("run 1:")
    resumed = _wait_for_line(log, r"\[1/\d\]", (slurm, job_id), after=offset)
    info = slurm.wait(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    text = log.read_text()
    assert info["JobState"] == "COMPLETED", text[-4000:]
    assert "stopped by SIGTERM" in text
    finished = _one_finished_run_per_cell(path, 3)
    assert before <= {r.info.run_id for r in finished}, "a finished cell ran again"
    assert re.search(r"\[1/2\]", text[offset:]), "the requeued run re-ran the finished cell"
    print(
        f"\nSLURM requeue: requeue -> job stopped and requeued {released - requeued_at:.1f} s; "
        f"restart -> first finished trial {resumed - restarted:.1f} s"
    )


@pytest.mark.cluster
def test_a_job_at_its_time_limit_stops_cleanly_and_a_resubmission_completes_it(
    slurm, tmp_path, data_cache
):
    """Once the first cell has finished and the second waits after its first checkpoint
    (``held_add``), the job's time limit is moved so that the warning is due at SLURM's next
    time-limit check (``_warning_due``): it stops the sweep, the waiting cell's run KILLED, the
    third cell not started. The resubmission, with the cells let go, completes it.

    Nothing races the clock: the held cell waits until the test lets it go, which it does for
    the resubmission only, and SLURM would kill the job only 5 minutes past its limit
    (``OverTimeLimit``)."""
    path = _held_sweep(tmp_path, "slurm_time")
    site, release = _held(tmp_path)
    script = _script(slurm, path, time="30", signal_seconds=WARN_S)
    job_id = slurm.sbatch(script, tmp_path, _job_env(data_cache, site))
    log = tmp_path / f"job-{job_id}.out"
    _wait_for_line(log, r"\[1/3\]", (slurm, job_id))
    wait_until_held(release, _job_ended((slurm, job_id)), timeout=600)
    _warning_due(slurm, job_id, log)
    info = slurm.wait(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    text = log.read_text()
    assert "the job's time limit is near (SIGUSR1" in text, text[-4000:]
    assert "the sweep driver exited with status 143" in text, text[-4000:]
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "143:0", info
    (parent,) = [r for r in _runs(path) if r.data.tags.get("role") == "sweep"]
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags["failure_reason"]
    statuses = sorted(r.info.status for r in _trials(path))
    assert set(statuses) <= {"FINISHED", "KILLED"} and "KILLED" in statuses, statuses
    assert statuses.count("FINISHED") < 3
    killed = [r.info.run_id for r in _trials(path, "KILLED")]

    release.touch()
    again = slurm.sbatch(script, tmp_path, _job_env(data_cache, site))
    info = slurm.wait(again, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=1800)
    text = (tmp_path / f"job-{again}.out").read_text()
    assert info["JobState"] == "COMPLETED", text[-4000:]
    _one_finished_run_per_cell(path, 3)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(yaml.safe_load(path.read_text())["tracking_uri"])
    for run_id in killed:  # continued in its own run, from its checkpoint
        steps = sorted(m.step for m in client.get_metric_history(run_id, "val_acc"))
        assert steps == list(range(EPOCHS)), steps


@pytest.mark.cluster
def test_a_job_requeues_itself_at_its_time_limit_and_the_next_run_finishes(
    slurm, tmp_path, data_cache
):
    """``--requeue-on-time-limit 1``: at the warning (due at SLURM's next check once the first
    cell has finished and the second waits, as above) the sweep stops and the job requeues
    itself (one job id, one log, ``Restarts=1``); given its time back, the next run finishes the
    sweep, every cell once. The held cell waits until the test gives the job its time back."""
    path = _held_sweep(tmp_path, "slurm_chain")
    site, release = _held(tmp_path)
    script = _script(slurm, path, time="30", signal_seconds=WARN_S, requeue_on_time_limit=1)
    job_id = slurm.sbatch(script, tmp_path, _job_env(data_cache, site))
    log = tmp_path / f"job-{job_id}.out"
    _wait_for_line(log, r"\[1/3\]", (slurm, job_id))
    wait_until_held(release, _job_ended((slurm, job_id)), timeout=600)
    _warning_due(slurm, job_id, log)
    _wait_for_line(log, rf"requeueing job {job_id}", (slurm, job_id))
    slurm.restarted(job_id)
    slurm.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=30")
    release.touch()
    slurm.release(job_id)
    info = slurm.wait(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=1800)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, (
        f"{info}\n{text[-3000:]}\n{slurm.logs()}"
    )
    assert "the sweep driver exited with status 143" in text and "run 1:" in text
    _one_finished_run_per_cell(path, 3)
