"""Faults a cluster has, each with real processes: a driver killed between a trial's end and its
run's FINISHED, a tracking server that goes away mid-sweep, a worker node lost mid-trial, the
node of one rank of a DDP trial lost mid-trial, a driver killed with SIGKILL, whose local Ray
must not outlive it, and full disks mid-sweep: the storage path's, the sqlite store's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, tiny_sweep
from tests.helpers import (
    MLFLOW_SERVER_ENV,
    SCENARIO_HANG_S,
    UNINTERRUPTED_METRICS,
    install_held_add,
    process_ended,
    run_with_hang_guard,
    uninterrupted_metrics,
    wait_until_held,
)

# the multi-node scenarios' own guard (SCENARIO_HANG_S) fails a hung one with its output,
# before the process tier's time limit would
pytestmark = [pytest.mark.process, pytest.mark.timeout(SCENARIO_HANG_S + 300)]


def _env(data_cache: str, ray_session=None) -> dict[str, str]:
    """A command's environment: this checkout, the session's data cache, and the session's Ray
    when given (else what this process has: a driver starts a Ray of its own)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FUSION_RAY_CACHE": data_cache}
    if ray_session is not None:
        env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    return env


def _trial_runs(tracking_uri: str, name: str):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    return client, client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")


# ----------------------------------------------------------------------------- a killed driver


def die_at_first_finish(sweep_file: str) -> None:
    """Subprocess entry point: run the sweep, but die (as kill -9 would) the moment the first
    trial's run would be marked FINISHED: its trial has ended and its final metrics are logged."""
    from fusion_ray.config import load_sweep
    from fusion_ray.driver.runner import run_sweep
    from fusion_ray.driver.tracking import Tracker

    def die(self, run_id, lease_token=None):
        os._exit(9)

    Tracker.finish = die
    run_sweep(load_sweep(sweep_file), sweep_file)


def test_a_driver_killed_after_a_trial_ended_finishes_it_from_storage(
    tmp_path, data_cache, ray_session, mlflow_store
):
    path = tiny_sweep(tmp_path, seeds=[0], tracking_uri=mlflow_store(tmp_path / "mlflow.db"))
    env = _env(data_cache, ray_session)
    first = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from {__name__} import die_at_first_finish; die_at_first_finish({str(path)!r})",
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
    expected = ["test_predictions.parquet"]
    if run.data.tags["fusion"] == "gate_scalar":  # gated: its gates by position too
        expected = ["gate_by_position.parquet", *expected]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == expected


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
        env={**os.environ, **MLFLOW_SERVER_ENV},
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.2)
    _stop_server(server)
    raise RuntimeError("the MLflow server did not start")


def _stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, 9)
    server.wait()


