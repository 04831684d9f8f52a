"""The report's optional sections, on a real (sqlite) MLflow store: the study's published numbers
beside ours (``analysis.sections.study.reproduction``) when the runs match its cells, and the gated operators'
gate by position (``analysis.sections.study.gates``) when gated runs logged ``gate_by_position.parquet``.

Experiment ``paper`` is one of the study's cells, made by hand: ArXiv, sinusoidal positions, no
attention-level position, ``add`` and ``gate_scalar``, seeds 0-3, 100 test documents, correct
counts (add) 58 60 62 60 and (gate_scalar) 64 66 68 66, so gate_scalar's mean is 66.00 % with sd
sqrt(8/3) = 1.633. Its gate_scalar runs of seeds 0-2 log gates by position bucket; the weight on E
in the first bucket is 0.70, 0.71, 0.72 and in the last bucket holding tokens 0.40, 0.39, 0.38;
seed 3 logs none. Experiment ``synthetic`` is a simulated sweep (data source ``synthetic``), one
of whose datasets is called ``arxiv``: it matches no paper cell, and logs no gates.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

import analysis.sections.study.gates
from analysis.load import load_experiment
from analysis.report import ReportOptions, build_report
from analysis.sections.base import Section
from analysis.sections.study.gates import gate_ends, gate_summary
from analysis.sections.study.reproduction import reproduction_table
from fusion_ray.schema import GATES_FILE, ROLE_SWEEP, ROLE_TAG
from tests.synthetic import SyntheticSweep, flat_config, log_synthetic_sweep, log_trial

pytestmark = pytest.mark.unit

SEEDS = range(4)
CORRECT = {"add": [58, 60, 62, 60], "gate_scalar": [64, 66, 68, 66]}
GATED_SEEDS = (0, 1, 2)
#: t(0.975, 3) from a printed table of Student's t.
T975_DF3 = 3.182446
REPRODUCTION_HEADING = "## Reproduction: the paper's numbers beside ours"
GATES_HEADING = "## Gate on token embeddings by position"


def _gates(seed: int) -> pd.DataFrame:
    """A gate_by_position table: buckets 0, 1, 2-3, 4-7 hold tokens, 8-15 holds none."""
    return pd.DataFrame(
        {
            "bucket_start": [0, 1, 2, 4, 8],
            "bucket_end": [1, 2, 4, 8, 16],
            "tokens": [40, 40, 80, 100, 0],
            "gate_mean": [0.70 + 0.01 * seed, 0.6, 0.55, 0.40 - 0.01 * seed, math.nan],
            "gate_std": [0.05, 0.05, 0.05, 0.05, math.nan],
        }
    )


def _log_paper(client, root: Path) -> dict[tuple[str, int], str]:
    """Experiment ``paper`` (module docstring); returns (operator, seed) -> run id."""
    exp = client.create_experiment("paper", artifact_location=str(root / "art_paper"))
    parent = client.create_run(exp, tags={ROLE_TAG: ROLE_SWEEP, "sweep": "paper"}).info.run_id
    ids = {}
    for seed in SEEDS:
        for op, counts in CORRECT.items():
            params = flat_config("arxiv", "long", "sinusoidal", "none", op, seed)
            params["data.source"] = "hub"
            tags = {
                "cell_id": f"arxiv-{op}-{seed}",
                "dataset": "arxiv",
                "position": "sinusoidal",
                "attention_position": "none",
                "fusion": op,
                "seed": seed,
                "sweep": "paper",
                "git_sha": "abc",
            }
            final = {
                "test_acc": counts[seed] / 100,
                "test_correct": counts[seed],
                "test_total": 100,
                "latency_ms_per_sample": 0.2,
                "num_params": 1000,
            }
            run_id = log_trial(
                client, exp, tags=tags, params=params, final_metrics=final, parent_run_id=parent
            )
            if op == "gate_scalar" and seed in GATED_SEEDS:
                path = root / f"seed{seed}" / GATES_FILE
                path.parent.mkdir()
                _gates(seed).to_parquet(path, index=False)
                client.log_artifact(run_id, str(path))
            ids[(op, seed)] = run_id
    client.set_terminated(parent, "FINISHED")
    return ids


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("sections")
    uri = mlflow_store()  # on the RAM disk
    ids = _log_paper(MlflowClient(uri), root)
    simulated = SyntheticSweep(
        name="synthetic",
        datasets={"short": "short", "arxiv": "long"},
        operators=("add", "gate_scalar"),
        seeds=(0, 1, 2),
        test_size=40,
        predictions=False,
    )
    log_synthetic_sweep(simulated, uri, artifact_location=str(root / "art_synthetic"))
    return {"uri": uri, "root": root, "ids": ids}


def _options(out: Path, **kw) -> ReportOptions:
    return ReportOptions(out=out, log_to_mlflow=False, lengths=False, **kw)


class _GateFrameSpy:
    """Stands in for ``gate_frame`` in ``analysis.sections.study.gates``: records the run ids it is asked
    for, then reads them (or raises ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.real = analysis.sections.study.gates.gate_frame
        self.error = error
        self.calls: list[list[str]] = []

    def __call__(self, client, runs, *args, **kwargs):
        self.calls.append(list(runs))
        if self.error is not None:
            raise self.error
        return self.real(client, runs, *args, **kwargs)


@pytest.fixture(scope="module")
def paper_report(store):
    """The report of ``paper`` with figures (so with the gates), and the gate_frame calls."""
    spy = _GateFrameSpy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis.sections.study.gates, "gate_frame", spy)
        result = build_report("paper", store["uri"], _options(store["root"] / "report_paper"))
    return result, spy.calls


