"""The example trainable package (examples/digits), installed as a user would: its own tests
(fusion-ray's contract suite on ``digits_mlp``, the pairing by the seed) pass, fusion-ray's
contract test over every registered trainable covers it, and ``fusion-ray list`` shows it with
its package; its tuning file is checked against its sweep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers import install_example

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The example package pip-installed, once for the module, into a folder of its own."""
    return install_example(tmp_path_factory.mktemp("example_digits") / "site", "digits")


def _run(site: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{site}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_example_own_tests_pass_through_the_contract_kit(site):
    proc = _run(site, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/digits/tests")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "\n8 passed" in proc.stdout, proc.stdout[-2000:]


def test_the_contract_test_over_every_trainable_covers_the_installed_example(site):
    listed = _run(site, "-m", "fusion_ray.cli", "list").stdout
    assert "  digits_mlp           [fusion-ray-digits]  fusion_ray_digits.trainable.train" in listed
    test = "tests/fusion_ray/trainables/test_trainables.py::test_every_registered_trainable_keeps_the_contract"
    proc = _run(site, "-m", "pytest", "-q", "-p", "no:cacheprovider", test)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_examples_adaptive_sweep_runs_end_to_end_through_the_report(site, tmp_path):
    """``fusion-ray sweep examples/digits/sweeps/label_smoothing.yaml``, shortened (3 epochs,
    seeds 4 to 6): the first wave and the seeds the open comparisons need run on Ray, the
    decisions are said, every cell has at most one run with the compared level as a tag, and
    the report (decisions, paired statistics, the figures) is written and logged."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _run(
        site, "-m", "fusion_ray.sweep", "examples/digits/sweeps/label_smoothing.yaml",
        "defaults.epochs=3", "seeds.first=4", "seeds.max=6", f"tracking_uri={store}",
        f"storage_path={tmp_path / 'ray_results'}", "--report-dir", str(tmp_path / "report"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "decisions (anytime-valid over the 6 hypotheses, one closed test):" in out
    assert "hidden=16: label_smoothing=0.1 vs label_smoothing=0.0" in out
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("digits_label_smoothing")
    trials = client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    assert 24 <= len(trials) <= 36  # the first wave (4 seeds of 6 grid points), at most 6 seeds
    assert len({r.data.tags["cell_id"] for r in trials}) == len(trials)
    assert {r.data.tags["axis.label_smoothing"] for r in trials} == {"0.0", "0.1", "0.2"}
    assert all(r.info.status == "FINISHED" and "test_acc" in r.data.metrics for r in trials)
    for name in ("report.md", "tables/decisions.csv", "tables/paired.tex",
                 "figures/decided_effects.png", "figures/e_processes.png"):  # fmt: skip
        assert (tmp_path / "report" / name).is_file(), name
    import pandas as pd

    parent = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")[0]
    logged = pd.read_csv(client.download_artifacts(parent.info.run_id, "decisions.csv"))
    again = pd.read_csv(tmp_path / "report" / "tables" / "decisions.csv")
    # the report's decisions are recomputed from the runs: the driver's, hypothesis by hypothesis
    assert list(again["comparison"]) == list(logged["comparison"])
    assert list(again["verdict"]) == list(logged["verdict"])
    assert list(again["seeds_used"]) == list(logged["seeds_used"])
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/report.md" in logged and "decisions.csv" in {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }


def test_the_examples_tuning_file_is_checked_against_its_sweep(site):
    """``fusion-ray hpo examples/digits/sweeps/hpo/tune_lr.yaml --dry-run``: the installed
    trainable, the comparison's seeds (the tuning seed none of them) and what is searched."""
    proc = _run(
        site, "-m", "fusion_ray.hpo", "examples/digits/sweeps/hpo/tune_lr.yaml", "--dry-run"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "8 Optuna settings of trainable digits_mlp at seed 1000" in proc.stdout
    assert (
        "for ../label_smoothing.yaml (seeds [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]" in proc.stdout
    )
