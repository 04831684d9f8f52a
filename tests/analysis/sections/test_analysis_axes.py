"""Extra grid axes in the analysis: axis columns from tags, pairing within levels, interaction
tests, the embedding-scale confound, position aliases in Holm families, and the logged latency
ratio. Runs are logged once for the module into a sqlite MLflow store, as the sweep logs them.

The experiment ``axes`` is hand-made so that its interaction tests can be computed by hand:
operators add, concat and gate_scalar, seeds 0-5, axis ``model.scale_embeddings: [true, false]``
(reference true), 100 test documents. Per seed (correct-count differences from add):

    gate_scalar: at true  6  7  8  9 10  2    at false  5  5  5  5  4  7   false - true: -1 -2 -3 -4 -6 +5
    concat:      at true  1  1  1  1  1  1    at false  2  3  4  5  7  6   false - true: +1 +2 +3 +4 +6 +5
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.load import axis_levels, load_experiment
from analysis.load.other_settings import compare_with_counterparts
from analysis.render.tables import TableInputs, operator_summary, table2
from analysis.report import STATS_COLUMNS, ReportOptions, build_report
from analysis.report.markdown import one_line
from analysis.sections.interaction import interaction_tests
from analysis.stats import StatsSettings, compare, holm
from analysis.stats.pairing import pair_runs
from fusion_ray.schema import (
    AXIS_TAG_PREFIX,
    GRID_AXES_TAG,
    LATENCY_RATIO_METRIC,
    POSITION_ALIAS_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
)
from tests.synthetic import SyntheticSweep, flat_config, log_synthetic_sweep, log_trial

pytestmark = pytest.mark.unit

SCALE = "model.scale_embeddings"
SEEDS = range(6)
#: Correct-count differences from add, per seed, at (operator, level): the module docstring.
DELTAS = {
    ("gate_scalar", "true"): [6, 7, 8, 9, 10, 2],
    ("gate_scalar", "false"): [5, 5, 5, 5, 4, 7],
    ("concat", "true"): [1, 1, 1, 1, 1, 1],
    ("concat", "false"): [2, 3, 4, 5, 7, 6],
}
#: gate_scalar's logged latency_ratio_to_baseline per seed (at each level): median 1.25.
GATE_RATIOS = [1.2, 1.3, 5.0, 1.24, 1.26, 1.28]


def _parent(client, exp_id: str, grid_axes: dict | None = None) -> str:
    tags = {ROLE_TAG: ROLE_SWEEP, "sweep": "x"}
    if grid_axes is not None:
        tags[GRID_AXES_TAG] = json.dumps(grid_axes)
    return client.create_run(exp_id, tags=tags).info.run_id


def _trial(
    client,
    exp_id: str,
    parent: str | None,
    op: str,
    seed: int,
    correct: int,
    *,
    position: str = "sinusoidal",
    axes: dict[str, str] | None = None,
    scale_param: str | None = "True",
    extra_tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
) -> str:
    """One FINISHED trial run logged as the sweep logs it (tags, flattened params, metrics)."""
    axes = axes or {}
    params = flat_config("d", "short", position, "none", op, seed)
    if scale_param is not None:
        params[SCALE] = scale_param
    level = "-".join(f"{k}={v}" for k, v in axes.items())
    tags = {
        "cell_id": f"{position}-{op}-{seed}-{level}",
        "dataset": "d",
        "position": position,
        "attention_position": "none",
        "fusion": op,
        "seed": seed,
        "sweep": "x",
        "git_sha": "abc",
        **{AXIS_TAG_PREFIX + k: v for k, v in axes.items()},
        **(extra_tags or {}),
    }
    final = {
        "test_acc": correct / 100,
        "test_correct": correct,
        "test_total": 100,
        "latency_ms_per_sample": 0.5 if op != "add" else 0.1,
        "num_params": 1000,
        **(metrics or {}),
    }
    return log_trial(
        client, exp_id, tags=tags, params=params, final_metrics=final, parent_run_id=parent
    )


def _log_axes(client, root: Path) -> None:
    """Both arms of model.scale_embeddings, with init metrics and logged latency ratios."""
    exp = client.create_experiment("axes", artifact_location=str(root / "art_axes"))
    parent = _parent(client, exp, {SCALE: ["true", "false"]})
    for level, base, token_rms in (("true", 60, 11.3), ("false", 55, 1.0)):
        param = "True" if level == "true" else "False"
        for s in SEEDS:
            for op in ("add", "concat", "gate_scalar"):
                lift = 0 if op == "add" else DELTAS[(op, level)][s]
                ratio = {"add": 1.0, "concat": 1.1, "gate_scalar": GATE_RATIOS[s]}[op]
                metrics = {
                    "init_token_rms": token_rms,
                    "init_position_rms": 0.7071,
                    LATENCY_RATIO_METRIC: ratio,
                }
                _trial(
                    client,
                    exp,
                    parent,
                    op,
                    s,
                    base + s + lift,
                    axes={SCALE: level},
                    scale_param=param,
                    metrics=metrics,
                )


def _log_scaled_only(client, root: Path) -> None:
    """Only the scaled arm: with init metrics (tagged axis), and without them (param only)."""
    exp = client.create_experiment("scaled_only", artifact_location=str(root / "art_so"))
    parent = _parent(client, exp, {SCALE: ["true"]})
    for s in SEEDS:
        init = {"init_token_rms": 11.0 + 0.1 * s, "init_position_rms": 0.7071}
        for op, lift in (("add", 0), ("gate_scalar", 3 + s)):
            _trial(client, exp, parent, op, s, 60 + lift, axes={SCALE: "true"}, metrics=init)
    exp = client.create_experiment("scaled_param", artifact_location=str(root / "art_sp"))
    parent = _parent(client, exp)
    for s in SEEDS:
        for op, lift in (("add", 0), ("gate_scalar", 3 + s)):
            _trial(client, exp, parent, op, s, 60 + lift)


def _log_alias(client, root: Path) -> None:
    """learned and relative_table (the same model under a second name), three operators."""
    exp = client.create_experiment("alias", artifact_location=str(root / "art_alias"))
    parent = _parent(client, exp)
    lifts = {"add": [0] * 6, "concat": [1, 2, -1, 3, 4, 5], "gate_scalar": [2, 3, 4, 5, 6, 7]}
    for position, tags in (("learned", {}), ("relative_table", {POSITION_ALIAS_TAG: "learned"})):
        for s in SEEDS:
            for op, lift in lifts.items():
                _trial(
                    client, exp, parent, op, s, 60 + s + lift[s], position=position, extra_tags=tags
                )


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="analysis-axes-", dir=shm))
    else:
        root = tmp_path_factory.mktemp("axes")
    uri = mlflow_store(root / "mlflow.db")
    client = MlflowClient(uri)
    _log_axes(client, root)
    _log_scaled_only(client, root)
    _log_alias(client, root)
    plain = SyntheticSweep(
        name="plain",
        datasets={"d": "short"},
        operators=("add", "concat"),
        seeds=(0, 1, 2),
        test_size=40,
        predictions=False,
    )
    log_synthetic_sweep(plain, uri, artifact_location=str(root / "art_plain"))
    yield {"uri": uri, "root": root}
    shutil.rmtree(root, ignore_errors=True)


def _options(out: Path, **kw) -> ReportOptions:
    return ReportOptions(out=out, log_to_mlflow=False, lengths=False, make_figures=False, **kw)


@pytest.fixture(scope="module")
def axes_report(store):
    out = store["root"] / "report_axes"
    return build_report("axes", store["uri"], ReportOptions(out=out, log_to_mlflow=False))


# ----------------------------------------------------------------------------- loading, pairing


def test_axis_tags_become_columns_with_levels_in_the_sweep_files_order(store):
    exp = load_experiment("axes", store["uri"])
    assert exp.axis_levels == {SCALE: ["true", "false"]}
    assert set(exp.runs[SCALE]) == {"true", "false"}
    assert (exp.runs.groupby(SCALE).size() == 18).all()
    assert f"params.{SCALE}" in exp.runs and "axis." + SCALE not in exp.runs
    assert exp.runs[LATENCY_RATIO_METRIC].notna().all()
    assert exp.runs["init_token_rms"].notna().all()
    # the fast sqlite path reads the same frame as search_runs
    slow = load_experiment("axes", store["uri"], method="search_runs").runs
    pd.testing.assert_frame_equal(exp.runs, slow, check_dtype=False)
    alias = load_experiment("alias", store["uri"], method="sql").runs
    slow = load_experiment("alias", store["uri"], method="search_runs").runs
    pd.testing.assert_frame_equal(alias, slow, check_dtype=False)
    assert set(alias[POSITION_ALIAS_TAG].dropna()) == {"learned"}


def test_a_sweep_without_axes_gets_no_new_columns(store):
    runs = load_experiment("plain", store["uri"]).runs
    for column in (SCALE, LATENCY_RATIO_METRIC, POSITION_ALIAS_TAG, "init_token_rms"):
        assert column not in runs
    assert load_experiment("plain", store["uri"]).axis_levels == {}


def test_levels_without_the_parent_tag_are_in_natural_order():
    runs = pd.DataFrame(
        {
            SCALE: ["true", "false", "true"],
            "train.lr": ["0.001", "1e-4", "0.0003"],
            "params.train.lr": ["0.001", "1e-4", "0.0003"],
            "dataset": ["d"] * 3,
        }
    )
    assert axis_levels(runs) == {SCALE: ["false", "true"], "train.lr": ["1e-4", "0.0003", "0.001"]}
    tag = json.dumps({"train.lr": ["0.001", "0.0003"]})
    levels = axis_levels(runs, tag)
    assert list(levels) == ["train.lr", SCALE]  # the tag's axes first
    assert levels["train.lr"] == ["0.001", "0.0003", "1e-4"]  # unlisted levels follow
    notes: list[str] = []
    assert axis_levels(runs, "not json", notes)[SCALE] == ["false", "true"]
    assert GRID_AXES_TAG in notes[0]


def test_a_pair_never_crosses_levels_of_an_axis(store):
    exp = load_experiment("axes", store["uri"])
    pairing = pair_runs(exp.runs, "add")  # the axis column is found without being named
    assert pairing.axes == (SCALE,) and SCALE in pairing.keys
    assert len(pairing.pairs) == 24 and pairing.duplicates.empty and pairing.incomplete.empty
    level = exp.runs.set_index("run_id")[SCALE]
    assert (pairing.pairs["run_id"].map(level) == pairing.pairs["baseline_run_id"].map(level)).all()
    assert (pairing.pairs["run_id"].map(level) == pairing.pairs[SCALE]).all()
    deltas = pairing.pairs["correct"] - pairing.pairs["baseline_correct"]
    for (op, lvl), grp in pairing.pairs.assign(delta=deltas).groupby(["operator", SCALE]):
        assert grp.sort_values("seed")["delta"].tolist() == DELTAS[(op, lvl)]
    # without the axis the two levels of a seed are two runs of one cell: nothing is paired
    ignored = pair_runs(exp.runs, "add", axes=(), ignore_params=[SCALE])
    assert ignored.pairs.empty and len(ignored.duplicates) == 18


def test_counterparts_of_runs_left_out_match_the_axis_level():
    sweep = pd.DataFrame(
        [
            {
                "dataset": "d",
                "position": "p",
                "attention_position": "none",
                "operator": "add",
                "seed": 0,
                SCALE: lvl,
                "status": "FINISHED",
                "run_id": f"r{lvl}",
                "params.model.scale_embeddings": param,
                "params.train.epochs": "1",
            }
            for lvl, param in (("true", "True"), ("false", "False"))
        ]
    )
    left_out = sweep.assign(**{"params.train.epochs": "2", "run_id": ["o1", "o2"]})
    differences, without, same = compare_with_counterparts(left_out, sweep, [SCALE])
    assert differences == ["train.epochs 2 in 2 runs vs 1 in the sweep's runs"]
    assert (without, same) == (0, 0)  # matched level by level: scale_embeddings never differs
    untagged = left_out.assign(**{SCALE: None}).iloc[:1]  # an older file without the axis tag
    assert compare_with_counterparts(untagged, sweep, [SCALE])[1] == 0


# ----------------------------------------------------------------------------- interaction


def test_interaction_on_the_hand_computed_case(axes_report):
    text = {"level": str, "reference": str}
    inter = pd.read_csv(axes_report.out_dir / "interaction.csv", dtype=text)
    assert len(inter) == 2 and set(inter["axis"]) == {SCALE}
    assert set(inter["level"]) == {"false"} and set(inter["reference"]) == {"true"}
    assert inter[SCALE].isna().all()  # the tested axis has no value of its own in a test
    rows = inter.set_index("operator")
    gate, concat = rows.loc["gate_scalar"], rows.loc["concat"]
    # per seed: (delta at false) - (delta at true), in pp of 100 documents
    d_gate = np.array(DELTAS[("gate_scalar", "false")]) - DELTAS[("gate_scalar", "true")]
    d_concat = np.array(DELTAS[("concat", "false")]) - DELTAS[("concat", "true")]
    assert d_gate.tolist() == [-1, -2, -3, -4, -6, 5]
    # hand: |d| ranks 1..6, positive rank 5 -> V = 5; P(T+ <= 5) = 10/64; two-sided 20/64
    assert gate["wilcoxon_stat"] == 5 and gate["p_wilcoxon"] == pytest.approx(20 / 64)
    assert concat["wilcoxon_stat"] == 21 and concat["p_wilcoxon"] == pytest.approx(2 / 64)
    for d, row in ((d_gate, gate), (d_concat, concat)):
        assert row["p_wilcoxon"] == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
        assert row["median_interaction"] == pytest.approx(np.median(d))
        assert row["n_pairs"] == 6
    assert gate["median_delta_reference"] == pytest.approx(7.5)
    assert gate["median_delta_level"] == pytest.approx(5.0)
    # Holm over the interaction family (m = 2): 2 * 2/64, then max(that, 20/64)
    assert concat["p_holm"] == pytest.approx(4 / 64) and gate["p_holm"] == pytest.approx(20 / 64)
    md = (axes_report.out_dir / "report.md").read_text()
    assert f"**Does the operator effect depend on {SCALE}?**" in md
    assert "m = 2 interaction tests" in md and "false vs true" in md


def test_interaction_with_more_levels_tests_each_against_the_reference():
    rows = []
    for lr, shift in (("0.001", 0), ("0.0003", 1), ("0.0001", 3)):
        for s in range(4):
            for op, lift in (("add", 0), ("concat", 2 + shift * (s + 1))):
                rows.append(
                    {
                        "run_id": f"{lr}-{op}-{s}",
                        "run_name": f"{lr}-{op}-{s}",
                        "status": "FINISHED",
                        "cell_id": f"{lr}-{op}-{s}",
                        "dataset": "d",
                        "position": "sinusoidal",
                        "attention_position": "none",
                        "train.lr": lr,
                        "operator": op,
                        "seed": s,
                        "test_correct": 50 + s + lift,
                        "test_total": 100,
                        "test_acc": (50 + s + lift) / 100,
                        "artifact_uri": "/nowhere",
                    }
                )
    pairing = pair_runs(pd.DataFrame(rows), "add")
    assert pairing.axes == ("train.lr",)
    levels = {"train.lr": ["0.001", "0.0003", "0.0001"]}
    table = interaction_tests(pairing, levels, StatsSettings()).table
    assert list(table["level"]) == ["0.0003", "0.0001"] and set(table["reference"]) == {"0.001"}
    # per seed the delta grows by shift * (seed + 1) against the reference
    assert table["median_interaction"].tolist() == pytest.approx([2.5, 7.5])
    assert (table["p_wilcoxon"] == 2 / 16).all()  # four positive differences, exact
    assert table["p_holm"].tolist() == pytest.approx(holm([2 / 16, 2 / 16]).tolist())


def test_tables_and_stats_get_a_column_per_axis(axes_report):
    out = axes_report.out_dir
    stats_csv = pd.read_csv(out / "stats.csv", dtype={SCALE: str})
    assert list(stats_csv.columns[:4]) == ["dataset", "position", "attention_position", SCALE]
    assert len(stats_csv) == 4 and axes_report.comparisons.settings["m"] == 4
    assert stats_csv[SCALE].tolist() == ["true", "true", "false", "false"]  # reference first
    table1 = pd.read_csv(out / "tables" / "table1_accuracy.csv", dtype={SCALE: str})
    assert list(table1.columns[:2]) == ["dataset", SCALE]
    display = axes_report.tables["table1"].display
    assert display[SCALE].tolist() == ["true", "false"]
    assert axes_report.tables["table2"].display[SCALE].tolist() == ["true"] * 3 + ["false"] * 3
    payload = json.loads((out / "stats.json").read_text())
    assert payload["settings"]["grid_axes"] == {SCALE: ["true", "false"]}
    assert payload["settings"]["group_keys"][-1] == SCALE
    assert len(payload["interaction_tests"]["rows"]) == 2
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {"paired_deltas__sinusoidal__none__true.png", "paired_deltas_by_setting__d.png"} <= (
        figures
    )
    assert {"accuracy_by_length_regime.png", "accuracy_vs_latency.png"} <= figures


# ----------------------------------------------------------------------------- the confound


def test_no_confound_warning_when_both_arms_are_compared(axes_report):
    assert not any("confound" in w for w in axes_report.warnings)
    md = (axes_report.out_dir / "report.md").read_text()
    section = md.split("## Operator effects with and without embedding scaling")[1]
    section = section.split("\n## ")[0]
    table = axes_report.comparisons.table.set_index(["operator", SCALE])
    gate_scaled = table.loc[("gate_scalar", "true")]
    gate_unscaled = table.loc[("gate_scalar", "false")]
    inter = pd.read_csv(axes_report.out_dir / "interaction.csv").set_index("operator")
    row = next(line for line in section.splitlines() if "| gate_scalar |" in line)
    assert f"+7.50 (p Holm {gate_scaled['p_holm']:.4g}" in row
    assert f"+5.00 (p Holm {gate_unscaled['p_holm']:.4g}" in row
    assert f"-2.50 (p Holm {inter.loc['gate_scalar', 'p_holm']:.4g})" in row
    assert "difference false − true" in section


def test_confound_warning_with_the_measured_ratio(store, tmp_path):
    res = build_report("scaled_only", store["uri"], _options(tmp_path))
    (warning,) = [w for w in res.warnings if "confound" in w]
    runs = res.experiment.runs
    ratio = (runs["init_token_rms"] / runs["init_position_rms"]).median()
    assert f"{ratio:.3g}x the position signal in RMS" in warning
    assert "median over 12 runs" in warning
    assert f"`{SCALE}: [true, false]`" in warning and "sweeps/confound.yaml" in warning
    assert warning in (tmp_path / "warnings.md").read_text()  # in full; report.md: one line
    assert f"- {one_line(warning)}" in (tmp_path / "report.md").read_text()
    assert "Operator effects with and without" not in (tmp_path / "report.md").read_text()


def test_confound_warning_without_init_metrics_gives_the_implied_ratio(store, tmp_path):
    res = build_report("scaled_param", store["uri"], _options(tmp_path))
    (warning,) = [w for w in res.warnings if "confound" in w]
    assert "init_token_rms and init_position_rms were not logged" in warning
    implied = math.sqrt(128) / math.sqrt(0.5)
    assert f"d_model = 128 implies sqrt(128) / sqrt(1/2) = {implied:.3g}x" in warning
    assert implied == pytest.approx(16.0)
    # another baseline is not `add`: no confound to warn about
    res = build_report("scaled_param", store["uri"], _options(tmp_path, baseline="gate_scalar"))
    assert not any("confound" in w for w in res.warnings)


# ----------------------------------------------------------------------------- aliases


def test_an_alias_leaves_the_holm_family(store, tmp_path):
    res = build_report("alias", store["uri"], _options(tmp_path))
    table = res.comparisons.table
    assert set(table["position"]) == {"learned"} and len(table) == 2
    assert res.comparisons.settings["m"] == 2
    assert table["p_holm"].tolist() == pytest.approx(holm(table["p_wilcoxon"]).tolist())
    aliases = res.pairing.aliases
    assert set(aliases["position"]) == {"relative_table"} and set(aliases["alias_of"]) == {
        "learned"
    }
    assert sorted(aliases["operator"]) == ["concat", "gate_scalar"]
    assert (aliases["n_pairs"] == 6).all()
    assert (
        "relative_table is the same model as learned: tested once"
        in (tmp_path / "report.md").read_text()
    )
    # tested twice, the family would be m = 4 and every adjusted p larger
    runs = res.experiment.runs.drop(columns=POSITION_ALIAS_TAG)
    twice = compare(pair_runs(runs, "add")).table
    assert len(twice) == 4 and twice["position"].nunique() == 2
    learned = twice[twice["position"] == "learned"].set_index("operator")["p_holm"]
    once = table.set_index("operator")["p_holm"]
    assert (learned > once).all()


def test_an_alias_without_its_canonical_position_is_tested(store):
    runs = load_experiment("alias", store["uri"]).runs
    alone = pair_runs(runs[runs["position"] == "relative_table"], "add")
    assert alone.aliases.empty and len(alone.pairs) == 12
    assert set(compare(alone).table["position"]) == {"relative_table"}


# ----------------------------------------------------------------------------- latency


def test_table2_uses_the_logged_latency_ratio(axes_report):
    data = axes_report.tables["table2"].data.set_index(["operator", SCALE])
    assert data.loc[("gate_scalar", "true"), "latency_ratio"] == pytest.approx(
        float(np.median(GATE_RATIOS))
    )
    assert data.loc[("add", "true"), "latency_ratio"] == 1.0
    assert set(data["latency_ratio_source"]) == {"logged"}
    # the mean latencies (0.5 vs 0.1 ms) would have given 5x
    assert data.loc[("gate_scalar", "true"), "latency_ms_mean"] == pytest.approx(0.5)
    notes = " ".join(axes_report.tables["table2"].footnotes)
    assert "does not depend on which trials shared the device" in notes
    assert "co-scheduled" not in notes
    md = (axes_report.out_dir / "report.md").read_text()
    method = md.split("## Method")[1].split("\n## ")[0]
    assert f"`{LATENCY_RATIO_METRIC}`" in method and "own process" in method


def test_without_the_logged_ratio_the_table_says_it_may_depend_on_co_scheduling(store, tmp_path):
    res = build_report("plain", store["uri"], _options(tmp_path))
    data = res.tables["table2"].data.set_index("operator")
    assert set(data["latency_ratio_source"]) == {"mean latencies"}
    assert data.loc["concat", "latency_ratio"] == pytest.approx(
        data.loc["concat", "latency_ms_mean"] / data.loc["add", "latency_ms_mean"]
    )
    assert "co-scheduled" in " ".join(res.tables["table2"].footnotes)


def test_length_analysis_and_figures_per_level(store, tmp_path):
    """A synthetic sweep logged at both levels of the axis, with predictions: the length
    analysis compares within levels, and the figures show every level."""
    from mlflow import MlflowClient

    client = MlflowClient(store["uri"])
    parent = None
    for level in ("true", "false"):
        spec = SyntheticSweep(
            name="lengths",
            datasets={"d": "long"},
            operators=("add", "gate_scalar"),
            seeds=(0, 1, 2, 3),
            test_size=80,
            extra_params={SCALE: level.capitalize()},
            cell_salt=level,
            cells_artifact=False,
        )
        ids = log_synthetic_sweep(
            spec,
            store["uri"],
            artifact_location=str(store["root"] / "art_len"),
            parent_run_id=parent,
        )
        parent = ids["parent_run_id"]
        for run_id in ids["run_ids"]:
            client.set_tag(run_id, AXIS_TAG_PREFIX + SCALE, level)
    res = build_report("lengths", store["uri"], ReportOptions(out=tmp_path, log_to_mlflow=False))
    assert res.experiment.axis_levels == {SCALE: ["false", "true"]}  # no parent tag: natural
    la = res.lengths
    assert set(la.stats[SCALE]) == {"true", "false"} and set(la.accuracy[SCALE]) == {
        "true",
        "false",
    }
    contrasts = la.stats[la.stats["bucket"] == "long-short"]
    assert len(contrasts) == 2
    md = (tmp_path / "report.md").read_text()
    buckets = md.split("## Length-aware analysis")[1].split("Contrasts and buckets")[0]
    assert "| dataset | bucket | tokens |" in buckets  # the same buckets at both levels: once
    assert "| dataset | model.scale_embeddings | operator | bucket |" in md
    figures = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"accuracy_by_length_bucket.png", "paired_deltas_by_setting__d.png"} <= figures
    assert len(pd.read_csv(tmp_path / "interaction.csv")) == 1


def test_table2_marks_the_rows_whose_ratio_is_not_logged():
    """A sweep resumed across versions: some operators' runs log the ratio, others do not."""
    rows = [
        {
            "dataset": "d",
            "position": "sinusoidal",
            "attention_position": "none",
            "operator": op,
            "seed": s,
            "test_correct": 60,
            "test_total": 100,
            "latency_ms_per_sample": latency,
            "num_params": 1000,
            "train_seconds": 1.0,
            LATENCY_RATIO_METRIC: ratio,
        }
        for s in range(3)
        for op, latency, ratio in (("add", 0.1, 1.0), ("concat", 0.3, math.nan), ("mlp", 0.2, 1.5))
    ]
    keys = ["dataset", "position", "attention_position"]
    summary = operator_summary(pd.DataFrame(rows), keys)
    settings = {"alpha": 0.05, "m": 2}
    setting = {"position": "sinusoidal", "attention_position": "none"}
    table = table2(TableInputs(summary, pd.DataFrame(), settings, "add", keys, ["d"], setting))
    data = table.data.set_index("operator")
    assert data.loc["mlp", "latency_ratio"] == 1.5  # logged, not 0.2 / 0.1
    assert data.loc["concat", "latency_ratio"] == pytest.approx(3.0)  # means: no logged ratio
    shown = table.display.set_index("operator")["latency / add"]
    assert shown["concat"] == "3.00×†" and shown["mlp"] == "1.50×"
    notes = " ".join(table.footnotes)
    assert "own process" in notes and "(cells marked †)" in notes and "co-scheduled" in notes


# ----------------------------------------------------------------------------- no extra axes


def test_a_report_without_extra_axes_has_no_axis_output(store, tmp_path):
    res = build_report("plain", store["uri"], _options(tmp_path))
    stats_csv = pd.read_csv(tmp_path / "stats.csv")
    assert list(stats_csv.columns[: len(STATS_COLUMNS)]) == STATS_COLUMNS
    assert not (tmp_path / "interaction.csv").exists()
    assert list(res.tables) == ["table1", "table2", "table3"]
    assert list(res.tables["table1"].display.columns) == ["dataset", "add", "concat"]
    md = (tmp_path / "report.md").read_text()
    for absent in ("Interaction tests", "Grid axes", "embedding scaling", "interaction.csv"):
        assert absent not in md
    payload = json.loads((tmp_path / "stats.json").read_text())
    assert "grid_axes" not in payload["settings"] and "interaction_tests" not in payload
    assert res.pairing.keys == ("dataset", "position", "attention_position")
