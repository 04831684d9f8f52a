"""Plug-in registries: entries another installed package declares under an entry-point group
are found in any fresh process (as a Ray worker is), a name declared twice is an error that
names both packages, and a plug-in that cannot be loaded is listed as broken and is an error
only where it is selected by name."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fusion_ray.registry import BUILT_IN, BrokenEntryError, Registry
from tests.conftest import ROOT

# The fresh-process tests are `process`, the in-process ones `unit`: a marker on each test.

PLUGIN = '''
import torch

from fusion_ray.model.fusion import Fusion


class HalfAdd(Fusion):
    """H = E + scale * P: a plug-in operator for the tests."""

    def __init__(self, d_model: int, *, scale: float = 0.5) -> None:
        super().__init__(d_model)
        self.scale = scale

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return E + self.scale * P
'''


def _install(
    site: Path,
    dist: str,
    entry_name: str,
    code: str = PLUGIN,
    group: str = "fusion_ray.fusions",
    target: str = "HalfAdd",
) -> Path:
    """A package (``code``) and its dist-info, with the entry point ``entry_name`` in ``group``
    naming ``target``, under ``site``: found by importlib.metadata when ``site`` is on the path,
    as an installed plug-in package is."""
    module = dist.replace("-", "_")
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(code)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry_name} = {module}:{target}\n")
    return site


def _run(code: str, *sites: Path) -> subprocess.CompletedProcess:
    path = ":".join([*(str(s) for s in sites), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.process
def test_a_plugin_operator_is_found_in_a_fresh_process_with_its_origin(tmp_path):
    site = _install(tmp_path / "site", "fusion-half-add", "half_add")
    proc = _run(
        """
        import torch
        from fusion_ray.model import FUSIONS
        op = FUSIONS.build("half_add", 4, scale=0.25)
        E, P = torch.ones(1, 2, 4), torch.full((1, 2, 4), 4.0)
        print(FUSIONS.origin("half_add"), FUSIONS.origin("add"), float(op(E, P)[0, 0, 0]))
        print(FUSIONS.check("half_add", {"scale": "big"}))
        """,
        site,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "fusion-half-add fusion-ray 2.0"
    assert "option scale" in second and "'big'" in second


@pytest.mark.process
def test_a_plugin_name_clashing_with_a_built_in_names_both_packages(tmp_path):
    site = _install(tmp_path / "site", "fusion-shadow", "add")
    proc = _run("from fusion_ray.model import FUSIONS; FUSIONS.names()", site)
    assert proc.returncode != 0
    assert "fusion 'add' is registered twice: by fusion-ray and by fusion-shadow" in proc.stderr


@pytest.mark.process
def test_two_plugins_declaring_one_name_are_an_error_naming_both(tmp_path):
    one = _install(tmp_path / "one", "fusion-one", "half_add")
    two = _install(tmp_path / "two", "fusion-two", "half_add")
    proc = _run("from fusion_ray.model import FUSIONS; FUSIONS.names()", one, two)
    assert proc.returncode != 0
    assert "fusion-one" in proc.stderr and "fusion-two" in proc.stderr
    assert "'half_add' is registered twice" in proc.stderr


SOURCE_PLUGIN = '''
from fusion_ray.data.sources import RawDataset, RawSplit


class Tiny:
    """A plug-in source of three classes that says so before loading."""

    def __init__(self, *, n: int = 30) -> None:
        self.n = n

    def problems(self):
        return [] if self.n >= 3 else [f"data.source_kwargs.n: at least 3 (got {self.n})"]

    def fingerprint(self):
        return {"version": 1}

    def declared_num_classes(self):
        return 3

    def load(self):
        texts = [f"word{i % 3} text" for i in range(self.n)]
        split = RawSplit(texts, [i % 3 for i in range(self.n)], origin="tiny")
        return RawDataset({"train": split, "test": split}, num_classes=3)


class Broken:
    """Registered as a source but without the protocol's methods."""

    def __init__(self) -> None:
        pass
