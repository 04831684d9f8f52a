"""The report's "Decisions" section: the anytime-valid decisions of fusion_ray.decide.sequential, first in
the report; primary (with the sweep's own rule) for an adaptive sweep, a secondary view for a
fixed-seed sweep. Hand-made runs on a real (sqlite) MLflow store: gate_scalar wins every seed by
6 points (64 vs 58 correct of 100)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from analysis.report import ReportOptions, build_report
from fusion_ray.schema import ADAPTIVE_TAG, DECISIONS_FILE, ROLE_SWEEP, ROLE_TAG
from tests.synthetic import flat_config, log_trial

pytestmark = pytest.mark.unit


def _log(client, name: str, seeds: int, parent_tags: dict[str, str]) -> None:
    exp = client.create_experiment(name)
    tags = {ROLE_TAG: ROLE_SWEEP, "sweep": name, **parent_tags}
    parent = client.create_run(exp, tags=tags).info.run_id
    for seed in range(seeds):
        for op, correct in (("add", 58), ("gate_scalar", 64)):
            log_trial(
                client,
                exp,
                tags={
                    "cell_id": f"{op}-{seed}",
                    "dataset": "short",
                    "position": "sinusoidal",
                    "attention_position": "none",
                    "fusion": op,
                    "seed": seed,
                    "sweep": name,
                    "git_sha": "abc",
                },
                params=flat_config("short", "short", "sinusoidal", "none", op, seed),
                final_metrics={
                    "test_acc": correct / 100,
                    "test_correct": correct,
                    "test_total": 100,
                    "latency_ms_per_sample": 0.2,
                    "num_params": 1000,
                },
                parent_run_id=parent,
            )
    client.set_terminated(parent, "FINISHED")


@pytest.fixture(scope="module")
def store(mlflow_store):
    from mlflow import MlflowClient

    uri = mlflow_store()  # on the RAM disk
    client = MlflowClient(uri)
    _log(client, "fixed", 4, {})
    rule = {"first": 2, "max": 12, "alpha": 0.05, "margin": None}
    _log(client, "adaptive", 8, {ADAPTIVE_TAG: json.dumps(rule)})
    return uri


def _report(store, name, tmp_path):
    options = ReportOptions(out=tmp_path / name, log_to_mlflow=False, lengths=False)
    build_report(name, store, options)
    text = (tmp_path / name / "report.md").read_text()
    table = pd.read_csv(tmp_path / name / DECISIONS_FILE)
    return text, table


def test_a_fixed_seed_sweep_gets_the_anytime_evidence_as_a_secondary_view(store, tmp_path):
    text, table = _report(store, "fixed", tmp_path)
    assert text.index("## Decisions") < text.index("## Warnings")  # first after the header
    assert "**Secondary view.**" in text and "fixed-n tests below are its primary" in text
    (row,) = table.to_dict(orient="records")
    # the default (magnitude) rule, its first wave all 4 planned seeds: four equal deltas of +6
    # points at their own scale, E_4 = ((1 + tanh 1.5)^4 + (1 - tanh 1.5)^4) / 2 = 6.59 < 20
    e_4 = ((1 + math.tanh(1.5)) ** 4 + (1 - math.tanh(1.5)) ** 4) / 2
    assert row["state"] == "open" and row["seeds_used"] == 4
    assert row["e_max"] == pytest.approx(e_4, rel=1e-6)
    assert row["p_anytime"] == pytest.approx(1 / e_4, rel=1e-6)
    assert row["rule"] == "magnitude(theta=1.5)" and "symmetric about 0" in row["null"]
    assert "short/sinusoidal/none: gate_scalar vs add" == row["comparison"]


def test_an_adaptive_sweep_decides_with_its_own_rule_as_the_primary_analysis(store, tmp_path):
    text, table = _report(store, "adaptive", tmp_path)
    assert "**Primary analysis.**" in text and "cap 12 seeds" in text
    assert "descriptive only" in text
    (row,) = table.to_dict(orient="records")
    # its tag names no rule: it was written when the sign rule was the only one, and is read so;
    # one comparison, so Holm's threshold is 1/alpha = 20: E_6 = 14.4, E_7 = 26.8
    assert "rule `sign`" in text and row["rule"] == "sign"
    assert (row["state"], row["seeds_used"], row["decided_at_seed"]) == ("better", 8, 6)
    assert row["p_family"] == pytest.approx(1 / row["e_max"], rel=1e-9)
    assert row["cs_low"] < 6 < row["cs_high"] or math.isinf(row["cs_high"])
    assert (tmp_path / "adaptive" / "figures" / "decisions_e_process.png").is_file()
    # the forest plot of what was decided comes first, as PNG and PDF, captioned in report.md
    for ext in ("png", "pdf"):
        assert (tmp_path / "adaptive" / "figures" / f"decisions_forest.{ext}").is_file()
    assert text.index("figures/decisions_forest.png") < text.index("decisions_e_process.png")
    assert "its e-BY interval (95.0%, valid for the decided ones together)" in text


def test_compare_given_the_experiment_returns_the_reports_decisions(store, tmp_path):
    """The Python API's compare() carries the verdicts beside the fixed-n table: the same rows
    the report's decisions.csv has (one computation, analysis.stats.verdicts)."""
    from analysis import compare, load_experiment, pair_runs

    _, table = _report(store, "adaptive", tmp_path)
    exp = load_experiment("adaptive", store)
    result = compare(pair_runs(exp.runs, baseline="add"), experiment=exp)
    (row,) = result.decisions.to_dict(orient="records")
    (logged,) = table.to_dict(orient="records")
    for column in ("comparison", "kind", "state", "verdict", "seeds_used", "decided_at_seed"):
        assert row[column] == logged[column]
    assert row["ci_low"] == pytest.approx(logged["ci_low"]) and row["ci_low"] > 0
    assert compare(pair_runs(exp.runs, baseline="add")).decisions is None