def test_a_tracking_server_outage_mid_sweep_loses_nothing(
    tmp_path, data_cache, ray_session, mlflow_store
):
    """The MLflow server is stopped while trials train and report, and started again once the
    driver has said that it waits for it: the sweep ends with every run FINISHED and complete.

    Nothing races the clock: the trials after the first (``held_add``) wait until the server is
    down, so the outage always falls in the middle of the sweep, and the server comes back only
    once the driver has met the outage."""
    port = _free_port()
    mlflow_store(tmp_path / "server.db")  # the server's store, migrated
    server = _start_server(tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    path = tiny_sweep(
        tmp_path,
        seeds=[0, 1, 2, 3],
        tracking_uri=uri,
        grid={"datasets": ["short"], "fusions": ["held_add"]},
    )
    raw = yaml.safe_load(path.read_text())
    raw["resources"]["max_concurrent_trials"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release)  # the driver's working directory: on its Ray's path
    out = tmp_path / "driver_output.txt"
    with out.open("w") as sink:
        driver = subprocess.Popen(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
            cwd=tmp_path,
            env=_env(data_cache, ray_session),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    client = MlflowClient(uri)
    try:
        # the first cell FINISHED ("[1/4]" is printed after it), the next trial waiting
        wait_until_held(
            release, process_ended(driver, out), also=lambda: "[1/4]" in out.read_text()
        )
        _stop_server(server)
        release.touch()  # the other trials train and report while the server is down
        deadline = time.monotonic() + 300
        while f"no answer from {uri}: waiting for it" not in out.read_text():
            assert driver.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, "the driver never met the outage"
            time.sleep(0.2)
        server = _start_server(tmp_path, port)
        assert driver.wait(timeout=600) == 0, out.read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    text = out.read_text()
    assert f"no answer from {uri}: waiting for it" in text, text[-4000:]
    _, runs = _trial_runs(uri, "tiny")
    try:
        assert sorted(r.info.status for r in runs) == ["FINISHED"] * 4, text[-4000:]
        assert len({r.data.tags["cell_id"] for r in runs}) == 4
        for run in runs:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")]
            assert sorted(steps) == [0, 1], steps
            assert "test_acc" in run.data.metrics and run.data.tags.get("checkpoint_path")
            artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
            assert artifacts == ["test_predictions.parquet"], artifacts
    finally:
        _stop_server(server)


# ------------------------------------------------------------- a lost node, a lost DDP rank's node


def _scenario(function: str, tmp_path: Path, env: dict[str, str]) -> None:
    """Runs ``function(tmp_path)`` of this module in a subprocess (its own multi-node Ray), its
    output kept in scenario_output.txt; fails with that output when it fails or hangs."""
    command = [
        sys.executable,
        "-c",
        f"from {__name__} import {function}; {function}({str(tmp_path)!r})",
    ]
    proc = run_with_hang_guard(command, tmp_path, env)
    (tmp_path / "scenario_output.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]


STEPS_PER_EPOCH = 5
"""Training steps of one epoch of the tiny sweep: 160 documents in batches of 32 (shared among a
DDP trial's ranks)."""
DRIVER_RESOURCE = "fusion_ray_driver"


def _held_cell(workdir: Path, name: str, **resources: Any) -> Path:
    """A one-cell sweep of ``held_add`` (3 epochs, 2 retries, one trial at a time) whose trial,
    every rank of it, waits after its first epoch, checkpointed, until the file
    ``workdir/turns/release`` exists: long enough to lose a node mid-trial on any machine."""
    path = tiny_sweep(workdir, name=name, seeds=[0], retries=2)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["held_add"]
    raw["defaults"]["train"]["epochs"] = 3
    raw["resources"] = {"workers": 1, "cpus_per_worker": 1, **resources}
    raw["resources"]["max_concurrent_trials"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _wait_for(what: str, ready: Any, timeout: float = 600) -> None:
    """In a scenario's watcher thread: until ``ready()``, else fail loudly after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in {timeout:.0f} s")
        time.sleep(0.05)


def lose_nodes(workdir: str) -> None:
    """Subprocess entry point: one cluster, a head (no CPU, the driver resource) and three
    worker nodes of one CPU, for two faults, each made while the trial (``held_add``, every
    rank of it) waits after its first epoch, checkpointed; the trial is let go once the node is
    removed.

    1. Sweep ``lost_node``, one worker: the trial's node is removed. Then the metrics of the same
       trial trained locally without a break (this process can build ``held_add``: its working
       directory).
    2. A third worker node again. The DDP cell (two ranks) runs as sweep ``ddp_clean`` (the
       release file there: nothing waits), then as ``ddp_lost``, where the node of one rank is
       removed once the first epoch's checkpoint is registered.

    Writes observed.json: per fault the outcome, the nodes, the removed one, and (DDP) where
    every Train actor ran."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from fusion_ray.config import load_sweep
    from fusion_ray.driver.runner import run_sweep

    work = Path(workdir)
    release = work / "turns" / "release"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "resources": {DRIVER_RESOURCE: 1},
            "include_dashboard": False,
        },
    )
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    observed: dict[str, Any] = {"head": cluster.head_node.node_id}

    def actors(classes: tuple[str, ...], alive_only: bool = False) -> dict[str, list[str]]:
        """actor id -> [class, node] of the actors of ``classes``."""
        return {
            actor_id: [a["ActorClassName"], a["Address"]["NodeID"]]
            for actor_id, a in ray._private.state.actors().items()
            if any(c in a["ActorClassName"] for c in classes)
            and (a["State"] == "ALIVE" or not alive_only)
        }

    def remove_a_node(seen: dict[str, Any], ready: Any, classes: tuple[str, ...]) -> None:
        """Once ``ready()``: the node of one live actor of ``classes`` removed, said in
        ``seen``; then the held trial is let go (also when something went wrong)."""
        try:
            _wait_for("held trial with its first epoch checkpointed", ready)
            found = actors(classes, alive_only=True)
            node = next(n for n in nodes if n.node_id in {host for _, host in found.values()})
            cluster.remove_node(node, allow_graceful=False)  # the trial dies mid-epoch
            nodes.remove(node)
            seen["at_removal"], seen["removed"] = found, node.node_id
        except Exception as exc:  # said in observed.json; the test fails on it
            seen["watcher_error"] = repr(exc)
        finally:
            release.touch()  # the resumed trial runs through

    def held(checkpoint: str, waiting: int) -> Any:
        return lambda: (
            bool(list(work.glob(checkpoint)))
            and (len(list(release.parent.glob("waiting-*"))) == waiting)
        )

    try:
        lost: dict[str, Any] = {"workers": [n.node_id for n in nodes]}
        threading.Thread(
            target=remove_a_node,
            args=(lost, held("ray_results/lost_node-*/*/checkpoint_*", 1), ("ImplicitFunc",)),
            daemon=True,
        ).start()
        outcome = run_sweep(load_sweep(work / "lost_node.yaml"), str(work / "lost_node.yaml"))
        lost.update(finished=outcome.finished, failed=outcome.failed)
        lost["reference"] = uninterrupted_metrics(work / "lost_node.yaml", work / "reference")
        observed["lost_node"] = lost

        nodes.append(cluster.add_node(num_cpus=1))
        cluster.wait_for_nodes()
        ddp: dict[str, Any] = {"workers": [n.node_id for n in nodes]}
        for name in ("ddp_clean", "ddp_lost"):
            for waited in release.parent.glob("waiting-*"):
                waited.unlink()
            if name == "ddp_lost":
                release.unlink()
                # The snapshot is written when a checkpoint is registered: only then durable.
                snapshot = "ray_results/ddp_lost-train/*/checkpoint_manager_snapshot.json"
                threading.Thread(
                    target=remove_a_node,
                    args=(ddp, held(snapshot, 2), ("RayTrainWorker",)),
                    daemon=True,
                ).start()
            before = actors(("RayTrainWorker", "TrainController"))
            outcome = run_sweep(load_sweep(work / f"{name}.yaml"), str(work / f"{name}.yaml"))
            ddp[name] = {
                "finished": outcome.finished,
                "failed": outcome.failed,
                "actors": {
                    k: v
                    for k, v in actors(("RayTrainWorker", "TrainController")).items()
                    if k not in before
                },
            }
        observed["ddp"] = ddp
    finally:
        (work / "observed.json").write_text(json.dumps(observed, indent=1))
        release.touch()
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def lost_nodes(tmp_path_factory, data_cache, mlflow_store) -> tuple[Path, dict[str, Any]]:
    """The lost-node scenarios (``lose_nodes``) run once for the module: their folder (sweep
    files, storage, the MLflow store) and what they observed."""
    work = tmp_path_factory.mktemp("lost_nodes")
    mlflow_store(work / "mlflow.db")  # the three sweeps' store
    _held_cell(work, "lost_node")
    for name in ("ddp_clean", "ddp_lost"):  # two ranks, the controller on the head
        _held_cell(work, name, workers=2, driver_resource=DRIVER_RESOURCE)
    release = work / "turns" / "release"
    release.parent.mkdir()
    install_held_add(work, release, hold_after=STEPS_PER_EPOCH, through=0, ranks=True)
    _scenario("lose_nodes", work, _env(data_cache))
    return work, json.loads((work / "observed.json").read_text())


def test_a_trial_on_a_lost_node_resumes_elsewhere_with_the_same_result(lost_nodes):
    """The node of a one-worker trial removed while the trial waits after its first epoch: Tune
    retries it from that checkpoint on another node, and the run logs what the same trial logs
    trained without interruption."""
    work, observed = lost_nodes
    seen = observed["lost_node"]
    assert "removed" in seen, f"no node was removed: {seen.get('watcher_error')}"
    assert seen["removed"] in seen["workers"]
    assert seen["removed"] in {node for _, node in seen["at_removal"].values()}
    assert len(seen["finished"]) == 1 and not seen["failed"], seen

    _, runs = _trial_runs(f"sqlite:///{work / 'mlflow.db'}", "lost_node")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    for name in UNINTERRUPTED_METRICS:
        assert runs[0].data.metrics[name] == seen["reference"][name], name


def _tune_trial_dir(storage: Path, sweep: str) -> Path:
    """The folder of the one trial of a one-cell sweep's Tune run (its results and errors)."""
    (trial_dir,) = [p.parent for p in storage.glob(f"{sweep}-2*/*/result.json")]
    return trial_dir


def test_a_ddp_trial_that_loses_a_ranks_node_resumes_with_the_same_result(lost_nodes):
    """The node of one rank of a two-rank DDP trial removed while the ranks wait after their
    first epoch, its checkpoint registered: Ray Train restarts the gang on the nodes left, from
    that checkpoint, and the run logs what the same cell logs without the fault."""
    work, observed = lost_nodes
    seen = observed["ddp"]
    for name in ("ddp_clean", "ddp_lost"):
        assert len(seen[name]["finished"]) == 1 and not seen[name]["failed"], seen[name]

    # the removed node hosted one of the two ranks
    assert "removed" in seen, f"no node was removed: {seen.get('watcher_error')}"
    assert seen["removed"] in seen["workers"]
    assert seen["removed"] in {node for _, node in seen["at_removal"].values()}
    # the Tune trial failed once and Tune retried it; Ray Train's controller stayed on the head,
    # and the restarted gang ran on the two worker nodes left
    lost_trial = _tune_trial_dir(work / "ray_results", "ddp_lost")
    assert "WorkerGroupError" in (lost_trial / "error.txt").read_text()
    actors = seen["ddp_lost"]["actors"]
    assert {node for cls, node in actors.values() if cls == "TrainController"} == {observed["head"]}
    restarted = [
        node
        for actor_id, (cls, node) in actors.items()
        if cls == "RayTrainWorker" and actor_id not in seen["at_removal"]
    ]
    assert sorted(restarted) == sorted(set(seen["workers"]) - {seen["removed"]})
    # ... from its last checkpoint: every epoch reported once, none trained again from scratch
    results = [json.loads(line) for line in (lost_trial / "result.json").read_text().splitlines()]
    assert [r.get("epoch") for r in results] == [0, 1, 2, None], results

    # and with the same numbers as the run without the fault (DDP with gloo on CPU is
    # deterministic given the seed, whichever nodes the ranks run on)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = {name: _trial_runs(client.tracking_uri, name)[1] for name in ("ddp_clean", "ddp_lost")}
    assert [len(r) for r in runs.values()] == [1, 1]
    clean, lost = runs["ddp_clean"][0], runs["ddp_lost"][0]
    assert clean.info.status == lost.info.status == "FINISHED"
    histories = {
        run.info.run_id: [
            (m.step, m.value)
            for m in sorted(
                client.get_metric_history(run.info.run_id, "val_loss"), key=lambda m: m.step
            )
        ]
        for run in (clean, lost)
    }
    assert [step for step, _ in histories[lost.info.run_id]] == [0, 1, 2]
    assert histories[lost.info.run_id] == histories[clean.info.run_id]
    for key in ("test_correct", "test_acc", "best_val_acc", "best_epoch", "epochs_run"):
        assert lost.data.metrics[key] == clean.data.metrics[key], key


# ----------------------------------------------------------------------------- a kill -9 driver


def _ray_processes(driver_pid: int | None, ray_tmp: Path) -> dict[int, str]:
    """pid -> command line of every live process of a driver's local Ray: those whose environment
    names the driver's Ray temp dir (RAY_TMPDIR, which they inherit) and, given ``driver_pid``,
    those in the driver's session (it was started as a session leader; Ray's processes keep
    its session unless they start one of their own)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # after the command in parentheses: state, ppid, process group, session
            state, _, _, session = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # gone meanwhile
            continue
        if state == "Z":  # exited, not yet reaped
            continue
        if int(session) == driver_pid or f"RAY_TMPDIR={ray_tmp}".encode() in environ:
            found[int(proc.name)] = cmdline
    return found


def _kill_all(driver: subprocess.Popen, ray_tmp: Path) -> None:
    """Whatever is left of the driver and its Ray, by pid; then its temp dir. Only processes
    that name the temp dir: a dead driver's pid (its session id) may be reused."""
    if driver.poll() is None:
        driver.kill()
        driver.wait()
    for pid in _ray_processes(None, ray_tmp):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    shutil.rmtree(ray_tmp, ignore_errors=True)


RAY_AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
"""Ray's per-node agents: they notice the raylet's death at once, then try for 60 s (a fixed
timeout) to tell the dead GCS before they exit."""


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_a_driver_killed_with_sigkill_leaves_no_ray_processes_behind(
    tmp_path, data_cache, mlflow_store
):
    path = tiny_sweep(
        tmp_path,
        tracking_uri=mlflow_store(tmp_path / "mlflow.db"),
        name="orphans",
        seeds=[0],
        # force_trainer: the Tune trial, Ray Train's controller and a rank, on one CPU
        resources={"workers": 1, "cpus_per_worker": 1, "force_trainer": True},
    )
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["add"]
    raw["defaults"]["train"]["epochs"] = 200  # still training when the driver is killed
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    # A short temp dir: Ray's socket paths under pytest's tmp_path would be too long.
    ray_tmp = Path(tempfile.mkdtemp(prefix="fusion-ray-"))
    env = {**_env(data_cache), "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)  # a local Ray of the driver's own
    with open(tmp_path / "driver_output.txt", "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("ray_results/orphans-train/*/checkpoint_*")):
            assert driver.poll() is None, (tmp_path / "driver_output.txt").read_text()[-4000:]
            assert time.time() < deadline, "the trial did not checkpoint an epoch in 300 s"
            time.sleep(0.5)
        running = {
            pid: cmd
            for pid, cmd in _ray_processes(driver.pid, ray_tmp).items()
            if pid != driver.pid
        }
        for name in ("gcs_server", "raylet", "ray::TrainController", "ray::RayTrainWorker"):
            assert any(name in cmd for cmd in running.values()), (name, running)

        os.kill(driver.pid, 9)
        driver.wait()
        killed, gone_after = time.time(), {}
        while time.time() < killed + 120 and len(gone_after) < len(running):
            alive = _ray_processes(driver.pid, ray_tmp)
            for pid in running:
                if pid not in alive and pid not in gone_after:
                    gone_after[pid] = time.time() - killed
            time.sleep(0.5)
        left = {pid: running[pid] for pid in running if pid not in gone_after}
        assert not left, f"Ray processes left 120 s after the driver was killed: {left}"
        # GCS, raylet, the trial, Ray Train's controller and rank: within seconds; the agents
        # within about a minute, once their report to the dead GCS times out
        late = {running[pid] for pid, seconds in gone_after.items() if seconds > 20}
        assert late <= RAY_AGENTS, {running[pid]: round(s) for pid, s in gone_after.items()}
    finally:
        _kill_all(driver, ray_tmp)


# ----------------------------------------------------------------------------- a full disk


def _private_tmpfs_prefix(mount_point: Path, size: str = "32m") -> list[str] | None:
    """A command prefix that runs its command in a mount namespace of its own where a tmpfs of
    ``size`` can be mounted at ``mount_point`` (as root, or as a user through a user namespace),
    or None when this machine allows neither."""
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        if unshare == ["unshare", "-m"] and os.geteuid() != 0:
            continue
        probe = subprocess.run(
            [*unshare, "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {mount_point}"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return unshare
    return None


def test_a_full_storage_path_fails_clearly_and_a_rerun_completes(
    tmp_path, data_cache, mlflow_store
):
    """storage_path on a 32 MiB tmpfs that fills up (another file takes the space) once the
    first cell has finished: the other trials fail for want of space, the driver exits 6 with
    one message saying the storage is full and what to do, the finished cell stays FINISHED,
    and the same command with space again runs exactly the missing cells.

    Nothing races the clock: every trial after the first waits (``held_add``) until the test has
    seen the first cell's run FINISHED and the next trial waiting, and has filled the storage."""
    storage = tmp_path / "storage"
    storage.mkdir()
    unshare = shutil.which("unshare") and _private_tmpfs_prefix(storage)
    if not unshare:
        pytest.skip("cannot mount a private tmpfs here (needs root or user namespaces)")
    path = tiny_sweep(
        tmp_path,
        name="full",
        seeds=[0, 1, 2, 3],
        grid={"datasets": ["short"], "fusions": ["held_add"]},
        storage_path=str(storage),
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        tracking_uri=mlflow_store(tmp_path / "mlflow.db"),
    )
    turns = tmp_path / "turns"
    turns.mkdir()
    release = turns / "release"
    site = install_held_add(tmp_path / "site", release)
    ray_tmp = Path(tempfile.mkdtemp(prefix="fusion-ray-"))
    env = {
        **_env(data_cache),
        "PYTHONPATH": f"{site}:{ROOT}",
        "RAY_TMPDIR": str(ray_tmp),
    }
    env.pop("RAY_ADDRESS", None)
    sweep = f"{sys.executable} -m fusion_ray.sweep {path} --no-report"
    out = tmp_path / "driver_output.txt"
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with out.open("w") as sink:
        driver = subprocess.Popen(
            [*unshare, "sh", "-c", f"mount -t tmpfs -o size=32m tmpfs {storage} && exec {sweep}"],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 300
        # the first cell's run FINISHED ("[1/4]" is printed after it), the next trial waiting
        while not list(turns.glob("waiting-*")) or "[1/4]" not in out.read_text():
            assert driver.poll() is None and time.time() < deadline, out.read_text()[-4000:]
            time.sleep(0.2)
        statuses = sorted(r.info.status for r in _trial_runs(tracking_uri, "full")[1])
        assert [s for s in statuses if s != "RUNNING"] == ["FINISHED"], statuses
        # the driver's view of its storage (its mount namespace): fill it
        with open(f"/proc/{driver.pid}/root{storage}/filler", "wb") as filler:
            with pytest.raises(OSError, match="No space left"):
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
        release.touch()  # the waiting trials go on, into a full storage
        assert driver.wait(timeout=300) == 6, out.read_text()[-4000:]
    finally:
        _kill_all(driver, ray_tmp)
    text = out.read_text()
    assert f"error: the storage at {storage} is full" in text
    assert "run the same command again" in text
    assert "Traceback" not in text and "Trial task failed" not in text, text[-4000:]
    client, runs = _trial_runs(tracking_uri, "full")
    statuses = sorted(r.info.status for r in runs)
    assert statuses[0] == "FAILED" and statuses.count("FINISHED") == 1, statuses
    first = next(r for r in runs if r.info.status == "FINISHED")
    parent = client.search_runs([first.info.experiment_id], "tags.role = 'sweep'")[0]
    assert parent.info.status == "FAILED" and "is full" in parent.data.tags["failure_reason"]

    rerun = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
        cwd=tmp_path,
        env={**env, "RAY_TMPDIR": tempfile.mkdtemp(prefix="fusion-ray-")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _, runs = _trial_runs(tracking_uri, "full")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len({r.data.tags["cell_id"] for r in finished}) == len(finished) == 4
    assert first.info.run_id in {r.info.run_id for r in finished}  # kept, not re-run


def _fill(path: str) -> None:
    """Write ``path`` until its disk is full."""
    with open(path, "wb") as filler:
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\0" * (1 << 20))
                filler.flush()


def store_summary(db: str, out: str) -> None:
    """Subprocess entry point, run where the store's tmpfs is mounted: SQLite's integrity check
    of the store and what it holds of each trial run (cell, status, test accuracy, the epochs
    of val_acc, artifacts), as JSON in ``out``."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        integrity = connection.execute("PRAGMA integrity_check").fetchone()[0]
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("store_full")
    runs = [
        {
            "run_id": run.info.run_id,
            "cell_id": run.data.tags["cell_id"],
            "status": run.info.status,
            "test_acc": run.data.metrics.get("test_acc"),
            "epochs": sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_acc")),
            "artifacts": [a.path for a in client.list_artifacts(run.info.run_id)],
        }
        for run in client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    ]
    Path(out).write_text(json.dumps({"integrity": integrity, "runs": runs}))


def test_a_tracking_store_whose_disk_fills_mid_sweep_is_one_message_and_stays_whole(
    tmp_path, data_cache, mlflow_store
):
    """The sqlite store on an 8 MiB tmpfs that fills up (another file takes the space) once the
    first cell has finished: the next write to the store fails with SQLite's "database or disk
    is full", and the driver stops its trials and exits 12 with one message naming the store
    and the fix, no traceback. The store is whole (SQLite's integrity check; the FINISHED run
    reads back with its metrics and predictions), and the same command with space again runs
    exactly the missing cells: the stopped driver's lease is taken over at once.

    The tmpfs exists only in the mount namespace of the shell that runs the driver: that shell
    also reads the store back, frees the space and runs the command again. Nothing races the
    clock: the trials after the first (``held_add``) wait until the test has filled the disk."""
    disk = tmp_path / "disk"
    disk.mkdir()
    unshare = shutil.which("unshare") and _private_tmpfs_prefix(disk, "8m")
    if not unshare:
        pytest.skip("cannot mount a private tmpfs here (needs root or user namespaces)")
    db = disk / "mlflow.db"
    template = mlflow_store(tmp_path / "template" / "mlflow.db").removeprefix("sqlite:///")
    path = tiny_sweep(
        tmp_path,
        name="store_full",
        seeds=[0, 1, 2],
        grid={"datasets": ["short"], "fusions": ["held_add"]},
        tracking_uri=f"sqlite:///{db}",
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    site = install_held_add(tmp_path / "site", release)
    ray_tmps = [Path(tempfile.mkdtemp(prefix="fusion-ray-")) for _ in range(2)]
    env = {**_env(data_cache), "PYTHONPATH": f"{site}:{ROOT}"}
    env.pop("RAY_ADDRESS", None)
    sweep = f"{sys.executable} -m fusion_ray.sweep {path} --no-report"
    summary = (
        f"{sys.executable} -c 'import sys; from {__name__} import store_summary; "
        "store_summary(*sys.argv[1:])'"
    )
    script = "; ".join(
        [
            f"mount -t tmpfs -o size=8m tmpfs {disk} || exit 99",
            f"cp {template} {db}",  # a new store, migrated (MLflow takes seconds to)
            f"RAY_TMPDIR={ray_tmps[0]} {sweep} > {tmp_path / 'full.out'} 2>&1",
            f"echo $? > {tmp_path / 'full.rc'}",
            f"{summary} {db} {tmp_path / 'left.json'}",
            f"rm {disk / 'filler'}",
            f"RAY_TMPDIR={ray_tmps[1]} {sweep} > {tmp_path / 'again.out'} 2>&1",
            f"echo $? > {tmp_path / 'again.rc'}",
            f"{summary} {db} {tmp_path / 'again.json'}",
        ]
    )
    out = tmp_path / "full.out"
    shell = subprocess.Popen(
        [*unshare, "sh", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        # the first cell's run FINISHED ("[1/3]" is printed after it), the next trial waiting
        wait_until_held(
            release,
            process_ended(shell, out),
            also=lambda: out.exists() and "[1/3]" in out.read_text(),
        )
        _fill(f"/proc/{shell.pid}/root{disk}/filler")  # the driver's view of its store's disk
        release.touch()  # the waiting trials go on, and their first results meet a full store
        said, _ = shell.communicate(timeout=900)
    finally:
        for ray_tmp in ray_tmps:
            _kill_all(shell, ray_tmp)
    assert shell.returncode == 0, said
    text = out.read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "12", text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-4000:]
    assert errors[0].startswith(
        f"error: no space is left for the tracking store {db} (database or disk is full) while "
        "the sweep ran, so the driver stopped: 1 trial(s) had finished in this run"
    )
    assert "Free space on its disk (or point tracking_uri at a store on a larger disk)" in errors[0]
    assert "Traceback" not in text and "MLflow tracking of" not in text, text[-4000:]

    left = json.loads((tmp_path / "left.json").read_text())
    assert left["integrity"] == "ok"
    finished = [r for r in left["runs"] if r["status"] == "FINISHED"]
    assert len(finished) == 1, left["runs"]
    (first,) = finished
    assert first["test_acc"] is not None and first["epochs"] == [0, 1]
    assert first["artifacts"] == ["test_predictions.parquet"]

    again_text = (tmp_path / "again.out").read_text()
    assert (tmp_path / "again.rc").read_text().strip() == "0", again_text[-4000:]
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["integrity"] == "ok"
    done = {r["cell_id"]: r for r in again["runs"] if r["status"] == "FINISHED"}
    assert len(done) == 3, again["runs"]
    assert done[first["cell_id"]] == first  # kept as it was, not run again