'''


@pytest.mark.process
def test_a_plugin_source_gets_the_same_checks_before_ray_starts(tmp_path):
    site = tmp_path / "site"
    (site / "tiny_source").mkdir(parents=True)
    (site / "tiny_source" / "__init__.py").write_text(SOURCE_PLUGIN)
    info = site / "tiny_source-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-source\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fusion_ray.sources]\ntiny = tiny_source:Tiny\nbroken = tiny_source:Broken\n"
    )
    proc = _run(
        """
        from fusion_ray.data import DataSpec, check_data_spec
        print(check_data_spec(DataSpec(source="tiny", source_kwargs={}, num_classes=2)))
        print(check_data_spec(DataSpec(source="tiny", source_kwargs={"n": 1})))
        print(check_data_spec(DataSpec(source="broken", source_kwargs={})))
        """,
        site,
    )
    assert proc.returncode == 0, proc.stderr
    fewer, small, broken = proc.stdout.splitlines()
    assert "2 is fewer than the 3 classes the tiny source has" in fewer
    assert "at least 3 (got 1)" in small
    assert (
        "'broken' (from tiny-source) does not provide problems(), fingerprint() and load()"
        in broken
    )


STATISTIC_PLUGIN = """
from analysis.stats import Statistic

MEDIAN_SIGN = Statistic(
    name="positive_share",
    columns=("positive_share",),
    compute=lambda d: {"positive_share": float((d.num > 0).mean())},
    method="**Positive share**: the share of seeds on which the operator wins.",
)
"""


def _install_statistic(
    site: Path, dist: str, entry_name: str, code: str = STATISTIC_PLUGIN
) -> Path:
    return _install(site, dist, entry_name, code, "fusion_ray.statistics", "MEDIAN_SIGN")


@pytest.mark.process
def test_a_plugin_statistic_is_computed_for_every_comparison_in_a_fresh_process(tmp_path):
    site = _install_statistic(tmp_path / "site", "fusion-positive-share", "positive_share")
    proc = _run(
        """
        import numpy as np
        from analysis.stats import StatsSettings, describe_deltas, origin
        row = describe_deltas(np.array([3, -1, 2, 5]), 100, StatsSettings())
        print(origin("positive_share"), origin("wilcoxon"), row["positive_share"])
        """,
        site,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fusion-positive-share", "analysis", "(built", "in)", "0.75"]
    listed = _run("from fusion_ray.cli import list_entries; print(list_entries())", site)
    assert "positive_share       [fusion-positive-share]" in listed.stdout


@pytest.mark.process
def test_a_plugin_statistic_clashing_with_a_built_in_names_both(tmp_path):
    shadow = STATISTIC_PLUGIN.replace('name="positive_share"', 'name="wilcoxon"')
    site = _install_statistic(tmp_path / "site", "fusion-stat-shadow", "wilcoxon", shadow)
    proc = _run("from analysis.stats import statistics; statistics()", site)
    assert proc.returncode != 0
    assert (
        "statistic 'wilcoxon' is registered twice: by analysis (built in) and by "
        "fusion-stat-shadow" in proc.stderr
    )


BROKEN_PLUGIN = "import fusion_broken_dependency  # not installed\n"
"""A plug-in module whose import fails, as one whose dependency is missing does."""

BROKEN_LINE = (
    "  broken_op            [fusion-broken]  BROKEN: cannot be imported (ModuleNotFoundError: "
    "No module named 'fusion_broken_dependency'): reinstall or remove fusion-broken"
)


@pytest.fixture
def broken_fusion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The fusion ``broken_op`` of the package ``fusion-broken``, whose module cannot be
    imported, installed (a real dist-info on sys.path); FUSIONS as a fresh process has it (its
    built-ins, the plug-ins loaded at its next look), and as it was again after the test."""
    from fusion_ray.model import FUSIONS

    FUSIONS.load_plugins()  # the plug-ins installed now, before the broken one
    built_in = {name for name, origin in FUSIONS._origin.items() if origin == BUILT_IN}
    for key, value in list(vars(FUSIONS).items()):
        if isinstance(value, dict):  # the registry's tables, keyed by entry name
            monkeypatch.setattr(FUSIONS, key, {k: v for k, v in value.items() if k in built_in})
    monkeypatch.setattr(FUSIONS, "_plugins_loaded", False)
    site = _install(tmp_path / "site", "fusion-broken", "broken_op", BROKEN_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    return FUSIONS


def _quickstart_with_fusions(*fusions: str) -> list[str]:
    """The problems of sweeps/quickstart.yaml with its grid's fusions replaced."""
    from fusion_ray.config.files import read_sweep_dict, validate_sweep_dict

    raw = read_sweep_dict(ROOT / "sweeps" / "quickstart.yaml")
    raw["grid"]["fusions"] = list(fusions)
    return validate_sweep_dict(raw)[1]


@pytest.mark.unit
def test_a_plugin_that_cannot_be_imported_is_listed_as_broken_with_its_package(broken_fusion):
    from fusion_ray.cli import list_entries

    listed = list_entries().splitlines()
    assert BROKEN_LINE in listed
    assert any(line.startswith("  add ") for line in listed)
    assert "broken_op" not in broken_fusion.names()


@pytest.mark.unit
def test_a_sweep_file_not_naming_a_broken_plugin_still_validates(broken_fusion, caplog):
    with caplog.at_level(logging.WARNING, logger="fusion_ray.registry"):
        assert _quickstart_with_fusions("add", "gate_scalar") == []
    warnings = [r for r in caplog.records if "broken_op" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "fusion-broken" in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # no traceback


@pytest.mark.unit
def test_a_sweep_file_naming_a_broken_plugin_gets_one_problem_naming_its_package(broken_fusion):
    assert _quickstart_with_fusions("add", "broken_op") == [
        "grid.fusions[1]: fusion 'broken_op' from fusion-broken (entry point "
        "fusion_broken:HalfAdd) cannot be imported (ModuleNotFoundError: No module named "
        "'fusion_broken_dependency'): reinstall fusion-broken (pip install --force-reinstall "
        "fusion-broken), or uninstall it (pip uninstall fusion-broken)"
    ]


@pytest.mark.unit
def test_selecting_a_broken_plugin_by_name_is_an_error_naming_its_package(broken_fusion):
    with pytest.raises(BrokenEntryError, match="'broken_op' from fusion-broken") as raised:
        broken_fusion.get("broken_op")
    assert "ModuleNotFoundError: No module named 'fusion_broken_dependency'" in str(raised.value)
    assert "pip uninstall fusion-broken" in str(raised.value)
    assert broken_fusion.check("broken_op", {}) == [str(raised.value)]
    with pytest.raises(BrokenEntryError):
        broken_fusion.build("broken_op", 4)
    assert broken_fusion.get("add") is not None


def _refuse(loaded: object, origin: str) -> object:
    raise TypeError(f"{origin}: {loaded!r} is not an operator\nsecond line")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("code", "target", "accept", "error", "reason"),
    [
        ("def broken(:\n", "HalfAdd", None, "SyntaxError: ", "cannot be imported"),
        (
            "raise RuntimeError('no GPU')\n",
            "HalfAdd",
            None,
            "RuntimeError: no GPU",
            "cannot be imported",
        ),
        ("X = 1\n", "HalfAdd", None, "AttributeError: ", "cannot be imported"),
        ("X = 1\n", "X", _refuse, "TypeError: ", "is not a valid fusion"),
    ],
    ids=["syntax-error", "raises-at-import", "missing-attribute", "refused-by-accept"],
)
def test_a_plugin_failing_at_import_or_refused_is_broken_not_fatal(
    tmp_path, monkeypatch, request, code, target, accept, error, reason
):
    dist = f"fusion-bad-{request.node.callspec.id}"
    site = _install(tmp_path / "site", dist, "bad", code, target=target)
    monkeypatch.syspath_prepend(str(site))
    registry: Registry = Registry("fusion", group="fusion_ray.fusions", accept=accept)
    registry.register("add")(lambda d_model: d_model)
    assert registry.names() == ["add"]
    (broken,) = registry.broken()
    assert (broken.name, broken.package) == ("bad", dist)
    assert broken.error.startswith(error) and "\n" not in broken.error
    assert reason in broken.message() and dist in broken.message()
    with pytest.raises(BrokenEntryError, match=f"'bad' from {dist}"):
        registry.get("bad")


@pytest.mark.process
def test_fusion_ray_list_with_a_broken_plugin_warns_once_in_a_fresh_process(tmp_path):
    site = _install(tmp_path / "site", "fusion-broken", "broken_op", BROKEN_PLUGIN)
    proc = _run("from fusion_ray.cli import main; main(['list'])", site)
    assert proc.returncode == 0, proc.stderr
    assert BROKEN_LINE in proc.stdout.splitlines()
    assert "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "broken_op" in line]) == 1
