"""A report section: one analysis beside the paired core, and all the report shows of it.

The report reads the registered sections (``analysis.sections.registry``, in their order). For
each it computes a result from the
report's paired core (``analysis.sections.context.ReportContext``: the runs, their seed pairs, the main
comparisons, the display order and Tables 1-3) and keeps it in ``ReportContext.results`` under
the section's name, so a later section may read an earlier one's result. Then the writers ask
every section, in list order, for its tables, its part of report.md, its figures, its data
files, its block of stats.json and the files the report's "Files" line names. A result of None
means the section has nothing to show: no tables, markdown, figures or data files, though
``record``, ``listed_files`` and ``tables_note`` are still asked (a section may name its files
whether or not it wrote them). A new analysis is one module with a ``Section`` subclass and one
registration (``analysis.sections.registry``: an entry point or ``register``).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.render.tables import Table
from analysis.sections.context import ReportContext

#: A figure as a section draws it: its caption in report.md, and the files written (the PNG
#: first, the PDF beside it).
Drawn = tuple[str, list[Path]]
#: The parts of report.md a section may follow (``Section.follows``), in the report's order.
PARTS = (
    "header",
    "summary",
    "tables",
    "paired statistics",
    "figures",
    "method",
    "gaps",
    "warnings",
)
#: Where a section's warnings go among the report's (``Section.warns_with``): before every
#: other, after the main comparisons' statistical warnings, or after the loading and pairing
#: notes.
WARNING_PLACES = ("start", "statistics", "end")


class Section:
    """The protocol of a report section, with a default that shows nothing for every step but
    ``compute``. Subclasses set ``name`` and override what they show."""

    name: str = ""
    """The key of the section's result in ``ReportContext.results``."""
    follows: str = "paired statistics"
    """The part of report.md (one of ``PARTS``) the section's markdown comes after; sections
    that follow the same part keep their order in the registry."""
    warns_with: str = "end"
    """Where its warnings go among the report's (one of ``WARNING_PLACES``)."""
    study: bool = False
    """One of the study's own sections (``analysis.sections.study``): it reads what only the
    fusion study's runs log (document lengths, evaluation lengths, gates, its published
    numbers) and shows nothing without it."""
    before_order: bool = False
    """Computed before the core is put in display order, because that order needs its result
    (the length section: datasets run from the shortest median test document to the longest).
    Such a section must not read ``ctx.datasets``, ``ctx.operators``, ``ctx.tables`` or the
    order of ``ctx.comparisons.table``."""

    def compute(self, ctx: ReportContext, warnings: list[str]) -> Any | None:
        """The section's result from the core (None: nothing to show); warnings it has for the
        reader are appended to ``warnings``."""
        raise NotImplementedError

    def tables(self, result: Any, ctx: ReportContext) -> dict[str, Table]:
        """Tables written to ``tables/`` (as .md, .tex and .csv), by name."""
        return {}

    def markdown(self, result: Any, ctx: ReportContext) -> list[str]:
        """Its lines of report.md."""
        return []

    def figures(self, result: Any, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        """The figures it draws into ``fig_dir`` (only when the report makes figures)."""
        return []

    def data_files(self, result: Any, ctx: ReportContext) -> list[Path]:
        """The data files it writes into ``ctx.out_dir``."""
        return []

    def record(self, result: Any, ctx: ReportContext) -> dict[str, Any]:
        """Its keys of stats.json (asked for a None result too)."""
        return {}

    def listed_files(self, result: Any) -> list[str]:
        """Its data files as the "Files" line of report.md names them (asked for a None result
        too)."""
        return []

    def tables_note(self, result: Any) -> str:
        """What the "Files" line adds inside its ``tables/`` parenthesis ('' for nothing)."""
        return ""


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """``frame`` as CSV at ``path`` (its folder made when missing); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def jsonable(value: Any) -> Any:
    """``value`` with numpy and pandas scalars as plain JSON values (NaN and inf as None)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (pd.Timestamp, dt.datetime)):
        return value.isoformat()
    return value


def records(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    """The rows of ``frame`` as JSON-ready dicts ([] for None or an empty frame)."""
    if frame is None or frame.empty:
        return []
    return [jsonable(r) for r in frame.astype(object).to_dict(orient="records")]
