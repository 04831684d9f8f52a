"""One verdict on every surface: an adaptive sweep over two regimes x two settings, run by the
driver's own schedule and tracker against a real (sqlite) MLflow store with planted accuracies
(no Ray, no training), then read back from each place a researcher reads it: the driver's rows
(the console table and decisions.csv on the parent run), the parent run's per-look metrics, the
report (its decisions.csv, summary and Tables 1-3 with their .tex), analysis.compare() and
load_experiment().

Planted: with scale_embeddings=true gate_scalar gains 20 points on short documents and 45 on
long ones (a 25-point length trend); with it false, it loses 1.5 points on short documents and 6
on long ones; one baseline run fails (it counts as a loss for the baseline). The family ends
with every kind of verdict: better, worse, futile, grows, open (the unscaled trend at the cap)
and smaller."""

from __future__ import annotations

import json
import math
import random
import re
import types

import pandas as pd
import pytest
import yaml

from analysis import compare, load_experiment, pair_runs
from analysis.report import ReportOptions, build_report, print_summary
from fusion_ray.config import load_sweep
from fusion_ray.decide.sequential import decisions_text
from fusion_ray.driver.tracking import Tracker, decision_key
from fusion_ray.policy.plan import plan
from fusion_ray.policy.seed_policy import AdaptiveSeedPolicy, live_decisions
from fusion_ray.schema import DECISION_METRIC_PREFIX, DECISION_TAG_PREFIX, DECISIONS_FILE
from fusion_ray.study.workload import final_metric_names
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit

TOTAL = 200
GAIN = {("short", "true"): 20.0, ("long", "true"): 45.0, ("short", "false"): -1.5}
GAIN[("long", "false")] = -6.0


def _spec(tmp_path, store: str):
    path = tiny_sweep(tmp_path, name="verdicts", tracking_uri=store)
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": 6, "max": 14}
    raw["grid"]["datasets"] = ["short", "long"]
    raw["grid"]["model.scale_embeddings"] = [True, False]
    raw["datasets"]["long"] = json.loads(json.dumps(raw["datasets"]["short"]))
    raw["datasets"]["long"]["data"]["source_kwargs"]["regime"] = "long"
    path.write_text(yaml.safe_dump(raw))
    return load_sweep(path)


def _correct(cell) -> int:
    """40 % plus the operator's planted gain plus noise of SD 2.5 points, the same for a cell
    in every run of the test (seeded by the cell)."""
    scale = dict(cell.axes)["model.scale_embeddings"]
    noise = random.Random(f"{cell.dataset}/{scale}/{cell.fusion}/{cell.seed}").gauss(0, 2.5)
    gain = GAIN[(cell.dataset, scale)] if cell.fusion != "add" else 0.0
    return round((40.0 + gain + noise) / 100 * TOTAL)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, mlflow_store):
    """Run the adaptive schedule to its end with the driver's tracker, logging each result as
    the sweep's callback would, then the driver's end: its decisions on the parent run."""
    tmp_path = tmp_path_factory.mktemp("one_verdict")
    spec = _spec(tmp_path, mlflow_store())  # on the RAM disk
    tracker = Tracker(spec.tracking_uri, spec.name)
    policy = AdaptiveSeedPolicy(spec, plan(spec, tracker))
    parent = tracker.parent_run(None, policy.parent_params())
    schedule = policy.schedule
    log_looks = live_decisions(types.SimpleNamespace(tracker=tracker, parent_id=parent, lease=None))
    failed = None
    while schedule.needed():
        for cell in schedule.needed():
            run = tracker.open_cell_run(cell, parent, None, resume=False)
            scale = dict(cell.axes)["model.scale_embeddings"]
            if (cell.fusion, cell.dataset, scale, cell.seed) == ("add", "long", "false", 2):
                tracker.fail(run, "diverged")  # the run failed: a loss for the baseline
                failed, schedule.results[cell.cell_id] = cell, None
            else:
                correct = _correct(cell)
                final = {"test_acc": correct / TOTAL, "test_correct": correct}
                final |= {"test_total": TOTAL, "best_val_acc": 0.6, "best_epoch": 1}
                final |= {"latency_ms_per_sample": 0.1, "num_params": 1000, "train_seconds": 1}
                tracker.log_final(run, final, final_metric_names(final))
                tracker.finish(run)
                schedule.results[cell.cell_id] = correct / TOTAL
            log_looks(schedule)
    rows = policy.finish(tracker, parent)
    tracker.end_parent(parent, {})
    out = tmp_path / "report"
    result = build_report(spec.name, spec.tracking_uri, ReportOptions(out=out, lengths=False))
    return types.SimpleNamespace(
        spec=spec, tracker=tracker, parent=parent, rows=rows, out=out, failed=failed, result=result
    )


