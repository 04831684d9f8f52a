"""The sweep driver killed mid-sweep, then the same command again: only the missing cells run,
an interrupted trial continues from its checkpoint in its own run, and no cell gets two runs."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, tiny_sweep
from tests.helpers import (
    install_held_add,
    process_ended,
    wait_until_held,
    wait_until_lapsed,
)

pytestmark = pytest.mark.process


@pytest.fixture(autouse=True)
def _store(tmp_path, mlflow_store) -> None:
    """Each test's sweep logs into a new sqlite store at the tiny sweep's ``mlflow.db``, a copy
    of the session's migrated one (a driver migrating a new file takes seconds)."""
    mlflow_store(tmp_path / "mlflow.db")


def _snapshot(client: MlflowClient, name: str) -> dict[str, dict]:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    return {
        r.info.run_id: {
            "cell": r.data.tags["cell_id"],
            "status": r.info.status,
            "ckpt": r.data.tags.get("checkpoint_path"),
        }
        for r in runs
    }


def _one_at_a_time(tmp_path, name: str, seed_list: list[int], epochs: int = 2, **raw_changes):
    """A tiny sweep running one trial at a time, ``epochs`` long, with top-level changes (which
    may replace ``seeds`` with an adaptive block)."""
    path = tiny_sweep(
        tmp_path,
        name=name,
        seeds=seed_list,
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
    )
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = epochs
    for key, value in raw_changes.items():
        raw[key] = value
    path.write_text(yaml.safe_dump(raw))
    return path


def _driver_env(ray_session, data_cache: str, **extra: str) -> dict[str, str]:
    """A driver subprocess's environment: the test session's Ray and data cache, this checkout."""
    return {
        **os.environ,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "FUSION_RAY_CACHE": data_cache,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _read_within(seconds: float, read):
    """``read()``, or None when it fails or takes longer than ``seconds``: the driver, stopped
    inside a write, holds the store locked until it goes on. Bounded, so the driver is never
    stopped long enough for its own waits on the store (20 s) to run out."""
    box: list = []

    def run() -> None:
        try:
            box.append(read())
        except Exception:
            box.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else None


def _store_is_free(db: Path) -> bool:
    """Whether no other connection holds a lock on the sqlite store: a driver stopped inside a
    read or a write would keep every other writer out until it goes on."""
    con = sqlite3.connect(db, timeout=1.0, isolation_level=None)
    try:
        con.execute("BEGIN EXCLUSIVE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def _stopped_when(
    driver: subprocess.Popen,
    client: MlflowClient,
    name: str,
    wanted,
    group: bool,
    free: Path | None = None,
):
    """Poll the tracking store until ``wanted(snapshot)``, then stop the driver (SIGSTOP; its
    process group with ``group``) and look again: a stopped driver writes nothing and its trials
    wait for it at their next report, so a state seen then stays until the test acts. Returns
    that snapshot, the driver stopped; continues the driver and polls again when the state had
    moved on (or the store was mid-write: see _read_within) by the time it stopped. No race
    with the clock. With ``free`` (the sqlite store), the driver is stopped only where it holds
    no lock on the store, so another driver can write while it stays stopped."""
    stop = (lambda sig: os.killpg(driver.pid, sig)) if group else driver.send_signal
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if wanted(_snapshot(client, name)):
            stop(signal.SIGSTOP)
            seen = _read_within(3.0, lambda: _snapshot(client, name))
            if seen is not None and wanted(seen) and (free is None or _store_is_free(free)):
                return seen
            stop(signal.SIGCONT)
        assert driver.poll() is None, "the sweep ended before the state the test waits for"
        time.sleep(0.2)
    pytest.fail("the sweep never reached the state the test waits for")


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed_seeds", "adaptive_seeds"])
def test_killed_driver_then_rerun_finishes_only_the_missing_cells(
    tmp_path, ray_session, data_cache, adaptive
):
    """The driver is killed (SIGKILL, with its process group) with two cells FINISHED and the
    third checkpointed midway (after the first of its two epochs); the rerun finishes only the
    missing cells, the interrupted one in its own run from its checkpoint, and each cell has
    exactly one run.

    Nothing races the clock: the first two trials (``held_add``, ``through=2``) run through; the
    third waits after its first epoch (5 steps) until the test lets it go, after the kill.
    Adaptive: two entries that build the same model, so every paired delta is 0 and the e-value
    stays 1: with a cap of 7 the comparison is futile at seed 2 (4 seeds left can at most
    multiply it by 16 < 20): 3 seeds x 2 cells, whichever driver decides it; the lease of the
    killed driver is taken over by the second."""
    fusions = ["held_add", {"name": "held_add", "tag": "twin"}] if adaptive else ["held_add"]
    changes = {"seeds": {"adaptive": True, "first": 2, "max": 7}} if adaptive else {}
    name = "killed_adaptive" if adaptive else "killed"
    path = _one_at_a_time(
        tmp_path, name, [0, 1, 2], grid={"datasets": ["short"], "fusions": fusions}, **changes
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, hold_after=5, through=2)
    spec = SimpleNamespace(name=name)  # held_add is the driver's plug-in, not this process's
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env = _driver_env(ray_session, data_cache)
    command = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]
    log = tmp_path / "driver.out"
    with log.open("w") as out:
        driver = subprocess.Popen(
            command, cwd=tmp_path, env=env, start_new_session=True, stdout=out, stderr=out
        )

    def two_finished_and_one_midway() -> bool:
        runs = _snapshot(client, spec.name).values()
        finished = [r for r in runs if r["status"] == "FINISHED"]
        midway = [r for r in runs if r["status"] == "RUNNING" and r["ckpt"]]
        return len(finished) == 2 and len(midway) == 1

    wait_until_held(release, process_ended(driver, log), also=two_finished_and_one_midway)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = _snapshot(client, spec.name)
    finished_before = {rid for rid, r in before.items() if r["status"] == "FINISHED"}
    interrupted = {rid for rid, r in before.items() if r["status"] == "RUNNING" and r["ckpt"]}
    assert len(finished_before) == 2 and len(interrupted) == 1, before

    release.touch()  # the rerun's trials run through
    rerun = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

    after = _snapshot(client, spec.name)
    cells = [r["cell"] for r in after.values()]
    n_cells = 6 if adaptive else 3
    assert len(cells) == n_cells and len(set(cells)) == n_cells, "exactly one run per cell"
    assert all(r["status"] == "FINISHED" for r in after.values())
    assert finished_before <= set(after), "finished cells were not re-run"
    for rid in interrupted:  # continued in its own run, from its checkpoint
        assert rid in after
        steps = [m.step for m in client.get_metric_history(rid, "val_acc")]
        assert sorted(steps) == [0, 1], f"epochs logged twice or missing: {steps}"


