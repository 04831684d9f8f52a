"""Faults a cluster has, each with real processes: a driver killed between a trial's end and its
run's FINISHED, a tracking server that goes away mid-sweep, a worker node lost mid-trial."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.slow


def _env(data_cache: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FUSION_RAY_CACHE": data_cache}


def _trial_runs(tracking_uri: str, name: str):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    return client, client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")


# ----------------------------------------------------------------------------- a killed driver


def die_at_first_finish(sweep_file: str) -> None:
    """Subprocess entry point: run the sweep, but die (as kill -9 would) the moment the first
    trial's run would be marked FINISHED: its trial has ended and its final metrics are logged."""
    from fusion_ray.config import load_sweep
    from fusion_ray.sweep import run_sweep
    from fusion_ray.tracking import Tracker

    def die(self, run_id):
        os._exit(9)

    Tracker.finish = die
    run_sweep(load_sweep(sweep_file), sweep_file)


def test_a_driver_killed_after_a_trial_ended_finishes_it_from_storage(tmp_path, data_cache):
    path = tiny_sweep(tmp_path, seeds=[0])
    env = _env(data_cache)
    first = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.test_faults import die_at_first_finish; die_at_first_finish({str(path)!r})",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 9, first.stderr[-3000:]
    spec = yaml.safe_load(path.read_text())
    client, runs = _trial_runs(spec["tracking_uri"], spec["name"])
    ended = [r for r in runs if r.info.status != "FINISHED" and "test_acc" in r.data.metrics]
    assert ended, "the first trial's final metrics should be logged before its run finished"
    ended_cell = ended[0].data.tags["cell_id"]

    again = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    _, runs = _trial_runs(spec["tracking_uri"], spec["name"])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    assert len({r.data.tags["cell_id"] for r in runs}) == 2
    run = next(r for r in runs if r.data.tags["cell_id"] == ended_cell)
    # not trained again, nothing logged twice: one value per epoch, one final test accuracy
    for metric in ("val_acc", "epoch_seconds"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
        assert sorted(steps) == [0, 1], (metric, steps)
    assert len(client.get_metric_history(run.info.run_id, "test_acc")) == 1
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["test_predictions.parquet"]


# ----------------------------------------------------------------------------- a tracking outage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(root: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{root / 'server.db'}",
            "--default-artifact-root",
            str(root / "server_artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("the MLflow server did not start")


def _stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, 9)
    server.wait()


def test_a_tracking_server_outage_mid_sweep_loses_nothing(tmp_path, data_cache):
    port = _free_port()
    server = _start_server(tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    path = tiny_sweep(tmp_path, seeds=[0, 1], tracking_uri=uri)
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = 3
    raw["resources"]["max_concurrent_trials"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    driver = subprocess.Popen(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
        cwd=tmp_path,
        env=_env(data_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = MlflowClient(uri)
        deadline = time.time() + 300
        while time.time() < deadline:  # wait for the first trial's first epoch
            exp = client.get_experiment_by_name("tiny")
            runs = client.search_runs([exp.experiment_id], "tags.role = 'trial'") if exp else []
            if any("val_acc" in r.data.metrics for r in runs):
                break
            time.sleep(0.5)
        _stop_server(server)
        time.sleep(30)  # the server is down while trials go on
        server = _start_server(tmp_path, port)
        out, _ = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    (tmp_path / "driver_output.txt").write_text(out)
    assert driver.returncode == 0, out[-4000:]
    _, runs = _trial_runs(uri, "tiny")
    try:
        assert sorted(r.info.status for r in runs) == ["FINISHED"] * 4, out[-4000:]
        assert len({r.data.tags["cell_id"] for r in runs}) == 4
        for run in runs:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")]
            assert sorted(steps) == [0, 1, 2], steps
            assert "test_acc" in run.data.metrics and run.data.tags.get("checkpoint_path")
            assert [a.path for a in client.list_artifacts(run.info.run_id)] == [
                "test_predictions.parquet"
            ]
    finally:
        _stop_server(server)


# ----------------------------------------------------------------------------- a lost node


def lose_a_node(workdir: str) -> None:
    """Subprocess entry point: a head (no CPU) and two worker nodes of one CPU; once the trial's
    first epoch is checkpointed, the node it runs on is removed. Writes observed.json."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from fusion_ray.config import load_sweep
    from fusion_ray.sweep import run_sweep

    work = Path(workdir)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    spec = load_sweep(work / "lost.yaml")
    storage = Path(spec.storage_path)
    removed: dict[str, str] = {}

    def remove_the_trials_node() -> None:
        while not list(storage.glob("lost-*/*/checkpoint_*")):
            time.sleep(0.05)
        alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
        trial_nodes = {
            a["Address"]["NodeID"] for a in alive if "ImplicitFunc" in a["ActorClassName"]
        }
        for node in nodes:
            if node.node_id in trial_nodes:
                cluster.remove_node(node, allow_graceful=False)  # the trial dies mid-epoch
                removed["node"] = node.node_id

    watcher = threading.Thread(target=remove_the_trials_node, daemon=True)
    watcher.start()
    try:
        outcome = run_sweep(spec, str(work / "lost.yaml"))
        (work / "observed.json").write_text(
            json.dumps({"finished": outcome.finished, "failed": outcome.failed, "removed": removed})
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_trial_on_a_lost_node_resumes_elsewhere_with_the_same_result(tmp_path, data_cache):
    from fusion_ray.config import load_sweep
    from fusion_ray.grid import expand
    from fusion_ray.train import run_local

    path = tiny_sweep(tmp_path, name="lost", seeds=[0], retries=2)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    raw["datasets"]["short"]["data"]["source_kwargs"]["n_train"] = 3000
    raw["defaults"]["model"].update(d_model=32, n_layers=2, d_ff=64)
    raw["defaults"]["train"]["epochs"] = 4
    raw["resources"]["max_concurrent_trials"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.test_faults import lose_a_node; lose_a_node({str(tmp_path)!r})",
        ],
        cwd=tmp_path,
        env=_env(data_cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert observed["removed"], observed
    assert len(observed["finished"]) == 1 and not observed["failed"], observed

    _, runs = _trial_runs(raw["tracking_uri"], "lost")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial ran (cpus_per_worker: 1): the same float sums
    try:
        reference = run_local(expand(load_sweep(path))[0].trial, str(tmp_path / "reference"))
    finally:
        torch.set_num_threads(threads)
    logged = runs[0].data.metrics
    for name in ("test_acc", "test_correct", "best_val_acc", "best_epoch", "epochs_run"):
        assert logged[name] == reference[name], name
