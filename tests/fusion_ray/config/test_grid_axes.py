"""Any setting as a grid axis: validation before Ray starts, expansion, cell ids, tags and params."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from fusion_ray.config import SweepFileError, load_sweep
from fusion_ray.config.grid import axis_counts, expand
from fusion_ray.model import POSITIONS, build_classifier
from fusion_ray.model.spec import ModelSpec
from fusion_ray.schema import AXIS_TAG_PREFIX, POSITION_ALIAS_TAG, TRIAL_TAGS
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


def _sweep(tmp_path, mutate=None, **overrides):
    path = tiny_sweep(tmp_path, **overrides)
    if mutate is not None:
        raw = yaml.safe_load(path.read_text())
        mutate(raw)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _problems(path) -> list[str]:
    with pytest.raises(SweepFileError) as info:
        load_sweep(path)
    return info.value.problems


def _scale_axis(raw):
    raw["grid"]["model.scale_embeddings"] = [True, False]


def test_a_setting_axis_multiplies_the_cells_and_reaches_the_trial(tmp_path):
    plain = expand(load_sweep(_sweep(tmp_path / "a")))
    cells = expand(load_sweep(_sweep(tmp_path / "b", _scale_axis)))
    assert len(cells) == 2 * len(plain) == 8
    by_level = {
        text: [c for c in cells if c.axes == (("model.scale_embeddings", text),)]
        for text in ("true", "false")
    }
    assert [len(v) for v in by_level.values()] == [4, 4]
    assert all(c.trial.model.scale_embeddings for c in by_level["true"])
    assert not any(c.trial.model.scale_embeddings for c in by_level["false"])
    # The default level keeps the cell ids the sweep had without the axis (nothing re-runs);
    # the other level gets its own ids.
    assert {c.cell_id for c in by_level["true"]} == {c.cell_id for c in plain}
    assert not {c.cell_id for c in by_level["false"]} & {c.cell_id for c in plain}
    # Seed-major: every cell of seed 0 (both levels) comes before any cell of seed 1.
    assert [c.seed for c in cells] == [0] * 4 + [1] * 4
    assert axis_counts(cells)["model.scale_embeddings"] == {"true": 4, "false": 4}


def test_a_run_name_leads_with_what_tells_the_cell_from_its_siblings(tmp_path):
    """MLflow's run table shows the start of a name: the operator, the setting levels and the
    seed come first, where the run ran after them; every cell's name is its own."""
    cells = expand(load_sweep(_sweep(tmp_path, _scale_axis)))
    cell = next(c for c in cells if c.axes == (("model.scale_embeddings", "false"),))
    assert cell.run_name == (
        f"{cell.fusion} scale_embeddings=false seed {cell.seed} | short/sinusoidal/none"
    )
    assert len({c.run_name for c in cells}) == len(cells)


def test_setting_axes_are_tags_and_params(tmp_path):
    cells = expand(load_sweep(_sweep(tmp_path, _scale_axis)))
    cell = next(c for c in cells if c.axes == (("model.scale_embeddings", "false"),))
    tags = cell.tags("tiny", "abc")
    assert tags[f"{AXIS_TAG_PREFIX}model.scale_embeddings"] == "false"
    assert set(tags) == set(TRIAL_TAGS) | {
        "role",
        "gated",
        f"{AXIS_TAG_PREFIX}model.scale_embeddings",
    }
    assert cell.params()["model.scale_embeddings"] == "False"


def test_axes_on_train_and_data_settings_and_inside_kwargs(tmp_path):
    def mutate(raw):
        raw["grid"]["train.lr"] = [0.001, 0.0003]
        raw["grid"]["data.source_kwargs.n_train"] = [96, 160]
        del raw["defaults"]["train"]["lr"]
        del raw["datasets"]["short"]["data"]["source_kwargs"]["n_train"]

    cells = expand(load_sweep(_sweep(tmp_path, mutate)))
    assert len(cells) == 2 * 2 * 2 * 2  # fusions x lr x n_train x seeds
    combos = {(c.trial.train.lr, c.trial.data.source_kwargs["n_train"]) for c in cells}
    assert combos == {(0.001, 96), (0.001, 160), (0.0003, 96), (0.0003, 160)}
    # The other source options are kept, not replaced, when one inner option is an axis.
    assert all(c.trial.data.source_kwargs["regime"] == "short" for c in cells)
    assert len({c.cell_id for c in cells}) == len(cells)


