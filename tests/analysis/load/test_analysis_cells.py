"""A sweep's runs are its cells: sweep_cells.json on the parent run decides which trial runs of
the experiment are analysed, and the report counts and describes the others.

The store holds sweeps whose file changed under the same name (train.epochs 2, then 1; the
second version also drops a dataset), the same without the artifact, and one whose new version
has no run yet.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.load import AnalysisError, load_experiment, parse_sweep_cells
from analysis.report import ReportOptions, build_report, main
from analysis.stats.pairing import NothingToCompareError, pair_runs
from tests.synthetic import (
    SyntheticSweep,
    iter_cells,
    log_sweep_cells,
    log_synthetic_sweep,
    log_trial,
    simulate_trial,
)

pytestmark = pytest.mark.unit

OPS = ("add", "concat", "gate_scalar")
SENTENCE = (
    "9 FINISHED runs in this experiment belong to other settings (train.epochs 2 in 9 runs vs 1 "
    "in the sweep's runs) and are not analysed; give the changed sweep a new name, or make the "
    "setting a grid axis."
)


def spec(name, epochs, datasets=("a",), **kw):
    regimes = {"a": "short", "b": "long"}
    return SyntheticSweep(
        name=name,
        datasets={d: regimes[d] for d in datasets},
        operators=kw.pop("operators", OPS),
        seeds=(0, 1, 2),
        epochs=epochs,
        test_size=50,
        predictions=False,
        cell_salt=f"epochs={epochs}",
        **kw,
    )


def log_changed_sweep(uri, root, name, *, datasets_before=("a",), artifact=True):
    """Version 1 of the sweep (train.epochs 2), then version 2 (train.epochs 1, dataset a only)
    into the same parent run, as the driver does when the file changes under the same name."""
    loc = str(root / f"art_{name}")
    v1 = spec(name, 2, datasets_before, cells_artifact=artifact)
    first = log_synthetic_sweep(v1, uri, artifact_location=loc)
    v2 = spec(name, 1, cells_artifact=artifact)
    second = log_synthetic_sweep(v2, uri, parent_run_id=first["parent_run_id"])
    return first, second


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("cells")
    uri = mlflow_store()  # on the RAM disk
    changed = log_changed_sweep(uri, root, "changed")
    dropped = log_changed_sweep(uri, root, "dropped", datasets_before=("a", "b"))
    client = MlflowClient(uri)
    # an unfinished run of the old file, too
    old = spec("dropped", 2, ("b",))
    cell = next(iter_cells(old))
    trial = simulate_trial(old, *cell)
    log_trial(
        client,
        dropped[0]["experiment_id"],
        tags=trial.tags,
        params=trial.params,
        final_metrics={},
        parent_run_id=dropped[0]["parent_run_id"],
        status="FAILED",
    )
    log_changed_sweep(uri, root, "changed_no_artifact", artifact=False)
    # the file changed, the driver logged its new cells, none of them has run yet
    pending = log_synthetic_sweep(spec("pending", 2), uri, artifact_location=str(root / "art_p"))
    new = spec("pending", 1)
    new_cells = [new.cell_id(d, p, a, o, s) for d, _, p, a, o, s in iter_cells(new)]
    log_sweep_cells(client, pending["parent_run_id"], "pending", new_cells)
    return {"uri": uri, "changed": changed, "dropped": dropped}


def test_the_artifact_restricts_the_runs_to_the_sweeps_cells(store):
    exp = load_experiment("changed", store["uri"])
    v2_runs = set(store["changed"][1]["run_ids"])
    assert set(exp.runs["run_id"]) == v2_runs and len(v2_runs) == 9
    assert set(exp.other_runs["run_id"]) == set(store["changed"][0]["run_ids"])
    assert (exp.runs["params.train.epochs"] == "1").all()
    assert (exp.other_runs["params.train.epochs"] == "2").all()
    assert len(exp.sweep_cells) == 9 and set(exp.runs["cell_id"]) == set(exp.sweep_cells)
    # the sweep's runs alone pair cleanly: no duplicate cells from the old file
    pairing = pair_runs(exp.runs, "add")
    assert len(pairing.pairs) == 6 and pairing.duplicates.empty


def test_the_report_counts_and_describes_the_runs_left_out(store, tmp_path, capsys):
    args = ["--experiment", "changed", "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    assert main([*args, "--no-figures", "--no-lengths", "--no-log"]) == 0
    assert SENTENCE in capsys.readouterr().out
    md = (tmp_path / "report.md").read_text()
    assert f"- sweep cells: 9 (`sweep_cells.json` of the parent run); {SENTENCE}" in md
    assert "trial runs: 9 (9 FINISHED); analysed: 9 FINISHED runs, 6 seed pairs" in md
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 9
    record = json.loads((tmp_path / "stats.json").read_text())["other_settings"]
    assert record["finished"] == 9 and record["sweep_cells"] == 9
    assert record["differences"] == ["train.epochs 2 in 9 runs vs 1 in the sweep's runs"]


def test_runs_without_a_counterpart_are_counted_apart(store, tmp_path):
    options = ReportOptions(out=tmp_path, lengths=False, make_figures=False, log_to_mlflow=False)
    other = build_report("dropped", store["uri"], options).other_settings
    assert (other.finished, other.unfinished, other.left_out) == (18, 1, 19)
    assert other.without_counterpart == 9 and other.same_params == 0
    assert other.sentence == (
        "18 FINISHED runs (and 1 unfinished run) in this experiment belong to other settings "
        "(train.epochs 2 in 9 runs vs 1 in the sweep's runs; 9 runs have no run of the same "
        "dataset, position, attention_position, fusion and seed among the sweep's runs) and are "
        "not analysed; give the changed sweep a new name, or make the setting a grid axis."
    )


def test_without_the_artifact_every_trial_run_is_the_sweeps(store, tmp_path):
    exp = load_experiment("changed_no_artifact", store["uri"])
    assert exp.sweep_cells is None and exp.other_runs.empty and len(exp.runs) == 18
    # as before: both versions' runs are analysed together, so every cell is duplicated ...
    assert len(pair_runs(exp.runs, "add").duplicates) == 9
    with pytest.raises(NothingToCompareError, match="If the sweep varies train.epochs on purpose"):
        build_report("changed_no_artifact", store["uri"], ReportOptions(out=tmp_path))
    # ... and --by separates them
    options = ReportOptions(
        out=tmp_path, by=("train.epochs",), lengths=False, make_figures=False, log_to_mlflow=False
    )
    result = build_report("changed_no_artifact", store["uri"], options)
    assert len(result.comparisons.table) == 4 and result.other_settings.left_out == 0
    assert result.other_settings.sentence == ""
    assert "sweep cells" not in (tmp_path / "report.md").read_text()


def test_a_remote_artifact_store_is_read_with_one_download(store, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import analysis.load.artifacts

    downloads = []
    real = MlflowClient.download_artifacts

    def counted(self, run_id, path, dst_path=None):
        downloads.append(path)
        return real(self, run_id, path, dst_path)

    monkeypatch.setattr(MlflowClient, "download_artifacts", counted)
    local = load_experiment("changed", store["uri"])
    assert downloads == []  # a local store is read in place
    monkeypatch.setattr(analysis.load.artifacts, "local_artifact_path", lambda uri: None)
    options = ReportOptions(out=tmp_path, lengths=False, make_figures=False, log_to_mlflow=False)
    result = build_report("changed", store["uri"], options)
    assert downloads == ["sweep_cells.json"]
    assert result.experiment.sweep_cells == local.sweep_cells
    assert result.other_settings.finished == 9


def test_a_sweep_whose_new_cells_have_no_run_yet_has_nothing_to_compare(store, tmp_path, capsys):
    with pytest.raises(NothingToCompareError) as err:
        build_report("pending", store["uri"], ReportOptions(out=tmp_path))
    msg = str(err.value)
    assert "none of the 9 cells in the sweep's sweep_cells.json has a FINISHED run" in msg
    assert "9 FINISHED runs in this experiment belong to other settings" in msg
    args = ["--experiment", "pending", "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    assert main(args) == 3
    assert "belong to other settings" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["{}", "not json", '{"cells": "abc"}', '{"cells": [1, 2]}'])
def test_an_unreadable_cells_artifact_is_refused(text):
    with pytest.raises(AnalysisError, match="sweep_cells.json of the sweep's parent run r1"):
        parse_sweep_cells(text, "r1")
    assert parse_sweep_cells('{"sweep": "s", "cells": ["x", "y"]}', "r1") == ["x", "y"]