# ----------------------------------------------------------------------------- reproduction


def test_runs_of_a_paper_cell_get_the_reproduction_section_and_csv(paper_report):
    result, _ = paper_report
    out = result.out_dir
    csv = out / "tables" / "reproduction.csv"
    assert csv in result.files
    table = pd.read_csv(csv)
    # arxiv / sinusoidal: add and gate_scalar in Tables 1, 2 and 3
    assert sorted(zip(table["table"], table["fusion"], strict=True)) == sorted(
        (t, op) for op in ("add", "gate_scalar") for t in (1, 2, 3)
    )
    row = table[(table["table"] == 1) & (table["fusion"] == "gate_scalar")].iloc[0]
    sd = math.sqrt(8 / 3)
    half = T975_DF3 * sd / 2
    assert row["paper_mean"] == 65.73 and row["paper_sd"] == 0.30
    assert row["n_seeds"] == 4 and row["matched_as"] == "paper and notebooks"
    assert row["mean"] == pytest.approx(66.0) and row["sd"] == pytest.approx(sd)
    assert row["ci_low"] == pytest.approx(66 - half) and row["ci_high"] == pytest.approx(66 + half)
    assert bool(row["paper_inside"]) and row["difference"] == pytest.approx(0.27)
    table2 = table[(table["table"] == 2) & (table["fusion"] == "add")].iloc[0]
    assert table2["paper_mean"] == pytest.approx(62.0) and table2["mean"] == pytest.approx(60.0)

    md = (out / "report.md").read_text()
    assert md.count(REPRODUCTION_HEADING) == 1
    section = md.split(REPRODUCTION_HEADING)[1].split("\n## ")[0]
    assert (
        "| Table 1, ArXiv, Gate-Scalar | arxiv | sinusoidal | gate_scalar | paper and notebooks "
        f"| 65.73 ± 0.30 | 66.00 ± 1.63 | [{66 - half:.2f}, {66 + half:.2f}] | 4 | yes |"
    ) in section
    assert "`tables/reproduction.csv`" in section
    payload = json.loads((out / "stats.json").read_text())
    assert payload["reproduction"]["file"] == "tables/reproduction.csv"
    assert len(payload["reproduction"]["rows"]) == 6
    assert payload["reproduction"]["rows"][0]["paper_inside"] in (True, False, None)


def test_simulated_runs_get_neither_section(store, tmp_path):
    spy = _GateFrameSpy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis.sections.study.gates, "gate_frame", spy)
        result = build_report("synthetic", store["uri"], _options(tmp_path / "r"))
    out = result.out_dir
    md = (out / "report.md").read_text()
    assert REPRODUCTION_HEADING not in md and GATES_HEADING not in md
    assert "reproduction.csv" not in md and "gates_by_position" not in md
    assert not (out / "tables" / "reproduction.csv").exists()
    assert not (out / "gates_by_position.csv").exists()
    assert not list((out / "figures").glob("gates_by_position*"))
    payload = json.loads((out / "stats.json").read_text())
    assert "reproduction" not in payload and "gates" not in payload
    # its gated runs were searched for gates and had none
    assert len(spy.calls) == 1 and len(spy.calls[0]) == 6
    # the arxiv runs are left out for being simulated, not for their names or settings
    runs = load_experiment("synthetic", store["uri"]).runs
    assert set(runs["params.data.source"]) == {"synthetic"}
    assert reproduction_table(runs.drop(columns=["params.data.source"])) is not None


# ----------------------------------------------------------------------------- gates