def test_display_names_for_a_paper_reach_the_tables_and_keep_the_data(store, tmp_path):
    options = ReportOptions(
        out=tmp_path / "named",
        log_to_mlflow=False,
        lengths=False,
        labels={"operators": {"gate_scalar": "Scalar gate"}, "datasets": {"short": "AG News"}},
    )
    result = build_report("adaptive", store, options)
    table1 = result.tables["table1"]
    assert "Scalar gate" in table1.display.columns and "gate_scalar" not in table1.display.columns
    assert "AG News" in table1.display.to_numpy().ravel().tolist()
    assert set(table1.data["operator"]) == {"add", "gate_scalar"}  # the numbers keep the names
    decisions = pd.read_csv(tmp_path / "named" / DECISIONS_FILE)
    assert decisions["comparison"].str.contains("gate_scalar").all()


def test_a_labels_file_is_checked_and_read(tmp_path):
    from analysis.report import read_labels

    good = tmp_path / "labels.yaml"
    good.write_text("operators: {gate_scalar: Scalar gate}\npositions: {sinusoidal: Sin.}\n")
    assert read_labels(good) == {
        "operators": {"gate_scalar": "Scalar gate"},
        "positions": {"sinusoidal": "Sin."},
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("fusions: {gate_scalar: x}\n")
    with pytest.raises(ValueError, match="keys operators, datasets, positions"):
        read_labels(bad)


def test_legends_sit_outside_the_axes_and_bars_say_what_they_are():
    from matplotlib.figure import Figure

    from analysis.render.drawing import SD_BARS, _grid_and_legend

    ax = Figure().subplots()
    ax.errorbar([0, 1], [1, 2], yerr=[0.1, 0.2], label="add")
    _grid_and_legend(ax)
    anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    assert anchor.x0 > 1.0  # right of the data area
    assert SD_BARS == "bars: mean ± 1 sd over seeds"


def test_an_error_bars_legend_entry_shows_its_marker_not_the_caps():
    """A legend entry of an error bar is its data line (marker and line style): the caps of a
    small legend icon hid which marker, so which setting, an entry was."""
    from matplotlib.figure import Figure

    from analysis.render.drawing import _grid_and_legend

    ax = Figure().subplots()
    ax.errorbar([0], [1], yerr=[0.1], fmt="s", label="false", capsize=3)
    ax.errorbar([1], [2], yerr=[0.1], fmt="o", label="true", capsize=3)
    _grid_and_legend(ax)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["false", "true"]
    assert [h.get_marker() for h in legend.legend_handles] == ["s", "o"]


def test_each_e_value_panel_is_titled_in_its_width_with_the_tables_verdict():
    from analysis.sections.decisions import PANEL_TITLE_CHARS, _panel_title

    name = "long-short/sinusoidal/none/scale_embeddings=false-true: gate_scalar vs add"
    title = _panel_title(name, "smaller")
    lines = title.split("\n")
    assert lines[0] == "gate_scalar vs add" and lines[-1] == "smaller"
    assert "/".join(lines[1:-1]) == name.split(": ")[0]  # the whole group, wrapped at "/"
    assert all(len(line) <= PANEL_TITLE_CHARS for line in lines[1:-1])
    assert _panel_title("short: concat vs add", "better") == "concat vs add\nshort\nbetter"


def test_the_forest_plot_draws_decided_intervals_and_greys_the_open_ones(tmp_path, monkeypatch):
    """Each hypothesis is one line: decided in colour with its e-BY interval, open or futile in
    grey with its confidence sequence (an unbounded one not drawn), the verdict beside."""
    from analysis.render import drawing

    rows = pd.DataFrame(
        {
            "comparison": ["short: b vs a", "long-short: b vs a", "medium: b vs a"],
            "state": ["better", "open", "futile"],
            "verdict": ["better", "open", "futile"],
            "hodges_lehmann": [3.0, math.nan, 0.5],
            "mean": [2.5, 1.0, 0.4],
            "ci_low": [1.0, math.nan, math.nan],
            "ci_high": [5.0, math.nan, math.nan],
            "cs_low": [0.5, -math.inf, -2.0],
            "cs_high": [6.0, math.inf, 3.0],
        }
    )
    drawn = []
    real_save = drawing.save
    monkeypatch.setattr(drawing, "save", lambda fig, *a: drawn.append(fig) or real_save(fig, *a))
    paths = drawing.forest(rows, tmp_path, "forest", "Decisions")
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.is_file() for p in paths)
    (ax,) = drawn[0].axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == list(rows["comparison"])[::-1]  # the family's order, top to bottom
    segments = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2 and ln.get_linewidth() == 2]
    spans = {tuple(ln.get_xdata()): ln.get_color() for ln in segments}
    assert spans == {(1.0, 5.0): drawing.FOREST_DECIDED, (-2.0, 3.0): "0.65"}
    points = {
        ln.get_ydata()[0]: ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_marker() == "o"
    }
    assert points == {2: 3.0, 1: 1.0, 0: 0.5}  # Hodges-Lehmann, else the mean
