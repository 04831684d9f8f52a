"""The tuning phase: HPO files validate up front, the tuned fragment is consumed by sweep files, and
the offline HPO runs end to end (Optuna + ASHA through Ray Tune, validation only, MLflow runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from fusion_ray.config import load_sweep
from fusion_ray.grid import expand, flatten
from fusion_ray.hpo import HpoFileError, fragment_text, load_hpo
from fusion_ray.hpo import main as hpo_main
from fusion_ray.tracking import Best
from tests.conftest import ROOT

HPO_FILES = sorted((ROOT / "sweeps" / "hpo").glob("*.yaml"))
TUNED = {
    "train.lr": 0.00123,
    "train.batch_size": 16,
    "train.warmup_steps": 7,
    "model.dropout": 0.05,
}


def test_there_are_hpo_files():
    assert {p.name for p in HPO_FILES} >= {"fusion_matters.yaml", "quick.yaml"}


@pytest.mark.parametrize("path", HPO_FILES, ids=lambda p: p.name)
def test_every_shipped_hpo_file_validates_and_has_a_dry_run(
    path: Path, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray")
    plan = load_hpo(path)
    assert plan.output.parent == ROOT / "sweeps" / "tuned"
    cells = expand(plan.spec)
    assert [c.dataset for c in cells] == plan.tune.datasets
    assert {c.fusion for c in cells} == {plan.tune.fusion.label} and {c.seed for c in cells} == {
        plan.tune.seed
    }
    monkeypatch.chdir(tmp_path)
    assert hpo_main([str(path), "--dry-run"]) == 0
    assert "validation only" in capsys.readouterr().out


def test_the_study_is_tuned_on_its_own_presets_and_seed():
    plan = load_hpo(ROOT / "sweeps" / "hpo" / "fusion_matters.yaml")
    grid = load_sweep(ROOT / "sweeps" / "full_grid.yaml")
    assert plan.tune.fusion.label == grid.grid.fusions[0].label  # the report's baseline
    assert plan.tune.seed not in grid.seeds
    assert plan.spec.datasets == grid.datasets
    assert set(plan.tune.space) == {
        "train.lr",
        "model.dropout",
        "train.batch_size",
        "train.warmup_steps",
    }


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hpo.yaml"
    path.write_text(text)
    return path


def test_a_bad_hpo_file_lists_every_problem_before_ray_starts(tmp_path, capsys):
    quick = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    quick["seeds"] = [0, 1]
    del quick["output"]
    quick["tune"]["datasets"] = ["short", "missing"]
    quick["tune"]["space"].update(
        {
            "model.fusion": {"type": "choice", "values": ["add", "concat"]},
            "train.nope": {"type": "uniform", "low": 0, "high": 1},
            "train.eval_batch_size": {"type": "choice", "values": [0, 8]},
            "model.d_ff": {"type": "loguniform", "low": 0, "high": 8},
        }
    )
    path = _write(tmp_path, yaml.safe_dump(quick))
    with pytest.raises(HpoFileError) as info:
        load_hpo(path)
    text = str(info.value)
    assert "seeds: not used by an HPO file" in text
    assert "output: the tuned fragment's path" in text
    assert "tune.datasets: 'missing' has no entry under datasets:" in text
    assert "tune.space.model.d_ff" in text and "loguniform needs low > 0" in text
    assert "tune.space.model.fusion: is a grid axis" in text
    assert "tune.space.train.nope: not a setting of the trial" in text
    # the bounds of the space are checked on an otherwise valid file: a second one
    quick["tune"]["datasets"] = ["short"]
    quick["tune"]["space"].pop("model.d_ff")
    quick["output"] = "tuned.yaml"
    del quick["seeds"]
    path = _write(tmp_path, yaml.safe_dump(quick))
    with pytest.raises(HpoFileError) as info:
        load_hpo(path)
    text = str(info.value)
    assert "tune.space.model.fusion: is a grid axis" in text
    assert "tune.space.train.nope: not a setting of the trial" in text
    assert (
        "tune.space.train.eval_batch_size = 0: datasets.short.train.eval_batch_size: must be > 0"
        in text
    )
    assert len(info.value.problems) == 3
    assert hpo_main([str(path), "--dry-run"]) == 2
    assert "3 problem(s)" in capsys.readouterr().err


def test_workers_and_asha_are_checked(tmp_path):
    quick = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    quick["resources"] = {"workers": 2, "cpus_per_worker": 1}
    quick["tune"]["asha"]["grace_period"] = 5
    quick["output"] = "tuned.yaml"
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert "resources.workers: tuning trials run on one worker" in str(info.value)
    assert "tune.asha.grace_period: 5 is more than datasets.short train.epochs 2" in str(info.value)


def _fragment(tmp_path: Path, hpo_file: str, dataset: str) -> Path:
    plan = load_hpo(ROOT / "sweeps" / "hpo" / hpo_file)
    text = fragment_text(plan, {dataset: Best(dict(TUNED), 0.5, "run0", 4)}, "abc123")
    path = tmp_path / "tuned" / "fragment.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _assert_tuned(cells, dataset: str) -> None:
    tuned = [c for c in cells if c.dataset == dataset]
    assert tuned
    for cell in tuned:
        assert cell.trial.train.lr == TUNED["train.lr"]
        assert cell.trial.train.batch_size == TUNED["train.batch_size"]
        assert cell.trial.train.warmup_steps == TUNED["train.warmup_steps"]
        assert cell.trial.model.dropout == TUNED["model.dropout"]
    # same seed => every operator's config is identical apart from the operator itself
    for seed in {c.seed for c in tuned}:
        configs = []
        for cell in (c for c in tuned if c.seed == seed):
            flat = flatten(dataclasses.asdict(cell.trial))
            configs.append({k: v for k, v in flat.items() if not k.startswith("model.fusion")})
        assert all(c == configs[0] for c in configs)


def test_the_fragment_is_consumed_by_the_quickstart(tmp_path):
    _fragment(tmp_path, "quick.yaml", "short")
    raw = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    raw["extends"] = ["tuned/fragment.yaml"]
    sweep = tmp_path / "quickstart_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    cells = expand(load_sweep(sweep))
    _assert_tuned(cells, "short")
    assert len({c.fusion for c in cells if c.dataset == "short"}) == 3
    untouched = [c for c in cells if c.dataset != "short"]
    assert untouched and all(c.trial.train.lr == raw["defaults"]["train"]["lr"] for c in untouched)


def test_the_fragment_overrides_the_study_presets_when_listed_after_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray")
    fragment = _fragment(tmp_path, "fusion_matters.yaml", "ag_news")
    assert yaml.safe_load(fragment.read_text()) == {
        "datasets": {
            "ag_news": {
                "train": {"lr": 0.00123, "batch_size": 16, "warmup_steps": 7},
                "model": {"dropout": 0.05},
            }
        }
    }
    raw = yaml.safe_load((ROOT / "sweeps" / "full_grid.yaml").read_text())
    raw["extends"] = [str(ROOT / "sweeps" / "_study_datasets.yaml"), "tuned/fragment.yaml"]
    sweep = tmp_path / "full_grid_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    cells = expand(load_sweep(sweep))
    _assert_tuned(cells, "ag_news")
    imdb = [c for c in cells if c.dataset == "imdb"]
    assert imdb and all(c.trial.train.lr == 3e-4 and c.trial.train.batch_size == 64 for c in imdb)


@pytest.mark.slow
def test_quick_hpo_runs_end_to_end_and_feeds_a_sweep(
    tmp_path, ray_session, data_cache, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the quick file's MLflow store and Tune results are relative paths
    output = tmp_path / "tuned" / "quick.yaml"
    assert hpo_main([str(ROOT / "sweeps" / "hpo" / "quick.yaml"), "--output", str(output)]) == 0
    tuned = yaml.safe_load(output.read_text())["datasets"]["short"]
    assert set(tuned) == {"train", "model"} and set(tuned["model"]) == {"dropout"}

    client = MlflowClient("sqlite:///mlflow.db")
    experiment = client.get_experiment_by_name("quick_hpo")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'trial'")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        assert (tags["dataset"], tags["fusion"], tags["seed"]) == ("short", "add", "1000")
        assert "best_val_acc" in metrics and "val_acc" in metrics
        assert not {m for m in metrics if m.startswith("test_")}, (
            "tuning must never see the test split"
        )
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert metrics["best_val_acc"] == max(m.value for m in history)
    best = max(runs, key=lambda r: r.data.metrics["best_val_acc"])
    assert best.data.metrics["best_val_acc"] == max(r.data.metrics["best_val_acc"] for r in runs)
    assert best.info.run_id in output.read_text()
    for section, values in tuned.items():
        for name, value in values.items():
            assert best.data.params[f"{section}.{name}"] == str(value)
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'sweep'")[0]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "report")] == [
        "report/quick.yaml"
    ]

    # the fragment feeds a sweep over the same dataset, for every operator
    raw = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    raw["extends"] = ["tuned/quick.yaml"]
    sweep = tmp_path / "quickstart_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    for cell in (c for c in expand(load_sweep(sweep)) if c.dataset == "short"):
        assert cell.trial.train.lr == tuned["train"]["lr"]
        assert cell.trial.model.dropout == tuned["model"]["dropout"]

    # running again does not silently replace the tuned values
    assert hpo_main([str(ROOT / "sweeps" / "hpo" / "quick.yaml"), "--output", str(output)]) == 2
    assert "--overwrite" in capsys.readouterr().err
