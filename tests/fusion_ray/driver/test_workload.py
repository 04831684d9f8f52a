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
