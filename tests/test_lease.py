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


def test_leases_of_different_sweeps_do_not_collide(client, store):
    with SweepLease(store, "a"), SweepLease(store, "b"):
        names = {m.name for m in client.search_registered_models()}
        assert {LEASE_PREFIX + "a", LEASE_PREFIX + "b"} <= names


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


def test_take_over_replaces_a_living_holder_and_the_old_one_notices(client, store):
    old = SweepLease(store, "s", heartbeat_s=0.2)
    old.acquire()
    try:
        with SweepLease(store, "s", take_over=True) as new:
            assert new.holder().token == new.token
            assert old.lost.wait(5), "the old holder's heartbeat did not notice the take-over"
    finally:
        old.release()


def test_the_heartbeat_refreshes_the_lease(client, store):
    with SweepLease(store, "s", heartbeat_s=0.2) as lease:
        first = lease.holder().heartbeat
        time.sleep(1.0)
        assert lease.holder().heartbeat > first
