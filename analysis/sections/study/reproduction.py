"""The study's published accuracies beside ours, cell by cell.

``paper_results.csv`` (next to this module) holds every number of Tables 1-3 of Hallam & Tseng
(2026), "Fusion Matters", exactly as printed, with the paper's row and column names and their
registry names: ``fusion`` is the operator the paper's column names (its equations), and
``notebook_fusion`` the operator the study's public notebooks ran for that cell where it differs
(the AG News / IMDB notebook's feature-wise gate, ``gate_vector``; the ArXiv notebook's ungated
``mlp``); it is empty where no notebook has the operator (``gate_cnn``). ``unit`` says whether a
value is a percent (Tables 1 and 3) or a fraction (Table 2); ``load_paper_results`` converts to
percent, so the file keeps the printed digits.

``reproduction_table`` matches runs to those cells (same dataset, input-level position and
operator, no attention-level position) and puts our mean test accuracy, its 95 % t interval over
seeds and the seed count beside the paper's mean and sd; ``reproduction_markdown`` renders it,
and ``REPRODUCTION`` is the report's section of it (after Tables 1-3; ``tables/reproduction.csv``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.render.escape import md_cell
from analysis.render.tables import fmt
from analysis.sections.base import Section, records, write_csv
from analysis.sections.context import ReportContext
from fusion_ray.schema import AXIS_TAG_PREFIX

#: Where the report writes the paper-versus-ours table.
REPRODUCTION_CSV = "tables/reproduction.csv"

#: The study's published numbers, a data file of this package.
PAPER_RESULTS_FILE = "paper_results.csv"
#: Columns of ``paper_results.csv``.
PAPER_COLUMNS = (
    "table",
    "row",
    "column",
    "dataset",
    "position",
    "fusion",
    "notebook_fusion",
    "mean",
    "std",
    "unit",
    "source",
    "note",
)
#: What a value in ``paper_results.csv`` is multiplied by to give a percent.
UNIT_TO_PERCENT = {"percent": 1.0, "fraction": 100.0}
#: Coverage of the interval over seeds.
CONFIDENCE = 0.95
#: Settings the study ran that a run frame may vary (as a grid axis or a param): only runs with
#: the study's value are compared with the paper. A missing value is the setting's default.
STUDY_SETTINGS = {"model.scale_embeddings": True}
#: Prefix of the frame's columns that hold a run's flattened config (``analysis.load``).
PARAM_PREFIX = "params."
#: The param naming a run's data source, and the sources whose runs never reproduce a paper
#: cell whatever their dataset is called (simulated documents, as in ``tests.synthetic``).
SOURCE_PARAM = "data.source"
SIMULATED_SOURCES = ("synthetic",)
#: Top-level sections of a flattened config: a frame column ``model.X`` / ``train.X`` / ``data.X``
#: is a grid axis or a ``--by`` key, and runs are compared within each of its values.
CONFIG_SECTIONS = ("model.", "train.", "data.")
#: What a run frame needs (the operator as ``fusion`` or, as ``analysis.load`` names it,
#: ``operator``).
NEEDED = ("dataset", "position", "attention_position", "seed", "test_acc")
#: Columns of the table ``reproduction_table`` returns, around the grid-axis columns.
LEAD_COLUMNS = ("table", "row", "column", "dataset", "position", "fusion", "matched_as")
VALUE_COLUMNS = (
    "paper_mean",
    "paper_sd",
    "n_seeds",
    "mean",
    "sd",
    "ci_low",
    "ci_high",
    "paper_inside",
    "difference",
    "source",
)


def load_paper_results() -> pd.DataFrame:
    """``paper_results.csv`` with ``mean_pct`` and ``sd_pct``: the printed values in percent.

    Raises ValueError naming the file when a column is missing or a unit is unknown."""
    path = resources.files("analysis.sections.study").joinpath(PAPER_RESULTS_FILE)
    with path.open("r", encoding="utf-8") as handle:
        paper = pd.read_csv(handle, dtype={"notebook_fusion": str, "note": str})
    missing = [c for c in PAPER_COLUMNS if c not in paper.columns]
    units = set(paper["unit"]) - set(UNIT_TO_PERCENT) if "unit" in paper else set()
    if missing or units:
        raise ValueError(
            f"{PAPER_RESULTS_FILE}: missing columns {missing}, unknown units {sorted(units)}; "
            f"it needs the columns {', '.join(PAPER_COLUMNS)} and units in "
            f"{', '.join(UNIT_TO_PERCENT)}"
        )
    paper["notebook_fusion"] = paper["notebook_fusion"].fillna("")
    factor = paper["unit"].map(UNIT_TO_PERCENT)
    # Round off the float error of the conversion (0.62 * 100 = 62.00000000000001).
    paper["mean_pct"] = (paper["mean"] * factor).round(10)
    paper["sd_pct"] = (paper["std"] * factor).round(10)
    return paper


def t_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Student-t interval for the mean of ``values``: mean +- t(1 - a/2, n - 1) * sd / sqrt(n).

    (nan, nan) for fewer than two values, where no interval exists."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def reproduction_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """The paper's cells that ``runs`` reproduce, the paper's numbers beside ours; None if none.

    ``runs`` is a per-run frame as the report uses it (``Experiment.runs`` or
    ``Pairing.runs``): ``dataset``, ``position``, ``attention_position``, ``fusion`` (or
    ``operator``), ``seed``, ``test_acc`` (a fraction), optionally ``status`` (only FINISHED
    runs count), ``params.*`` and grid-axis columns (``axis.<key>`` or ``<section>.<key>``).

    A run matches a paper cell when its dataset is the cell's, its attention position is
    ``none``, and its position and operator have the cell's registry names (labels with options,
    ``name(k=v)``, match by name and keep their own row). A cell is matched with the operator the
    paper names and with the one the notebooks ran (``matched_as`` says which; both where they
    are one). Runs of another study setting (``model.scale_embeddings`` false) and runs on
    simulated data (param ``data.source`` synthetic) are left out; any other grid axis gets a
    row per value. Per row: ``n_seeds``, ``mean`` and ``sd`` (ddof = 1)
    of the per-seed test accuracy in percent (a seed with several runs counts once, by their
    mean), the 95 % t interval of that mean over seeds (``ci_low``, ``ci_high``; none below two
    seeds), ``paper_inside`` (the paper's mean in that interval; NA without one) and
    ``difference`` (ours minus the paper's, in points).
    """
    frame = _study_runs(runs)
    axes = _axis_columns(frame)
    rows = []
    for cell in load_paper_results().itertuples(index=False):
        for name, matched_as in _operators(cell):
            hits = frame[
                (frame["dataset"] == cell.dataset)
                & (_base_name(frame["position"]) == cell.position)
                & (_base_name(frame["fusion"]) == name)
            ]
            keys = ["position", "fusion", *axes]
            for key, group in hits.groupby(keys, sort=True, dropna=False):
                labels = dict(zip(keys, key, strict=True))
                rows.append(_compare(cell, group, labels, matched_as))
    if not rows:
        return None
    table = pd.DataFrame(rows, columns=[*LEAD_COLUMNS, *axes, *VALUE_COLUMNS])
    return table.astype({"paper_inside": "boolean", "n_seeds": int})


def _study_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs without an attention-level position, on real data, in the study's
    settings, with the operator in a column ``fusion``; ValueError naming what a frame lacks."""
    operator = "fusion" if "fusion" in runs.columns else "operator"
    missing = [c for c in (*NEEDED, operator) if c not in runs.columns]
    if missing:
        raise ValueError(
            f"reproduction_table: the run frame lacks the columns {', '.join(missing)}; pass "
            "the per-run frame of analysis.load (Experiment.runs) or of the pairing "
            "(Pairing.runs), which has dataset, position, attention_position, operator (or "
            "fusion), seed and test_acc"
        )
    frame = runs.rename(columns={operator: "fusion"}) if operator != "fusion" else runs.copy()
    if "status" in frame.columns:
        frame = frame[frame["status"] == "FINISHED"]
    frame = frame.dropna(subset=["dataset", "position", "fusion", "seed", "test_acc"])
    frame = frame[frame["attention_position"] == "none"]
    if PARAM_PREFIX + SOURCE_PARAM in frame.columns:
        frame = frame[~frame[PARAM_PREFIX + SOURCE_PARAM].isin(SIMULATED_SOURCES)]
    for key, value in STUDY_SETTINGS.items():
        for column in (key, AXIS_TAG_PREFIX + key, PARAM_PREFIX + key):
            if column in frame.columns:
                # astype(bool): an empty frame's mask would otherwise select columns, not rows
                keep = frame[column].map(lambda v, want=value: _setting_is(v, want)).astype(bool)
                frame = frame[keep]
    return frame


def _setting_is(value: object, wanted: bool) -> bool:
    """Whether a logged boolean setting (True, ``true``, ``True``; missing = the default, which
    is the study's) equals ``wanted``."""
    # pd.isna takes any object (False for one that is no missing marker); pandas-stubs' overloads
    # list only scalars, arrays and frames
    if value is None or (not isinstance(value, str) and pd.isna(value)):  # type: ignore[call-overload]
        return True
    if isinstance(value, (bool, np.bool_)):
        return bool(value) == wanted
    return str(value).strip().lower() == str(wanted).lower()


def _axis_columns(frame: pd.DataFrame) -> list[str]:
    """Grid-axis columns other than the study settings: ``axis.<key>`` and ``<section>.<key>``."""
    settings = set(STUDY_SETTINGS) | {AXIS_TAG_PREFIX + k for k in STUDY_SETTINGS}
    return [
        str(c)
        for c in frame.columns
        if str(c) not in settings
        and (str(c).startswith(AXIS_TAG_PREFIX) or str(c).startswith(CONFIG_SECTIONS))
    ]


def _base_name(labels: pd.Series) -> pd.Series:
    """``gate_cnn(kernel_size=9)`` -> ``gate_cnn``: the registry name of a label."""
    return labels.astype(str).str.split("(", n=1).str[0]


def _operators(cell: Any) -> list[tuple[str, str]]:
    """(operator, matched_as) pairs under which runs reproduce a paper cell."""
    paper, notebook = cell.fusion, cell.notebook_fusion
    if notebook == paper:
        return [(paper, "paper and notebooks")]
    if not notebook:
        return [(paper, "paper (no notebook)")]
    return [(paper, "paper"), (notebook, "notebooks")]


def _compare(cell: Any, group: pd.DataFrame, labels: dict, matched_as: str) -> dict[str, Any]:
    """One output row: the paper's cell, our runs' per-seed accuracy and its interval."""
    per_seed = (100.0 * group["test_acc"].astype(float)).groupby(group["seed"]).mean()
    values = per_seed.to_numpy()
    n = len(values)
    mean = float(np.mean(values))
    low, high = t_interval(values)
    inside = pd.NA if math.isnan(low) else bool(low <= cell.mean_pct <= high)
    return {
        "table": cell.table,
        "row": cell.row,
        "column": cell.column,
        "dataset": cell.dataset,
        **labels,
        "matched_as": matched_as,
        "paper_mean": cell.mean_pct,
        "paper_sd": cell.sd_pct,
        "n_seeds": n,
        "mean": mean,
        "sd": float(np.std(values, ddof=1)) if n > 1 else math.nan,
        "ci_low": low,
        "ci_high": high,
        "paper_inside": inside,
        "difference": mean - cell.mean_pct,
        "source": cell.source,
    }


def reproduction_markdown(table: pd.DataFrame | None) -> str:
    """``reproduction_table``'s result as a Markdown table with its caption paragraph."""
    title = "**The study's published test accuracy (%) beside ours.**"
    if table is None or table.empty:
        return f"{title}\n\nNo run matches a cell of the study's Tables 1-3.\n"
    axes = [c for c in table.columns if c not in (*LEAD_COLUMNS, *VALUE_COLUMNS)]
    header = ["paper cell", "dataset", "position", "fusion", "as", *axes]
    header += ["paper", "ours", f"{CONFIDENCE:.0%} CI", "n", "inside"]
    lines = [title, "", "| " + " | ".join(map(md_cell, header)) + " |", "|" + "---|" * len(header)]
    for r in table.to_dict(orient="records"):
        cells = [
            f"Table {r['table']}, {r['row']}, {r['column']}",
            r["dataset"],
            r["position"],
            r["fusion"],
            r["matched_as"],
            *(str(r[a]) for a in axes),
            fmt(r["paper_mean"], r["paper_sd"]),
            fmt(r["mean"], r["sd"]),
            "–" if math.isnan(r["ci_low"]) else f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
            str(r["n_seeds"]),
            "–" if pd.isna(r["paper_inside"]) else ("yes" if r["paper_inside"] else "no"),
        ]
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join([*lines, "", _CAPTION]) + "\n"


_CAPTION = (
    "Paper: the mean ± sd printed in the study (five seeds; Table 2 gives fractions rounded to "
    "two decimals and no sd, shown here in percent, so its values are exact only to ± 0.5 "
    "points). Ours: mean ± sd (ddof = 1) of test accuracy over our seeds, a seed with several "
    "runs counting once by their mean, and a 95 % Student-t interval for that mean over seeds "
    "(mean ± t(0.975, n − 1) · sd / √n; none below two seeds). `as` says whether our operator is "
    "the one the paper's column names, the one the study's notebooks ran for that cell, or both. "
    "`inside` says whether the paper's mean lies in our interval. It is not a test of "
    "equivalence: the interval describes the uncertainty of our mean only, not of the paper's, "
    "and with few or noisy seeds it is wide enough to contain almost anything, so `yes` does not "
    "show that the results agree, and `no` can come from a setting that differs as well as from "
    "a different effect."
)


# ----------------------------------------------------------------------------- the section


class ReproductionSection(Section):
    """The study's published cells that our runs reproduce, beside ours (none: no section)."""

    study = True
    name = "reproduction"
    follows = "tables"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> pd.DataFrame | None:
        return reproduction_table(ctx.pairing.runs)

    def markdown(self, result: pd.DataFrame, ctx: ReportContext) -> list[str]:
        return [
            "## Reproduction: the paper's numbers beside ours",
            "",
            reproduction_markdown(result).rstrip("\n"),
            "",
            f"Every column (differences, sd in points, the source of each number): "
            f"`{REPRODUCTION_CSV}`.",
            "",
        ]

    def data_files(self, result: pd.DataFrame, ctx: ReportContext) -> list[Path]:
        return [write_csv(result, ctx.out_dir / REPRODUCTION_CSV)]

    def record(self, result: pd.DataFrame | None, ctx: ReportContext) -> dict[str, Any]:
        if result is None:
            return {}
        return {"reproduction": {"file": REPRODUCTION_CSV, "rows": records(result)}}

    def tables_note(self, result: pd.DataFrame | None) -> str:
        if result is None:
            return ""
        return f"; `{REPRODUCTION_CSV}`: the paper's numbers beside ours"


REPRODUCTION = ReproductionSection()