def test_a_paused_driver_that_lost_its_lease_stops_and_finishes_no_cell(
    tmp_path, ray_session, data_cache
):
    """The driver paused (SIGSTOP) past the lease's TTL while a trial trains; a second driver
    takes the lease over and runs the sweep; the first, resumed, must stop at once, mark nothing
    FINISHED and exit 4 saying another driver took over: one FINISHED run per cell.

    Nothing races the clock: every trial (``held_add``, ``through=0``) waits after its first
    epoch, checkpointed, until the test lets them go, which it does before the second driver
    starts; no cell can finish before the pause. The second driver starts once the paused one's
    lease has had no heartbeat for longer than the TTL (1 s), read from the store."""
    path = _one_at_a_time(
        tmp_path, "paused", [0, 1, 2, 3], grid={"datasets": ["short"], "fusions": ["held_add"]}
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, hold_after=5, through=0)
    spec = SimpleNamespace(name="paused")  # held_add is the driver's plug-in, not this process's
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    # A heartbeat slower than the pause: the first driver learns of the takeover only through
    # the fence before its writes, which is what this test is about.
    env = _driver_env(
        ray_session, data_cache, FUSION_RAY_LEASE_TTL_S="1", FUSION_RAY_LEASE_HEARTBEAT_S="600"
    )
    command = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]
    first_err = tmp_path / "first.err"
    with first_err.open("w") as err:
        first = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    # paused while its first trial waits, checkpointed (no cell can finish: every FINISHED run
    # must be the second driver's), and outside any read or write of the sqlite store (a
    # driver paused inside one would lock the second out: exit 9, not what this tests)
    _stopped_when(
        first,
        client,
        spec.name,
        lambda runs: (
            bool(list(release.parent.glob("waiting-*")))
            and any(r["status"] == "RUNNING" and r["ckpt"] for r in runs.values())
        ),
        group=False,
        free=tmp_path / "mlflow.db",
    )
    try:
        wait_until_lapsed(f"sqlite:///{tmp_path / 'mlflow.db'}", spec.name, ttl_s=1)
        release.touch()  # the second driver's trials run through
        second = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "taking over the lease of sweep paused" in second.stderr
    assert first.wait(timeout=300) == 4
    assert "was taken over by another driver" in first_err.read_text()

    after = _snapshot(client, spec.name)
    finished = [r["cell"] for r in after.values() if r["status"] == "FINISHED"]
    assert len(finished) == 4 and len(set(finished)) == 4, "exactly one FINISHED run per cell"
    assert len(after) == 4, "a cell has a second run"
    tokens = {
        client.get_run(rid).data.tags.get("lease_token")
        for rid, r in after.items()
        if r["status"] == "FINISHED"
    }
    assert len(tokens) == 1 and None not in tokens, "every FINISHED run names the second driver"


