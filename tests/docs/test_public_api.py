"""docs/reference/public-api.md is what the code promises: each listed module exports exactly
the names the page lists, every listed base class exists, and the page names the entry-point
group of every registry."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

PAGE = (ROOT / "docs" / "reference" / "public-api.md").read_text()


def _table(heading: str) -> list[list[str]]:
    """The body rows of the first table after ``heading``, as cells."""
    part = PAGE.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@pytest.mark.parametrize("row", _table("## Modules"), ids=lambda row: row[0].strip("`"))
def test_a_listed_module_exports_exactly_the_listed_names(row):
    (module_name,) = _names(row[0])
    module = importlib.import_module(module_name)
    listed = _names(row[1])
    assert sorted(module.__all__) == sorted(listed), f"{module_name}: update the page or __all__"
    assert all(hasattr(module, name) for name in listed)


def test_every_listed_base_class_exists_and_every_group_is_listed():
    from analysis.sections.registry import REGISTRY as SECTIONS
    from analysis.stats.registry import REGISTRY as STATISTICS
    from fusion_ray.cli import registries
    from fusion_ray.decide.rules import RULES
    from fusion_ray.driver.workload import WORKLOADS
    from fusion_ray.launch import LAUNCHERS
    from fusion_ray.trainables import TRAINABLES

    rows = _table("## Plug-in base classes")
    for row in rows:
        for dotted in _names(row[0]):
            module, _, name = dotted.rpartition(".")
            if module and module.split(".")[0] in ("fusion_ray", "analysis"):
                assert hasattr(importlib.import_module(module), name), dotted
    listed = {group for row in rows for group in _names(row[1])}
    groups = {
        r.group
        for r in [
            *registries().values(),
            RULES,
            STATISTICS,
            SECTIONS,
            LAUNCHERS,
            TRAINABLES,
            WORKLOADS,
        ]
    }
    assert listed == groups
