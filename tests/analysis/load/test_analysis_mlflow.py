"""analysis against a real (temporary, sqlite) MLflow store: loading, errors, the full report.

One store is logged once for the module: a clean sweep (2 datasets x 3 operators x 6 seeds,
parent run, predictions), a partial one (missing, FAILED and duplicated cells), one whose pair
differs in a param, one without a parent run, and two with nothing to analyse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.load import (
    AnalysisError,
    EmptyExperimentError,
    ExperimentNotFoundError,
    load_experiment,
)
from analysis.report import STATS_COLUMNS, ReportOptions, build_report, main
from analysis.stats import (
    PairedDeltas,
    Statistic,
    StatsSettings,
    describe_deltas,
    method_lines,
    register,
    statistics,
    unregister,
)
from analysis.stats.pairing import NothingToCompareError, pair_runs
from tests.conftest import ROOT
from tests.synthetic import (
    SyntheticSweep,
    flat_config,
    log_synthetic_sweep,
    log_trial,
    synthetic_cell_id,
)


def _trial(client, exp_id, op, seed, *, dataset="arxiv", status="FINISHED", parent=None, **over):
    params = flat_config(dataset, "long", "sinusoidal", "none", op, seed)
    params.update(over)
    tags = {
        "cell_id": f"{dataset}-{op}-{seed}",
        "dataset": dataset,
        "position": "sinusoidal",
        "attention_position": "none",
        "fusion": op,
        "seed": seed,
        "sweep": "x",
        "git_sha": "abc",
    }
    final = {"test_acc": 0.5 + seed / 100, "test_correct": 50 + seed, "test_total": 100}
    return log_trial(
        client,
        exp_id,
        tags=tags,
        params=params,
        final_metrics=final,
        parent_run_id=parent,
        status=status,
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    # sqlite fsyncs every commit; a RAM disk, where there is one, makes logging 2-3x faster
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="analysis-tests-", dir=shm))
    else:
        root = tmp_path_factory.mktemp("mlflow")
    yield from _log_store(root, MlflowClient, mlflow_store)
    shutil.rmtree(root, ignore_errors=True)


def _log_store(root, MlflowClient, mlflow_store):
    uri = mlflow_store(root / "mlflow.db")
    clean = SyntheticSweep(
        name="clean",
        datasets={"short_ds": "short", "long_ds": "long"},
        operators=("add", "concat", "gate_scalar"),
        effects={"concat": 0.02, "gate_scalar": 0.3},
        seeds=tuple(range(6)),
        test_size=120,
    )
    ids = log_synthetic_sweep(clean, uri, artifact_location=str(root / "art_clean"))
    partial = SyntheticSweep(
        name="partial",
        datasets={"long_ds": "long"},
        operators=("add", "gate_scalar"),
        seeds=tuple(range(4)),
        test_size=60,
        predictions=False,
    )
    pids = log_synthetic_sweep(
        partial,
        uri,
        artifact_location=str(root / "art_partial"),
        skip=[("long_ds", "gate_scalar", 3)],
    )
    client = MlflowClient(uri)
    exp_id = pids["experiment_id"]
    parent = pids["parent_run_id"]
    # a FAILED attempt of the missing cell and a duplicate FINISHED run of (add, seed 1)
    params = flat_config("long_ds", "long", "sinusoidal", "none", "gate_scalar", 3, num_classes=4)
    tags = {
        "dataset": "long_ds",
        "position": "sinusoidal",
        "attention_position": "none",
        "fusion": "gate_scalar",
        "seed": 3,
        "cell_id": synthetic_cell_id("long_ds", "sinusoidal", "none", "gate_scalar", 3),
    }
    log_trial(
        client,
        exp_id,
        tags=tags,
        params=params,
        final_metrics={},
        parent_run_id=parent,
        status="FAILED",
    )
    params = flat_config("long_ds", "long", "sinusoidal", "none", "add", 1, num_classes=4)
    tags = {**tags, "fusion": "add", "seed": 1}
    tags["cell_id"] = synthetic_cell_id("long_ds", "sinusoidal", "none", "add", 1)
    log_trial(
        client,
        exp_id,
        tags=tags,
        params=params,
        final_metrics={"test_correct": 30, "test_total": 60, "test_acc": 0.5},
        parent_run_id=parent,
    )

    mismatch = client.create_experiment("mismatch", artifact_location=str(root / "art_mm"))
    for seed in range(3):
        _trial(client, mismatch, "add", seed)
        _trial(client, mismatch, "gate_scalar", seed, **({"train.lr": 0.001} if seed == 2 else {}))

    no_parent = SyntheticSweep(
        name="no_parent",
        datasets={"d": "short"},
        operators=("add", "concat"),
        seeds=(0, 1),
        test_size=40,
        predictions=False,
        with_parent=False,
    )
    log_synthetic_sweep(no_parent, uri, artifact_location=str(root / "art_np"))

    client.create_experiment("empty", artifact_location=str(root / "art_empty"))
    running = client.create_experiment("running_only", artifact_location=str(root / "art_run"))
    _trial(client, running, "add", 0, status="RUNNING")
    yield {"uri": uri, "root": root, "clean": ids, "partial": pids}


@pytest.fixture(scope="module")
def clean_report(store):
    out = store["root"] / "report_clean"
    return build_report("clean", store["uri"], ReportOptions(out=out))


# ----------------------------------------------------------------------------- loading


@pytest.mark.unit
def test_load_tidy_frame(store):
    exp = load_experiment("clean", store["uri"])
    runs = exp.runs
    assert len(runs) == 36 and (runs["status"] == "FINISHED").all()
    assert exp.parent_run_id == store["clean"]["parent_run_id"]
    assert set(runs["operator"]) == {"add", "concat", "gate_scalar"}
    assert runs["seed"].dtype == "Int64" and sorted(set(runs["seed"])) == list(range(6))
    assert (runs["test_total"] == 120).all()
    assert "params.train.lr" in runs and "params.model.fusion" in runs
    assert runs["latency_ms_per_sample"].notna().all()
    assert exp.decisions is None  # fixed seeds: no logged verdicts


@pytest.mark.unit
def test_fast_sqlite_path_equals_search_runs(store):
    fast = load_experiment("partial", store["uri"], method="sql").runs
    slow = load_experiment("partial", store["uri"], method="search_runs").runs
    pd.testing.assert_frame_equal(fast, slow, check_dtype=False)
    assert set(fast["status"]) == {"FINISHED", "FAILED"}


@pytest.mark.unit
def test_unknown_experiment_lists_available(store):
    with pytest.raises(ExperimentNotFoundError) as err:
        load_experiment("nope", store["uri"])
    msg = str(err.value)
    assert "'nope'" in msg and store["uri"] in msg
    assert "'clean'" in msg and "'partial'" in msg


@pytest.mark.unit
@pytest.mark.parametrize("name, detail", [("empty", "has no runs"), ("running_only", "1 RUNNING")])
def test_experiment_without_finished_trials(store, name, detail):
    with pytest.raises(EmptyExperimentError) as err:
        load_experiment(name, store["uri"])
    assert f"'{name}'" in str(err.value) and store["uri"] in str(err.value)
    assert detail in str(err.value)


@pytest.mark.unit
def test_cli_fails_clearly(store, capsys):
    assert main(["--experiment", "nope", "--tracking-uri", store["uri"]]) == 2
    err = capsys.readouterr().err
    assert "'nope' not found" in err and store["uri"] in err and "'clean'" in err
    assert main(["--experiment", "empty", "--tracking-uri", store["uri"]]) == 2
    assert "no FINISHED trial runs" in capsys.readouterr().err


@pytest.mark.unit
def test_param_mismatch_fails_the_report(store, capsys, tmp_path):
    code = main(
        ["--experiment", "mismatch", "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    )
    assert code == 3
    err = capsys.readouterr().err
    assert "train.lr: '0.001' vs '0.0003'" in err and "seed=2" in err


# ----------------------------------------------------------------------------- the report


@pytest.mark.unit
def test_report_writes_every_output(clean_report):
    out = clean_report.out_dir
    for name in (
        "report.md",
        "stats.csv",
        "stats.json",
        "length_stats.csv",
        "length_accuracy.csv",
        "runs.csv",
    ):
        assert (out / name).is_file(), name
    for table in ("table1_accuracy", "table2_latency", "table3_positions"):
        for ext in ("md", "tex", "csv"):
            assert (out / "tables" / f"{table}.{ext}").is_file()
    figures = {p.name for p in (out / "figures").iterdir()}
    for stem in (
        "paired_deltas__sinusoidal__none",
        "accuracy_by_length_regime",
        "accuracy_vs_latency",
        "accuracy_by_length_bucket",
    ):
        assert {f"{stem}.png", f"{stem}.pdf"} <= figures
    assert (out / "figures" / "accuracy_vs_latency.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "figures" / "accuracy_vs_latency.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.unit
def test_stats_csv_and_json(clean_report):
    out = clean_report.out_dir
    stats = pd.read_csv(out / "stats.csv")
    assert list(stats.columns[: len(STATS_COLUMNS)]) == STATS_COLUMNS
    assert len(stats) == 4  # 2 datasets x 2 operators against add
    assert (stats["n_pairs"] == 6).all() and set(stats["baseline"]) == {"add"}
    assert (stats["min_attainable_p"] == 2 / 2.0 ** stats["n_nonzero"]).all()
    payload = json.loads((out / "stats.json").read_text())
    s = payload["settings"]
    assert s["alpha"] == 0.05 and s["alternative"] == "two-sided" and s["correction"] == "holm"
    assert s["zero_method"] == "wilcox" and "dropped" in s["zero_policy"] and s["scipy"]
    assert s["m"] == 4 and "Holm-Sidak" in s["correction_detail"]
    assert len(payload["comparisons"]) == 4
    # deltas come from the logged counts
    runs = clean_report.experiment.runs.set_index(["dataset", "operator", "seed"])
    row = stats[(stats["dataset"] == "long_ds") & (stats["operator"] == "gate_scalar")].iloc[0]
    deltas = [
        runs.loc[("long_ds", "gate_scalar", s), "test_correct"]
        - runs.loc[("long_ds", "add", s), "test_correct"]
        for s in range(6)
    ]
    assert row["mean_delta"] == pytest.approx(100 * sum(deltas) / 6 / 120)
    assert row["wins"] == sum(d > 0 for d in deltas)


@pytest.mark.unit
def test_report_md_states_policy_and_guard(clean_report):
    md = (clean_report.out_dir / "report.md").read_text()
    assert "# Fusion analysis: `clean`" in md
    assert "zero_method = `wilcox`" in md and "Holm" in md and "Holm-Sidak" in md
    # 6 seeds, Holm over 4 comparisons: floor 4 * 2/64 = 0.125 > 0.05, needs 8 seeds
    assert "cannot reach alpha = 0.05" in md  # the warning's first clause, at the end
    assert "8 with Holm over m = 4" in (clean_report.out_dir / "warnings.md").read_text()
    assert "under-cover" in md
    assert "![" in md and "figures/accuracy_by_length_bucket.png" in md
    assert "Table 1" in md and "Table 2" in md and "Table 3" in md
    assert "logged to it under `analysis/`" in md


@pytest.mark.unit
def test_report_logged_to_parent_run(store, clean_report):
    from mlflow import MlflowClient

    parent = store["clean"]["parent_run_id"]
    assert clean_report.logged_to == parent
    client = MlflowClient(store["uri"])
    names = {Path(a.path).name for a in client.list_artifacts(parent, "analysis")}
    assert {"report.md", "stats.csv", "stats.json", "figures", "tables"} <= names


@pytest.mark.unit
def test_length_analysis_is_consistent(clean_report):
    la = clean_report.lengths
    assert la is not None
    assert la.buckets.groupby("dataset")["n_docs"].sum().eq(120).all()
    assert la.median_length["short_ds"] < la.median_length["long_ds"]
    contrasts = la.stats[la.stats["bucket"] == "long-short"]
    assert len(contrasts) == 4 and contrasts["p_holm"].notna().all()
    # bucket deltas add up to the overall delta (weighted by bucket size)
    buckets = la.stats[
        (la.stats["bucket"] != "long-short")
        & (la.stats["dataset"] == "long_ds")
        & (la.stats["operator"] == "gate_scalar")
    ]
    overall = clean_report.comparisons.table.set_index(["dataset", "operator"]).loc[
        ("long_ds", "gate_scalar"), "mean_delta"
    ]
    weighted = (buckets["mean_delta"] * buckets["n_docs"]).sum() / buckets["n_docs"].sum()
    assert weighted == pytest.approx(overall)


@pytest.mark.unit
def test_partial_sweep_lists_what_is_missing(store, tmp_path, capsys):
    code = main(
        [
            "--experiment",
            "partial",
            "--tracking-uri",
            store["uri"],
            "--out",
            str(tmp_path),
            "--no-lengths",
            "--no-figures",
        ]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "incomplete block" in printed.out
    md = (tmp_path / "report.md").read_text()
    assert "seed=3, missing=gate_scalar (FAILED)" in md
    # (add, seed 1) finished twice with one config: the first run counts, the second is set aside
    assert "## Duplicate cells\n\n- none" in md
    warnings = (tmp_path / "warnings.md").read_text()
    assert "1 FINISHED run(s) set aside" in warnings
    assert (
        "7 of 8 cells (parent run tag `cells`) have a FINISHED run; 0 have no run yet" in warnings
    )
    stats = pd.read_csv(tmp_path / "stats.csv")
    assert stats.loc[0, "n_pairs"] == 3 and stats.loc[0, "seeds"] == "0,1,2"
    assert not (tmp_path / "length_stats.csv").exists()


@pytest.mark.unit
def test_no_parent_run_says_so(store, tmp_path, capsys):
    assert (
        main(["--experiment", "no_parent", "--tracking-uri", store["uri"], "--out", str(tmp_path)])
        == 0
    )
    assert "not logged to MLflow" in capsys.readouterr().out
    assert "on disk only" in (tmp_path / "report.md").read_text()


@pytest.mark.unit
def test_one_sided_alternative_and_alpha_flow_through(store, tmp_path):
    res = build_report(
        "clean",
        store["uri"],
        ReportOptions(
            out=tmp_path,
            lengths=False,
            log_to_mlflow=False,
            settings=StatsSettings(alpha=0.1, alternative="greater"),
        ),
    )
    table = res.comparisons.table
    assert (table["min_attainable_p"] == 1 / 2.0 ** table["n_nonzero"]).all()
    assert res.comparisons.settings["alternative"] == "greater"
    gs = table[(table["operator"] == "gate_scalar") & (table["dataset"] == "long_ds")].iloc[0]
    # the synthetic data are deterministic: gate_scalar wins on all six long_ds seeds, so the
    # exact one-sided p is 1/64 and Holm over 4 comparisons gives 0.0625 <= alpha = 0.1
    assert gs["wins"] == 6 and gs["p_wilcoxon"] == pytest.approx(1 / 64)
    assert gs["p_holm"] == pytest.approx(4 / 64) and gs["significant"]
    table1 = (tmp_path / "tables" / "table1_accuracy.md").read_text()
    assert "*" in table1.split("| long_ds |")[1].splitlines()[0]
    assert "exact greater Wilcoxon" in table1


@pytest.mark.unit
def test_pairing_of_logged_runs_matches_tags(store):
    exp = load_experiment("clean", store["uri"])
    p = pair_runs(exp.runs, "add")
    assert len(p.pairs) == 24 and p.incomplete.empty and p.duplicates.empty


@pytest.mark.process
def test_module_runs_as_a_script():
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.report", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--experiment",
        "--tracking-uri",
        "--baseline",
        "--out",
        "--alpha",
        "--alternative",
        "--no-lengths",
    ):
        assert flag in proc.stdout


@pytest.mark.unit
def test_missing_baseline_is_nothing_to_compare(store, tmp_path):
    with pytest.raises(NothingToCompareError) as err:
        build_report(
            "no_parent",
            store["uri"],
            ReportOptions(baseline="gate_mlp", out=tmp_path, lengths=False, make_figures=False),
        )
    msg = str(err.value)
    assert "baseline operator 'gate_mlp' has no FINISHED run; operators present: add, concat" in msg
    assert not (tmp_path / "report.md").exists()


@pytest.mark.unit
def test_operator_filter_shrinks_the_holm_family(store, tmp_path, capsys):
    res = build_report(
        "clean",
        store["uri"],
        ReportOptions(
            out=tmp_path,
            lengths=False,
            make_figures=False,
            log_to_mlflow=False,
            only_operators=["gate_scalar"],
        ),
    )
    assert set(res.comparisons.table["operator"]) == {"gate_scalar"}
    assert res.comparisons.settings["m"] == 2
    assert "restricted to operators gate_scalar" in (tmp_path / "report.md").read_text()
    args = ["--experiment", "clean", "--tracking-uri", store["uri"], "--operator", "gate_mlp"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    assert "--operator gate_mlp: no run has it" in capsys.readouterr().err


@pytest.mark.unit
def test_unknown_main_position_is_an_error(store, tmp_path):
    with pytest.raises(AnalysisError, match="--position 'rope'.*available: sinusoidal"):
        options = ReportOptions(out=tmp_path, position="rope", lengths=False)
        build_report("no_parent", store["uri"], options)


@pytest.mark.unit
def test_a_registered_statistic_reaches_every_output(store, tmp_path):
    """One function and one registry entry: the statistic is computed for every comparison
    (and length bucket), written to stats.csv and stats.json, and described in the Method."""

    def largest_delta(d: PairedDeltas) -> dict[str, float]:
        return {"max_delta": float(d.pp.max())}

    register(
        Statistic(
            name="max_delta",
            columns=("max_delta",),
            compute=largest_delta,
            record={"max_delta": "largest per-seed delta in pp, one of m = {m} comparisons"},
            method="**Largest delta**: {max_delta}.",
        )
    )
    try:
        options = ReportOptions(out=tmp_path, make_figures=False, log_to_mlflow=False)
        res = build_report("clean", store["uri"], options)
    finally:
        unregister("max_delta")
    stats = pd.read_csv(tmp_path / "stats.csv")
    assert list(stats.columns[: len(STATS_COLUMNS)]) == STATS_COLUMNS
    assert "max_delta" in stats.columns[len(STATS_COLUMNS) :]
    runs = res.experiment.runs.set_index(["dataset", "operator", "seed"])["test_correct"]
    row = stats[(stats["dataset"] == "long_ds") & (stats["operator"] == "gate_scalar")].iloc[0]
    deltas = [runs[("long_ds", "gate_scalar", s)] - runs[("long_ds", "add", s)] for s in range(6)]
    assert row["max_delta"] == pytest.approx(100 * max(deltas) / 120)
    assert pd.read_csv(tmp_path / "length_stats.csv")["max_delta"].notna().all()
    settings = json.loads((tmp_path / "stats.json").read_text())["settings"]
    assert settings["max_delta"] == "largest per-seed delta in pp, one of m = 4 comparisons"
    md = (tmp_path / "report.md").read_text()
    method = md.split("## Method")[1].split("\n## ")[0]
    assert "- **Largest delta**: largest per-seed delta in pp, one of m = 4 comparisons." in method
    # unregistered again: the next report has neither the column nor the line
    assert "max_delta" not in describe_deltas(np.array([1, 2]), 10, StatsSettings())
    assert all("Largest delta" not in line for line in method_lines(settings))


@pytest.mark.unit
def test_method_text_describes_every_statistic_from_the_settings_record(clean_report):
    md = (clean_report.out_dir / "report.md").read_text()
    method = md.split("## Method")[1].split("\n## ")[0]
    record = json.loads((clean_report.out_dir / "stats.json").read_text())["settings"]
    assert len(method_lines(record)) == len(statistics())
    for line in method_lines(record):
        assert f"- {line}" in method
    for stat in statistics():  # what a statistic states is in stats.json, filled in, and shown
        for key in stat.record:
            assert "{" not in record[key]
            if "{" + key in stat.method:
                assert record[key] in method


@pytest.mark.unit
def test_report_options_refuse_a_bare_string_for_a_list():
    with pytest.raises(TypeError, match=r"by=\('train.lr',\)"):
        ReportOptions(by="train.lr")
    assert ReportOptions(by=["train.lr"]).by == ("train.lr",)


@pytest.mark.unit
def test_build_report_from_python_prints_nothing(store, tmp_path, capfd):
    res = build_report(
        "clean", store["uri"], ReportOptions(baseline="add", out=tmp_path, make_figures=False)
    )
    assert res.logged_to == store["clean"]["parent_run_id"]
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
