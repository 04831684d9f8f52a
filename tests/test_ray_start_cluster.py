"""A cluster of real ``ray start`` processes on this machine: a head (no CPU, the driver
resource) and two worker nodes of one CPU, each with its own temp dir, token authentication on
(RAY_AUTH_MODE=token, a token of the test's own). A client without the token is refused; a sweep
driver started with ``--address`` trains a cell, the raylet of the node running it is killed
mid-trial with SIGKILL, and the trial resumes on the other node from its last checkpoint: one
FINISHED run with the metrics of an uninterrupted run."""

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

pytestmark = pytest.mark.slow

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
            "ray",
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


@pytest.fixture
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    # short paths: Ray's socket paths under pytest's tmp_path would be too long
    base = Path(f"/tmp/frc-{secrets.token_hex(3)}")
    ray_cluster = Cluster(base)
    try:
        ray_cluster.start(
            "--head",
            f"--port={ray_cluster.port}",
            "--num-cpus=0",
            f'--resources={{"{DRIVER_RESOURCE}": 2}}',
            "--include-dashboard=false",
            temp_dir="head",
        )
        for worker in ("worker1", "worker2"):
            ray_cluster.start(f"--address={ray_cluster.address}", "--num-cpus=1", temp_dir=worker)
        yield ray_cluster
    finally:
        ray_cluster.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_ray_start_cluster_refuses_a_client_without_the_token_and_survives_a_lost_raylet(
    cluster: Cluster, tmp_path, data_cache
):
    from mlflow.tracking import MlflowClient

    from fusion_ray.config import load_sweep
    from fusion_ray.grid import expand
    from fusion_ray.train import run_local

    connect = f"import ray; ray.init(address={cluster.address!r}); print('connected')"
    wrong = {**cluster.env, "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    refused = subprocess.run(
        [sys.executable, "-c", connect], env=wrong, capture_output=True, text=True, timeout=180
    )
    assert refused.returncode != 0 and "connected" not in refused.stdout
    assert "Authentication token is missing or incorrect" in refused.stderr
    assert len(cluster.raylets()) == 3

    path = tiny_sweep(tmp_path, name="raylet", seeds=[0], retries=2)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    raw["datasets"]["short"]["data"]["source_kwargs"]["n_train"] = 3000
    raw["defaults"]["model"].update(d_model=32, n_layers=2, d_ff=64)
    raw["defaults"]["train"]["epochs"] = 4
    raw["resources"] = {"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**cluster.env, "FUSION_RAY_CACHE": data_cache}
    out = tmp_path / "driver.out"
    with out.open("w") as sink:
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fusion_ray.sweep",
                str(path),
                "--address",
                cluster.address,
                "--no-report",
            ],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("ray_results/raylet-*/*/checkpoint_*")):
            assert driver.poll() is None and time.time() < deadline, out.read_text()[-4000:]
            time.sleep(0.2)
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
        assert driver.wait(timeout=600) == 0, out.read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()

    client = MlflowClient(raw["tracking_uri"])
    runs = client.search_runs(
        [client.get_experiment_by_name("raylet").experiment_id], "tags.role = 'trial'"
    )
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert "Trial task failed" in out.read_text()  # it did lose its node, then resumed
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_acc")]
    assert sorted(steps) == [0, 1, 2, 3], f"epochs logged twice or missing: {steps}"
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial ran (cpus_per_worker: 1): the same float sums
    try:
        reference = run_local(expand(load_sweep(path))[0].trial, str(tmp_path / "reference"))
    finally:
        torch.set_num_threads(threads)
    for name in ("test_acc", "test_correct", "best_val_acc", "best_epoch", "epochs_run"):
        assert runs[0].data.metrics[name] == reference[name], name
