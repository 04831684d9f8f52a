"""A trainable's tuning phase (``fusion_ray.hpo.trainable``): its HPO file is checked whole
before Ray starts (against the sweeps it is for: their trainable, seeds, decision metric and
grid), Optuna is told final results only, and a tuning runs end to end on Ray (one MLflow run
per trial, the best written as a ``defaults:`` fragment that the sweep file extends). The
trainable is the built-in ``study`` on its tiny example config (seconds a trial)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from fusion_ray.config import SweepFileError
from fusion_ray.config.files import load_trainable_sweep
from fusion_ray.hpo.cli import main as hpo_main
from fusion_ray.hpo.trainable import fragment_text, load_trainable_hpo
from fusion_ray.train.trainable import EXAMPLE


def _sweep(folder: Path, **changes) -> Path:
    raw = {
        "name": "study_ops",
        "trainable": "study",
        "extends": ["tuned/study.yaml"],
        "defaults": copy.deepcopy(EXAMPLE),
        "grid": {"model.fusion": ["add", "gate_scalar"]},
        "metric": {"name": "test_acc", "mode": "max"},
        "seeds": [0, 1, 2],
    } | changes
    del raw["defaults"]["train"]["epochs"]  # left to the defaults below it
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _hpo(folder: Path, tracking_uri: str = "sqlite:///mlflow.db", **tune) -> Path:
    raw = {
        "name": "study_tuning",
        "trainable": "study",
        "defaults": copy.deepcopy(EXAMPLE),
        "tune": {
            "at": {"model.fusion": "add"},
            "seed": 1000,
            "num_samples": 3,
            "metric": {"name": "best_val_acc", "mode": "max"},
            "space": {"train.lr": {"type": "loguniform", "low": 0.0003, "high": 0.03}},
        }
        | tune,
        "output": "tuned/study.yaml",
        "sweeps": ["sweep.yaml"],
        "resources": {"cpus_per_worker": 1, "max_concurrent_trials": 2},
        "tracking_uri": tracking_uri,
        "storage_path": str(folder / "ray_results"),
        "retries": 0,
    }
    path = folder / "tuning.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.unit
def test_a_trainables_tuning_file_is_checked_against_the_sweeps_it_is_for(tmp_path, capsys):
    _sweep(tmp_path)
    plan = load_trainable_hpo(_hpo(tmp_path))
    assert plan.sweeps == {"sweep.yaml": [0, 1, 2]}
    assert plan.output == (tmp_path / "tuned" / "study.yaml").resolve()
    assert plan.spec.base_config()["model"]["fusion"] == "add"
    assert hpo_main([str(tmp_path / "tuning.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 Optuna settings of trainable study at seed 1000, scored on best_val_acc" in out
    assert "train.lr" in out and "loguniform" in out and "for sweep.yaml (seeds [0, 1, 2]" in out

    _sweep(
        tmp_path, grid={"train.lr": [0.001, 0.01]}, seeds=[0, 1000], metric={"name": "best_val_acc"}
    )
    space = {"train.lr": {"type": "loguniform", "low": 0.0003, "high": 0.03}, "model.fusion": {
        "type": "choice", "values": ["add"]}}  # fmt: skip
    with pytest.raises(SweepFileError) as info:
        load_trainable_hpo(_hpo(tmp_path, space=space))
    text = str(info.value)
    assert "tune.space.model.fusion: tune.at sets it too" in text
    assert "sweeps: sweep.yaml: runs seed 1000: tuning on a paired seed" in text
    assert "sweeps: sweep.yaml: decides on best_val_acc, the metric tuned on" in text
    assert "sweeps: sweep.yaml: varies train.lr (grid)" in text

    _sweep(tmp_path, trainable="digits_mlp")
    (tmp_path / "tuning.yaml").write_text(
        (tmp_path / "tuning.yaml").read_text().replace("trainable: study", "trainable: stduy")
    )
    with pytest.raises(SweepFileError) as info:
        load_trainable_hpo(tmp_path / "tuning.yaml")
    text = str(info.value)
    assert "trainable: " in text and "stduy" in text and "study" in text
    assert "sweeps: sweep.yaml: is a sweep of digits_mlp, not of stduy" in text
    assert hpo_main([str(tmp_path / "tuning.yaml"), "--dry-run"]) == 2


@pytest.mark.unit
def test_the_fragment_sets_the_chosen_defaults_that_the_sweep_file_extends(tmp_path):
    sweep = _sweep(tmp_path)
    plan = load_trainable_hpo(_hpo(tmp_path))
    text = fragment_text(plan, ({"train.lr": 0.0042}, 0.875, "run-7"), "abc1234")
    assert "best_val_acc 0.875 (max), MLflow experiment study_tuning, run run-7" in text
    assert yaml.safe_load(text) == {"defaults": {"train": {"lr": 0.0042}}}
    plan.output.parent.mkdir()
    plan.output.write_text(text)
    spec = load_trainable_sweep(sweep)
    assert spec.defaults["train"]["lr"] == 0.0042  # from the fragment
    assert spec.defaults["train"]["batch_size"] == EXAMPLE["train"]["batch_size"]  # its own


@pytest.mark.unit
def test_optuna_is_told_final_results_only():
    """A trainable's reports lack the tuned metric (it comes with what it returns): the
    searcher takes no intermediate result and scores the completed one."""
    from ray import tune

    from fusion_ray.hpo.searcher import FinalResultSearch

    search = FinalResultSearch("best_val_acc", "max", seed=3)
    assert search.metric is None  # Tune checks no report against it
    assert search.set_search_properties(None, None, {"lr": tune.uniform(0.0, 1.0)})
    config = search.suggest("t1")
    assert 0.0 <= config["lr"] <= 1.0
    search.on_trial_result("t1", {"val_acc": 0.5, "training_iteration": 1})  # no KeyError
    search.on_trial_complete("t1", {"best_val_acc": 0.75, "training_iteration": 2})
    (trial,) = search.inner._ot_study.trials
    assert trial.value == 0.75 and trial.params["lr"] == config["lr"]


@pytest.mark.ray
def test_a_trainables_tuning_runs_end_to_end_and_feeds_its_sweep(
    tmp_path, ray_session, mlflow_store, data_cache, capsys
):
    from mlflow.tracking import MlflowClient

    sweep = _sweep(tmp_path)
    uri = mlflow_store()
    path = _hpo(tmp_path, tracking_uri=uri)
    assert hpo_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "wrote " in out and "best best_val_acc" in out
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("study_tuning")
    runs = client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert run.data.tags["seed"] == "1000" and "axis.train.lr" in run.data.tags
        assert run.data.params["model.fusion"] == "add"
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert sorted(m.step for m in history) == [0, 1]  # each epoch once
    best = max(runs, key=lambda r: r.data.metrics["best_val_acc"])
    fragment = tmp_path / "tuned" / "study.yaml"
    assert best.info.run_id in fragment.read_text()
    tuned = yaml.safe_load(fragment.read_text())["defaults"]["train"]["lr"]
    assert best.data.params["train.lr"] == str(tuned)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] != []
    assert load_trainable_sweep(sweep).defaults["train"]["lr"] == tuned
    assert hpo_main([str(path)]) == 2  # the fragment exists: not tuned again
    assert "pass --overwrite to replace it" in capsys.readouterr().err