def test_the_family_decides_both_questions_and_counts_the_failed_run(sweep):
    by = {r["comparison"]: r for r in sweep.rows}
    kinds = [r["kind"] for r in sweep.rows]
    assert kinds == ["operator"] * 4 + ["length"] * 2 + ["interaction"] * 2
    assert sweep.failed is not None
    trend = by["long-short/sinusoidal/none/scale_embeddings=true: gate_scalar vs add"]
    assert trend["verdict"] == "grows" and trend["ci_low"] > 0
    flat = by["long-short/sinusoidal/none/scale_embeddings=false: gate_scalar vs add"]
    assert flat["verdict"] != "grows" and flat["failed_runs"] == 1
    assert by["long/sinusoidal/none/scale_embeddings=true: gate_scalar vs add"]["state"] == "better"
    # the failed baseline run is in three hypotheses: its comparison, its trend, its interaction
    assert sum(r["failed_runs"] for r in sweep.rows) == 3
    for r in sweep.rows:
        if r["state"] in ("better", "worse"):
            assert r["ci_low"] < r["hodges_lehmann"] < r["ci_high"], r["comparison"]


def test_every_surface_shows_the_same_verdicts(sweep):
    driver = pd.DataFrame(sweep.rows).set_index("comparison")
    client = sweep.tracker.client
    # decisions.csv on the parent run, as the driver wrote it
    path = client.download_artifacts(sweep.parent, DECISIONS_FILE, str(sweep.out.parent))
    logged = pd.read_csv(path).set_index("comparison")
    # the report's decisions.csv, recomputed from the runs by analysis.stats.verdicts
    report = pd.read_csv(sweep.out / DECISIONS_FILE).set_index("comparison")
    exp = load_experiment(sweep.spec.name, sweep.spec.tracking_uri)
    api = compare(pair_runs(exp.runs, baseline="add"), experiment=exp).decisions
    api = api.set_index("comparison")
    columns = ["kind", "state", "verdict", "seeds_used", "decided_at_seed", "failed_runs"]
    # load_experiment() returns the logged ones
    assert exp.decisions is not None
    loaded = exp.decisions.set_index("comparison")
    for other in (logged, report, api, loaded):
        assert list(other.index) == list(driver.index)
        assert other[columns].astype(str).equals(driver[columns].astype(str))
        for col in ("ci_low", "ci_high", "mean", "p_family"):
            assert other[col].to_numpy() == pytest.approx(driver[col].to_numpy(), nan_ok=True)
    # the parent run: each hypothesis under its short key in the family's order, its full name
    # and final state as tags, 1 as its last "decided" point exactly when it was decided
    data = client.get_run(sweep.parent).data
    decided = {
        k: v
        for k, v in data.metrics.items()
        if k.startswith(DECISION_METRIC_PREFIX) and k.endswith(".decided")
    }
    assert len(decided) == len(driver)
    for i, (name, row) in enumerate(driver.iterrows()):
        key = decision_key(i, len(driver))
        assert data.tags[f"{DECISION_TAG_PREFIX}{key}"] == name
        assert data.tags[f"{DECISION_TAG_PREFIX}{key}.state"] == row["state"], name
        assert decided[f"{DECISION_METRIC_PREFIX}{key}.decided"] == (row["state"] != "open")
    assert data.metrics[f"{DECISION_METRIC_PREFIX}log10_threshold_least"] == pytest.approx(
        math.log10(1 / 0.05)
    )
    # the console's table names every verdict; the report's summary and Decisions say them too
    console = decisions_text(sweep.rows)
    text = (sweep.out / "report.md").read_text()
    for name, row in driver.iterrows():
        assert name in console and row["verdict"] in console
        assert f"`{name}`" in text or name.split(": ")[0] in text
    assert "grows" in text.split("## Decisions")[0]  # the summary answers the length question


