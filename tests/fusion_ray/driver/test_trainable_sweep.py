"""A trainable's sweep (``trainable: NAME``) run by the driver on Ray, as the study's sweeps are:
one MLflow run per cell with the compared level as a tag and the trainable's own metrics, a
second invocation that runs nothing, a metric the trainable does not return failing every
cell with the fix, and the report's generic parts. The trainable is the built-in ``study``
(its encoder on synthetic documents, seconds a trial), declared in the entry-point group like
any plug-in, so the Ray workers find it as they would a user's."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from fusion_ray.train.trainable import EXAMPLE

pytestmark = pytest.mark.ray


def _write(tmp_path, tracking_uri, **overrides):
    defaults = copy.deepcopy(EXAMPLE)
    defaults["train"]["epochs"] = 2
    raw = {
        "name": "trainable_study",
        "trainable": "study",
        "defaults": defaults,
        "grid": {"model.fusion": ["add", "gate_scalar"]},
        "seeds": [0, 1],
        "resources": {"cpus_per_worker": 1, "max_concurrent_trials": 2},
        "storage_path": str(tmp_path / "ray_results"),
        "tracking_uri": tracking_uri,
        "retries": 0,
    } | overrides
    path = tmp_path / "trainable.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _trial_runs(spec):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    return client, runs


def test_a_trainable_sweep_runs_each_cell_once_tracked_and_reported(
    tmp_path, ray_session, mlflow_store, data_cache
):
    from fusion_ray import api

    spec = api.load(_write(tmp_path, mlflow_store()))
    outcome = api.run(spec)
    assert len(outcome.finished) == 4 and not outcome.failed
    client, runs = _trial_runs(spec)
    assert sorted(r.data.tags["axis.model.fusion"] for r in runs) == [
        "add", "add", "gate_scalar", "gate_scalar",
    ]  # fmt: skip
    for run in runs:
        assert run.info.status == "FINISHED"
        assert json.loads(run.data.tags["metrics_returned"])[0] == "test_acc"
        assert 0.0 <= run.data.metrics["test_acc"] <= 1.0
        assert run.data.tags["trainable"] == "study"
        # the loop's per-epoch reports, logged at their epoch
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")]
        assert sorted(steps)[-2:] == [0, 1], steps
    again = api.run(spec)  # every cell FINISHED: a second invocation runs nothing
    assert again.already_finished == 4 and again.ran == 0
    assert len(_trial_runs(spec)[1]) == 4

    report = api.report(spec, tmp_path / "report")
    assert list(report.paired["comparison"]) == ["model.fusion=gate_scalar vs model.fusion=add"]
    assert int(report.paired["n_seeds"].iloc[0]) == 2
    assert report.decisions is None  # fixed seeds: Holm on the paired p-values decides
    for name in ("report.md", "report.html", "tables/paired.md", "tables/paired.tex"):
        assert (tmp_path / "report" / name).is_file(), name
    text = (tmp_path / "report" / "report.md").read_text()
    assert "study: model.fusion against add" in text and "test_acc" in text


def test_a_metric_the_trainable_does_not_return_fails_each_cell_with_the_fix(
    tmp_path, ray_session, mlflow_store, data_cache
):
    from fusion_ray import api

    path = _write(tmp_path, mlflow_store(), seeds=[0], metric={"name": "f1"})
    spec = api.load(path)
    outcome = api.run(spec)
    assert not outcome.finished and len(outcome.failed) == 2
    for reason in outcome.failed.values():
        assert "not the sweep's metric 'f1'" in reason and "metric: {name: ...}" in reason
    _, runs = _trial_runs(spec)
    assert {r.info.status for r in runs} == {"FAILED"}


def test_a_trainable_with_two_workers_runs_as_a_ddp_torch_trainer(
    tmp_path, ray_session, mlflow_store, data_cache
):
    """``resources.workers: 2``: each cell is a Ray Train run of two workers (its folder under
    the storage path's ``<name>-train``), the trainable called on both with its rank, the
    metrics of rank 0 tracked as the cell's."""
    from fusion_ray import api

    path = _write(
        tmp_path, mlflow_store(), seeds=[0], grid={"train.lr": [1e-3, 2e-3]},
        resources={"workers": 2, "cpus_per_worker": 1, "max_concurrent_trials": 1},
    )  # fmt: skip
    spec = api.load(path)
    outcome = api.run(spec)
    assert len(outcome.finished) == 2 and not outcome.failed, outcome.failed
    trained = sorted(p.name for p in (tmp_path / "ray_results" / "trainable_study-train").iterdir())
    assert len(trained) == 2 and all(name.endswith(tuple(outcome.finished)) for name in trained)
    _, runs = _trial_runs(spec)
    assert all(0.0 <= r.data.metrics["test_acc"] <= 1.0 for r in runs)
