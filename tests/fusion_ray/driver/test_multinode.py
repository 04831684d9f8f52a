"""Multi-node on one machine: ``ray.cluster_utils.Cluster`` with a head and two worker nodes.

The head has no CPU and offers the driver resource (as in cluster.yaml); worker A has one CPU and
one GPU *as Ray sees it* (a fake GPU: Ray schedules on the number it is told, the trial still
trains on the CPU), worker B one CPU. A two-cell sweep runs against it with token authentication
on: a two-worker DDP cell pinned to the head by ``driver_resource``, and a one-worker cell asking
for a quarter of a GPU. The scenario runs in a subprocess, so the session's shared local Ray
(``ray_session``) is neither needed nor disturbed, whichever test started it. Everything is
observed from outside the sweep: Ray's actor table, Tune's own result files and the MLflow store.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT, tiny_sweep
from tests.helpers import SCENARIO_HANG_S, run_with_hang_guard

# the multi-node scenarios' own guard (SCENARIO_HANG_S) fails a hung one with its output,
# before the process tier's time limit would
pytestmark = [pytest.mark.process, pytest.mark.timeout(SCENARIO_HANG_S + 300)]

DRIVER_RESOURCE = "fusion_ray_driver"


def _sweep_file(workdir: Path) -> Path:
    """Two cells on the same tiny synthetic data: DDP over two nodes, and a packed one-worker trial."""
    path = tiny_sweep(workdir, name="multinode", seeds=[0])
    raw = yaml.safe_load(path.read_text())
    short = raw["datasets"].pop("short")
    raw["grid"] = {"datasets": ["ddp", "packed"], "fusions": ["add"]}
    raw["datasets"] = {
        "ddp": {
            **short,
            "resources": {"workers": 2, "cpus_per_worker": 1, "driver_resource": DRIVER_RESOURCE},
        },
        "packed": {
            **short,
            "resources": {
                "workers": 1,
                "cpus_per_worker": 1,
                "use_gpu": True,
                "gpus_per_worker": 0.25,
            },
        },
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_scenario(workdir: str) -> None:
    """Subprocess entry point: start the cluster, run the sweep, write what Ray saw to observed.json."""
    import ray
    from ray._raylet import AuthenticationMode, get_authentication_mode
    from ray.cluster_utils import Cluster

    from fusion_ray.config import load_sweep
    from fusion_ray.driver.runner import run_sweep

    work = Path(workdir)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "resources": {DRIVER_RESOURCE: 4},
            "include_dashboard": False,
        },
    )
    try:
        gpu_node = cluster.add_node(num_cpus=1, num_gpus=1)
        cpu_node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        path = _sweep_file(work)
        outcome = run_sweep(load_sweep(path), str(path))
        actors = [
            {"cls": a["ActorClassName"], "node": a["Address"]["NodeID"], "pid": a["Pid"]}
            for a in ray._private.state.actors().values()
        ]
        observed = {
            "auth_token_mode": get_authentication_mode() == AuthenticationMode.TOKEN,
            "head": cluster.head_node.node_id,
            "gpu_node": gpu_node.node_id,
            "cpu_node": cpu_node.node_id,
            "driver_node": ray.get_runtime_context().get_node_id(),
            "finished": outcome.finished,
            "failed": outcome.failed,
            "actors": actors,
        }
        (work / "observed.json").write_text(json.dumps(observed, indent=1))
    finally:
        ray.shutdown()
        cluster.shutdown()


def _trial_pids(storage: Path) -> dict[str, int]:
    """cell_id -> pid of its Tune trial actor, from Tune's own result.json files."""
    pids = {}
    for result in storage.glob("multinode-*/*/result.json"):
        lines = [json.loads(x) for x in result.read_text().splitlines() if x.strip()]
        pids[result.parent.name] = lines[-1]["pid"]
    return pids


