"""Tables and figures from hand-built frames: marks, footnotes, escaping, files written."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.render import drawing
from analysis.render.tables import (
    TableInputs,
    dataset_order,
    latex_cell,
    operator_order,
    operator_summary,
    table1,
    table2,
    table3,
)

pytestmark = pytest.mark.unit

KEYS = ["dataset", "position", "attention_position"]
SETTINGS = {"alpha": 0.05, "alternative": "two-sided", "zero_method": "wilcox", "m": 2}


def runs_frame():
    rows = []
    for d, base in (("imdb", 80), ("arxiv", 60)):
        for op, lift in (("add", 0), ("gate_scalar", 5), ("gate_cnn(kernel_size=3)", 2)):
            for seed in range(4 if op == "gate_cnn(kernel_size=3)" else 6):
                rows.append(
                    {
                        "dataset": d,
                        "position": "sinusoidal",
                        "attention_position": "none",
                        "operator": op,
                        "seed": seed,
                        "test_correct": base + lift + seed % 2,
                        "test_total": 100,
                        "latency_ms_per_sample": 0.1 + 0.01 * lift,
                        "num_params": 1000 + lift,
                        "train_seconds": 1.0,
                    }
                )
    return pd.DataFrame(rows)


def comparisons():
    rows = []
    for d in ("imdb", "arxiv"):
        for op in ("gate_scalar", "gate_cnn(kernel_size=3)"):
            sig = d == "arxiv" and op == "gate_scalar"
            rows.append(
                {
                    "dataset": d,
                    "position": "sinusoidal",
                    "attention_position": "none",
                    "operator": op,
                    "n_pairs": 6 if op == "gate_scalar" else 4,
                    "significant": sig,
                    "can_reach_alpha": op == "gate_scalar",
                    "min_attainable_p_holm": 0.0625 if op == "gate_scalar" else 0.5,
                }
            )
    return pd.DataFrame(rows)


def test_orders():
    """The baseline first, then the order the sweep recorded (the fusion registry's for
    operators, options ignored; the sweep file's for datasets), then by name; datasets by
    median length first where it is known."""
    ops = ["mlp", "gate_scalar", "zeta", "add", "gate_cnn(k=3)"]
    registry = ["add", "concat", "gate_scalar", "gate_cnn", "mlp"]
    assert operator_order(ops, "add", registry) == [
        "add",
        "gate_scalar",
        "gate_cnn(k=3)",
        "mlp",
        "zeta",
    ]
    assert operator_order(ops, "mlp") == ["mlp", "add", "gate_cnn(k=3)", "gate_scalar", "zeta"]
    sweep_file = ["ag_news", "imdb", "arxiv"]
    assert dataset_order(["arxiv", "imdb", "ag_news"], known=sweep_file) == sweep_file
    assert dataset_order(["arxiv", "imdb", "ag_news"]) == ["ag_news", "arxiv", "imdb"]
    assert dataset_order(["a", "b"], {"a": 900.0, "b": 40.0}, ["a", "b"]) == ["b", "a"]


def test_table1_marks_only_significant_cells_and_footnotes_the_test():
    summary = operator_summary(runs_frame(), KEYS)
    setting = {"position": "sinusoidal", "attention_position": "none"}
    t = table1(
        TableInputs(summary, comparisons(), SETTINGS, "add", KEYS, ["imdb", "arxiv"], setting)
    )
    md = t.to_markdown()
    row = {r["dataset"]: r for _, r in t.display.iterrows()}
    assert row["arxiv"]["gate_scalar"].endswith("*")
    assert not row["imdb"]["gate_scalar"].endswith("*")
    assert "(n=4)" in row["arxiv"]["gate_cnn(kernel_size=3)"]  # n differs from the usual 6
    assert row["arxiv"]["add"] == "60.50 ± 0.55"
    assert "Holm" in md and "Wilcoxon" in md and "m = 2" in md and "`add`" in md
    assert "2 of 4 comparisons cannot reach 0.05" in md
    assert list(t.data.columns) == [
        "dataset",
        "operator",
        "n",
        "acc_mean",
        "acc_sd",
        "significant",
        "mark",
    ]
    tex = t.to_latex()
    assert "gate\\_scalar" in tex and "$^{*}$" in tex and "\\toprule" in tex


def test_an_adaptive_sweeps_tables_mark_its_anytime_decisions_and_no_fixed_n_star():
    summary = operator_summary(runs_frame(), KEYS)
    setting = {"position": "sinusoidal", "attention_position": "none"}
    decided = {
        ("arxiv", "sinusoidal", "none", "gate_scalar"): "worse",
        ("imdb", "sinusoidal", "none", "gate_scalar"): "better",
    }
    inputs = TableInputs(
        summary, comparisons(), SETTINGS, "add", KEYS, ["imdb", "arxiv"], setting,
        decided=decided, decided_note="decided by the anytime-valid rule magnitude",
    )  # fmt: skip
    t = table1(inputs)
    row = {r["dataset"]: r for _, r in t.display.iterrows()}
    assert row["arxiv"]["gate_scalar"].endswith("↓") and row["imdb"]["gate_scalar"].endswith("↑")
    assert not any("*" in str(v) for v in t.display.to_numpy().ravel())  # Holm's star is gone
    assert t.footnotes[0] == "decided by the anytime-valid rule magnitude"
    # a cell whose seed count is not the most common says it, and the footnote says what it means
    assert any("(n=" in str(v) for v in t.display.to_numpy().ravel())
    assert t.footnotes[1:] == [
        "(n=k): a cell with k seeds; every other cell has 6, the most common count."
    ]
    assert "$^{\\uparrow}$" in t.to_latex() and "$^{\\downarrow}$" in t.to_latex()
    t2 = table2(inputs)
    assert set(t2.data["mark"]) == {"", "↑", "↓"} and not t2.data["significant"].any()


def test_table2_latency_ratio_and_table3_rows(tmp_path):
    summary = operator_summary(runs_frame(), KEYS)
    setting = {"position": "sinusoidal", "attention_position": "none"}
    inputs = TableInputs(summary, comparisons(), SETTINGS, "add", KEYS, ["imdb", "arxiv"], setting)
    t2 = table2(inputs)
    arxiv = t2.data[t2.data["dataset"] == "arxiv"].set_index("operator")
    assert arxiv.loc["add", "latency_ratio"] == 1.0
    assert arxiv.loc["gate_scalar", "latency_ratio"] == pytest.approx(1.5)
    t3 = table3(inputs)
    assert list(t3.display["dataset"]) == ["imdb", "arxiv"]
    paths = t3.write(tmp_path)
    assert [p.suffix for p in paths] == [".md", ".tex", ".csv"] and all(p.exists() for p in paths)


def test_table3_names_the_order_blind_control_only_when_it_is_there():
    runs = runs_frame()
    setting = {"position": "sinusoidal", "attention_position": "none"}
    plain = table3(
        TableInputs(
            operator_summary(runs, KEYS),
            comparisons(),
            SETTINGS,
            "add",
            KEYS,
            ["imdb", "arxiv"],
            setting,
        )
    )
    assert not any("order-blind" in note for note in plain.footnotes)
    blind = runs[runs["dataset"] == "arxiv"].assign(position="none")
    summary = operator_summary(pd.concat([runs, blind]), KEYS)
    table = table3(
        TableInputs(summary, comparisons(), SETTINGS, "add", KEYS, ["imdb", "arxiv"], setting)
    )
    assert any("order-blind control" in note for note in table.footnotes)
    assert ("arxiv", "none") in set(map(tuple, table.data[["dataset", "position"]].to_numpy()))


def test_latex_escaping():
    assert latex_cell("gate_cnn(k=3) 50% ± 1 `add` & #") == (
        "gate\\_cnn(k=3) 50\\% $\\pm$ 1 \\texttt{add} \\& \\#"
    )


def test_paired_delta_figure_writes_png_and_pdf(tmp_path):
    deltas = pd.DataFrame(
        {
            "dataset": ["arxiv"] * 4 + ["imdb"] * 4,
            "operator": ["gate_scalar", "gate_scalar", "concat", "concat"] * 2,
            "seed": [0, 1, 0, 1] * 2,
            "delta": [1.0, 2.0, -0.5, 0.5, 0.1, -0.1, 0.0, 0.2],
        }
    )
    paths = drawing.paired_deltas(
        deltas,
        "dataset",
        ["imdb", "arxiv"],
        ["add", "concat", "gate_scalar"],
        "add",
        "title",
        tmp_path,
        "deltas",
    )
    assert [p.name for p in paths] == ["deltas.png", "deltas.pdf"]
    assert drawing.slug("gate_cnn(kernel_size=3)") == "gate_cnn-kernel_size-3"


def test_length_buckets_merge_rather_than_come_out_empty():
    import numpy as np

    from analysis.sections.study.lengths import bucket_edges

    def sizes(length):
        length = np.sort(np.asarray(length))
        return np.bincount(np.searchsorted(bucket_edges(length, 4), length, side="right")).tolist()

    assert sizes(np.arange(1, 101)) == [25, 24, 25, 26]
    assert sizes([1] * 50 + [100] * 50) == [50, 50]
    assert sizes([512] * 10) == [10]


def test_a_latency_bar_runs_from_the_fastest_to_the_slowest_run_never_below_zero():
    """Mean ± sd of a skewed latency (its sd above its mean) drew a bar below 0 ms; the
    figure's bar now spans the runs' own latencies."""
    from analysis.render.drawing import latency_bar

    skewed = pd.Series({"latency_mean": 0.467, "latency_sd": 0.528, "latency_min": 0.12,
                        "latency_max": 1.95})  # fmt: skip
    (below,), (above,) = latency_bar(skewed)
    assert 0.467 - below == pytest.approx(0.12) and 0.467 + above == pytest.approx(1.95)
    assert 0.467 - below >= 0
    runs = runs_frame()
    summary = operator_summary(runs, KEYS)
    assert (summary["latency_min"] <= summary["latency_mean"] + 1e-12).all()
    assert (summary["latency_mean"] <= summary["latency_max"] + 1e-12).all()
    assert latency_bar(pd.Series({"latency_mean": 1.0})) == [[0.0], [0.0]]  # nothing logged
