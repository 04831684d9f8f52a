"""A cluster of real ``ray start`` processes on this machine: a head (no CPU, the driver
resource) and two worker nodes of one CPU, each with its own temp dir, token authentication on
(RAY_AUTH_MODE=token, a token of the test's own). A client without the token is refused; a sweep
driver started with ``--address`` trains a cell, the raylet of the node running it is killed
mid-trial with SIGKILL, and the trial resumes on the other node from its last checkpoint: one
FINISHED run with the metrics of an uninterrupted run. The head killed mid-sweep: the driver
fails clearly, and a re-run on a new head resumes without duplicates.

One cluster serves the module (``ray start`` of three nodes costs seconds of CPU each): the
lost-raylet test leaves its head and one worker, which is all the lost-head test needs before
it kills the head and starts a new cluster. Each test has its own sweep, store and storage. The
mid-trial states are made, not waited for: the trial or cell the test interrupts
(``held_add``) waits until the test has killed what it kills."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.cluster

DRIVER_RESOURCE = "fusion_ray_driver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_naming(text: str) -> dict[int, str]:
    """pid -> command line of every live process whose command line or environment names
    ``text`` (this cluster's base directory)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (text in cmdline or text.encode() in environ):
            found[int(proc.name)] = cmdline
    return found


class Cluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "PYTHONPATH": str(ROOT),
            "FUSION_RAY_CLUSTER_BASE": str(base),  # marks every process of this cluster
        }
        self.env.pop("RAY_ADDRESS", None)

    def start(self, *args: str, temp_dir: str) -> None:
        (self.base / temp_dir).mkdir(parents=True)
        command = [
            str(Path(sys.executable).with_name("ray")),  # this interpreter's, activated or not
            "start",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={self.base / temp_dir}",
            "--disable-usage-stats",
            *args,
        ]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def raylets(self) -> dict[int, str]:
        return {
            pid: cmd for pid, cmd in _processes_naming(str(self.base)).items() if "raylet" in cmd
        }

    def stop(self) -> None:
        for _ in range(3):
            left = _processes_naming(str(self.base))
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(1)

    def start_all(self) -> None:
        """The head (no CPU, the driver resource) and two one-CPU workers."""
        self.start(
            "--head",
            f"--port={self.port}",
            "--num-cpus=0",
            f'--resources={{"{DRIVER_RESOURCE}": 2}}',
            "--include-dashboard=false",
            temp_dir=f"head-{secrets.token_hex(2)}",
        )
        for worker in ("worker1", "worker2"):
            self.start(
                f"--address={self.address}",
                "--num-cpus=1",
                temp_dir=f"{worker}-{secrets.token_hex(2)}",
            )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # short paths: Ray's socket paths under pytest's tmp_path would be too long
    base = Path(f"/tmp/frc-{secrets.token_hex(3)}")
    ray_cluster = Cluster(base)
    try:
        ray_cluster.start_all()
        yield ray_cluster
    finally:
        ray_cluster.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _driver(
    cluster: Cluster, path: Path, data_cache: str, out: Path, **env: str
) -> subprocess.Popen:
    command = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--address", cluster.address]
    with out.open("w") as sink:
        return subprocess.Popen(
            [*command, "--no-report"],
            cwd=path.parent,
            env={**cluster.env, "FUSION_RAY_CACHE": data_cache, **env},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def uninterrupted(path: str, run_id: str, work: str) -> None:
    """Subprocess entry point (run where ``held_add`` is installed): the run ``run_id`` of sweep
    ``path`` logged what its cell logs trained locally without interruption."""
    from mlflow.tracking import MlflowClient

    from tests.helpers import assert_metrics_of_an_uninterrupted_run

    tracking_uri = yaml.safe_load(Path(path).read_text())["tracking_uri"]
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert_metrics_of_an_uninterrupted_run(Path(path), run, Path(work))


def _held_sweep(tmp_path: Path, name: str, seeds: int, epochs: int, retries: int) -> Path:
    """``held_add`` cells, one at a time, on the tiny synthetic data (5 steps an epoch)."""
    path = tiny_sweep(
        tmp_path,
        name=name,
        seeds=list(range(seeds)),
        retries=retries,
        grid={"datasets": ["short"], "fusions": ["held_add"]},
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
    )
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = epochs
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_ray_start_cluster_refuses_a_client_without_the_token_and_survives_a_lost_raylet(
    cluster: Cluster, tmp_path, data_cache
):
    """The trial (``held_add``, every trial held) waits after its first epoch, checkpointed,
    until the test has killed its node's raylet and the driver has seen the trial fail: still
    training when its node goes, however fast this machine is."""
    from mlflow.tracking import MlflowClient

    from tests.helpers import install_held_add, process_ended, wait_until_held

    connect = f"import ray; ray.init(address={cluster.address!r}); print('connected')"
    # Ray's client tries the GCS 20 times, a second apart, before it gives up; refused, it is
    # refused each time: two tries say the same
    tries = {"RAY_NUM_REDIS_GET_RETRIES": "2"}
    wrong = {**cluster.env, **tries, "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    # no token at all: none in the environment, none in a home of its own
    none = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH_")}
    none.update(tries, HOME=str(tmp_path / "home"))
    for env in (wrong, none):
        refused = subprocess.run(
            [sys.executable, "-c", connect], env=env, capture_output=True, text=True, timeout=180
        )
        assert refused.returncode != 0 and "connected" not in refused.stdout
        assert "Authentication token is missing or incorrect" in refused.stderr[-20000:]
    assert len(cluster.raylets()) == 3

    path = _held_sweep(tmp_path, "raylet", seeds=1, epochs=4, retries=2)
    raw = yaml.safe_load(path.read_text())
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, hold_after=5, through=0)  # the driver's working dir
    out = tmp_path / "driver.out"
    driver = _driver(cluster, path, data_cache, out)
    try:
        wait_until_held(
            release,
            process_ended(driver, out),
            also=lambda: bool(list(tmp_path.glob("ray_results/raylet-*/*/checkpoint_*"))),
        )
        # the trial's process is a child of its node's raylet: kill that raylet
        trial = [
            pid
            for pid, cmd in _processes_naming(str(cluster.base)).items()
            if "ImplicitFunc" in cmd
        ]
        assert len(trial) == 1, _processes_naming(str(cluster.base))
        raylet = int((Path(f"/proc/{trial[0]}/stat").read_text().rsplit(")", 1)[1].split())[1])
        assert raylet in cluster.raylets()
        os.kill(raylet, signal.SIGKILL)
        # let the trial go on only once Tune has seen it fail: a held worker on the other node
        # could otherwise finish it before its node's loss is noticed
        deadline = time.monotonic() + 300
        while "Ray Tune retries it from its last checkpoint" not in out.read_text():
            assert driver.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, f"the trial outlived its node: {trial}"
            time.sleep(0.2)
        release.touch()
        assert driver.wait(timeout=600) == 0, out.read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()

    client = MlflowClient(raw["tracking_uri"])
    runs = client.search_runs(
        [client.get_experiment_by_name("raylet").experiment_id], "tags.role = 'trial'"
    )
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert "Ray Tune retries it from its last checkpoint" in out.read_text()  # lost, resumed
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_acc")]
    assert sorted(steps) == [0, 1, 2, 3], f"epochs logged twice or missing: {steps}"
    # the same cell trained locally, in an interpreter that finds held_add (its working dir)
    check = f"import sys; from {__name__} import uninterrupted; uninterrupted(*sys.argv[1:])"
    reference = subprocess.run(
        [sys.executable, "-c", check, str(path), runs[0].info.run_id, str(tmp_path)],
        cwd=tmp_path,
        env={**cluster.env, "FUSION_RAY_CACHE": data_cache},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-4000:]


def test_a_lost_head_fails_the_sweep_clearly_and_a_rerun_on_a_new_head_resumes(
    cluster: Cluster, tmp_path, data_cache
):
    """The head's processes killed mid-sweep (two of four cells finished, the third held by
    ``held_add`` until the re-run): the driver exits 7 within the head timeout with one
    message, the parent run is FAILED saying the head is gone; a new head on the same port and
    the same command again: four cells, one FINISHED run each, the first two not run again."""
    from mlflow.tracking import MlflowClient

    from tests.helpers import install_held_add, process_ended, wait_until_held

    path = _held_sweep(tmp_path, "head", seeds=4, epochs=2, retries=2)
    raw = yaml.safe_load(path.read_text())
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, through=2)  # the driver's working dir
    out = tmp_path / "driver.out"
    driver = _driver(cluster, path, data_cache, out, FUSION_RAY_HEAD_TIMEOUT_S="6")
    try:
        wait_until_held(
            release, process_ended(driver, out), also=lambda: "[2/4]" in out.read_text()
        )
        head = [
            pid
            for pid, cmd in _processes_naming(str(cluster.base)).items()
            if "/head-" in cmd and ("gcs_server" in cmd or "raylet" in cmd)
        ]
        assert len(head) == 2, head
        for pid in head:
            os.kill(pid, signal.SIGKILL)
        assert driver.wait(timeout=60) == 7, out.read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    text = out.read_text()
    assert "error: the Ray head at" in text and "run the same command" in text
    client = MlflowClient(raw["tracking_uri"])
    experiment = client.get_experiment_by_name("head").experiment_id
    (parent,) = client.search_runs([experiment], "tags.role = 'sweep'")
    assert parent.info.status == "FAILED" and "Ray head" in parent.data.tags["failure_reason"]
    before = {
        r.info.run_id
        for r in client.search_runs([experiment], "tags.role = 'trial'")
        if r.info.status == "FINISHED"
    }
    assert len(before) == 2

    cluster.stop()
    cluster.start_all()  # a new head on the same port
    release.touch()
    rerun = _driver(cluster, path, data_cache, tmp_path / "rerun.out")
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.out").read_text()[-4000:]
    runs = client.search_runs([experiment], "tags.role = 'trial'")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == len({r.data.tags["cell_id"] for r in finished}) == 4
    assert before <= {r.info.run_id for r in finished}