def test_gated_runs_with_gates_get_the_figure_csv_and_section(paper_report):
    result, _ = paper_report
    out = result.out_dir
    png, pdf = out / "figures" / "gates_by_position.png", out / "figures" / "gates_by_position.pdf"
    assert png in result.files and pdf in result.files
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    csv = out / "gates_by_position.csv"
    assert csv in result.files
    summary = pd.read_csv(csv, dtype={"bucket": str})
    assert summary["operator"].unique().tolist() == ["gate_scalar"]
    assert summary["bucket"].tolist() == ["0", "1", "2-3", "4-7"]  # 8-15 holds no token
    assert summary["n_seeds"].tolist() == [3, 3, 3, 3]
    assert summary["tokens"].tolist() == [40, 40, 80, 100]
    first, last = summary.iloc[0], summary.iloc[-1]
    assert (first["gate_mean"], first["gate_min"], first["gate_max"]) == pytest.approx(
        (0.71, 0.70, 0.72)
    )
    assert (last["gate_mean"], last["gate_min"], last["gate_max"]) == pytest.approx(
        (0.39, 0.38, 0.40)
    )
    assert summary.loc[1:2, "gate_mean"].tolist() == pytest.approx([0.6, 0.55])

    md = (out / "report.md").read_text()
    assert md.count(GATES_HEADING) == 1
    section = md.split(GATES_HEADING)[1].split("\n## ")[0]
    assert "H = g E + (1 − g) P" in section and "g = 0.5 weighs E and P equally" in section
    assert (
        "| arxiv | sinusoidal | none | gate_scalar | 3 | 0 | 0.710 [0.700, 0.720] | 4-7 | "
        "0.390 [0.380, 0.400] | -0.320 |"
    ) in section
    assert "`gates_by_position.csv`" in section
    assert "![Gate on token embeddings by position" in md and "figures/gates_by_position.png" in md
    # seed 3's gate_scalar run logged no gates: said, not silently averaged over
    assert any(
        f"1 of the 4 analysed runs of gated operators have no {GATES_FILE}" in w
        for w in result.warnings
    )
    payload = json.loads((out / "stats.json").read_text())
    assert payload["gates"]["runs"] == 3 and payload["gates"]["file"] == "gates_by_position.csv"
    assert payload["gates"]["first_and_last_bucket"][0]["change"] == pytest.approx(-0.32)


def test_gates_are_read_once_per_report_and_only_for_gated_runs(store, paper_report):
    _, calls = paper_report
    gated = {store["ids"][("gate_scalar", s)] for s in SEEDS}
    assert len(calls) == 1 and sorted(calls[0]) == sorted(gated)


def test_without_figures_no_gate_is_read(store, tmp_path):
    spy = _GateFrameSpy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis.sections.study.gates, "gate_frame", spy)
        result = build_report("paper", store["uri"], _options(tmp_path / "r", make_figures=False))
    assert spy.calls == []
    out = result.out_dir
    assert not (out / "gates_by_position.csv").exists()
    assert GATES_HEADING not in (out / "report.md").read_text()
    assert (out / "tables" / "reproduction.csv").exists()  # not a figure: still written


