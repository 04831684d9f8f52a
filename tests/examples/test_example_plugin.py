"""The example plug-in package (examples/plugin), installed as a user would, runs an adaptive
sweep on Ray workers through the report: its operator, its data source and its decision rule are
selected by name, and its gated operator gets the gate diagnostics; its launch target is listed
and rendered by ``fusion-ray cluster``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.helpers import install_example, tiny_sweep

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The example package pip-installed, once for the module, into a folder of its own (its
    site directory); the tests only read it."""
    return install_example(tmp_path_factory.mktemp("example_plugin") / "site", "plugin")


def _pytest(site: str, *paths: str, select: str | None = None) -> subprocess.CompletedProcess:
    """pytest in a fresh process with the installed example on the path."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
        + (["-k", select] if select else []),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{site}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _passed(proc: subprocess.CompletedProcess) -> int:
    return int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])


def test_the_plugin_own_tests_pass_through_the_contract_kit(site):
    """examples/plugin/tests, the plug-in's own pytest, checks each of its entries with
    fusion_ray.testing (fusion, data source, decision rule, launch target), by name, as
    installed, and runs its launch target's script with stand-ins for ssh, ray and python."""
    proc = _pytest(site, str(ROOT / "examples" / "plugin" / "tests"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _passed(proc) == 6, proc.stdout[-2000:]


def test_the_registry_contract_tests_cover_the_plugin_entries(site):
    """fusion-ray's own contract tests run over every registered entry: with the example
    installed, its operator, source and rule go through them like the built-in ones."""
    tests = [
        "model/test_model_contract.py",
        "data/test_data_contract.py",
        "decide/test_rule_contract.py",
        "launch/test_launcher_contract.py",
    ]
    paths = [str(ROOT / "tests" / "fusion_ray" / t) for t in tests]
    select = "position_gate or keywords or sign_closure or ssh_hosts"
    proc = _pytest(site, *paths, select=select)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _passed(proc) >= 7, proc.stdout[-2000:]


def test_the_plugin_launch_target_is_listed_and_renders_through_fusion_ray_cluster(site):
    """``ssh_hosts`` (entry-point group fusion_ray.launchers), installed as a user would:
    ``fusion-ray list`` and ``fusion-ray cluster --help`` show it with its package, and
    ``fusion-ray cluster ssh_hosts`` prints its script with the sweep command as given."""
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fusion_ray.cli", *args],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    listed = cli("list").stdout
    assert "  ssh_hosts            [fusion-ray-example-plugin]  print a bash script" in listed
    assert "options: --hosts, --workdir, --activate, --port" in listed
    assert "ssh_hosts" in cli("cluster", "--help").stdout
    done = cli("cluster", "ssh_hosts", "sweeps/quickstart.yaml", "train.epochs=1", "--hosts=a,b")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash\n")
    assert "hosts=(a b)" in done.stdout
    assert (
        'fusion_ray.sweep sweeps/quickstart.yaml train.epochs=1 --address "$address"' in done.stdout
    )
    refused = cli("cluster", "ssh_hosts", "s.yaml", "--hosts=-oProxyCommand=x")
    assert refused.returncode == 2 and "--hosts '-oProxyCommand=x'" in refused.stderr


def test_the_example_plugin_runs_a_sweep_on_ray_through_the_report(
    site, tmp_path, data_cache, mlflow_store
):
    """One adaptive sweep that names the plug-in's operator (``position_gate``), data source
    (``keywords``) and decision rule (``sign_closure``, entry-point group
    fusion_ray.decision_rules; its contract is in the plug-in's own tests), installed as a user
    would: ``fusion-ray list`` shows the rule, the sweep decides with it (its parent run says
    so), and its report covers the operator with the gate diagnostics."""
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}", "FUSION_RAY_CACHE": data_cache}
    listed = subprocess.run(
        [sys.executable, "-m", "fusion_ray.cli", "list"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "sign_closure" in listed.stdout and "fusion-ray-example-plugin" in listed.stdout
    path = tiny_sweep(tmp_path, name="plugin_demo", tracking_uri=mlflow_store(tmp_path / "m.db"))
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": 2, "max": 3, "rule": "sign_closure"}
    raw["grid"]["fusions"] = ["add", "position_gate"]
    raw["datasets"]["short"]["data"] = {
        "source": "keywords",
        "source_kwargs": {"num_classes": 3, "n_train": 96, "n_test": 32, "words": 12},
        "tokenizer": "word",
        "max_length": 16,
    }
    raw["defaults"]["model"]["max_len"] = 16
    raw["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "fusion_ray.cli", "sweep", str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rule sign_closure" in proc.stdout
    report = (tmp_path / "reports" / "plugin_demo" / "report.md").read_text()
    assert "position_gate" in report
    gates = tmp_path / "reports" / "plugin_demo" / "gates_by_position.csv"
    assert gates.is_file() and "position_gate" in gates.read_text()

    from fusion_ray.driver.tracking import Tracker

    tracker = Tracker(raw["tracking_uri"], "plugin_demo")
    runs = tracker.trial_runs()
    assert f"{len(runs)} finished now, 0 failed" in proc.stdout and len(runs) in (4, 6)
    assert {r.info.status for r in runs} == {"FINISHED"}
    tags = {(r.data.tags["fusion"], r.data.tags["gated"]) for r in runs}
    assert tags == {("add", "false"), ("position_gate", "true")}
    parent = tracker.client.search_runs([tracker.experiment_id], "tags.role = 'sweep'")[0]
    assert '"rule":"sign_closure"' in parent.data.tags["adaptive_seeds"]
