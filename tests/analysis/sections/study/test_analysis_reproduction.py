"""The study's published numbers (analysis/sections/study/paper_results.csv), the paper-versus-ours table, and
the sweep of what the study's notebooks ran (sweeps/study_faithful.yaml)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.sections.study.reproduction import (
    PAPER_RESULTS_FILE,
    load_paper_results,
    reproduction_markdown,
    reproduction_table,
    t_interval,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


CSV = ROOT / "analysis" / "sections" / "study" / PAPER_RESULTS_FILE
#: The study's text (Markdown); the cross-check against it is skipped where it is absent.
STUDY_TEXT = Path(os.environ.get("FUSION_RAY_STUDY_TEXT", "/work/shared/study/fusion_matters.md"))
#: t(0.975, df) from a printed table of Student's t, for checking intervals by hand.
T975 = {2: 4.302653, 4: 2.776445}

TABLE1_ROWS = {"AG News": "ag_news", "IMDB": "imdb", "ArXiv": "arxiv"}
TABLE3_ROWS = {
    "Sinusoidal": "sinusoidal",
    "Learned Absolute": "learned",
    "RoPE": "rotary_features",
    "Relative": "relative_table",
}
PAPER_FUSIONS = {
    "Add": "add",
    "Concat": "concat",
    "Gate-Scalar": "gate_scalar",
    "MLP-Gate": "gate_mlp",
    "Gate-CNN": "gate_cnn",
}


def raw_csv() -> pd.DataFrame:
    """The csv with every value as the text it holds (so "83.40" keeps its digits)."""
    return pd.read_csv(CSV, dtype=str, keep_default_na=False)


def run(dataset, position, fusion, seed, acc, attention="none", **extra) -> dict:
    """One row of a run frame as analysis.load gives it (the operator column is ``operator``)."""
    return {
        "dataset": dataset,
        "position": position,
        "attention_position": attention,
        "operator": fusion,
        "seed": seed,
        "test_acc": acc,
        "status": "FINISHED",
        **extra,
    }


# ----------------------------------------------------------------------------- the data file


def test_the_csv_has_every_cell_of_tables_1_and_3_once():
    paper = raw_csv()
    assert not paper.duplicated(["table", "row", "column"]).any()
    t1 = paper[paper["table"] == "1"]
    t3 = paper[paper["table"] == "3"]
    assert set(zip(t1["row"], t1["column"], strict=True)) == {
        (r, c) for r in TABLE1_ROWS for c in ("Add", "Concat", "Gate-Scalar")
    }
    assert set(zip(t3["row"], t3["column"], strict=True)) == {
        (r, c) for r in TABLE3_ROWS for c in ("Add", "Concat", "Gate-Scalar", "MLP-Gate")
    }
    for frame in (t1, t3):
        assert (frame["unit"] == "percent").all()
        assert frame["mean"].str.fullmatch(r"\d+\.\d\d").all()
        assert frame["std"].str.fullmatch(r"\d+\.\d\d").all()
    t2 = paper[paper["table"] == "2"]
    assert list(t2["row"]) == ["Add", "Gate-CNN", "Gate-Scalar"]
    assert (t2["unit"] == "fraction").all() and (t2["std"] == "").all()


def test_the_csv_names_follow_the_readme_mapping():
    paper = raw_csv()
    for cell in paper.itertuples(index=False):
        assert cell.source == f"Table {cell.table}, row {cell.row}, column {cell.column}"
        rows = TABLE1_ROWS if cell.table == "1" else TABLE3_ROWS
        if cell.table == "1":
            assert cell.dataset == rows[cell.row] and cell.position == "sinusoidal"
        elif cell.table == "3":
            assert cell.dataset == "arxiv" and cell.position == rows[cell.row]
        column = cell.row if cell.table == "2" else cell.column
        assert cell.fusion == PAPER_FUSIONS[column]
    notebook_differs = paper[paper["fusion"] != paper["notebook_fusion"]]
    assert sorted(
        zip(notebook_differs["source"], notebook_differs["notebook_fusion"], strict=True)
    ) == sorted(
        [
            ("Table 1, row AG News, column Gate-Scalar", "gate_vector"),
            ("Table 1, row IMDB, column Gate-Scalar", "gate_vector"),
            ("Table 2, row Gate-CNN, column Mean Test Accuracy", ""),
            *((f"Table 3, row {r}, column MLP-Gate", "mlp") for r in TABLE3_ROWS),
        ]
    )


def test_every_registry_name_in_the_csv_exists():
    from fusion_ray.model import FUSIONS, POSITIONS

    paper = raw_csv()
    fusions = set(paper["fusion"]) | (set(paper["notebook_fusion"]) - {""})
    assert fusions <= set(FUSIONS.names())
    assert set(paper["position"]) <= set(POSITIONS.names())
    assert POSITIONS.same_as("relative_table") == "learned"


def test_spot_values_and_unit_normalisation():
    paper = load_paper_results().set_index("source")
    relative_mlp = paper.loc["Table 3, row Relative, column MLP-Gate"]
    assert (relative_mlp["mean_pct"], relative_mlp["sd_pct"]) == (65.23, 2.34)
    assert paper.loc["Table 1, row IMDB, column Gate-Scalar", "mean_pct"] == 83.40
    table2 = paper[paper["table"] == 2]
    assert list(table2["mean_pct"]) == [62.0, 64.0, 67.0]
    assert table2["sd_pct"].isna().all()


def study_tables(text: str) -> dict[int, tuple[list[str], dict[str, list[str]]]]:
    """Table number -> (header cells, row label -> value cells) of the study's Markdown text."""
    tables: dict[int, tuple[list[str], dict[str, list[str]]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = re.match(r"Table (\d+):", line.strip())
        if not found:
            continue
        rows = []
        for follow in lines[i + 1 :]:
            if follow.strip().startswith("|"):
                rows.append([re.sub(r"<[^>]+>", "", c).strip() for c in follow.split("|")[1:-1]])
            elif rows:
                break
        body = [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
        tables[int(found.group(1))] = (rows[0], {r[0]: r[1:] for r in body})
    return tables


@pytest.mark.skipif(not STUDY_TEXT.is_file(), reason=f"no study text at {STUDY_TEXT}")
def test_every_csv_value_equals_the_study_text():
    tables = study_tables(STUDY_TEXT.read_text(encoding="utf-8"))
    paper = raw_csv()
    checked = 0
    for number in (1, 3):
        header, body = tables[number]
        for label, cells in body.items():
            for column, cell in zip(header[1:], cells, strict=True):
                mean, sd = re.search(r"(\d+\.\d+)\D*?\\pm\D*?(\d+\.\d+)", cell).groups()
                ours = paper[
                    (paper["table"] == str(number))
                    & (paper["row"] == label)
                    & (paper["column"] == column)
                ]
                assert len(ours) == 1, (number, label, column)
                assert (ours["mean"].iloc[0], ours["std"].iloc[0]) == (mean, sd)
                checked += 1
    header, body = tables[2]
    for label, cells in body.items():
        value = re.search(r"\d+\.\d+", cells[0]).group(0)
        ours = paper[(paper["table"] == "2") & (paper["row"] == label)]
        assert list(ours["mean"]) == [value]
        assert ours["column"].iloc[0] == header[1]
        checked += 1
    assert checked == 9 + 16 + 3 == len(paper)


# ----------------------------------------------------------------------------- the comparison


def test_interval_and_inside_flag_by_hand():
    runs = pd.DataFrame(
        [run("arxiv", "sinusoidal", "add", s, a) for s, a in enumerate([0.60, 0.62, 0.64])]
        + [
            run("arxiv", "sinusoidal", "gate_scalar", s, a)
            for s, a in enumerate([0.6, 0.605, 0.61])
        ]
    )
    table = reproduction_table(runs).set_index("source")
    add = table.loc["Table 3, row Sinusoidal, column Add"]
    half = T975[2] * 2.0 / math.sqrt(3)  # sd of 60, 62, 64 is 2
    assert add["n_seeds"] == 3
    assert add["mean"] == pytest.approx(62.0)
    assert add["sd"] == pytest.approx(2.0)
    assert (add["ci_low"], add["ci_high"]) == pytest.approx((62 - half, 62 + half), abs=1e-5)
    assert add["paper_mean"] == 59.22 and add["paper_sd"] == 1.07
    assert add["paper_inside"]
    assert add["difference"] == pytest.approx(62.0 - 59.22)
    gate = table.loc["Table 1, row ArXiv, column Gate-Scalar"]
    assert gate["ci_high"] == pytest.approx(60.5 + T975[2] * 0.5 / math.sqrt(3), abs=1e-5)
    assert not gate["paper_inside"]  # 65.73 is far above [59.26, 61.74]
    table2 = table.loc["Table 2, row Add, column Mean Test Accuracy"]
    assert table2["paper_mean"] == 62.0 and table2["paper_inside"]
    # Every paper cell of (arxiv, sinusoidal, add) and (.., gate_scalar) is matched, nothing else.
    assert set(table.index) == {
        "Table 1, row ArXiv, column Add",
        "Table 2, row Add, column Mean Test Accuracy",
        "Table 3, row Sinusoidal, column Add",
        "Table 1, row ArXiv, column Gate-Scalar",
        "Table 2, row Gate-Scalar, column Mean Test Accuracy",
        "Table 3, row Sinusoidal, column Gate-Scalar",
    }


def test_t_interval_matches_the_t_table():
    low, high = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = T975[4] * math.sqrt(2.5) / math.sqrt(5)
    assert (low, high) == pytest.approx((3 - half, 3 + half), abs=1e-5)
    assert all(math.isnan(x) for x in t_interval([1.0]))


def test_notebook_operators_match_with_their_own_label():
    runs = pd.DataFrame(
        [run("ag_news", "sinusoidal", "gate_vector", s, 0.91) for s in range(2)]
        + [run("ag_news", "sinusoidal", "gate_scalar", s, 0.90) for s in range(2)]
        + [run("arxiv", "relative_table", "mlp", s, 0.65) for s in range(2)]
        + [run("arxiv", "sinusoidal", "gate_cnn(kernel_size=9)", 0, 0.64)]
    )
    table = reproduction_table(runs)
    got = set(zip(table["source"], table["fusion"], table["matched_as"], strict=True))
    assert got == {
        ("Table 1, row AG News, column Gate-Scalar", "gate_vector", "notebooks"),
        ("Table 1, row AG News, column Gate-Scalar", "gate_scalar", "paper"),
        ("Table 3, row Relative, column MLP-Gate", "mlp", "notebooks"),
        (
            "Table 2, row Gate-CNN, column Mean Test Accuracy",
            "gate_cnn(kernel_size=9)",
            "paper (no notebook)",
        ),
    }
    single = table[table["n_seeds"] == 1].iloc[0]
    assert math.isnan(single["ci_low"]) and pd.isna(single["paper_inside"])


def test_only_the_study_setting_and_finished_runs_count():
    runs = pd.DataFrame(
        [
            run("imdb", "sinusoidal", "add", s, 0.83, **{"axis.model.scale_embeddings": "true"})
            for s in range(3)
        ]
        + [
            run("imdb", "sinusoidal", "add", s, 0.50, **{"axis.model.scale_embeddings": "false"})
            for s in range(3)
        ]
        + [{**run("imdb", "sinusoidal", "add", 3, 0.10), "status": "FAILED"}]
    )
    row = reproduction_table(runs).iloc[0]
    assert row["n_seeds"] == 3 and row["mean"] == pytest.approx(83.0)
    assert "axis.model.scale_embeddings" not in reproduction_table(runs).columns
    params = runs.drop(columns="axis.model.scale_embeddings").assign(
        **{"params.model.scale_embeddings": ["True"] * 3 + ["False"] * 3 + ["True"]}
    )
    assert reproduction_table(params).iloc[0]["mean"] == pytest.approx(83.0)


def test_another_grid_axis_gets_a_row_per_value():
    runs = pd.DataFrame(
        [run("imdb", "sinusoidal", "concat", s, 0.80, **{"train.lr": "0.001"}) for s in range(2)]
        + [run("imdb", "sinusoidal", "concat", s, 0.84, **{"train.lr": "0.0003"}) for s in range(2)]
    )
    table = reproduction_table(runs)
    assert dict(zip(table["train.lr"], table["mean"], strict=True)) == pytest.approx(
        {"0.0003": 84.0, "0.001": 80.0}
    )
    assert "train.lr" in reproduction_markdown(table).splitlines()[2]


def test_fusion_column_is_accepted_too_and_a_seed_with_two_runs_counts_once():
    runs = pd.DataFrame(
        [run("arxiv", "learned", "concat", 0, 0.60)] * 2
        + [run("arxiv", "learned", "concat", 1, 0.62)]
    )
    table = reproduction_table(runs.rename(columns={"operator": "fusion"}))
    assert list(table["n_seeds"]) == [2] and table["mean"].iloc[0] == pytest.approx(61.0)


def test_no_match_gives_none():
    synthetic = pd.DataFrame([run("long", "sinusoidal", "add", s, 0.7) for s in range(3)])
    assert reproduction_table(synthetic) is None
    rotated = pd.DataFrame(
        [run("arxiv", "none", "add", s, 0.6, attention="rope") for s in range(3)]
        + [run("arxiv", "sinusoidal", "add", s, 0.6, attention="alibi") for s in range(3)]
    )
    assert reproduction_table(rotated) is None
    assert "No run matches" in reproduction_markdown(None)


def test_a_frame_without_the_needed_columns_is_refused():
    with pytest.raises(ValueError, match="lacks the columns test_acc"):
        reproduction_table(
            pd.DataFrame([run("arxiv", "learned", "add", 0, 0.6)]).drop(columns="test_acc")
        )


def test_markdown_has_a_row_per_match_and_says_what_the_interval_is():
    runs = pd.DataFrame(
        [run("arxiv", "sinusoidal", "add", s, a) for s, a in enumerate([0.60, 0.62, 0.64])]
    )
    table = reproduction_table(runs)
    text = reproduction_markdown(table)
    rows = [line for line in text.splitlines() if line.startswith("| Table")]
    assert len(rows) == len(table) == 3
    assert "| Table 3, Sinusoidal, Add | arxiv | sinusoidal | add |" in text
    assert "59.22 ± 1.07 | 62.00 ± 2.00 | [57.03, 66.97] | 3 | yes |" in text
    assert "Student-t interval" in text and "not a test of equivalence" in text


# ----------------------------------------------------------------------------- the sweep


def test_the_faithful_sweep_runs_the_notebooks_cells_with_five_seeds():
    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import expand

    spec = load_sweep(ROOT / "sweeps" / "study_faithful.yaml")
    cells = expand(spec)
    assert spec.seeds == [0, 1, 2, 3, 4]
    points = {(c.dataset, c.position, c.attention_position, c.fusion) for c in cells}
    assert len(cells) == 5 * len(points)
    paper = raw_csv()
    wanted = {
        (cell.dataset, cell.position, "none", cell.notebook_fusion or cell.fusion)
        for cell in paper.itertuples(index=False)
    }
    assert points == wanted
    settings = {c.dataset: c.params() for c in cells}
    assert settings["ag_news"]["model.activation"] == "gelu"
    assert settings["imdb"]["train.weight_decay"] == "0.0"
    assert settings["arxiv"]["train.grad_clip"] == "None"
