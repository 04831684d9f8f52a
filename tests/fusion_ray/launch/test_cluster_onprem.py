"""`ray up` of a lab's cluster file, end to end over SSH, with this machine as the lab.

What a lab does, with 127.0.0.1 as its only node: render the file with ``python -m
fusion_ray.launch onprem`` (head 127.0.0.1, no workers, the head runs trials), ``ray up`` it, run
a two-cell sweep on the head with ``ray exec``, fetch the report and the MLflow store with ``ray
rsync-down``, check that the store holds each cell once, FINISHED, stop MLflow and ``ray down``.

Needs OpenSSH's server and client, rsync, netcat and curl (Debian: ``apt-get install
openssh-server rsync netcat-openbsd curl``); skipped, saying what is missing, without them or when
sshd cannot start. The system's SSH setup is neither used nor changed: the test makes a host key,
a user key, authorized_keys and an sshd_config in a temporary folder and runs its own sshd on a
free port of 127.0.0.1, which Ray's launcher reaches through ``ssh_proxy_command: nc %h PORT``
(Ray has no SSH port setting). That sshd gives every session HOME, TMPDIR and RAY_TMPDIR inside
the temporary folder, so the "head" writes nothing to the real home or to /tmp/ray, and the
environment every test's ``mlflow server`` gets (``tests.helpers.MLFLOW_SERVER_ENV``); the laptop
side (``ray up``, ``ray exec``, ...) has a HOME of its own too, holding the checkout (a copy of
this working tree) and Ray's token. The nodes' Python environment is this interpreter's
(``--python-env``): nothing is installed. As root, sshd needs its privilege separation folder
/run/sshd; the test creates it when missing and removes it afterwards.

``ray stop``, which ``ray up`` and ``ray down`` run on the head, stops every Ray process on the
machine, other users' and other tests' included. The head's ~/.bashrc here therefore turns ``ray
stop`` into stopping only the Ray processes started through this test's sshd (SIGKILL for what
SIGTERM has not stopped after ``STOP_GRACE_S``). That sshd is a child subreaper (prctl), so
every process started through it stays its descendant; whatever is left at the end (Ray, MLflow,
a driver) is stopped by pid, and the sshd with it, even when the test fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT, tiny_sweep
from tests.helpers import MLFLOW_SERVER_ENV

pytestmark = pytest.mark.cluster

SWEEP = "onprem_tiny"
DRIVER_RESOURCE = "fusion_ray_driver"
DRIVER_SLOTS = 64
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
TOOLS = ("sshd", "ssh", "ssh-keygen", "rsync", "nc", "curl")
#: Ports `ray start --head` takes by default that the cluster file does not set.
RAY_FIXED_PORTS = (10001, 52365)
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the head's ``ray stop`` gives Ray's processes between SIGTERM and SIGKILL. Ray's own
#: waits 16 s, and its gcs_server and raylet here outlive SIGTERM longer than that: a wait that
#: only delays ``ray down``.
STOP_GRACE_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _missing_requirements() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux (a child subreaper keeps every process the test starts in reach)"
    missing = [tool for tool in TOOLS if not shutil.which(tool, path=SEARCH_PATH)]
    if missing:
        return (
            f"needs {', '.join(missing)} (Debian: apt-get install openssh-server rsync "
            "netcat-openbsd curl)"
        )
    taken = [p for p in RAY_FIXED_PORTS if _port_taken(p)]
    if taken:
        return f"ports {taken}, which `ray start --head` takes, are in use on 127.0.0.1"
    return None


def _write_sshd_files(root: Path, port: int, head_home: Path, user: str) -> Path:
    """Keys, authorized_keys and an sshd_config, all under root/ssh; returns the config."""
    ssh = root / "ssh"
    ssh.mkdir()
    for key in ("host_key", "id"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / key)], check=True
        )
    (ssh / "authorized_keys").write_text((ssh / "id.pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    config = ssh / "sshd_config"
    mlflow_env = " ".join(f"{key}={value}" for key, value in MLFLOW_SERVER_ENV.items())
    config.write_text(
        f"ListenAddress 127.0.0.1:{port}\n"
        f"HostKey {ssh / 'host_key'}\n"
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}\n"
        f"PidFile {ssh / 'sshd.pid'}\n"
        f"AllowUsers {user}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        f"SetEnv HOME={head_home} TMPDIR={root / 'rt'} RAY_TMPDIR={root / 'rt'} {mlflow_env}\n"
    )
    return config


def _start_sshd(config: Path, port: int) -> subprocess.Popen:
    """Our own sshd in the foreground, a child subreaper: orphans of its sessions (Ray's daemons,
    the MLflow server) become its children, not init's. Skips when it does not come up."""
    sshd = shutil.which("sshd", path=SEARCH_PATH)
    libc = ctypes.CDLL(None, use_errno=True)

    def become_subreaper() -> None:
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")

    log = config.with_name("sshd.log")
    proc = subprocess.Popen(
        [sshd, "-D", "-f", str(config), "-E", str(log)],
        preexec_fn=become_subreaper,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None and not _port_taken(port):
        time.sleep(0.1)
    if proc.poll() is not None or not _port_taken(port):
        proc.kill()
        proc.wait()
        reason = log.read_text()[-500:] if log.exists() else "no log"
        pytest.skip(f"sshd could not be started: {reason}")
    return proc


@dataclass
class LocalLab:
    """This machine as a lab: an sshd standing in for the head, a laptop HOME, a shared folder."""

    root: Path
    laptop: Path
    head: Path
    shared: Path
    cluster_file: Path
    env: dict[str, str]
    sshd: subprocess.Popen

    def ray(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``ray ARGS`` as typed on the laptop; output is stdout and stderr together."""
        return subprocess.run(
            [str(Path(sys.executable).with_name("ray")), *args],
            cwd=self.laptop,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )

    def ray_pids(self) -> list[int]:
        """Ray's processes still running under our sshd, found as `ray stop` finds them."""
        return [p for p in descendants(self.sshd.pid) if is_ray_process(p)]


def descendants(root: int) -> list[int]:
    """Live descendants of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, ppid = (Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def is_ray_process(pid: int) -> bool:
    """Whether ``ray stop`` would stop ``pid``: its name or command line has one of Ray's keys."""
    from ray.autoscaler._private.constants import RAY_PROCESSES

    try:
        comm = (Path("/proc") / str(pid) / "comm").read_text().strip()
        args = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    text = f"{comm} {args.decode(errors='replace')}"
    return any(key in text for key, _ in RAY_PROCESSES)


def stop_processes(root: int, everything: bool) -> None:
    """``ray stop`` for the processes under ``root`` only (everything: all of them), by pid:
    SIGTERM, then SIGKILL for what is left after ``STOP_GRACE_S``. The head's ``ray stop`` calls
    this."""
    me = os.getpid()
    pids = [p for p in descendants(root) if p != me and (everything or is_ray_process(p))]
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = set(descendants(root))
            pids = [p for p in pids if p in alive]
        if not pids:
            return


def _head_bashrc(sshd_pid: int) -> str:
    """The head's ~/.bashrc before `ray up` appends its profile line: `ray stop` stops only the Ray
    processes under our sshd, whereas Ray's own would stop every Ray on this machine."""
    stop = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        f"from {__name__} import stop_processes; "
        f"stop_processes({sshd_pid}, everything=False)"
    )
    return (
        "# `ray stop` here stops only the Ray started through this test's sshd\n"
        f'ray() {{ if [ "$1" = stop ]; then {sys.executable} -c "{stop}"; '
        'else command ray "$@"; fi; }\n'
    )


def _checkout(laptop: Path) -> Path:
    """The laptop's ~/.fusion-ray/checkout: this working tree's package, analysis and sweeps, and
    the tiny sweep, which writes where the head's profile says (FUSION_RAY_STORAGE, MLflow)."""
    checkout = laptop / ".fusion-ray" / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("fusion_ray", "analysis", "sweeps"):
        shutil.copytree(ROOT / name, checkout / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", checkout)
    path = tiny_sweep(
        checkout,
        name=SWEEP,
        seeds=[0],
        storage_path="${FUSION_RAY_STORAGE}",
        tracking_uri="${MLFLOW_TRACKING_URI}",
    )
    spec = yaml.safe_load(path.read_text())
    spec["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return checkout


def _ssh_control_dir(cluster_name: str) -> Path:
    """Where Ray's launcher keeps a cluster's SSH master connections (see its command_runner.py)."""

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    return Path("/tmp") / f"ray_ssh_{digest(getpass.getuser())}" / digest(cluster_name)


def _remove_ssh_control_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only when no other cluster's is left in it


def _stop_sshd(sshd: subprocess.Popen) -> None:
    """Everything started through our sshd, then the sshd."""
    try:
        stop_processes(sshd.pid, everything=True)
    finally:
        sshd.terminate()
        try:
            sshd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait()


@pytest.fixture
def local_lab() -> Iterator[LocalLab]:
    """This machine as a lab, up to the rendered cluster file; everything it starts is stopped
    and everything it writes removed, whatever happens."""
    reason = _missing_requirements()
    if reason:
        pytest.skip(reason)
    user = getpass.getuser()
    with contextlib.ExitStack() as cleanup:
        root = Path(tempfile.mkdtemp(prefix="fro", dir="/tmp"))  # short: Ray's socket paths
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        cleanup.callback(_remove_ssh_control_dir, _ssh_control_dir(root.name))
        laptop, head, shared = root / "laptop", root / "head", root / "shared"
        for folder in (laptop, head, shared, root / "rt", root / "lt"):
            folder.mkdir()
        if os.geteuid() == 0 and not Path("/run/sshd").exists():
            Path("/run/sshd").mkdir(mode=0o755)  # sshd's privilege separation folder, as root
            cleanup.callback(shutil.rmtree, "/run/sshd", ignore_errors=True)
        port = _free_port()
        sshd = _start_sshd(_write_sshd_files(root, port, head, user), port)
        cleanup.callback(_stop_sshd, sshd)
        (head / ".bashrc").write_text(_head_bashrc(sshd.pid))
        _checkout(laptop)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_", "MLFLOW_", "FUSION_RAY_"))
        }
        env.update(
            HOME=str(laptop),
            TMPDIR=str(root / "lt"),
            RAY_TMPDIR=str(root / "lt"),
            RAY_USAGE_STATS_ENABLED="0",
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        )
        lab = LocalLab(root, laptop, head, shared, laptop / "cluster-lab.yaml", env, sshd)
        _render(lab, user, port)
        yield lab


def _render(lab: LocalLab, user: str, ssh_port: int) -> None:
    """Ray's token and the cluster file, as the README has a lab make them."""
    token = lab.ray("get-auth-token", "--generate", timeout=60)
    assert token.returncode == 0, token.stdout
    ports = [_free_port() for _ in range(4)]
    assert len(set(ports)) == 4, "free ports taken twice; run again"
    render = subprocess.run(
        [sys.executable, "-m", "fusion_ray.launch", "onprem", "--name", lab.root.name]
        + ["--head", "127.0.0.1", "--head-trials", "--user", user]
        + ["--key", str(lab.root / "ssh" / "id"), "--storage", str(lab.shared)]
        + ["--python-env", sys.prefix, "--ssh-proxy-command", f"nc %h {ssh_port}"]
        + ["--ray-port", str(ports[0]), "--object-manager-port", str(ports[1])]
        + ["--dashboard-port", str(ports[2]), "--mlflow-port", str(ports[3])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lab.cluster_file.write_text(render.stdout)


def _ok(result: subprocess.CompletedProcess, what: str) -> str:
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-6000:]}"
    return result.stdout


def test_ray_up_runs_a_sweep_on_the_labs_machines(local_lab: LocalLab):
    lab, cluster = local_lab, str(local_lab.cluster_file)
    _ok(lab.ray("up", cluster, "-y", "--no-config-cache", timeout=420), "ray up")

    # the head offers the driver resource; token authentication is on: a wrong token is refused
    status = _ok(lab.ray("exec", cluster, "ray status"), "ray status")
    assert f"0.0/{DRIVER_SLOTS}.0 {DRIVER_RESOURCE}" in status, status[-3000:]
    wrong = lab.ray("exec", cluster, "RAY_AUTH_TOKEN=not-the-cluster-token ray status")
    assert wrong.returncode != 0 and "InvalidAuthToken" in wrong.stdout, wrong.stdout[-3000:]

    # the sweep, from the synced checkout, writing where the head's profile says
    sweep = f"cd ~/fusion-ray && python -m fusion_ray.sweep {SWEEP}.yaml"
    out = _ok(lab.ray("exec", cluster, sweep, timeout=480), "the sweep")
    assert f"sweep {SWEEP}: 2 cells" in out, out[-3000:]

    # the report and the run store come back to the laptop
    report = lab.laptop / "report"
    remote_report = f"{lab.head}/fusion-ray/reports/{SWEEP}/"
    _ok(lab.ray("rsync-down", cluster, remote_report, f"{report}/"), "rsync-down report")
    names = {p.name for p in report.iterdir()}
    assert {"report.md", "runs.csv"} <= names, sorted(names)
    assert len(pd.read_csv(report / "runs.csv")) == 2, "one row per cell"
    store = lab.laptop / "mlflow-cluster.db"
    _ok(lab.ray("rsync-down", cluster, f"{lab.head}/mlflow/mlflow.db", str(store)), "rsync-down db")
    _assert_each_cell_finished_once(store, lab)

    # MLflow stops by its pid file, Ray with `ray down`
    mlflow_pid = int((lab.head / "mlflow" / "server.pid").read_text())
    _ok(lab.ray("exec", cluster, "kill $(cat ~/mlflow/server.pid)"), "stopping MLflow")
    _ok(lab.ray("down", cluster, "-y"), "ray down")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (lab.ray_pids() or mlflow_pid in _live(lab)):
        time.sleep(0.5)
    assert not lab.ray_pids(), "Ray still runs on the head after `ray down`"
    assert mlflow_pid not in _live(lab), "the MLflow server outlived its pid file's kill"


def _live(lab: LocalLab) -> set[int]:
    return set(descendants(lab.sshd.pid))


def _assert_each_cell_finished_once(store: Path, lab: LocalLab) -> None:
    """One FINISHED trial run per cell of the sweep file; artifacts and checkpoints on the shared
    storage."""
    from mlflow.tracking import MlflowClient

    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import expand

    # as on the head; cell ids depend on neither
    env = {"FUSION_RAY_STORAGE": f"{lab.shared}/ray_results", "MLFLOW_TRACKING_URI": "http://h"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        cells = {
            c.cell_id
            for c in expand(load_sweep(lab.laptop / ".fusion-ray" / "checkout" / f"{SWEEP}.yaml"))
        }
    assert len(cells) == 2
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(SWEEP)
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'trial'")
    assert sorted(r.data.tags["cell_id"] for r in runs) == sorted(cells)
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        artifacts = lab.shared / "mlflow" / experiment.experiment_id / run.info.run_id / "artifacts"
        assert (artifacts / "test_predictions.parquet").is_file(), sorted(artifacts.rglob("*"))
    assert any((lab.shared / "ray_results").iterdir()), "no checkpoints on the shared storage"