def test_the_tables_mark_the_anytime_decisions_not_fixed_n_stars(sweep):
    table1 = (sweep.out / "tables" / "table1_accuracy.md").read_text()
    tex = (sweep.out / "tables" / "table1_accuracy.tex").read_text()
    cells = "\n".join(line for line in table1.splitlines() if line.startswith("|"))
    assert "↑" in cells and "↓" in cells and "*" not in cells
    assert "anytime-valid rule" in table1 and "$^{\\uparrow}$" in tex
    interaction = (sweep.out / "report.md").read_text().split("## Interaction tests")[1]
    assert "descriptive only" in interaction.split("##")[0]


def test_the_console_leaves_the_descriptive_statistics_warnings_to_warnings_md(sweep, capsys):
    """An adaptive sweep's fixed-n tests are descriptive: their warnings (and the incomplete
    blocks adaptive seeds leave by design) stay in warnings.md; the console says how many."""
    print_summary(sweep.result, 0.05)
    err = capsys.readouterr().err
    assert not any(
        w in err for w in sweep.result.warnings if w not in sweep.result.console_warnings
    )
    assert "incomplete block" not in err
    more = len(sweep.result.warnings) - len(sweep.result.console_warnings)
    assert more > 0 and f"{more} more warning(s) about the fixed-n statistics" in err


def test_one_verdict_per_hypothesis_on_every_surface_and_no_fixed_n_star(sweep, capsys):
    """The console's last lines, the parent run's tags (counted by verdict), the report's every
    section and table (md, tex, csv, json): the anytime verdicts, and the fixed-n p-values only
    as descriptive numbers, never starred or counted as significant."""
    from collections import Counter

    from fusion_ray.schema import DECISIONS_TAG_PREFIX

    verdicts = Counter(r["verdict"] for r in sweep.rows)
    assert set(verdicts) == {"better", "worse", "futile", "grows", "open", "smaller"}
    assert any(r["failed_runs"] for r in sweep.rows)
    print_summary(sweep.result, 0.05)
    out = capsys.readouterr().out
    said = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(), key=lambda x: -x[1]))
    assert (
        f"decisions (anytime-valid, one closed test over the 8 hypotheses, alpha=0.05): {said}"
        in out
    )
    assert "significant after Holm" not in out
    tags = sweep.tracker.client.get_run(sweep.parent).data.tags
    counted = {k.removeprefix(DECISIONS_TAG_PREFIX): int(v) for k, v in tags.items()
               if k.startswith(DECISIONS_TAG_PREFIX)}  # fmt: skip
    assert {k: v for k, v in counted.items() if v} == dict(verdicts)
    assert counted["shrinks"] == 0 and counted["larger"] == 0 and counted["equivalent"] == 0
    # no fixed-n test is called significant or starred anywhere in the report
    star = re.compile(r"\d\*|\^\{\*\}|\$\^\*\$")
    for path in sorted(sweep.out.rglob("*")):
        if path.suffix in (".md", ".tex", ".html"):
            text = path.read_text(encoding="utf-8")
            assert not star.search(text), (path.name, star.search(text))
            assert "significant after Holm" not in text, path.name
        if path.suffix == ".csv":
            frame = pd.read_csv(path)
            for column in (c for c in frame if c == "significant" or c.endswith("_significant")):
                assert not frame[column].astype(bool).any(), (path.name, column)
    stats = json.loads((sweep.out / "stats.json").read_text())
    assert stats["settings"]["descriptive"] is True
    assert not any(row.get("significant") for row in stats["comparisons"])
    # the report's Decisions section and its summary say each hypothesis's verdict
    text = (sweep.out / "report.md").read_text()
    decisions = text.split("## Decisions")[1].split("\n## ")[0]
    for r in sweep.rows:
        line = next(x for x in decisions.splitlines() if r["comparison"].split(": ")[0] in x
                    and f"| {r['verdict']} |" in x)  # fmt: skip
        assert line, r["comparison"]
