"""Plug-in registries: entries another installed package declares under an entry-point group
are found in any fresh process (as a Ray worker is), and a name declared twice is an error that
names both packages."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.process

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


def test_a_plugin_name_clashing_with_a_built_in_names_both_packages(tmp_path):
    site = _install(tmp_path / "site", "fusion-shadow", "add")
    proc = _run("from fusion_ray.model import FUSIONS; FUSIONS.names()", site)
    assert proc.returncode != 0
    assert "fusion 'add' is registered twice: by fusion-ray and by fusion-shadow" in proc.stderr


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


def test_a_plugin_statistic_clashing_with_a_built_in_names_both(tmp_path):
    shadow = STATISTIC_PLUGIN.replace('name="positive_share"', 'name="wilcoxon"')
    site = _install_statistic(tmp_path / "site", "fusion-stat-shadow", "wilcoxon", shadow)
    proc = _run("from analysis.stats import statistics; statistics()", site)
    assert proc.returncode != 0
    assert (
        "statistic 'wilcoxon' is registered twice: by analysis (built in) and by "
        "fusion-stat-shadow" in proc.stderr
    )
