"""The documentation's generated reference (docs/reference_gen.py, run by MkDocs on every
build) covers what the code has: every field of the typed config, every name of the MLflow
schema, every command and every registry entry; and every page's generated marker names a
generator. (CI builds the whole site with ``mkdocs build --strict``.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("reference_gen", ROOT / "docs/reference_gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(cls) -> list[str]:
    if hasattr(cls, "model_fields"):
        return list(cls.model_fields)
    return [f.name for f in dataclasses.fields(cls)]


def test_every_config_field_is_in_the_sweep_file_reference(gen):
    from fusion_ray.config import SweepSpec
    from fusion_ray.data import DataSpec
    from fusion_ray.hpo import TuneSection
    from fusion_ray.model import ModelSpec
    from fusion_ray.train import TrainSpec

    pages = {
        SweepSpec: gen.GENERATORS["sweep-file"](),
        DataSpec: gen.GENERATORS["data-settings"](),
        ModelSpec: gen.GENERATORS["model-settings"](),
        TrainSpec: gen.GENERATORS["train-settings"](),
        TuneSection: gen.GENERATORS["hpo-file"](),
    }
    for cls, text in pages.items():
        for nested in gen.nested_classes(cls, {}).values():
            if nested is not cls and f"### {nested.__name__}" not in "".join(pages.values()):
                pytest.fail(f"{nested.__name__} (nested in {cls.__name__}) has no section")
        for name in _fields(cls):
            assert f"| `{name}` |" in text, f"{cls.__name__}.{name} is missing"
    assert "| `storage_path` | str | `ray_results` |" in pages[SweepSpec]
    lr = re.search(r"\| `lr` \|[^\n]*", pages[TrainSpec]).group(0)
    assert "<= 10" in lr, lr  # constraints come from the field


def test_every_schema_name_and_command_and_entry_is_generated(gen):
    from analysis.stats import statistics
    from fusion_ray import schema
    from fusion_ray.cli import COMMANDS, registries
    from fusion_ray.decide.rules import RULES
    from fusion_ray.launch import LAUNCHERS

    text = gen.GENERATORS["mlflow-schema"]()
    for name in (n for n in vars(schema) if n.isupper() and not n.startswith("_")):
        assert f"| `{name}` |" in text, name
    assert "| `TRIAL_TAGS` | `cell_id`, `dataset`," in text
    cli = gen.GENERATORS["cli"]()
    for command in COMMANDS:
        assert f"### `fusion-ray {command}`" in cli
    assert "usage: python -m fusion_ray.sweep" in cli and "--take-over" in cli
    for target in LAUNCHERS.names():
        assert f"usage: fusion-ray cluster {target} " in cli, target
    entries = gen.GENERATORS["registries"]()
    for registry in [*registries().values(), RULES, LAUNCHERS]:
        for name in registry.names():
            assert f"| `{name}` | {registry.origin(name)} |" in entries, name
    for stat in statistics():
        assert f"| `{stat.name}` |" in entries, stat.name
    assert "`kernel_size` = `7`" in entries


def test_every_generated_marker_of_the_pages_has_a_generator(gen):
    used = set()
    for page in (ROOT / "docs").rglob("*.md"):
        used |= set(re.findall(r"^<!-- generated: ([a-z-]+) -->$", page.read_text(), re.M))
    assert used == set(gen.GENERATORS)
