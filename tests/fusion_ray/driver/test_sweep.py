"""Sweeps on a real local Ray and a real MLflow store: tracking schema, idempotent re-runs,
failures recorded while the sweep goes on, and the direct vs TorchTrainer one-worker paths.

The tests' tiny sweep runs once for the module (``tiny_run``): the schema test and the
direct-path half of the paths test read its runs."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from fusion_ray.config import load_sweep
from fusion_ray.driver.runner import run_sweep
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.ray

TRIAL_PARAMS = ("data", "model", "train", "seed")
"""The parameter groups that make a trial's numbers (resources and names aside)."""


def _runs(spec, status=None):
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    return client, [r for r in runs if status is None or r.info.status == status]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_session, data_cache, mlflow_store):
    """The tests' tiny sweep (seeds 0 and 1 of add and gate_scalar, one worker each, run in the
    Tune trial), run once: its folder, file, spec and outcome. Tests that add runs to its store
    say so and leave the first four as they were."""
    folder = tmp_path_factory.mktemp("tiny_run")
    path = tiny_sweep(folder, tracking_uri=mlflow_store())
    spec = load_sweep(path)
    return folder, path, spec, run_sweep(spec, str(path), verbose=0)


def test_sweep_logs_the_schema_and_a_rerun_does_no_new_work(tiny_run):
    tmp_path, path, spec, outcome = tiny_run
    assert outcome.ran == 4 and len(outcome.finished) == 4 and not outcome.failed

    client, runs = _runs(spec, "FINISHED")
    assert len(runs) == 4
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        for tag in (
            "cell_id",
            "dataset",
            "position",
            "attention_position",
            "fusion",
            "seed",
            "sweep",
            "git_sha",
        ):
            assert tags.get(tag), f"missing tag {tag}"
        assert tags["fusion"] in ("add", "gate_scalar") and tags["sweep"] == "tiny"
        assert params["model.d_model"] == "16" and params["train.lr"] == "0.001"
        assert params["model.fusion"] == tags["fusion"] and params["seed"] == tags["seed"]
        for metric in (
            "test_acc",
            "best_val_acc",
            "best_epoch",
            "test_correct",
            "test_total",
            "latency_ms_per_sample",
            "num_params",
            "train_seconds",
        ):
            assert metric in metrics, f"missing metric {metric}"
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert sorted(m.step for m in history) == [0, 1]
        assert metrics["best_val_acc"] == max(m.value for m in history)
        local = client.download_artifacts(
            run.info.run_id, "test_predictions.parquet", str(tmp_path / run.info.run_id)
        )
        preds = pd.read_parquet(local)
        assert (
            len(preds) == metrics["test_total"]
            and (preds.label == preds.pred).sum() == metrics["test_correct"]
        )
        assert tags["mlflow.parentRunId"]
    parents = client.search_runs([runs[0].info.experiment_id], filter_string="tags.role = 'sweep'")
    assert len(parents) == 1 and parents[0].info.run_id == runs[0].data.tags["mlflow.parentRunId"]

    # the same command again: nothing to do, no new runs
    again = run_sweep(load_sweep(path), str(path), verbose=0)
    assert again.ran == 0 and again.already_finished == 4
    assert len(_runs(spec)[1]) == 4

    # one more seed: only its two cells run (the store gains seed 2's runs; seeds 0-1 are kept)
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = [0, 1, 2]
    path.write_text(yaml.safe_dump(raw))
    more = run_sweep(load_sweep(path), str(path), verbose=0)
    assert more.ran == 2 and more.already_finished == 4
    finished = _runs(spec, "FINISHED")[1]
    assert len(finished) == 6 and len({r.data.tags["cell_id"] for r in finished}) == 6