def test_exclude_and_include_name_setting_axes(tmp_path):
    def mutate(raw):
        _scale_axis(raw)
        raw["exclude"] = [{"fusions": ["gate_scalar"], "model.scale_embeddings": [False]}]

    cells = expand(load_sweep(_sweep(tmp_path, mutate)))
    kept = {(c.fusion, c.axes[0][1]) for c in cells}
    assert kept == {("add", "true"), ("add", "false"), ("gate_scalar", "true")}

    def narrowed(raw):
        _scale_axis(raw)
        raw["grid"]["fusions"] = ["add"]
        raw["include"] = [{"fusions": ["concat"], "model.scale_embeddings": [True]}]

    cells = expand(load_sweep(_sweep(tmp_path / "n", narrowed)))
    assert {(c.fusion, c.axes[0][1]) for c in cells} == {
        ("add", "true"),
        ("add", "false"),
        ("concat", "true"),
    }


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda raw: raw["grid"].update({"model.d_modle": [8, 16]}),
            "grid.model.d_modle: model.d_modle is not a model setting; allowed: activation, d_ff, d_model",
        ),
        (
            lambda raw: raw["grid"].update({"optimizer": ["adam"]}),
            "grid.optimizer: unknown key; a grid axis is datasets, positions",
        ),
        (
            lambda raw: raw["grid"].update({"model.fusion": ["add"]}),
            "grid.model.fusion: set by grid.fusions, not a setting axis",
        ),
        (
            lambda raw: raw["grid"].update({"data.cache_dir": ["/tmp/a"]}),
            "grid.data.cache_dir: not an experimental setting",
        ),
        (
            lambda raw: raw["grid"].update({"model.scale_embeddings": True}),
            "grid.model.scale_embeddings: must be a non-empty list of values",
        ),
        (
            lambda raw: raw["grid"].update({"model.scale_embeddings": [True, True]}),
            "grid.model.scale_embeddings: 'true' is listed twice",
        ),
        (  # pinned by the shared defaults
            lambda raw: raw["grid"].update({"model.d_model": [16, 32]}),
            "defaults.model.d_model: varied by the grid axis model.d_model; remove it here",
        ),
        (  # pinned by a dataset preset
            lambda raw: raw["grid"].update({"data.max_length": [32, 64]}),
            "datasets.short.data.max_length: varied by the grid axis data.max_length",
        ),
        (
            lambda raw: raw.update({"exclude": [{"model.dropout": [0.1]}]}),
            "exclude[0].model.dropout: not a setting axis of grid:; add it to grid: first",
        ),
        (
            lambda raw: (
                _scale_axis(raw),
                raw.update({"exclude": [{"model.scale_embeddings": [3]}]}),
            ),
            "exclude[0].model.scale_embeddings: '3' is not a value of the axis; allowed: false, true",
        ),
    ],
)
def test_bad_setting_axes_are_refused_before_anything_runs(tmp_path, mutate, expected):
    problems = _problems(_sweep(tmp_path, mutate))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("key", "levels", "pairs"),
    [
        ("model.scale_embeddings", [True, 1], [("true", "1")]),
        ("model.scale_embeddings", [True, "True"], [("true", "True")]),
        ("model.scale_embeddings", [True, "yes"], [("true", "yes")]),
        ("model.scale_embeddings", [False, "no", "off"], [("false", "no"), ("false", "off")]),
        ("train.lr", [0.001, "1e-3"], [("0.001", "1e-3")]),
    ],
)
def test_levels_that_are_one_value_once_read_are_refused_naming_both(tmp_path, key, levels, pairs):
    """Each pair would be one trial twice (one cell id): trained twice at once into one run and
    one checkpoint folder, and an interaction comparing a level with itself."""

    def mutate(raw):
        raw["grid"][key] = levels
        raw["defaults"]["train"].pop(key.removeprefix("train."), None)

    problems = _problems(_sweep(tmp_path, mutate))
    for a, b in pairs:
        assert any(
            p.startswith(f"grid.{key}: {a!r} and {b!r} are one value once read") for p in problems
        ), problems
    assert all("list each value once" in p for p in problems), problems


def test_an_include_repeating_a_grid_level_in_another_spelling_is_refused(tmp_path):
    def mutate(raw):
        _scale_axis(raw)
        raw["include"] = [{"model.scale_embeddings": ["on"]}]

    problems = _problems(_sweep(tmp_path, mutate))
    assert any("'true' and 'on' are one value once read" in p for p in problems), problems


def test_a_value_of_the_wrong_type_names_its_grid_point(tmp_path):
    def mutate(raw):
        raw["grid"]["train.lr"] = [0.001, "fast"]
        del raw["defaults"]["train"]["lr"]

    problems = _problems(_sweep(tmp_path, mutate))
    assert len(problems) == 1, problems
    assert problems[0].startswith("grid point short/sinusoidal/none/add/train.lr=fast: train.lr:")