def test_sweep_on_a_three_node_cluster(tmp_path, data_cache):
    from ray._private.authentication.authentication_token_generator import (
        generate_new_authentication_token,
    )

    token = tmp_path / "auth_token"
    token.write_text(generate_new_authentication_token())
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # token authentication stays on, with a token of its own
        "RAY_AUTH_TOKEN_PATH": str(token),
        "FUSION_RAY_CPU_FALLBACK": "1",  # the GPU is one Ray is told about; the trial trains on CPU
        "FUSION_RAY_CACHE": data_cache,
        "PYTHONPATH": str(ROOT),
        # Ray Train's controller collects its workers' reports every 2 s (its default): the DDP
        # cell's epochs of milliseconds would wait for it; 0.2 s saves about 6 s of the sweep
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    }
    env.pop("RAY_ADDRESS", None)
    command = [
        sys.executable,
        "-c",
        f"import sys; from {__name__} import run_scenario; run_scenario(sys.argv[1])",
        str(tmp_path),
    ]
    proc = run_with_hang_guard(command, ROOT, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    seen = json.loads((tmp_path / "observed.json").read_text())
    assert seen["auth_token_mode"]
    assert len(seen["finished"]) == 2 and not seen["failed"]
    head, gpu_node, cpu_node = seen["head"], seen["gpu_node"], seen["cpu_node"]

    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import expand

    spec = load_sweep(tmp_path / "multinode.yaml")  # written by the scenario
    cells = {c.dataset: c for c in expand(spec)}
    node_of_pid = {a["pid"]: a["node"] for a in seen["actors"]}
    trial_node = {
        cid: node_of_pid[pid] for cid, pid in _trial_pids(tmp_path / "ray_results").items()
    }

    # the DDP trial spans both worker nodes; its Tune trial and Train controller stay on the head
    workers = [a["node"] for a in seen["actors"] if a["cls"] == "RayTrainWorker"]
    assert sorted(workers) == sorted([gpu_node, cpu_node])
    controllers = [a["node"] for a in seen["actors"] if a["cls"] == "TrainController"]
    assert controllers == [head]
    assert trial_node[cells["ddp"].cell_id] == head
    assert seen["driver_node"] == head  # the sweep driver itself
    # the quarter-GPU request reached Ray: only worker A advertises a GPU
    assert trial_node[cells["packed"].cell_id] == gpu_node

    # MLflow: the laptop schema for both cells
    from mlflow.tracking import MlflowClient

    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name("multinode")
    runs = {
        r.data.tags["dataset"]: r
        for r in client.search_runs([experiment.experiment_id], filter_string="tags.role = 'trial'")
    }
    assert sorted(runs) == ["ddp", "packed"]
    for dataset, run in runs.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["cell_id"] == cells[dataset].cell_id
        assert run.data.params["model.d_model"] == "16"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_acc")) == [
            0,
            1,
        ]
        local = client.download_artifacts(
            run.info.run_id, "test_predictions.parquet", str(tmp_path / dataset)
        )
        preds = pd.read_parquet(local)
        assert len(preds) == run.data.metrics["test_total"] == 64
        assert (preds.label == preds.pred).sum() == run.data.metrics["test_correct"]

    # ... and the same numbers as the cell run on a laptop without Ray (one thread, as in the trial)
    import torch

    from fusion_ray.train.loop import run_local

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        laptop = run_local(cells["packed"].trial, str(tmp_path / "laptop"))
    finally:
        torch.set_num_threads(threads)
    packed = runs["packed"]
    history = sorted(
        client.get_metric_history(packed.info.run_id, "val_loss"), key=lambda m: m.step
    )
    laptop_history = [
        json.loads(x)["val_loss"]
        for x in (tmp_path / "laptop" / "metrics.jsonl").read_text().splitlines()[:-1]
    ]
    assert [m.value for m in history] == laptop_history
    for key in ("test_correct", "best_val_acc", "best_epoch", "num_params"):
        assert packed.data.metrics[key] == laptop[key], key
