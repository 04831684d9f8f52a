"""The HPO command in the sweep's driver session, with real driver processes: a second driver on
the same HPO file is refused while the first runs, and a third that found no fragment and waited
at the lease until the first had written it tunes nothing; a driver paused (SIGSTOP) past the
lease's TTL loses the lease to a second one, and, resumed, stops with exit 4 having written
nothing more: no tuning run finished by it, no fragment, and the parent run left as the new
holder ends it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from fusion_ray.schema import PARENT_TAG
from tests.conftest import ROOT, tiny_sweep
from tests.helpers import install_held_add, process_ended, wait_until_held, wait_until_lapsed

pytestmark = pytest.mark.process


@pytest.fixture(autouse=True)
def _store(tmp_path, mlflow_store) -> None:
    """Each test's HPO run logs into a new sqlite store at ``mlflow.db``, a copy
    of the session's migrated one (a driver migrating a new file takes seconds)."""
    mlflow_store(tmp_path / "mlflow.db")


def _hpo_file(tmp_path: Path, name: str, epochs: int = 4, samples: int = 2) -> Path:
    """A tiny HPO file over the tiny sweep's dataset: one operator, ``held_add`` (every trial
    waits after ``hold_after`` steps for the file ``tmp_path/turns/release``: see ``_held``),
    ``samples`` Optuna trials of ``epochs`` epochs, one at a time, no early stopping."""
    sweep = yaml.safe_load(tiny_sweep(tmp_path, name=f"{name}_grid").read_text())
    raw = {
        "name": name,
        "output": f"tuned/{name}.yaml",
        "sweeps": [f"{name}_grid.yaml"],
        "tune": {
            "datasets": ["short"],
            "fusion": "held_add",
            "seed": 1000,
            "num_samples": samples,
            "max_concurrent_trials": 1,
            "asha": {"grace_period": epochs, "reduction_factor": 2},
            "space": {"train.lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2}},
        },
        "datasets": sweep["datasets"],
        "defaults": {
            **sweep["defaults"],
            "train": {**sweep["defaults"]["train"], "epochs": epochs},
        },
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "storage_path": str(tmp_path / "ray_results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "retries": 0,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _held(tmp_path: Path, hold_after: int) -> Path:
    """``held_add`` in the driver's working directory (Ray puts it on its workers' path): every
    tuning trial waits after ``hold_after`` training steps until the returned file exists."""
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, hold_after=hold_after, through=0)
    return release


def _env(ray_session, data_cache: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "FUSION_RAY_CACHE": data_cache,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _trial_runs(client: MlflowClient, name: str) -> list:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")


AT_THE_LEASE = """
import sys, time
from pathlib import Path

from fusion_ray.driver import lease
from fusion_ray.hpo.cli import main

arrived, go = Path(sys.argv[1]), Path(sys.argv[2])
acquire = lease.SweepLease.acquire


def acquire_when_told(self):
    arrived.touch()
    while not go.exists():
        time.sleep(0.1)
    acquire(self)


lease.SweepLease.acquire = acquire_when_told
sys.exit(main(sys.argv[3:]))
"""
"""``python -c AT_THE_LEASE ARRIVED GO HPO.yaml``: the HPO command, waiting just before it takes
the lease (past every check before it) for the file GO, after creating ARRIVED."""


def _start(command: list[str], cwd: Path, env: dict[str, str], err: Path) -> subprocess.Popen:
    with err.open("w") as stream:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stream)


def _pause_outside_the_store(driver: subprocess.Popen, db: Path) -> None:
    """SIGSTOP the driver where it holds no lock on the sqlite store (else continue it and try
    again): paused inside a read or a write, it would keep every other writer out until it goes
    on, and the second driver would stop at MLflow's 20 s wait instead of taking over."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        os.kill(driver.pid, signal.SIGSTOP)
        con = sqlite3.connect(db, timeout=1.0, isolation_level=None)
        try:
            con.execute("BEGIN EXCLUSIVE")
            con.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(driver.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            con.close()
    pytest.fail("the driver never paused outside a read or write of its store")


def test_a_second_hpo_driver_on_the_same_file_is_refused(tmp_path, ray_session, data_cache):
    """The first driver's trial is held (``held_add``) while the second starts: the first still
    holds the lease whatever the machine's speed. A third driver starts then too, finds no
    fragment, and waits just before the lease (``AT_THE_LEASE``) until the first has written the
    fragment and ended: holding the lease, it finds the fragment and tunes nothing (exit 2)."""
    path = _hpo_file(tmp_path, "twice", epochs=1)  # held from the start: one epoch is enough
    release = _held(tmp_path, hold_after=0)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    command = [sys.executable, "-m", "fusion_ray.hpo", str(path)]
    env = _env(ray_session, data_cache)
    first_err, third_err = tmp_path / "first.err", tmp_path / "third.err"
    arrived, go = tmp_path / "turns" / "arrived", tmp_path / "turns" / "go"
    first = _start(command, tmp_path, env, first_err)
    third = None
    try:
        wait_until_held(release, process_ended(first, first_err))
        third_command = [sys.executable, "-c", AT_THE_LEASE, str(arrived), str(go), str(path)]
        third = _start(third_command, tmp_path, env, third_err)  # starts while the second runs
        second = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        wait_until_held(release, process_ended(third, third_err), also=arrived.exists)
        release.touch()
        assert first.wait(timeout=600) == 0, first_err.read_text()[-3000:]
        go.touch()
        third_code = third.wait(timeout=300)
    finally:
        release.touch()
        for driver in (first, third):
            if driver is not None and driver.poll() is None:
                driver.kill()
    assert second.returncode == 3, second.stderr[-3000:]
    assert "HPO 'twice' is being run by another driver" in second.stderr
    assert "Traceback" not in second.stderr
    fragment = (tmp_path / "tuned" / "twice.yaml").read_text()
    runs = _trial_runs(client, "twice")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    assert any(r.info.run_id in fragment for r in runs)

    assert third_code == 2, third_err.read_text()[-3000:]
    text = third_err.read_text()
    assert "was written by another driver of HPO 'twice' after this command started" in text
    assert "nothing was run" in text and "Traceback" not in text
    assert {r.info.run_id for r in _trial_runs(client, "twice")} == {r.info.run_id for r in runs}
    parents = client.search_runs([runs[0].info.experiment_id], filter_string="tags.role != 'trial'")
    assert len(parents) == 1, "the third driver opened a parent run"
    assert (tmp_path / "tuned" / "twice.yaml").read_text() == fragment, "fragment rewritten"


def test_a_paused_hpo_driver_that_lost_its_lease_stops_and_writes_nothing_more(
    tmp_path, ray_session, data_cache
):
    """The first driver is paused while its first trial waits after its first epoch of two
    (``held_add``): none of its trials can have finished; the trials go on once the second
    driver starts, which it does once the paused driver's lease has had no heartbeat for longer
    than the TTL (1 s)."""
    path = _hpo_file(tmp_path, "paused_hpo", epochs=2)
    release = _held(tmp_path, hold_after=5)  # one epoch: 160 documents in batches of 32
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    command = [sys.executable, "-m", "fusion_ray.hpo", str(path)]
    # a heartbeat slower than the pause: the first driver learns of the takeover through the
    # fence before its writes
    env = _env(
        ray_session, data_cache, FUSION_RAY_LEASE_TTL_S="1", FUSION_RAY_LEASE_HEARTBEAT_S="600"
    )
    first_err = tmp_path / "first.err"
    first = _start(command, tmp_path, env, first_err)
    wait_until_held(release, process_ended(first, first_err))
    _pause_outside_the_store(first, tmp_path / "mlflow.db")
    try:
        wait_until_lapsed(f"sqlite:///{tmp_path / 'mlflow.db'}", "paused_hpo", ttl_s=1)
        release.touch()
        second = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "taking over the lease of HPO paused_hpo" in second.stderr
    fragment = (tmp_path / "tuned" / "paused_hpo.yaml").read_text()
    assert first.wait(timeout=300) == 4, first_err.read_text()[-3000:]
    first_text = first_err.read_text()
    assert "was taken over by another driver" in first_text and "Traceback" not in first_text

    runs = _trial_runs(client, "paused_hpo")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == 2, "the second driver's two trials, and none of the first's"
    tokens = {r.data.tags.get("lease_token") for r in finished}
    assert len(tokens) == 1 and None not in tokens, "every FINISHED run names the second driver"
    assert (tmp_path / "tuned" / "paused_hpo.yaml").read_text() == fragment, "fragment rewritten"
    assert any(r.info.run_id in fragment for r in finished)
    parent = client.get_run(finished[0].data.tags[PARENT_TAG])
    assert parent.info.status == "FINISHED", "the fenced driver changed the parent run"
