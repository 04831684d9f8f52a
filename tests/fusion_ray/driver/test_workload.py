"""The kinds of sweep the driver runs, by name: the study's through its entry point (the engine
imports nothing of it), a trainable's built in; what each says of its cells and trials."""

from __future__ import annotations

import json

import pytest

from fusion_ray.driver.workload import WORKLOADS, TrainableWorkload, workload_for
from fusion_ray.train.result import FINAL, REPORTED, TrialResult
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


def test_each_kind_of_sweep_gets_its_workload_the_study_by_its_entry_point(tmp_path):
    from fusion_ray import api
    from fusion_ray.study.workload import StudyWorkload

    study = api.load(tiny_sweep(tmp_path))
    assert type(workload_for(study)) is StudyWorkload
    assert WORKLOADS.origin("study") == "fusion-ray"  # declared in pyproject like a plug-in
    trainable = tmp_path / "t.yaml"
    trainable.write_text(
        "name: t\ntrainable: study\ngrid: {model.fusion: [add, gate_scalar]}\nseeds: [0]\n"
        "metric: {name: test_loss, mode: min}\ntrend: null\n"
    )
    spec = api.load(trainable)
    work = workload_for(spec)
    assert isinstance(work, TrainableWorkload)
    record = json.loads(work.parent_params([])["trainable_sweep"])
    assert record == {
        "trainable": "study", "axis": "model.fusion", "baseline": "add",
        "metric": "test_loss", "mode": "min", "trend": None,
    }  # fmt: skip
    last = TrialResult.of(
        {FINAL: True, REPORTED: '["test_acc", "test_loss"]', "test_loss": 0.123456}
    )
    assert work.outcome(last) == "test_loss 0.1235"


def test_the_study_says_a_finished_trial_as_its_test_accuracy_and_orders_its_operators(tmp_path):
    from fusion_ray import api
    from fusion_ray.config.workload import cells_of
    from fusion_ray.schema import DISPLAY_ORDER_TAG

    spec = api.load(tiny_sweep(tmp_path))
    work = workload_for(spec)
    assert work.outcome(TrialResult.of({FINAL: True, "test_acc": 0.203125})) == "test_acc 20.31%"
    order = json.loads(work.parent_params(cells_of(spec))[DISPLAY_ORDER_TAG])
    assert order == {"operator": ["add", "gate_scalar"], "dataset": ["short"]}


def test_each_kind_says_which_metrics_its_runs_log_and_the_tracker_logs_only_those(
    tmp_path, mlflow_store, monkeypatch
):
    """The tracker logs what the workload names: the study's epoch and final lists (with its
    results' evaluation-length and reference metrics, by prefix), a trainable's own reports
    and returns (their order tagged); a key of the result that neither names is not logged."""
    from fusion_ray import api
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.schema import EPOCH_METRICS, RETURNED_TAG, STEP_METRIC

    study = workload_for(api.load(tiny_sweep(tmp_path)))
    assert study.step_metric == "val_acc" and study.epoch_metrics({}) == EPOCH_METRICS
    final = {"test_acc": 0.5, "test_acc_at_512": 0.4, "reference.majority.test_acc": 0.25}
    names, tags = study.final_record({**final, "stray": 1.0})
    assert {"test_acc", "test_acc_at_512", "reference.majority.test_acc"} <= set(names)
    assert "stray" not in names and tags == {}

    spec = tmp_path / "t.yaml"
    spec.write_text("name: t\ntrainable: study\ngrid: {model.fusion: [add, concat]}\nseeds: [0]\n")
    trainable = workload_for(api.load(spec))
    epoch = {REPORTED: '["loss"]', "loss": 0.7, "epoch": 3, "val_acc": 0.9}
    assert trainable.step_metric == STEP_METRIC
    assert list(trainable.epoch_metrics(epoch)) == ["loss", STEP_METRIC]
    returned = {REPORTED: '["f1", "acc"]', "f1": 0.6, "acc": 0.8, "test_acc": 0.1}
    names, tags = trainable.final_record(returned)
    assert list(names) == ["f1", "acc"] and json.loads(tags[RETURNED_TAG]) == ["f1", "acc"]

    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    tracker = Tracker(mlflow_store(), "logs")
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    tracker.log_epoch(run_id, {**epoch, STEP_METRIC: 3}, trainable.epoch_metrics(epoch))
    tracker.log_final(run_id, returned, *trainable.final_record(returned))
    run = tracker.client.get_run(run_id)
    assert set(run.data.metrics) == {"loss", STEP_METRIC, "f1", "acc"}  # no val_acc, no test_acc
    assert json.loads(run.data.tags[RETURNED_TAG]) == ["f1", "acc"]
    assert tracker.last_logged_epoch(run_id, trainable.step_metric) == 3
    assert tracker.last_logged_epoch(run_id, study.step_metric) == -1


def test_fusion_ray_list_names_each_kind_of_sweep_with_its_origin():
    from fusion_ray.cli import list_entries

    lines = list_entries().splitlines()
    start = lines.index(
        "kinds of sweep (entry-point group fusion_ray.workloads; what the driver runs):"
    )
    listed = lines[start + 1 :]
    assert any(
        line.split()[:3]
        == ["trainable", "[fusion-ray]", "fusion_ray.driver.workload.TrainableWorkload"]
        for line in listed
    )
    assert any(
        line.split()[:3] == ["study", "[fusion-ray]", "fusion_ray.study.workload.StudyWorkload"]
        for line in listed
    )
