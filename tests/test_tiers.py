"""The tier check of tests/conftest.py: every test under tests/ in exactly one tier, a unit test
never starting Ray, and the failure names each test, on one process and on pytest-xdist workers
(where a UsageError would lose its message)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import TESTS, TIER_TIMEOUT_S, pytest_collection_modifyitems

pytestmark = pytest.mark.unit


class _Item:
    """What the check reads of a collected test: its id, path, markers and fixtures."""

    def __init__(self, name: str, marks: tuple[str, ...], fixtures=(), path: Path | None = None):
        self.nodeid = f"tests/test_new.py::{name}"
        self.path = path or TESTS / "test_new.py"
        self.marks = [SimpleNamespace(name=m) for m in marks]
        self.fixturenames = fixtures

    def iter_markers(self):
        return iter(self.marks)

    def get_closest_marker(self, name: str):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark) -> None:
        self.marks.append(mark.mark)


def _items() -> list[_Item]:
    return [
        _Item("test_fine", ("unit", "parametrize")),
        _Item("test_untiered", ("parametrize",)),
        _Item("test_twice", ("ray", "process")),
        _Item("test_unit_with_ray", ("unit",), fixtures=("tmp_path", "ray_session")),
        _Item("test_elsewhere", (), path=TESTS.parent / "examples" / "plugin" / "test_x.py"),
    ]


def _assert_names_every_problem(message: str) -> None:
    assert message.startswith("3 test(s) must be in exactly one tier (unit, ray, process,")
    assert "tests/test_new.py::test_untiered: has none" in message
    assert "tests/test_new.py::test_twice: has process, ray" in message
    assert "test_unit_with_ray: is unit but starts Ray (ray_session): at least ray" in message
    assert "test_fine" not in message and "test_elsewhere" not in message
    assert "pytestmark = pytest.mark.unit" in message


def test_one_process_fails_the_collection_naming_each_test():
    items = _items()
    with pytest.raises(pytest.UsageError) as info:
        pytest_collection_modifyitems(SimpleNamespace(), items)
    _assert_names_every_problem(str(info.value))
    fine = [i for i in _items() if i.nodeid.endswith(("test_fine", "test_elsewhere"))]
    pytest_collection_modifyitems(SimpleNamespace(), fine)  # no problem: nothing raised
    assert len(fine) == 2  # and nothing taken away


def test_an_xdist_worker_reports_a_failed_collection_and_runs_nothing():
    reports = []
    worker = SimpleNamespace(
        workerinput={"workerid": "gw0"},
        hook=SimpleNamespace(pytest_collectreport=lambda report: reports.append(report)),
    )
    items = _items()
    pytest_collection_modifyitems(worker, items)
    assert items == []
    (report,) = reports
    assert report.failed and report.nodeid == "tests/conftest.py"
    _assert_names_every_problem(str(report.longrepr))


def test_each_tiered_test_gets_its_tiers_time_limit_unless_it_sets_its_own():
    items = [_Item("test_a", ("process",)), _Item("test_b", ("cluster",))]
    items[1].marks.append(pytest.mark.timeout(60).mark)
    pytest_collection_modifyitems(SimpleNamespace(), items)
    assert items[0].get_closest_marker("timeout").args == (TIER_TIMEOUT_S["process"],)
    assert items[1].get_closest_marker("timeout").args == (60,)
    assert [m.name for m in items[1].marks].count("timeout") == 1


def test_this_run_enforces_the_limit(request):
    """pytest-timeout is loaded and this test carries the unit tier's limit."""
    assert request.config.pluginmanager.hasplugin("timeout")
    assert request.node.get_closest_marker("timeout").args == (TIER_TIMEOUT_S["unit"],)