def test_an_unreadable_artifact_store_leaves_a_warning_not_a_failure(store, tmp_path):
    from mlflow.exceptions import MlflowException

    spy = _GateFrameSpy(MlflowException("artifact store unreachable"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analysis.sections.study.gates, "gate_frame", spy)
        result = build_report("paper", store["uri"], _options(tmp_path / "r"))
    assert len(spy.calls) == 1
    out = result.out_dir
    assert (out / "report.md").exists() and not (out / "gates_by_position.csv").exists()
    assert not (out / "figures" / "gates_by_position.png").exists()
    assert any("could not be read" in w and "unreachable" in w for w in result.warnings)
    assert GATES_HEADING not in (out / "report.md").read_text()


def test_gate_summary_averages_the_runs_of_a_seed_before_the_seeds():
    axis = "model.scale_embeddings"
    rows = []
    # level true: seed 0 has two runs (0.2, 0.4 -> 0.3), seed 1 one (0.6); level false: 0.9
    for run, seed, level, first, last in [
        ("a", 0, "true", 0.2, 0.5),
        ("b", 0, "true", 0.4, 0.5),
        ("c", 1, "true", 0.6, 0.8),
        ("d", 0, "false", 0.9, 0.1),
    ]:
        for start, end, tokens, gate in [(0, 1, 5, first), (1, 2, 5, last), (2, 4, 0, math.nan)]:
            rows.append(
                {
                    "run_id": run,
                    "dataset": "d",
                    axis: level,
                    "operator": "gate_vector",
                    "seed": seed,
                    "bucket_start": start,
                    "bucket_end": end,
                    "tokens": tokens,
                    "gate_mean": gate,
                    "gate_std": 0.0,
                }
            )
    summary = gate_summary(pd.DataFrame(rows), ["dataset", axis])
    true = summary[summary[axis] == "true"].set_index("bucket")
    assert true.index.tolist() == ["0", "1"]  # the bucket without tokens is left out
    assert true.loc["0", "n_seeds"] == 2
    assert true.loc["0", "gate_mean"] == pytest.approx(0.45)  # (0.3 + 0.6) / 2, not 0.4
    assert (true.loc["0", "gate_min"], true.loc["0", "gate_max"]) == pytest.approx((0.3, 0.6))
    false = summary[summary[axis] == "false"]
    assert false["gate_mean"].tolist() == pytest.approx([0.9, 0.1])
    assert false["n_seeds"].tolist() == [1, 1]

    ends = gate_ends(summary, ["dataset", axis]).set_index(axis)
    assert ends.loc["true", "first_bucket"] == "0" and ends.loc["true", "last_bucket"] == "1"
    assert ends.loc["true", "last_gate_mean"] == pytest.approx(0.65)
    assert ends.loc["true", "change"] == pytest.approx(0.65 - 0.45)
    assert ends.loc["false", "change"] == pytest.approx(-0.8)


def test_no_study_run_left_gives_no_table_even_with_a_setting_column():
    """Every run has an attention-level position, so none is a study run; the setting column
    must then not turn the empty row mask into a column selection."""
    runs = pd.DataFrame(
        [
            {
                "dataset": "arxiv",
                "position": "sinusoidal",
                "attention_position": "rope",
                "operator": "gate_scalar",
                "seed": seed,
                "test_acc": 0.6,
                "status": "FINISHED",
                "model.scale_embeddings": "true",
            }
            for seed in range(3)
        ]
    )
    assert reproduction_table(runs) is None
    assert len(reproduction_table(runs.assign(attention_position="none"))) == 3


# ----------------------------------------------------------------------------- a new section


class _SeedCount(Section):
    """A section made for this test: the number of seed pairs, as a line, a file and a key."""

    name = "seed_count"
    follows = "paired statistics"
    warns_with = "end"
    before_order = False

    def compute(self, ctx, warnings):
        warnings.append("seed count: a test warning")
        return len(ctx.pairing.pairs)

    def tables(self, result, ctx):
        return {}

    def markdown(self, result, ctx):
        return ["## Seed pairs", "", f"{result} seed pairs.", ""]

    def figures(self, result, ctx, fig_dir):
        return []

    def data_files(self, result, ctx):
        path = ctx.out_dir / "seed_count.txt"
        path.write_text(str(result))
        return [path]

    def record(self, result, ctx):
        return {"seed_count": result}

    def listed_files(self, result):
        return ["`seed_count.txt`"]

    def tables_note(self, result):
        return ""


def test_a_registered_section_is_shown_in_every_report_file(store, tmp_path):
    """An analysis added to the report's list shows in report.md after the part it follows,
    writes its file, names it on the Files line, and adds its key and warning to stats.json."""
    from analysis.report import build_context, write_report
    from analysis.sections.registry import register, sections, unregister

    register(_SeedCount())
    try:
        assert sections()[-1].name == "seed_count"
        options = _options(tmp_path, make_figures=False)
        ctx = build_context("synthetic", store["uri"], options)
        write_report(ctx)
    finally:
        unregister("seed_count")
    assert "seed_count" not in [s.name for s in sections()]
    md = (tmp_path / "report.md").read_text()
    pairs = len(ctx.pairing.pairs)
    assert ctx.results["seed_count"] == pairs > 0
    assert md.index("## Paired statistics") < md.index("## Seed pairs") < md.index("## Figures")
    assert f"{pairs} seed pairs." in md and "`seed_count.txt`, `runs.csv`" in md
    assert (tmp_path / "seed_count.txt").read_text() == str(pairs)
    payload = json.loads((tmp_path / "stats.json").read_text())
    assert payload["seed_count"] == pairs
    assert payload["warnings"][-1] == "seed count: a test warning"


@pytest.mark.parametrize(
    "attribute, value, said",
    [
        ("follows", "appendix", "follows 'appendix', not one of the report's parts"),
        ("warns_with", "never", "warns with 'never', not one of"),
        ("name", "seed count", "a section's name is a Python identifier"),
    ],
)
def test_a_section_that_cannot_be_placed_is_refused_saying_why(attribute, value, said):
    from analysis.sections.registry import register, sections

    section = _SeedCount()
    setattr(section, attribute, value)
    with pytest.raises(ValueError, match=said):
        register(section)
    assert all(s is not section for s in sections())


def test_a_section_name_is_registered_once():
    from analysis.sections.registry import register

    taken = _SeedCount()
    taken.name = "decisions"
    with pytest.raises(ValueError, match="registered twice"):
        register(taken)
