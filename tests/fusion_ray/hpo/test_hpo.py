"""The tuning phase: HPO files validate up front (a tuning seed of the grid is refused), settings
tuned on several operators are chosen by mean validation rank, the tuned fragment is consumed by
sweep files, and the offline HPO runs end to end (Optuna through Ray Tune, validation only, MLflow
runs), on one operator with ASHA and on several."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from fusion_ray.config import load_sweep
from fusion_ray.config.combinations import flatten
from fusion_ray.config.grid import expand
from fusion_ray.hpo import (
    OPERATOR_INDEX,
    HpoFileError,
    Ranking,
    ScoredSetting,
    fragment_text,
    load_hpo,
    rank_settings,
)
from fusion_ray.hpo.cli import main as hpo_main
from fusion_ray.hpo.tracking import Best
from tests.conftest import ROOT

HPO_FILES = sorted((ROOT / "sweeps" / "hpo").glob("*.yaml"))
TUNED = {
    "train.lr": 0.00123,
    "train.batch_size": 16,
    "train.warmup_steps": 7,
    "model.dropout": 0.05,
}


@pytest.mark.unit
def test_there_are_hpo_files():
    assert {p.name for p in HPO_FILES} >= {
        "fusion_matters.yaml",
        "fusion_matters_shared.yaml",
        "quick.yaml",
    }


@pytest.mark.unit
def test_command_line_overrides_edit_the_hpo_file_before_validation(tmp_path, monkeypatch, capsys):
    quick = ROOT / "sweeps" / "hpo" / "quick.yaml"
    plan = load_hpo(quick, ["tune.num_samples=2", "train.epochs=1", "model.d_model=16"])
    assert plan.tune.num_samples == 2 and plan.overrides == (
        "tune.num_samples=2",
        "train.epochs=1",
        "model.d_model=16",
    )
    assert {(c.trial.train.epochs, c.trial.model.d_model) for c in expand(plan.spec)} == {(1, 16)}
    with pytest.raises(HpoFileError) as info:
        load_hpo(quick, ["tune.seed=3", "model.n_heads=5"])
    text = str(info.value)
    assert "tune.seed" in text and "n_heads" in text  # both found, each named
    monkeypatch.chdir(tmp_path)
    # options and overrides in any order, as for a sweep
    assert hpo_main([str(quick), "--dry-run", "tune.num_samples=3"]) == 0
    assert "3 Optuna trials" in capsys.readouterr().out


@pytest.mark.unit
@pytest.mark.parametrize("path", HPO_FILES, ids=lambda p: p.name)
def test_every_shipped_hpo_file_validates_and_has_a_dry_run(
    path: Path, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray")
    plan = load_hpo(path)
    assert plan.output.parent == ROOT / "sweeps" / "tuned"
    cells = expand(plan.spec)
    operators = [op.label for op in plan.tune.operators]
    assert [(c.dataset, c.fusion) for c in cells] == [
        (d, op) for d in plan.tune.datasets for op in operators
    ]
    assert {c.seed for c in cells} == {plan.tune.seed}
    assert plan.sweeps and all(plan.tune.seed not in seeds for seeds in plan.sweeps.values())
    monkeypatch.chdir(tmp_path)
    assert hpo_main([str(path), "--dry-run"]) == 0
    assert "validation only" in capsys.readouterr().out


@pytest.mark.unit
def test_the_study_is_tuned_on_its_own_presets_and_seed():
    plan = load_hpo(ROOT / "sweeps" / "hpo" / "fusion_matters.yaml")
    grid = load_sweep(ROOT / "sweeps" / "full_grid.yaml")
    assert plan.tune.fusion.label == grid.grid.fusions[0].label  # the report's baseline
    assert plan.tune.seed not in grid.seeds
    assert plan.sweeps["../full_grid.yaml"] == grid.seeds
    assert plan.spec.datasets == grid.datasets
    assert set(plan.tune.space) == {
        "train.lr",
        "model.dropout",
        "train.batch_size",
        "train.warmup_steps",
    }


@pytest.mark.unit
def test_the_shared_study_tuning_uses_table_1s_operators_and_presets():
    plan = load_hpo(ROOT / "sweeps" / "hpo" / "fusion_matters_shared.yaml")
    grid = load_sweep(ROOT / "sweeps" / "full_grid.yaml")
    assert [op.label for op in plan.tune.operators] == [f.label for f in grid.grid.fusions]
    assert plan.spec.datasets == grid.datasets
    assert set(plan.sweeps) == {f"../{n}.yaml" for n in ("full_grid", "table1", "table2", "table3")}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hpo.yaml"
    path.write_text(text)
    return path


def _quick() -> dict:
    """quick.yaml as a mapping, for files written elsewhere: its sweep named by absolute path."""
    quick = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    quick["sweeps"] = [str(ROOT / "sweeps" / "quickstart.yaml")]
    return quick


@pytest.mark.unit
def test_a_bad_hpo_file_lists_every_problem_before_ray_starts(tmp_path, capsys):
    quick = _quick()
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


@pytest.mark.unit
def test_workers_and_asha_are_checked(tmp_path):
    quick = _quick()
    quick["resources"] = {"workers": 2, "cpus_per_worker": 1}
    quick["tune"]["asha"]["grace_period"] = 5
    quick["output"] = "tuned.yaml"
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert "resources.workers: tuning trials run on one worker" in str(info.value)
    assert "tune.asha.grace_period: 5 is more than datasets.short train.epochs 2" in str(info.value)


@pytest.mark.unit
def test_a_tuning_seed_of_the_grid_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    import fusion_ray.hpo.cli

    quick = _quick()
    quick["output"] = "tuned.yaml"
    quick["tune"]["seed"] = 3  # quickstart.yaml's adaptive seeds are 0-13 at most
    path = _write(tmp_path, yaml.safe_dump(quick))
    with pytest.raises(HpoFileError) as info:
        load_hpo(path)
    sweep = quick["sweeps"][0]
    assert info.value.problems == [
        f"tune.seed: 3 is one of the paired seeds of the sweeps this tuning is for "
        f"({sweep} {list(range(14))}); tuning on a seed the grid evaluates lets that "
        "seed's runs choose the settings the operators are then compared with (same seed, same "
        "initialisation and batch order), which leaks the selection into the comparison; pick a "
        "seed none of them uses, e.g. 1000"
    ]
    assert str(info.value).startswith(f"1 problem(s) in HPO file {path}:\n  {path}: tune.seed: 3")

    def started(*args, **kwargs):
        raise AssertionError("tuning started despite an invalid file")

    monkeypatch.setattr(fusion_ray.hpo.cli, "run_hpo", started)
    monkeypatch.chdir(tmp_path)
    assert hpo_main([str(path)]) == 2
    assert "tune.seed: 3 is one of the paired seeds" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpo.yaml"]  # no MLflow store, no results
    quick["tune"]["seed"] = 14  # not one of them
    assert load_hpo(_write(tmp_path, yaml.safe_dump(quick))).sweeps == {sweep: list(range(14))}


@pytest.mark.unit
def test_the_grid_seeds_are_read_through_extends_and_the_sweeps_must_be_named(tmp_path):
    # The sweep extends a seeds fragment and the tuned fragment, not written yet: the seeds are
    # found all the same, as the sweep's loader would merge them.
    (tmp_path / "seeds.yaml").write_text("seeds: [0, 1000]\n")
    (tmp_path / "grid.yaml").write_text("extends: [seeds.yaml, tuned/out.yaml]\nname: grid\n")
    quick = _quick()
    quick["output"] = "tuned/out.yaml"
    quick["sweeps"] = "grid.yaml"
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert [p.split(" is ")[0] for p in info.value.problems] == ["tune.seed: 1000"]
    assert "(grid.yaml [0, 1000])" in info.value.problems[0]
    assert "e.g. 1001" in info.value.problems[0]

    quick["sweeps"] = ["missing.yaml", "seeds.yaml"]
    (tmp_path / "seeds.yaml").write_text("name: no_seeds_here\n")
    del quick["output"]
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    text = str(info.value)
    assert f"sweeps: 'missing.yaml' not found at {tmp_path / 'missing.yaml'}" in text
    assert "sweeps: seeds.yaml has no seeds, neither its own nor from its extends" in text

    del quick["sweeps"]
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert "sweeps: the sweep files that extend this file's output" in str(info.value)


@pytest.mark.unit
def test_several_operators_are_checked(tmp_path):
    quick = _quick()
    quick["tune"]["fusions"] = ["add", "no_such_operator", "add"]  # fusion: add is kept too
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    text = str(info.value)
    assert "tune.fusions: give either fusion (one operator) or fusions (several), not both" in text
    assert "tune.asha: not used when several operators are tuned" in text
    assert "tune.fusions: 'add' is listed twice" in text
    assert "tune.fusions[1]: " in text and "no_such_operator" in text

    del quick["tune"]["fusion"], quick["tune"]["asha"]
    quick["tune"]["fusions"] = ["concat"]
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert [p.split(":")[0] for p in info.value.problems] == ["tune.fusions"]

    quick["tune"]["fusions"] = ["add", {"name": "gate_cnn", "kernel_size": 5}]
    plan = load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    assert [op.label for op in plan.tune.operators] == ["add", "gate_cnn(kernel_size=5)"]
    assert [(c.dataset, c.fusion) for c in expand(plan.spec)] == [
        ("short", "add"),
        ("short", "gate_cnn(kernel_size=5)"),
    ]


@pytest.mark.unit
def test_the_operator_index_is_the_one_ray_tunes_repeater_sets():
    from ray.tune.search.repeater import TRIAL_INDEX

    assert OPERATOR_INDEX == TRIAL_INDEX


def _setting(lr: float, **scores: float) -> ScoredSetting:
    return ScoredSetting({"train.lr": lr}, scores)


@pytest.mark.unit
def test_settings_are_chosen_by_mean_validation_rank_across_operators():
    # Hand-computed (accuracies are exact binary fractions, so sums and means are exact):
    #            add            concat         gate_scalar      mean rank   mean val_acc
    #   A  0.75    rank 3   0.6875  rank 3   0.75    rank 1.5     7.5/3 = 2.50
    #   B  0.875   rank 1   0.625   rank 4   0.75    rank 1.5     6.5/3 = 2.17
    #   C  0.8125  rank 2   0.71875 rank 2   0.5     rank 4       8/3   = 2.67   0.6771
    #   D  0.6875  rank 4   0.75    rank 1   0.71875 rank 3       8/3   = 2.67   0.71875
    # B wins; C and D tie on mean rank and D's higher mean accuracy puts it first.
    settings = [
        _setting(1.0, add=0.75, concat=0.6875, gate_scalar=0.75),
        _setting(2.0, add=0.875, concat=0.625, gate_scalar=0.75),
        _setting(3.0, add=0.8125, concat=0.71875, gate_scalar=0.5),
        _setting(4.0, add=0.6875, concat=0.75, gate_scalar=0.71875),
    ]
    ranked = rank_settings(settings)
    assert [s.config["train.lr"] for s in ranked] == [2.0, 1.0, 4.0, 3.0]
    assert [s.ranks for s in ranked] == [
        {"add": 1, "concat": 4, "gate_scalar": 1.5},
        {"add": 3, "concat": 3, "gate_scalar": 1.5},
        {"add": 4, "concat": 1, "gate_scalar": 3},
        {"add": 2, "concat": 2, "gate_scalar": 4},
    ]
    assert [s.mean_rank for s in ranked] == pytest.approx([6.5 / 3, 2.5, 8 / 3, 8 / 3])
    assert all(not s.ranks for s in settings)  # the inputs are left as they were

    # Ranks weigh every operator alike: B is ahead on two of three operators by a hair and far
    # behind on one, so the mean accuracy prefers A and the mean rank prefers B.
    a = _setting(1.0, add=0.9, concat=0.6, gate_scalar=0.6)
    b = _setting(2.0, add=0.5, concat=0.61, gate_scalar=0.61)
    assert a.mean_score > b.mean_score
    assert [s.config["train.lr"] for s in rank_settings([a, b])] == [2.0, 1.0]

    # A full tie (same ranks, same accuracies) goes to the earlier sampled setting.
    same = [_setting(5.0, add=0.5, concat=0.5), _setting(6.0, add=0.5, concat=0.5)]
    assert [s.config["train.lr"] for s in rank_settings(same)] == [5.0, 6.0]
    assert [s.config["train.lr"] for s in rank_settings(same[::-1])] == [6.0, 5.0]
    assert rank_settings(same)[0].ranks == {"add": 1.5, "concat": 1.5}
    assert rank_settings([]) == []


@pytest.mark.unit
def test_a_ranked_fragment_records_how_it_was_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray")
    plan = load_hpo(ROOT / "sweeps" / "hpo" / "fusion_matters_shared.yaml")
    operators = ["add", "concat", "gate_scalar"]
    settings = [
        ScoredSetting(
            {"train.lr": 0.0005, "model.dropout": 0.2},
            {"add": 0.75, "concat": 0.70, "gate_scalar": 0.71},
            {op: f"loser-{op}" for op in operators},
        ),
        ScoredSetting(
            dict(TUNED),
            {"add": 0.74, "concat": 0.72, "gate_scalar": 0.73},
            {op: f"run-{op}" for op in operators},
        ),
    ]
    ranking = Ranking(operators, rank_settings(settings), trials=6)
    text = fragment_text(plan, {"ag_news": ranking}, "abc123")
    assert yaml.safe_load(text) == {
        "datasets": {
            "ag_news": {
                "train": {"lr": 0.00123, "batch_size": 16, "warmup_steps": 7},
                "model": {"dropout": 0.05},
            }
        }
    }
    assert "# Operators add, concat, gate_scalar, each sampled setting trained on every one" in text
    assert "# Chosen by mean validation rank" in text
    assert "# ag_news: 2 settings finished on every operator (6 trials" in text
    assert (
        "#   chosen 1.33: add 2 (0.7400), concat 1 (0.7200), gate_scalar 1 (0.7300); train.lr=0.00123"
        in text
    )
    assert (
        "#          1.67: add 1 (0.7500), concat 2 (0.7000), gate_scalar 2 (0.7100); train.lr=0.0005"
        in text
    )
    assert (
        "#   chosen setting's runs: add run-add, concat run-concat, gate_scalar run-gate_scalar"
        in text
    )
    path = tmp_path / "tuned" / "fragment.yaml"
    path.parent.mkdir()
    path.write_text(text)
    raw = yaml.safe_load((ROOT / "sweeps" / "full_grid.yaml").read_text())
    raw["extends"] = [str(ROOT / "sweeps" / "_study_datasets.yaml"), "tuned/fragment.yaml"]
    sweep = tmp_path / "full_grid_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    _assert_tuned(expand(load_sweep(sweep)), "ag_news")


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
    # same seed (and setting-axis values) => every operator's config is identical apart from
    # the operator itself
    for block in {(c.seed, c.axes) for c in tuned}:
        configs = []
        for cell in (c for c in tuned if (c.seed, c.axes) == block):
            flat = flatten(dataclasses.asdict(cell.trial))
            configs.append({k: v for k, v in flat.items() if not k.startswith("model.fusion")})
        assert all(c == configs[0] for c in configs)


@pytest.mark.unit
def test_the_fragment_is_consumed_by_the_quickstart(tmp_path):
    _fragment(tmp_path, "quick.yaml", "short")
    raw = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    raw["extends"] = ["tuned/fragment.yaml"]
    sweep = tmp_path / "quickstart_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    cells = expand(load_sweep(sweep))
    _assert_tuned(cells, "short")
    assert {c.fusion for c in cells if c.dataset == "short"} == set(raw["grid"]["fusions"])
    untouched = [c for c in cells if c.dataset != "short"]

    def own_lr(dataset: str) -> float:  # the preset's own, else the defaults'
        preset = raw["datasets"][dataset].get("train", {})
        return preset.get("lr", raw["defaults"]["train"]["lr"])

    assert untouched and all(c.trial.train.lr == own_lr(c.dataset) for c in untouched)


@pytest.mark.unit
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


@pytest.mark.ray
def test_quick_hpo_runs_end_to_end_and_feeds_a_sweep(
    tmp_path, ray_session, data_cache, mlflow_store, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the quick file's MLflow store and Tune results are relative paths
    mlflow_store(tmp_path / "mlflow.db")  # a new store where the file's relative URI points
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


@pytest.mark.ray
def test_shared_settings_are_tuned_on_several_operators_end_to_end(
    tmp_path, ray_session, data_cache, mlflow_store, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    quick = _quick()
    quick["name"] = "quick_shared_hpo"
    del quick["tune"]["fusion"], quick["tune"]["asha"]
    quick["tune"]["fusions"] = ["add", "concat"]
    quick["tune"]["num_samples"] = 2
    path = _write(tmp_path, yaml.safe_dump(quick))
    monkeypatch.chdir(tmp_path)  # the file's MLflow store and Tune results are relative paths
    mlflow_store(tmp_path / "mlflow.db")  # a new store where the file's relative URI points
    output = tmp_path / "tuned" / "shared.yaml"
    assert hpo_main([str(path), "--output", str(output)]) == 0
    assert "[short concat" in capsys.readouterr().out  # progress lines name the operator

    client = MlflowClient("sqlite:///mlflow.db")
    experiment = client.get_experiment_by_name("quick_shared_hpo")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'trial'")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    settings: dict[tuple, dict[str, object]] = {}
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        assert (tags["dataset"], tags["seed"]) == ("short", "1000")
        assert not {m for m in metrics if m.startswith("test_")}, (
            "tuning must never see the test split"
        )
        assert len(client.get_metric_history(run.info.run_id, "val_acc")) == 2  # no early stop
        values = tuple(run.data.params[key] for key in sorted(quick["tune"]["space"]))
        settings.setdefault(values, {})[tags["fusion"]] = run
    # each of the two sampled settings was trained once on each operator
    assert len(settings) == 2 and all(set(s) == {"add", "concat"} for s in settings.values())

    # the fragment holds a setting with the lowest mean rank (ties: the higher mean val_acc)
    def score(per_op: dict, op: str) -> float:
        return per_op[op].data.metrics["best_val_acc"]

    def mean_rank(values: tuple) -> float:
        ranks = []
        for op in ("add", "concat"):
            mine = score(settings[values], op)
            others = [score(s, op) for v, s in settings.items() if v != values]
            ranks.append(1 + sum(o > mine for o in others) + sum(o == mine for o in others) / 2)
        return sum(ranks) / 2

    def key(values: tuple) -> tuple:
        return (mean_rank(values), -sum(score(settings[values], op) for op in ("add", "concat")))

    tuned = yaml.safe_load(output.read_text())["datasets"]["short"]
    chosen = tuple(
        str(tuned[k.split(".")[0]][k.split(".")[1]]) for k in sorted(quick["tune"]["space"])
    )
    assert chosen in settings
    assert key(chosen) == min(key(v) for v in settings)
    text = output.read_text()
    assert "# Operators add, concat, each sampled setting trained on every one" in text
    assert f"#   chosen {mean_rank(chosen):.2f}: add " in text
    assert all(settings[chosen][op].info.run_id in text for op in ("add", "concat"))
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'sweep'")[0]
    assert parent.data.metrics["short.mean_rank"] == pytest.approx(mean_rank(chosen))
    assert parent.data.metrics["short.mean_best_val_acc"] == pytest.approx(-key(chosen)[1] / 2)

    # the fragment feeds a sweep over the same dataset, for every operator
    raw = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    raw["extends"] = ["tuned/shared.yaml"]
    sweep = tmp_path / "quickstart_tuned.yaml"
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))
    for cell in (c for c in expand(load_sweep(sweep)) if c.dataset == "short"):
        assert cell.trial.train.lr == tuned["train"]["lr"]
        assert cell.trial.model.dropout == tuned["model"]["dropout"]


@pytest.mark.unit
def test_the_tune_section_is_checked_as_a_grid_named_by_its_keys(tmp_path):
    """The tuning trials go through the sweep's own validation step: registry problems name the
    tune.* key, and the presets are checked even while the tune section itself is broken."""
    quick = _quick()
    quick["output"] = "tuned.yaml"
    quick["tune"]["position"] = "no_such_position"
    quick["tune"]["attention_position"] = {"name": "alibi", "no_such_option": 1}
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    wheres = sorted(p.split(":")[0] for p in info.value.problems)
    assert wheres == ["tune.attention_position", "tune.position"]
    assert "no_such_position" in str(info.value) and "no_such_option" in str(info.value)

    quick = _quick()
    quick["output"] = "tuned.yaml"
    del quick["tune"]["seed"]
    quick["defaults"]["train"]["lr"] = -1.0
    with pytest.raises(HpoFileError) as info:
        load_hpo(_write(tmp_path, yaml.safe_dump(quick)))
    text = str(info.value)
    assert "tune.seed: required field is missing" in text
    assert "defaults.train.lr: " in text and "-1.0" in text  # named where it was set
