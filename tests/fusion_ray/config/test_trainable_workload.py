"""What the engine asks of a trainable's sweep, checked without Ray: its dry run, its smoke copy,
the runs scored by its metric and direction, the reports of its trial as results, the
questions it asks, and the report's paired statistics."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from fusion_ray.train.trainable import EXAMPLE

pytestmark = pytest.mark.unit


def _write(tmp_path, **overrides):
    raw = {
        "name": "trainable_study",
        "trainable": "study",
        "defaults": copy.deepcopy(EXAMPLE),
        "grid": {"model.fusion": ["add", "gate_scalar"], "model.d_model": [16, 32]},
        "seeds": [0, 1],
        "smoke": {"train.epochs": 1},
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "storage_path": str(tmp_path / "ray_results"),
    } | overrides
    path = tmp_path / "trainable.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_dry_run_of_a_trainable_sweep_lists_its_cells_and_what_it_compares(tmp_path, capsys):
    from fusion_ray.sweep import main

    assert main([str(_write(tmp_path)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep trainable_study: 8 cells (0 already FINISHED" in out
    assert (
        "trainable study: model.fusion levels against add on its first returned metric (more "
        "is better)" in out
    )
    assert "  model.fusion        add x4, gate_scalar x4" in out
    assert "(seed, model.fusion, model.d_model, status, cell_id):" in out
    assert out.count(" pending ") == 8


def test_the_smoke_copy_runs_seed_0_with_the_smoke_settings_as_its_own_experiment(tmp_path):
    from fusion_ray import api
    from fusion_ray.config.workload import cells_of

    spec = api.load(_write(tmp_path, seeds={"adaptive": True, "first": 4, "max": 8}))
    smoke = api.smoke_version(spec)
    assert smoke.name == "trainable_study-smoke" and smoke.adaptive is None
    assert list(smoke.seeds) == [0]
    assert smoke.defaults["train"]["epochs"] == 1 and spec.defaults["train"]["epochs"] == 2
    cells = cells_of(smoke)
    assert len(cells) == 4 and {c.config["train"]["epochs"] for c in cells} == {1}


def _run(cid, status, metrics, start, tags=None):
    return SimpleNamespace(
        info=SimpleNamespace(run_id=f"r-{cid}-{start}", status=status, start_time=start,
                             end_time=start + 1000),
        data=SimpleNamespace(tags={"cell_id": cid, **(tags or {})}, metrics=metrics),
    )  # fmt: skip


def test_runs_are_scored_by_the_sweeps_metric_negated_when_less_is_better():
    from fusion_ray.driver.tracking import Tracker

    returned = {"metrics_returned": json.dumps(["val_loss", "acc"])}
    runs = [
        _run("a", "FINISHED", {"val_loss": 0.25, "acc": 0.9}, 2, returned),
        _run("a", "FAILED", {}, 3),  # older or failed attempts do not replace a FINISHED one
        _run("b", "FINISHED", {"val_loss": 0.5, "acc": 0.8}, 1, returned),
    ]
    by_min = Tracker.best_runs(runs, "val_loss", "min")
    assert by_min["a"].score == -0.25 and by_min["b"].score == -0.5
    assert by_min["a"].has_final
    first = Tracker.best_runs(runs, None, "max")  # no metric named: the first one returned
    assert first["a"].score == 0.25
    assert Tracker.best_runs(runs, "acc", "max")["b"].score == 0.8
    assert (
        Tracker.best_runs(runs, "test_acc")["a"].score is None
    )  # the study's test_acc: not logged here


def test_a_trainables_reports_become_results_with_its_own_metric_names():
    from fusion_ray.driver.trainable_trial import RaySink
    from fusion_ray.train.result import TrialResult

    sent = []
    sink = RaySink(lambda result, folder: sent.append((result, folder)), "mine")
    sink({"loss": 1.0}, None)
    sink({"loss": 0.5, "step": 7.0}, "/ckpt")
    sink({"loss": 0.4, "epoch": 9.0}, None)
    sink.final({"acc": 0.75, "loss": 0.4})
    assert [TrialResult.of(r).epoch for r, _ in sent[:3]] == [0, 7, 9]
    assert [TrialResult.of(r).reported for r, _ in sent] == [
        ["loss"], ["loss"], ["loss", "epoch"], ["acc", "loss"],
    ]  # fmt: skip
    assert sent[1][1] == "/ckpt" and TrialResult.of(sent[3][0]).final
    assert [r["step"] for r, _ in sent[:3]] == [0.0, 7.0, 9.0]  # the step always goes with it
    with pytest.raises(ValueError, match=r"\['final'\] are names the sweep's results use"):
        sink({"final": 1.0}, None)


def test_a_trainable_sweep_asks_no_length_question():
    from fusion_ray.decide.questions import possible

    groups = [(("hidden", "16"),), (("hidden", "64"),)]
    assert possible(groups, [], {"hidden": ["16", "64"]}) == ("operator", "interaction")
    assert possible(groups[:1], [], {}) == ("operator",)
    study = [(("dataset", "short"), ("position", "sinusoidal"))]
    assert "length_within" in possible(study, ["short"], {})


def test_the_reports_paired_statistics_pair_by_seed_within_each_group_signed_by_mode():
    from analysis.stats.trainable import TrainableRecord, paired_statistics

    rng = np.random.default_rng(3)
    rows = []
    for seed in range(8):
        for width in ("16", "64"):
            base = 0.5 + rng.normal(0, 0.01)
            for level, shift in (("0.0", 0.0), ("0.1", -0.05 if width == "16" else 0.0)):
                rows.append({"seed": str(seed), "status": "FINISHED", "smoothing": level,
                             "hidden": width, "loss": base + shift})  # fmt: skip
    rows.append({"seed": "8", "status": "FAILED", "smoothing": "0.1", "hidden": "16", "loss": None})
    runs = pd.DataFrame(rows)
    levels = {"smoothing": ["0.0", "0.1"], "hidden": ["16", "64"]}
    record = TrainableRecord("mine", "smoothing", "0.0", "loss", "min", levels)
    table = paired_statistics(runs, record)
    assert list(table["comparison"]) == [
        "hidden=16: smoothing=0.1 vs smoothing=0.0",
        "hidden=64: smoothing=0.1 vs smoothing=0.0",
    ]
    first, second = table.to_dict(orient="records")
    assert first["n_seeds"] == 8 and first["failed_runs"] == 1
    assert first["mean"] == pytest.approx(5.0)  # a lower loss is better: +5 points
    assert first["sign_consistency"] == 1.0 and first["wilcoxon_p"] == pytest.approx(2 / 256)
    assert second["mean"] == pytest.approx(0.0) and second["failed_runs"] == 0
    assert first["p_holm"] == pytest.approx(min(1.0, 2 * first["wilcoxon_p"]))