def test_the_tracking_store_vanishing_mid_sweep_is_one_clear_message(
    tmp_path, ray_session, data_cache
):
    """The sqlite store deleted while the sweep runs: the driver stops with one message saying
    what happened, what is safe and how to recover (exit 5), and storage keeps the checkpoints.

    Nothing races the clock: the trials after the first (``held_add``) wait until the store is
    gone, so the driver always meets the missing store mid-sweep."""
    path = _one_at_a_time(
        tmp_path, "vanish", [0, 1, 2], grid={"datasets": ["short"], "fusions": ["held_add"]}
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release)  # the driver's working directory
    spec = SimpleNamespace(name="vanish")  # held_add is the driver's plug-in, not this process's
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env = _driver_env(ray_session, data_cache)
    err_file = tmp_path / "driver.err"
    with err_file.open("w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    wait_until_held(  # the first cell FINISHED, the next trial waiting
        release,
        process_ended(driver, err_file),
        also=lambda: any(r["status"] == "FINISHED" for r in _snapshot(client, spec.name).values()),
    )
    (tmp_path / "mlflow.db").unlink()
    release.touch()  # the waiting trials go on and report to a driver whose store is gone
    assert driver.wait(timeout=300) == 5
    err = err_file.read_text()
    assert f"the tracking store {tmp_path / 'mlflow.db'} disappeared while the sweep ran" in err
    assert "remain under storage_path" in err and "run the same command again" in err
    assert len(err) < 20_000, f"{len(err)} characters of error output"
    assert "Traceback" not in err
    assert list((tmp_path / "ray_results").rglob("checkpoint_*")), "storage was left as it was"


def _alive_trial_actors(ray_session) -> dict[str, str]:
    """Actor id -> class name of the session Ray's live Tune trial / Ray Train actors (GCS)."""
    kinds = ("ImplicitFunc", "RayTrainWorker", "TrainController")
    return {
        actor_id: a["ActorClassName"]
        for actor_id, a in ray_session._private.state.actors().items()
        if a["State"] == "ALIVE" and any(k in a["ActorClassName"] for k in kinds)
    }


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT", "SIGINT")], ids="+".join)
def test_a_driver_stopped_by_a_signal_marks_its_runs_killed_and_a_rerun_resumes(
    tmp_path, ray_session, data_cache, signals
):
    """SIGTERM (a scheduler's or ``ray down``'s stop) or Ctrl+C twice, while one cell has
    finished and another trains: the driver exits 128 + signal with one message, its parent
    run and the training cell's run are KILLED, no trial keeps running, and the same command
    again finishes the rest, the interrupted cell from its checkpoint in its own run.

    Nothing races the clock: the second cell (``held_add``) waits after the first of its two
    epochs (5 steps: 160 documents in batches of 32), checkpointed, until the test lets it go,
    which it does only for the re-run."""
    name = f"stopped_{signals[0].lower()}"
    path = _one_at_a_time(
        tmp_path, name, [0, 1], grid={"datasets": ["short"], "fusions": ["held_add"]}
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, hold_after=5)  # the driver's working directory
    spec = SimpleNamespace(name=name)  # held_add is the driver's plug-in, not this process's
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env = _driver_env(ray_session, data_cache)
    command = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]
    earlier = set(_alive_trial_actors(ray_session))  # other tests' actors in the shared Ray
    err = tmp_path / "driver.err"
    with err.open("w") as out:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=out)

    wait_until_held(  # one cell FINISHED; the other checkpointed and held
        release,
        process_ended(driver, err),
        also=lambda: (
            sorted((r["status"], bool(r["ckpt"])) for r in _snapshot(client, spec.name).values())
            == [("FINISHED", True), ("RUNNING", True)]
        ),
    )
    for i, name_ in enumerate(signals):
        if i:  # the second once the driver has said it stops for the first
            deadline = time.monotonic() + 60
            while f"{signals[0]}: stopping the trials" not in err.read_text():
                assert driver.poll() is None, err.read_text()[-4000:]
                assert time.monotonic() < deadline, "the first signal was not said"
                time.sleep(0.05)
        driver.send_signal(getattr(signal, name_))
    code = driver.wait(timeout=120)
    text = err.read_text()
    assert code == 128 + getattr(signal, signals[0]), text[-4000:]
    assert f"stopped by {signals[0]}" in text and "Re-run the same command" in text
    assert "Traceback" not in text

    stopped = _snapshot(client, spec.name)
    assert sorted(r["status"] for r in stopped.values()) == ["FINISHED", "KILLED"]
    (parent,) = client.search_runs(
        [client.get_experiment_by_name(spec.name).experiment_id], "tags.role = 'sweep'"
    )
    assert parent.info.status == "KILLED"
    assert signals[0] in parent.data.tags["failure_reason"]

    def left_running() -> list[str]:
        return [c for a, c in _alive_trial_actors(ray_session).items() if a not in earlier]

    deadline = time.monotonic() + 60
    while left_running() and time.monotonic() < deadline:
        time.sleep(1)
    assert left_running() == [], "a trial kept running after its driver stopped"

    release.touch()
    rerun = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    after = _snapshot(client, spec.name)
    cells = [r["cell"] for r in after.values()]
    assert len(cells) == 2 and len(set(cells)) == 2, "exactly one run per cell"
    assert all(r["status"] == "FINISHED" for r in after.values())
    (killed,) = [rid for rid, r in stopped.items() if r["status"] == "KILLED"]
    steps = sorted(m.step for m in client.get_metric_history(killed, "val_acc"))
    assert steps == [0, 1], f"the interrupted cell did not continue in its own run: {steps}"


