"""Trials no node can hold are an error before Tune starts (never an endless wait); trials only a
node type of the autoscaler can hold wait with one line and give up after a set time. (--smoke on
a Ray without GPUs rehearses GPU trials on CPUs: test_smoke_sweeps.py runs the shipped files that
ask for GPUs that way.)"""

from __future__ import annotations

import pytest
import yaml
from mlflow import MlflowClient

from fusion_ray.config import Resources, load_sweep
from fusion_ray.driver.placement import (
    Capacity,
    PlacementError,
    autoscaler_node_types,
    check_placement,
    placeable,
    trial_bundles,
)
from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.ray

GPU = Resources(workers=1, use_gpu=True, gpus_per_worker=1, cpus_per_worker=1)
DDP = Resources(workers=4, use_gpu=True, gpus_per_worker=1, cpus_per_worker=8)


def test_a_trial_asks_one_bundle_or_a_token_and_one_per_worker():
    assert trial_bundles(Resources(cpus_per_worker=2)) == [{"CPU": 2.0}]
    bundles = trial_bundles(DDP.model_copy(update={"driver_resource": "fusion_ray_driver"}))
    assert bundles[0] == {"memory": 1024.0, "fusion_ray_driver": 1.0}
    assert bundles[1:] == [{"CPU": 8.0, "GPU": 1.0}] * 4


def test_bundles_fit_per_node_and_may_spread_over_nodes():
    laptop = [{"CPU": 2.0, "memory": 8e9}]
    assert placeable(trial_bundles(Resources(cpus_per_worker=2)), laptop)
    assert not placeable(trial_bundles(Resources(cpus_per_worker=3)), laptop)
    assert not placeable(trial_bundles(GPU), laptop)
    two_gpu_nodes = [{"CPU": 16.0, "GPU": 2.0, "memory": 1e10}] * 2
    assert placeable(trial_bundles(DDP), two_gpu_nodes)  # 2 + 2 workers
    assert not placeable(trial_bundles(DDP), two_gpu_nodes[:1])


def test_the_check_separates_never_from_after_the_autoscaler(tmp_path):
    config = tmp_path / "bootstrap.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "max_workers": 4,
                "available_node_types": {
                    "head": {"resources": {"CPU": 8}, "max_workers": 0},
                    "gpu_1x": {"resources": {"CPU": 8, "GPU": 1}, "max_workers": 2},
                },
            }
        )
    )
    types = autoscaler_node_types(str(config))
    assert set(types) == {"gpu_1x"}
    capacity = Capacity([{"CPU": 8.0}], types)
    check = check_placement({"agnews": GPU, "arxiv": DDP}, capacity)
    assert set(check.later) == {"agnews"}  # a gpu_1x node will hold it
    assert set(check.never) == {"arxiv"}  # 4 GPUs x 8 CPUs: at most 2 gpu_1x nodes of 1 GPU
    message = check.error(capacity)
    for needle in ("arxiv", "4 worker(s) x (8 CPU + 1 GPU)", "8 CPUs and 0 GPUs", "ray up"):
        assert needle in message
    assert "FUSION_RAY_CPU_FALLBACK=1" in message