def test_an_axis_value_that_breaks_a_cross_field_rule_is_refused(tmp_path):
    def mutate(raw):  # heads must divide d_model: 3 does not divide 16
        raw["grid"]["model.n_heads"] = [2, 3]
        del raw["defaults"]["model"]["n_heads"]

    problems = _problems(_sweep(tmp_path, mutate))
    assert problems and all("model.n_heads=3" in p for p in problems), problems


def test_the_parent_run_records_the_axes_in_file_order(tmp_path):
    from fusion_ray.schema import GRID_AXES_TAG

    spec = load_sweep(
        _sweep(tmp_path, lambda raw: raw["grid"].update({"model.scale_embeddings": [False, True]}))
    )
    # What the driver writes to the parent run (fusion_ray.sweep): level texts, in file order.
    from fusion_ray.schema import axis_text

    tag = json.dumps({k: [axis_text(v) for v in vs] for k, vs in spec.grid.settings.items()})
    assert json.loads(tag) == {"model.scale_embeddings": ["false", "true"]}
    assert GRID_AXES_TAG == "grid_axes"


def test_an_alias_position_is_tagged_with_the_entry_it_equals(tmp_path):
    def mutate(raw):
        raw["grid"]["positions"] = ["learned", "relative_table"]

    cells = expand(load_sweep(_sweep(tmp_path, mutate)))
    tags = {c.position: c.tags("tiny", "abc") for c in cells}
    assert tags["relative_table"][POSITION_ALIAS_TAG] == "learned"
    assert POSITION_ALIAS_TAG not in tags["learned"]


@pytest.mark.parametrize("alias", [n for n in POSITIONS.names() if POSITIONS.same_as(n)])
def test_a_registered_alias_is_the_same_model(alias):
    """``same_as`` is a claim the report relies on (it tests an alias once): hold it to it."""
    canonical = POSITIONS.same_as(alias)
    spec = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32, dropout=0.0)
    a = build_classifier(ModelSpec(position=alias, **spec), vocab_size=50, num_classes=3, seed=7)
    b = build_classifier(
        ModelSpec(position=canonical, **spec), vocab_size=50, num_classes=3, seed=7
    )
    va, vb = list(a.state_dict().values()), list(b.state_dict().values())
    assert len(va) == len(vb)
    assert all(torch.equal(x, y) for x, y in zip(va, vb, strict=True))
    ids = torch.randint(1, 50, (3, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 20, dtype=torch.bool)
    a.eval()
    b.eval()
    assert torch.equal(a(ids, mask), b(ids, mask))


# ----------------------------------------------------------------------------- overrides


def _with_override(override):
    def mutate(raw):
        raw["grid"]["attention_positions"] = ["none", "alibi"]
        raw["overrides"] = [override]

    return mutate


def test_an_override_sets_how_a_step_is_computed_for_the_cells_it_selects(tmp_path):
    override = {"where": {"attention_positions": ["alibi"]}, "train": {"micro_batch_size": 8}}
    cells = expand(load_sweep(_sweep(tmp_path, _with_override(override))))
    by_attention = {
        a: {c.trial.train.micro_batch_size for c in cells if c.attention_position == a}
        for a in ("none", "alibi")
    }
    assert by_attention == {"none": {None}, "alibi": {8}}
    # Every operator of a paired block gets the same value, so the pair's configs still agree.
    for seed in (0, 1):
        block = [c for c in cells if c.seed == seed and c.attention_position == "alibi"]
        assert {c.fusion for c in block} == {"add", "gate_scalar"}
        assert {c.trial.train.micro_batch_size for c in block} == {8}
    # Cells it does not select keep the ids they had without it.
    plain = expand(load_sweep(_sweep(tmp_path / "plain")))
    assert {c.cell_id for c in cells if c.attention_position == "none"} >= {
        c.cell_id for c in plain
    }


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"where": {"fusions": ["add"]}, "train": {"micro_batch_size": 8}},
            "overrides[0].where.fusions: an override may not select operators",
        ),
        (
            {"where": {"attention_positions": ["alibi"]}, "train": {"lr": 0.1}},
            "overrides[0].train.lr: an override may set only micro_batch_size, eval_batch_size",
        ),
        (
            {"where": {"attention_positions": ["rope"]}, "train": {"micro_batch_size": 8}},
            "overrides[0].where.attention_positions: 'rope' is in no grid",
        ),
        (  # 32 documents per step cannot be cut into micro-batches of 5
            {"where": {"attention_positions": ["alibi"]}, "train": {"micro_batch_size": 5}},
            "micro_batch_size",
        ),
    ],
)
def test_bad_overrides_are_refused_before_anything_runs(tmp_path, override, expected):
    problems = _problems(_sweep(tmp_path, _with_override(override)))
    assert any(expected in p for p in problems), problems
