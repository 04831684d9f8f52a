"""Tag text is data: report.md shows it escaped, never as Markdown or HTML markup.

One experiment on a real (sqlite) MLflow store, every name in it hostile: an operator (tag
``fusion``) ``x|y<script>alert(1)</script>``, another ``[click](javascript:alert(1))``, a dataset
holding a backtick and a newline followed by a would-be heading, a position with emphasis and
a ``|``, an ``axis.*`` tag whose level is ``<img src=x onerror=alert(1)>``, a ``git_sha`` tag
holding an SVG tag, an experiment name with HTML and backticks, and an excluded run (no test
counts) whose name is HTML and a ``javascript:`` link. The report is built with its length
analysis and figures, then read as a Markdown reader would: no HTML tag, no link, no line that
a name starts, every table row with as many cells as its header; the names are still there,
escaped; stats.json and the CSV files keep them raw.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from analysis.render.escape import fence, md, md_cell, md_code, md_prose
from analysis.report import ReportOptions, build_report
from fusion_ray.schema import AXIS_TAG_PREFIX, GRID_AXES_TAG, OPERATOR_PARAM, ROLE_SWEEP, ROLE_TAG
from tests.synthetic import flat_config, log_trial

pytestmark = pytest.mark.unit

EXPERIMENT = "esc <i>exp</i> `x`"
SCRIPT_OP = "x|y<script>alert(1)</script>"
LINK_OP = "[click](javascript:alert(1))"
DATASET = "ds`tick\n# injected heading"
POSITION = "**sin|us**"
AXIS = "model.flavour"
IMG = "<img src=x onerror=alert(1)>"
LEVELS = ["plain", IMG]
GIT_SHA = "<svg/onload=alert(3)>"
RUN_NAME = "run <b>bold</b> [x](javascript:alert(2))"
SEEDS = range(4)
#: Correct counts (of 100) above add's 50 + seed, per seed.
LIFT = {"add": [0, 0, 0, 0], SCRIPT_OP: [3, 5, 4, 6], LINK_OP: [-1, 2, 0, 1]}
N_DOCS = 100


def _predictions(correct: int) -> dict[str, np.ndarray]:
    """The same 100 test documents for every run; the first ``correct`` predicted right."""
    label = np.zeros(N_DOCS, dtype=np.int64)
    pred = np.where(np.arange(N_DOCS) < correct, 0, 1)
    return {"length": 10 + 3 * np.arange(N_DOCS), "label": label, "pred": pred}


def _trial(client, exp: str, parent: str, op: str, seed: int, level: str, cell: str) -> str:
    params = flat_config("d", "short", "sinusoidal", "none", "add", seed)
    params.update({"dataset": DATASET, "model.position": POSITION, OPERATOR_PARAM: op, AXIS: level})
    tags = {
        "cell_id": cell,
        "dataset": DATASET,
        "position": POSITION,
        "attention_position": "none",
        "fusion": op,
        "seed": seed,
        "sweep": "esc",
        "git_sha": GIT_SHA,
        AXIS_TAG_PREFIX + AXIS: level,
    }
    correct = 50 + seed + LIFT[op][seed] + (4 if level == IMG and op != "add" else 0)
    final = {
        "test_acc": correct / N_DOCS,
        "test_correct": correct,
        "test_total": N_DOCS,
        "latency_ms_per_sample": 0.1,
        "num_params": 1000,
    }
    return log_trial(
        client,
        exp,
        tags=tags,
        params=params,
        final_metrics=final,
        predictions=_predictions(correct),
        parent_run_id=parent,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("escaping")
    uri = mlflow_store()  # on the RAM disk
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=str(root / "art"))
    tags = {ROLE_TAG: ROLE_SWEEP, "sweep": "esc", GRID_AXES_TAG: json.dumps({AXIS: LEVELS})}
    parent = client.create_run(exp, tags=tags).info.run_id
    for i, (level, op, seed) in enumerate(
        (level, op, seed) for level in LEVELS for op in LIFT for seed in SEEDS
    ):
        _trial(client, exp, parent, op, seed, level, f"cell-{i}")
    # a FINISHED run without test counts: listed under "Excluded runs" by its name
    log_trial(
        client,
        exp,
        tags={"cell_id": RUN_NAME, "dataset": DATASET, "fusion": "add", "seed": 9},
        params={},
        final_metrics={},
        parent_run_id=parent,
    )
    client.set_terminated(parent, "FINISHED")
    options = ReportOptions(out=root / "report", log_to_mlflow=False)
    return build_report(EXPERIMENT, uri, options)


def _text(report, name: str) -> str:
    return (report.out_dir / name).read_text(encoding="utf-8")


def _markdown_files(report) -> dict[str, str]:
    out = report.out_dir
    files = [out / "report.md", out / "warnings.md", *sorted((out / "tables").glob("*.md"))]
    return {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in files}


def _cells(line: str) -> int:
    """The unescaped ``|`` of a table row (one preceded by an even run of backslashes)."""
    return sum(1 for m in re.finditer(r"(\\*)\|", line) if len(m.group(1)) % 2 == 0)


def _tables(text: str) -> list[list[str]]:
    """Every Markdown table of ``text``: its runs of consecutive lines starting with ``|``."""
    blocks: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        row = line.startswith("|")
        if row and previous:
            blocks[-1].append(line)
        elif row:
            blocks.append([line])
        previous = row
    return blocks


# ----------------------------------------------------------------------------- the helpers


def test_md_escapes_markup_and_keeps_plain_names():
    assert md("gate_scalar") == "gate_scalar" and md("gate_cnn(k=3)") == "gate_cnn(k=3)"
    assert md("a|b") == "a\\|b" and md("<b>&") == "&lt;b&gt;&amp;"
    assert md("*x* _y_ `z` ~w~") == "\\*x\\* \\_y\\_ \\`z\\` \\~w\\~"
    assert md("[a](javascript:b)") == "\\[a\\]\\(javascript:b)"
    assert "\n" not in md("a\nb\r\nc") and md("a\nb") == "a\\nb"
    assert md("a\\|b") == "a\\\\\\|b"  # a backslash in the data cannot unescape the pipe


def test_md_code_fences_backticks_and_falls_back_to_text():
    assert md_code("add") == "`add`"
    assert md_code("a`b") == "``a`b``" and md_code("`a") == "`` `a ``"
    assert md_code("<b>") == "&lt;b&gt;" and md_code("a|b") == "a\\|b"
    assert fence("a``b") == "```a``b```"


def test_md_cell_keeps_the_reports_own_cells():
    for cell in ("66.00 ± 1.63*", "60.00* (n=4)", "+1.00 [+0.50, +1.50] (approx.)", "1.25×†"):
        assert md_cell(cell) == cell
    assert md_cell("*a*") == "\\*a\\*" and md_cell("[a](b)") == "[a\\]\\(b)"


def test_md_prose_keeps_safe_code_spans_only():
    assert md_prose("against `add` and `x|y`: <b>") == "against `add` and x\\|y: &lt;b&gt;"
    assert md_prose("# title") == "\\# title" and md_prose("1. x") == "1\\. x"
    assert md_prose("a\nb") == "a b"


# ----------------------------------------------------------------------------- the report


def test_no_html_no_link_no_injected_line(report):
    for name, text in _markdown_files(report).items():
        assert re.search(r"<\s*[A-Za-z!/?]", text) is None, name  # no HTML tag at all
        assert "](javascript:" not in text and "](" not in text.replace("](figures/", ""), name
        lines = text.splitlines()
        assert not any(line.lstrip().startswith("# injected") for line in lines), name
        headings = [line for line in lines if line.startswith("#")]
        assert all("injected" not in h for h in headings), name


def test_every_table_row_has_its_headers_cells(report):
    tables = 0
    for name, text in _markdown_files(report).items():
        for block in _tables(text):
            tables += 1
            width = _cells(block[0])
            assert re.fullmatch(r"\|(-{3,}\|)+", block[1]), (name, block[:2])
            assert all(_cells(line) == width for line in block), (name, block)
    assert tables >= 5
    md_text = _text(report, "report.md")
    rows = [line for block in _tables(md_text) for line in block[2:]]
    assert any(md(SCRIPT_OP) in row for row in rows)
    assert any(md(IMG) in row for row in rows) and any(md(POSITION) in row for row in rows)


def test_hostile_names_are_shown_escaped(report):
    text = _text(report, "report.md")
    for value in (SCRIPT_OP, LINK_OP, DATASET, IMG, POSITION, RUN_NAME, GIT_SHA[:12]):
        assert md(value) in text, value
    assert md_cell(LINK_OP) in text  # in the tables' cells
    assert f"# Fusion analysis: {md(EXPERIMENT)}" in text.splitlines()[0]
    assert f"# Warnings: {md(EXPERIMENT)}" in _text(report, "warnings.md")
    # the report's own markup still works around them
    for own in ("## Summary", "## Paired statistics", "## Interaction tests", "`add`", "**"):
        assert own in text
    assert "## Length-aware analysis" in text and "## Excluded runs" in text


def test_data_files_keep_the_raw_values(report):
    out = report.out_dir
    stats = pd.read_csv(out / "stats.csv", keep_default_na=False)
    assert set(stats["operator"]) == {SCRIPT_OP, LINK_OP}
    assert set(stats["dataset"]) == {DATASET} and set(stats["position"]) == {POSITION}
    assert set(stats[AXIS]) == set(LEVELS)
    payload = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert payload["experiment"] == EXPERIMENT
    assert {c["operator"] for c in payload["comparisons"]} == {SCRIPT_OP, LINK_OP}
    assert {c["dataset"] for c in payload["comparisons"]} == {DATASET}
    assert payload["settings"]["grid_axes"] == {AXIS: LEVELS}
    assert [r["run_name"] for r in payload["excluded_runs"]] == [RUN_NAME]
    table1 = pd.read_csv(out / "tables" / "table1_accuracy.csv", keep_default_na=False)
    assert set(table1["operator"]) == {"add", SCRIPT_OP, LINK_OP}
    assert set(table1["dataset"]) == {DATASET}
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    assert RUN_NAME in set(runs["run_name"]) and GIT_SHA in set(runs["git_sha"])
    inter = pd.read_csv(out / "interaction.csv", keep_default_na=False)
    assert set(inter["level"]) == {IMG} and set(inter["operator"]) == {SCRIPT_OP, LINK_OP}
