"""One driver per sweep: the lease in the tracking store (no Ray needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from fusion_ray.driver.lease import LEASE_PREFIX, LeaseHeldError, SweepLease
from fusion_ray.driver.tracking import LeaseStore


@pytest.fixture
def client(mlflow_store):
    return MlflowClient(tracking_uri=mlflow_store())


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
from pathlib import Path

from fusion_ray.driver.lease import LeaseHeldError, SweepLease
from fusion_ray.driver.tracking import Tracker

uri, turns, me, delays = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
other = "1" if me == "0" else "0"
tracker = Tracker(uri, "race")


def wait_for(path):
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"racer {me}: no {path.name} in 120 s")
        time.sleep(0.001)


for round_, delay in enumerate(map(float, delays.split(","))):
    lease = SweepLease(tracker.lease_store(), f"sweep{round_}")
    (turns / f"ready{round_}-{me}").touch()  # the test starts a round once both are ready
    wait_for(turns / f"go{round_}")
    time.sleep(delay)
    try:
        lease.acquire()
    except LeaseHeldError:
        (turns / f"tried{round_}-{me}").touch()
        print(round_, "held", flush=True)
        continue
    got = time.time()
    (turns / f"tried{round_}-{me}").touch()
    wait_for(turns / f"tried{round_}-{other}")  # held until the other has asked for it
    print(round_, "got", got, time.time(), flush=True)  # held from .. to (before the release)
    lease.release()
"""
"""``python -c RACER URI TURNS ME DELAYS``: one of two drivers that ask for the lease of sweep
``sweepN`` in round N, each round once the test has created TURNS/goN, after that round's delay
(DELAYS: comma-separated seconds); one that got the lease holds it until the other has asked."""


@pytest.mark.process
def test_two_drivers_started_within_50_ms_never_both_hold_the_lease(tmp_path):
    """Twenty times, two processes ask for one sweep's lease at nearly the same moment (the
    second up to 50 ms later): never do both hold it at once. A racer that got the lease holds
    it until the other has asked (a file the other creates), so every round is contended: the
    second asks while the first holds it, however slow the machine."""
    import random

    from fusion_ray.driver.tracking import Tracker
    from tests.conftest import ROOT

    uri = f"sqlite:///{tmp_path / 'race.db'}"
    Tracker(uri, "race")  # the store exists before the race, as a sweep's does
    rng = random.Random(0)
    rounds = 20
    delays = [[0.0] * rounds, [rng.uniform(0.0, 0.05) for _ in range(rounds)]]
    turns = tmp_path / "turns"
    turns.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, uri, str(turns), str(i), ",".join(map(str, delays[i]))],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    try:
        for round_ in range(rounds):
            # both racers are at the start of the round (imported MLflow, done with the last
            # round), however long that took: start the race
            ready = [turns / f"ready{round_}-{i}" for i in (0, 1)]
            deadline = time.monotonic() + 120
            while not all(r.exists() for r in ready):
                assert all(p.poll() is None for p in procs), [
                    p.stderr.read()[-2000:] for p in procs
                ]
                assert time.monotonic() < deadline, f"round {round_}: a racer is not ready"
                time.sleep(0.01)
            (turns / f"go{round_}").touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    outcomes = []
    lines = [line.split() for out, _ in results for line in out.splitlines()]
    for round_ in range(rounds):
        said = [words[1:] for words in lines if words[0] == str(round_)]
        assert len(said) == 2, f"round {round_}: {said}"
        held = [tuple(map(float, words[1:])) for words in said if words[0] == "got"]
        assert held, f"round {round_}: nobody got the lease"
        if len(held) == 2:
            (a_from, a_to), (b_from, b_to) = sorted(held)
            assert b_from >= a_to, f"round {round_}: both held the lease at once: {held}"
        outcomes.append(len(held))
    assert outcomes == [1] * rounds, f"a round where both got the lease: {outcomes}"


@pytest.mark.unit
def test_a_driver_whose_experiment_another_created_meanwhile_uses_that_one(mlflow_store):
    """Two drivers of one new sweep both read "no experiment" and both create it: the store
    refuses the second (RESOURCE_ALREADY_EXISTS, an IntegrityError on PostgreSQL); that driver
    takes the experiment the first made, and goes on to ask for the lease, instead of dying."""
    from fusion_ray.driver.tracking import Tracker

    uri = mlflow_store()
    late = Tracker(uri, "other")  # a driver of another sweep, to reach the store with
    theirs = MlflowClient(uri).create_experiment("shared")  # the first driver's, made meanwhile
    assert late._create_experiment("shared", uri) == theirs
    assert Tracker(uri, "shared").experiment_id == theirs
    with pytest.raises(Exception, match="RESOURCE_ALREADY_EXISTS|already exists"):
        late.client.create_experiment("shared")  # what the driver used to die of
