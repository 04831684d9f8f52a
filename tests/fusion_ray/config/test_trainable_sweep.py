"""A trainable sweep file (``trainable: NAME``): its schema, the problems it is refused with
(each naming its key and the fix), and its cells: configs, arms, groups, ids and pairing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fusion_ray.config.files import SweepFileError, load_trainable_sweep
from fusion_ray.config.trainable import (
    trainable_cells,
    trainable_names,
    with_levels,
)

pytestmark = pytest.mark.unit

SWEEP = {
    "name": "smoothing",
    "trainable": "study",
    "defaults": {"epochs": 3, "optim": {"lr": 0.01}},
    "grid": {"label_smoothing": [0.0, 0.1], "hidden": [16, 64]},
    "seeds": [0, 1, 2],
}


def _write(tmp_path: Path, **changes) -> Path:
    raw = {**SWEEP, **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _problems(tmp_path: Path, **changes) -> str:
    with pytest.raises(SweepFileError) as caught:
        load_trainable_sweep(_write(tmp_path, **changes))
    return str(caught.value)


def test_a_minimal_file_compares_the_first_axis_against_its_first_level(tmp_path):
    spec = load_trainable_sweep(_write(tmp_path))
    assert (spec.axis, spec.baseline_label) == ("label_smoothing", "label_smoothing=0.0")
    assert (spec.metric.name, spec.metric.mode) == (None, "max")
    assert spec.adaptive is None and spec.seeds == [0, 1, 2]


def test_an_adaptive_block_and_a_chosen_axis_baseline_and_metric(tmp_path):
    spec = load_trainable_sweep(
        _write(
            tmp_path,
            seeds={"adaptive": True, "first": 4, "max": 10},
            compare={"axis": "hidden", "baseline": 64},
            metric={"name": "val_loss", "mode": "min"},
        )
    )
    assert spec.seeds == list(range(10)) and spec.adaptive is not None
    assert spec.adaptive.first == 4
    assert (spec.axis, spec.baseline_label, spec.metric.mode) == ("hidden", "hidden=64", "min")


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"trainable": "stduy"},
            "trainable: unknown trainable 'stduy'; allowed: .*did you mean 'study'",
        ),
        (
            {"compare": {"axis": "label_smothing"}},
            "compare.axis: unknown grid axis 'label_smothing'.*did you mean 'label_smoothing'",
        ),
        (
            {"compare": {"baseline": 0.5}},
            r"compare.baseline: '0.5' is not a level of grid.label_smoothing; its levels: 0.0, 0.1",
        ),
        (
            {"grid": {"label_smoothing": [0.0], "hidden": [16]}},
            "the compared axis needs two levels or more",
        ),
        (
            {"grid": {"label_smoothing": [0.0, 0.0, 0.1]}},
            r"grid.label_smoothing: levels \['0.0'\] are given twice",
        ),
        (
            {"grid": {"label_smoothing": [0.0, 0.1], "epochs.n": [1, 2]}},
            "grid.epochs.n: defaults.epochs is 3, not a mapping",
        ),
        ({"grid": {}}, "grid: "),
        ({"metric": {"mode": "maximise"}}, "metric.mode: "),
        ({"seeds": [0, 0, 1]}, r"duplicate seeds \[0\]"),
        ({"trainabel": "study"}, "trainabel: unknown key"),
        ({"grid": {"label_smoothing": [[0.0], 0.1]}}, "grid.label_smoothing.0"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key_and_the_fix(tmp_path, changes, says):
    problems = _problems(tmp_path, **changes)
    assert re.search(says, problems), problems


def test_cells_are_seed_major_and_pair_the_compared_arms_within_a_group(tmp_path):
    spec = load_trainable_sweep(_write(tmp_path))
    cells = trainable_cells(spec)
    assert len(cells) == 2 * 2 * 3
    assert [c.seed for c in cells] == sorted(c.seed for c in cells)
    first = cells[:4]
    assert [(c.level, c.group) for c in first] == [
        ("label_smoothing=0.0", (("hidden", "16"),)),
        ("label_smoothing=0.0", (("hidden", "64"),)),
        ("label_smoothing=0.1", (("hidden", "16"),)),
        ("label_smoothing=0.1", (("hidden", "64"),)),
    ]
    assert first[2].config == {
        "epochs": 3,
        "optim": {"lr": 0.01},
        "label_smoothing": 0.1,
        "hidden": 16,
    }
    assert first[2].run_name == "label_smoothing=0.1 seed 0 | hidden=16"
    assert first[2].tags("smoothing", "abc")["axis.label_smoothing"] == "0.1"
    assert first[2].params()["optim.lr"] == "0.01"


def test_cell_ids_are_stable_and_differ_by_seed_and_by_config(tmp_path):
    spec = load_trainable_sweep(_write(tmp_path))
    ids = [c.cell_id for c in trainable_cells(spec)]
    assert len(set(ids)) == len(ids)
    assert ids == [c.cell_id for c in trainable_cells(load_trainable_sweep(_write(tmp_path)))]
    other = load_trainable_sweep(_write(tmp_path, defaults={"epochs": 4, "optim": {"lr": 0.01}}))
    assert not set(ids) & {c.cell_id for c in trainable_cells(other)}


def test_dotted_keys_set_nested_settings_without_touching_the_defaults():
    defaults = {"optim": {"lr": 0.01, "betas": [0.9, 0.99]}}
    config = with_levels(defaults, {"optim.lr": 0.1, "model.width": 8})
    assert config == {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "model": {"width": 8}}
    assert defaults == {"optim": {"lr": 0.01, "betas": [0.9, 0.99]}}


def test_the_installed_trainables_are_known_by_name():
    assert "study" in trainable_names()


def test_an_adaptive_schedule_decides_a_trainable_sweep_per_group(tmp_path):
    """The engine's schedule on a trainable sweep's cells: one comparison per group (the
    compared level against the baseline within each level of the other axis) and the
    interaction; a clear effect in every group is decided better, the null interaction is not
    decided, and cells run only while a question is open."""
    from fusion_ray.policy.schedule import SeedSchedule

    spec = load_trainable_sweep(_write(tmp_path, seeds={"adaptive": True, "first": 4, "max": 12}))
    cells = trainable_cells(spec)
    results: dict = {}
    schedule = SeedSchedule(
        cells, spec.baseline_label, spec.adaptive, results, spec.regimes, spec.regime_key
    )
    assert [h.name for h in schedule.family] == [
        "hidden=16: label_smoothing=0.1 vs label_smoothing=0.0",
        "hidden=64: label_smoothing=0.1 vs label_smoothing=0.0",
        "hidden=64-16: label_smoothing=0.1 vs label_smoothing=0.0",
    ]
    ran = 0
    while needed := schedule.needed():
        for cell in needed:  # +5 points for smoothing in every group, the same in both
            bump = 0.05 if cell.level == "label_smoothing=0.1" else 0.0
            results[cell.cell_id] = 0.8 + bump + 0.001 * ((cell.seed * 7 + len(cell.cell_id)) % 5)
        ran += len(needed)
    states = {name: seq[-1] for name, seq in schedule.states().items()}
    assert states["hidden=16: label_smoothing=0.1 vs label_smoothing=0.0"] == "better"
    assert states["hidden=64: label_smoothing=0.1 vs label_smoothing=0.0"] == "better"
    assert states["hidden=64-16: label_smoothing=0.1 vs label_smoothing=0.0"] != "better"
    assert ran < len(cells)


def test_a_length_question_is_refused_for_a_trainable_sweep(tmp_path):
    problems = _problems(tmp_path, seeds={"adaptive": True, "decide": ["operator", "length"]})
    assert "seeds.decide: length asks about document length" in problems


def test_the_sweep_command_checks_a_trainable_sweep_file_as_one(tmp_path, capsys):
    """Not the study's keys it lacks: its own problems (exit 2, before any compute); a clean
    one is planned (its dry run)."""
    from fusion_ray.sweep import main

    assert main([str(_write(tmp_path, trainable="stduy")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown trainable 'stduy'" in err and "datasets" not in err
    assert main([str(_write(tmp_path)), "--dry-run"]) == 0
    assert "trainable study:" in capsys.readouterr().out


def test_the_study_loader_sends_a_trainable_file_to_the_loader_of_both(tmp_path):
    from fusion_ray.config import SweepFileError, load_sweep

    with pytest.raises(SweepFileError, match=r"load it with fusion_ray.api.load"):
        load_sweep(_write(tmp_path))


def test_a_trend_axis_asks_whether_the_difference_grows_along_it(tmp_path):
    """``trend: hidden``: the comparison's difference at the axis's last level minus at its
    first is a hypothesis of the family (kind ``length``, the study's question over its
    datasets), not an interaction; an effect that grows along the axis is decided to grow."""
    from fusion_ray.policy.schedule import SeedSchedule

    seeds = {"adaptive": True, "first": 4, "max": 14}
    grid = {"label_smoothing": [0.0, 0.1], "hidden": [16, 32, 64], "dropout": [0.0, 0.5]}
    spec = load_trainable_sweep(_write(tmp_path, seeds=seeds, grid=grid, trend="hidden"))
    assert spec.regimes == ["16", "32", "64"]
    cells = trainable_cells(spec)
    results: dict = {}
    schedule = SeedSchedule(
        cells, spec.baseline_label, spec.adaptive, results, spec.regimes, spec.regime_key
    )
    kinds = [h.kind for h in schedule.family]
    assert kinds.count("operator") == 6 and kinds.count("length") == 2
    assert kinds.count("interaction") == 3  # dropout only: hidden is the trend, not a setting
    grows = "hidden=64-16/dropout=0.0: label_smoothing=0.1 vs label_smoothing=0.0"
    assert grows in schedule.by_name
    while needed := schedule.needed():
        for cell in needed:  # smoothing's gain: 0 at width 16, 2 points at 32, 6 at 64
            gain = {"16": 0.0, "32": 0.02, "64": 0.06}[dict(cell.axes)["hidden"]]
            bump = gain if cell.level == "label_smoothing=0.1" else 0.0
            results[cell.cell_id] = 0.8 + bump + 0.001 * ((cell.seed * 7 + len(cell.cell_id)) % 5)
    states = {name: seq[-1] for name, seq in schedule.states().items()}
    assert states[grows] == "better" and schedule.by_name[grows].verdict("better") == "grows"
    assert states["hidden=16/dropout=0.0: label_smoothing=0.1 vs label_smoothing=0.0"] != "better"


@pytest.mark.parametrize(
    "trend, said",
    [
        ("width", "trend: unknown grid axis 'width'"),
        ("label_smoothing", "trend: label_smoothing is the compared axis"),
    ],
)
def test_a_trend_axis_the_grid_does_not_allow_is_refused(tmp_path, trend, said):
    assert said in _problems(tmp_path, trend=trend)