LOCKED_AFTER_A_RESULT_S = 2.0
"""How long the locked-store test keeps the store locked after a trial has handed the driver a
result to write: the driver then waits on the lock (MLflow's wait is 20 s)."""


def test_a_tracking_store_locked_mid_sweep_loses_nothing(tmp_path, ray_session, data_cache):
    """Another writer holds the MLflow sqlite file locked (an exclusive transaction) while a
    trial reports to the driver: the driver waits for it (MLflow's sqlite busy timeout is 20 s),
    and the sweep ends with one FINISHED run per cell, each with its final metrics.

    Nothing races the clock: the trials after the first (``held_add``) wait until the store is
    locked; the lock is held until the next trial has checkpointed its first epoch (its result
    is then the driver's to write, and the trial waits for the driver to take it), then
    ``LOCKED_AFTER_A_RESULT_S`` more: the driver waits on the lock a few seconds, far less than
    MLflow's wait, however slow the machine."""
    import sqlite3

    path = _one_at_a_time(
        tmp_path, "locked", [0, 1, 2, 3], grid={"datasets": ["short"], "fusions": ["held_add"]}
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release)  # the driver's working directory
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env = _driver_env(ray_session, data_cache)
    command = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]
    out = tmp_path / "driver.out"
    with out.open("w") as sink:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=sink, stderr=sink)
    wait_until_held(release, process_ended(driver, out), also=lambda: "[1/4]" in out.read_text())
    lock = sqlite3.connect(tmp_path / "mlflow.db", timeout=60, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        release.touch()  # the other trials go on while the store is locked

        def checkpointed_trials() -> int:
            return len(
                {p.parent for p in (tmp_path / "ray_results").glob("locked-*/*/checkpoint_*")}
            )

        deadline = time.monotonic() + 300
        while checkpointed_trials() < 2:  # the first cell's trial, and the next one's first epoch
            assert driver.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, "no trial checkpointed while the store was locked"
            time.sleep(0.1)
        time.sleep(LOCKED_AFTER_A_RESULT_S)
        # one progress line per ended trial: "[N/M] held_add seed S | short/...: ..."
        finished_while_locked = len(re.findall(r"^\[\d+/\d+\] ", out.read_text(), re.M))
    finally:
        lock.execute("COMMIT")
        lock.close()
    assert driver.wait(timeout=300) == 0, out.read_text()[-3000:]
    assert finished_while_locked == 1, "a run was marked FINISHED through the lock"

    runs = client.search_runs(
        [client.get_experiment_by_name("locked").experiment_id], "tags.role = 'trial'"
    )
    assert len({r.data.tags["cell_id"] for r in runs}) == len(runs) == 4
    assert all(r.info.status == "FINISHED" and "test_acc" in r.data.metrics for r in runs)
