"""A dry run in a fresh interpreter joins the cluster $RAY_ADDRESS names for its placement
check and leaves it: the plan, then the line naming that cluster, exit 0, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.process


def test_a_dry_run_joins_the_named_cluster_for_its_placement_check(tmp_path, ray_session):
    address = ray_session.get_runtime_context().gcs_address
    path = tiny_sweep(
        tmp_path,
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        resources={"workers": 1, "cpus_per_worker": 64},
    )
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"WARNING: the cluster at {address} cannot run these trials" in done.stdout
    assert "short: each trial asks 1 worker(s) x (64 CPU); the largest node has 2 CPUs" in (
        done.stdout
    )
    assert not (tmp_path / "mlflow.db").exists()
    # the session's Ray still runs: the dry run left it without stopping it
    assert ray_session.is_initialized() and ray_session.cluster_resources().get("CPU") == 2