def _gpu_sweep(tmp_path, name, store):
    path = tiny_sweep(tmp_path, name=name, seeds=[0], tracking_uri=store())
    raw = yaml.safe_load(path.read_text())
    raw["resources"] = {"workers": 1, "use_gpu": True, "gpus_per_worker": 1, "cpus_per_worker": 1}
    raw["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(raw))
    return load_sweep(path)


def test_a_gpu_sweep_on_a_ray_without_gpus_fails_before_any_trial(
    tmp_path, ray_session, data_cache, mlflow_store, monkeypatch
):
    from fusion_ray.driver.runner import run_sweep
    from fusion_ray.driver.tracking import Tracker

    monkeypatch.delenv("FUSION_RAY_CPU_FALLBACK", raising=False)
    spec = _gpu_sweep(tmp_path, "gpu_here", mlflow_store)
    with pytest.raises(PlacementError) as info:
        run_sweep(spec)
    assert "short: each trial asks 1 worker(s) x (1 CPU + 1 GPU)" in str(info.value)
    assert "0 GPUs" in str(info.value) and "--smoke" in str(info.value)
    assert Tracker(spec.tracking_uri, spec.name).trial_runs() == []  # nothing was started
    # and nothing was left in the store: no empty experiment for the refused sweep
    assert MlflowClient(spec.tracking_uri).get_experiment_by_name(spec.name) is None
    # the fix it names works: the same sweep with its GPU trials rehearsed on CPUs
    monkeypatch.setenv("FUSION_RAY_CPU_FALLBACK", "1")
    outcome = run_sweep(spec)
    assert len(outcome.finished) == 2 and not outcome.failed
    parents = MlflowClient(spec.tracking_uri).search_runs(
        [MlflowClient(spec.tracking_uri).get_experiment_by_name(spec.name).experiment_id],
        filter_string="tags.role = 'sweep'",
    )
    assert parents[0].data.tags.get("smoke_gpu_trials_on_cpu") == "true"


def test_waiting_for_a_node_type_gives_up_after_the_timeout(
    tmp_path, ray_session, data_cache, mlflow_store, monkeypatch, capsys
):
    from fusion_ray.driver.runner import run_sweep

    config = tmp_path / "bootstrap.yaml"
    config.write_text(
        yaml.safe_dump({"available_node_types": {"gpu": {"resources": {"CPU": 4, "GPU": 1}}}})
    )
    monkeypatch.setenv("FUSION_RAY_AUTOSCALER_CONFIG", str(config))
    monkeypatch.setenv("FUSION_RAY_PLACEMENT_TIMEOUT_S", "1")
    spec = _gpu_sweep(tmp_path, "gpu_wait", mlflow_store)
    with pytest.raises(Exception, match="no trial could be placed for 1 s"):
        run_sweep(spec)
    assert "waiting for the autoscaler to add a node for short" in capsys.readouterr().out


def test_an_hpo_whose_trials_fit_no_node_fails_before_any_trial(
    tmp_path, ray_session, monkeypatch, capsys
):
    """The HPO command checks placement too: trials asking more CPUs than any node has are an
    error before any run is created."""
    from fusion_ray.hpo.cli import main as hpo_main

    quick = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    quick["sweeps"] = [str(ROOT / "sweeps" / "quickstart.yaml")]
    quick["output"] = "tuned.yaml"
    quick["resources"] = {"workers": 1, "cpus_per_worker": 64}
    quick["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    quick["storage_path"] = str(tmp_path / "ray_results")
    path = tmp_path / "hpo.yaml"
    path.write_text(yaml.safe_dump(quick))
    monkeypatch.setenv("RAY_ADDRESS", ray_session.get_runtime_context().gcs_address)
    assert hpo_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "no node of this Ray cluster can run these trials" in err
    assert "short: each trial asks 1 worker(s) x (64 CPU)" in err
    assert not (tmp_path / "mlflow.db").exists()  # nothing was created


def test_a_dry_run_checks_placement_against_the_cluster_it_names(
    tmp_path, ray_session, monkeypatch
):
    """--address (or the file's address:, or $RAY_ADDRESS) is the cluster the dry run checks:
    joined for the question (here the session's Ray, 2 CPUs); trials it cannot hold are a warning
    after the plan, naming that cluster; an address where nothing answers is a warning too."""
    from fusion_ray import api

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    address = ray_session.get_runtime_context().gcs_address
    fits = load_sweep(tiny_sweep(tmp_path, tracking_uri=f"sqlite:///{tmp_path / 'a.db'}"))
    text = api.dry_run_text(fits, address=address)
    assert f"placement: every trial fits the cluster at {address}" in text
    big = load_sweep(
        tiny_sweep(
            tmp_path,
            tracking_uri=f"sqlite:///{tmp_path / 'b.db'}",
            resources={"workers": 1, "cpus_per_worker": 64},
        )
    )
    text = api.dry_run_text(big, address=address)
    assert f"WARNING: the cluster at {address} cannot run these trials" in text
    assert "short: each trial asks 1 worker(s) x (64 CPU)" in text
    assert "cells" in text.split("placement:")[0]  # the plan comes first, in full
    assert not (tmp_path / "b.db").exists()  # a dry run writes nothing
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    text = api.dry_run_text(fits, address=f"127.0.0.1:{closed}")
    assert f"WARNING: not checked: no Ray head answers at 127.0.0.1:{closed}" in text
