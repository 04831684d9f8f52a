"""One driver per sweep: the lease in the tracking store (no Ray needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from fusion_ray.lease import LEASE_PREFIX, LeaseHeldError, SweepLease
from fusion_ray.tracking import LeaseStore


@pytest.fixture
def client(tmp_path):
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


@pytest.fixture
def store(client):
    return LeaseStore(client)


@pytest.mark.unit
def test_a_second_driver_is_refused_with_the_holder_named(client, store):
    with SweepLease(store, "s") as first:
        with pytest.raises(LeaseHeldError) as info:
            SweepLease(store, "s").acquire()
        message = str(info.value)
        assert f"pid {os.getpid()}" in message and "--take-over" in message
        assert first.holder().token == first.token
    # released: the next driver gets it
    with SweepLease(store, "s") as second:
        assert second.holder().token == second.token
    assert SweepLease(store, "s").holder() is None


@pytest.mark.unit
def test_leases_of_different_sweeps_do_not_collide(client, store):
    with SweepLease(store, "a"), SweepLease(store, "b"):
        names = {m.name for m in client.search_registered_models()}
        assert {LEASE_PREFIX + "a", LEASE_PREFIX + "b"} <= names


@pytest.mark.process
def test_a_lease_whose_holder_died_is_taken_over(client, store):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # this process has exited: its pid is not alive
    lease = SweepLease(store, "s")
    assert lease._create()
    client.set_registered_model_tag(lease.name, "pid", str(pid))
    with SweepLease(store, "s") as taker:
        assert taker.holder().token == taker.token


@pytest.mark.unit
def test_a_lease_without_heartbeat_expires_and_a_fresh_one_does_not(client, store):
    holder = SweepLease(store, "s", ttl_s=60)
    holder.acquire()
    try:
        with pytest.raises(LeaseHeldError):
            SweepLease(store, "s", ttl_s=60).acquire()
        client.set_registered_model_tag(holder.name, "heartbeat", repr(time.time() - 120))
        with SweepLease(store, "s", ttl_s=60) as taker:
            assert taker.holder().token == taker.token
            assert holder.holder().token != holder.token
    finally:
        holder._stop.set()


@pytest.mark.unit
def test_take_over_replaces_a_living_holder_and_the_old_one_notices(client, store):
    old = SweepLease(store, "s", heartbeat_s=0.2)
    old.acquire()
    try:
        with SweepLease(store, "s", take_over=True) as new:
            assert new.holder().token == new.token
            assert old.lost.wait(5), "the old holder's heartbeat did not notice the take-over"
    finally:
        old.release()


@pytest.mark.unit
def test_the_heartbeat_refreshes_the_lease(client, store):
    with SweepLease(store, "s", heartbeat_s=0.2) as lease:
        first = lease.holder().heartbeat
        deadline = time.monotonic() + 60  # a deadline, not a guess at how soon it beats
        while lease.holder().heartbeat <= first:
            assert time.monotonic() < deadline, "no heartbeat in 60 s"
            time.sleep(0.1)


RACER = """
import sys, time
from fusion_ray.lease import LeaseHeldError, SweepLease
from fusion_ray.tracking import Tracker

from pathlib import Path

uri, name, ready, go, delay = sys.argv[1:6]
tracker = Tracker(uri, "race")
lease = SweepLease(tracker.lease_store(), name)
Path(ready).touch()  # imported: the test starts the race once both racers are ready
while not Path(go).exists():
    time.sleep(0.001)
time.sleep(float(delay))
try:
    lease.acquire()
except LeaseHeldError:
    print("held", flush=True)
else:
    got = time.time()
    time.sleep(2.0)
    print("got", got, time.time(), flush=True)  # held from .. to (before the release)
    lease.release()
"""


@pytest.mark.process
def test_two_drivers_started_within_50_ms_never_both_hold_the_lease(tmp_path):
    """Twenty times, two processes ask for one sweep's lease at nearly the same moment (the
    second up to 50 ms later): never do both hold it at once (the second may get it only after
    the first released it, when the store made it wait that long)."""
    import random

    from fusion_ray.tracking import Tracker
    from tests.conftest import ROOT

    uri = f"sqlite:///{tmp_path / 'race.db'}"
    Tracker(uri, "race")  # the store exists before the race, as a sweep's does
    rng = random.Random(0)
    outcomes = []
    for round_ in range(20):
        turns = tmp_path / f"round{round_}"
        turns.mkdir()
        ready = [turns / "ready0", turns / "ready1"]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    RACER,
                    uri,
                    f"sweep{round_}",
                    str(ready[i]),
                    str(turns / "go"),
                    str(delay),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, delay in enumerate((0.0, rng.uniform(0.0, 0.05)))
        ]
        # both interpreters have imported MLflow, however long that took: start the race
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, round_
            time.sleep(0.05)
        (turns / "go").touch()
        results = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
        held = [tuple(map(float, out.split()[1:])) for out, _ in results if out.startswith("got")]
        assert held, "nobody got the lease"
        if len(held) == 2:
            (a_from, a_to), (b_from, b_to) = sorted(held)
            assert b_from >= a_to, f"round {round_}: both held the lease at once: {held}"
        outcomes.append(len(held))
    assert outcomes.count(1) >= 10, f"too few contended rounds to say anything: {outcomes}"


@pytest.mark.unit
def test_a_driver_whose_experiment_another_created_meanwhile_uses_that_one(tmp_path):
    """Two drivers of one new sweep both read "no experiment" and both create it: the store
    refuses the second (RESOURCE_ALREADY_EXISTS, an IntegrityError on PostgreSQL); that driver
    takes the experiment the first made, and goes on to ask for the lease, instead of dying."""
    from fusion_ray.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    late = Tracker(uri, "other")  # a driver of another sweep, to reach the store with
    theirs = MlflowClient(uri).create_experiment("shared")  # the first driver's, made meanwhile
    assert late._create_experiment("shared", uri) == theirs
    assert Tracker(uri, "shared").experiment_id == theirs
    with pytest.raises(Exception, match="RESOURCE_ALREADY_EXISTS|already exists"):
        late.client.create_experiment("shared")  # what the driver used to die of