def test_a_failing_cell_is_recorded_failed_and_the_others_finish(
    tmp_path, ray_session, data_cache, mlflow_store
):
    store = mlflow_store()
    path = tiny_sweep(tmp_path, name="with_failure", seeds=[0], retries=2, tracking_uri=store)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["datasets"] = ["short", "diverges"]
    raw["datasets"]["diverges"] = {
        "data": raw["datasets"]["short"]["data"],
        # the largest learning rate and decoupled weight decay allowed, unclipped: AdamW scales
        # every weight by 1 - lr * wd = -99 a step, so the loss overflows within two epochs
        "train": {"lr": 10, "weight_decay": 10, "optimizer": "adamw", "grad_clip": None},
    }
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    outcome = run_sweep(spec, str(path), verbose=0)
    assert len(outcome.finished) == 2 and len(outcome.failed) == 2
    client, runs = _runs(spec)
    by_status = {}
    for run in runs:
        by_status.setdefault(run.info.status, []).append(run)
    assert {r.data.tags["dataset"] for r in by_status["FINISHED"]} == {"short"}
    assert {r.data.tags["dataset"] for r in by_status["FAILED"]} == {"diverges"}
    for run in by_status["FAILED"]:
        assert "training loss is" in run.data.tags["failure_reason"]
        assert "lower train.lr" in run.data.tags["failure_reason"]
        # a diverging loss repeats at every attempt at this seed: recorded once, not retried
        assert "not retried" in run.data.tags["failure_reason"]
        assert run.data.tags["failure_kind"] == "trial"  # its own code failed: it counts

    # the next run retries the failed cells (and only them), replacing their runs
    again = run_sweep(load_sweep(path), str(path), verbose=0)
    assert again.ran == 2 and again.already_finished == 2 and len(again.failed) == 2
    runs_after = _runs(spec)[1]
    assert len(runs_after) == 4 and len({r.data.tags["cell_id"] for r in runs_after}) == 4
    old_failed = {r.info.run_id for r in by_status["FAILED"]}
    assert not old_failed & {r.info.run_id for r in runs_after if r.info.status == "FAILED"}


def _paths_result(client, run) -> tuple:
    history = client.get_metric_history(run.info.run_id, "val_loss")
    return (
        run.data.metrics["test_correct"],
        run.data.metrics["best_val_acc"],
        [m.value for m in sorted(history, key=lambda m: m.step)],
    )


def test_one_worker_direct_and_trainer_paths_give_identical_metrics(
    tmp_path, tiny_run, mlflow_store
):
    """The direct path: gate_scalar at seed 0 in the module's tiny sweep (one worker, one CPU,
    trained in the Tune trial itself). The trainer path: the same cell through a one-worker
    TorchTrainer (``force_trainer``). A trial's threads follow cpus_per_worker, not how many
    trials run beside it, so the two must agree exactly."""
    _, _, shared, _ = tiny_run
    client, runs = _runs(shared, "FINISHED")
    (direct,) = [
        r for r in runs if (r.data.tags["fusion"], r.data.tags["seed"]) == ("gate_scalar", "0")
    ]
    path = tiny_sweep(
        tmp_path,
        name="paths_trainer",
        seeds=[0],
        resources={
            "workers": 1,
            "cpus_per_worker": 1,
            "force_trainer": True,
            "max_concurrent_trials": 1,
        },
        tracking_uri=mlflow_store(),
    )
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    assert len(run_sweep(spec, str(path), verbose=0).finished) == 1
    trainer_client, (trainer,) = _runs(spec, "FINISHED")

    def trial(run) -> dict[str, str]:  # the trial's settings, whatever the resources
        return {k: v for k, v in run.data.params.items() if k.split(".")[0] in TRIAL_PARAMS}

    assert trial(direct) == trial(trainer) and len(trial(direct)) > 20
    assert _paths_result(client, direct) == _paths_result(trainer_client, trainer)


def test_two_worker_ddp_cell_through_the_sweep(tmp_path, ray_session, data_cache, mlflow_store):
    """workers: 2 runs a TorchTrainer inside the Tune trial; its metrics reach MLflow through
    TuneReportCallback exactly like a one-worker trial's."""
    path = tiny_sweep(
        tmp_path,
        name="ddp",
        seeds=[0],
        resources={"workers": 2, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        tracking_uri=mlflow_store(),
    )
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    assert len(run_sweep(spec, str(path), verbose=0).finished) == 1
    client, (run,) = _runs(spec, "FINISHED")
    assert run.data.params["model.fusion"] == "gate_scalar"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_acc")) == [0, 1]
    assert run.data.metrics["test_total"] == 64
    assert run.data.tags["checkpoint_path"].startswith(str(tmp_path))
    local = client.download_artifacts(
        run.info.run_id, "test_predictions.parquet", str(tmp_path / "dl")
    )
    assert len(pd.read_parquet(local)) == 64
