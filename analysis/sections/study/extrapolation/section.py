"""The report's section for train short, test long: computes (``compute``) and presents
(``present``) the extrapolation of a report's runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.render.tables import Table
from analysis.sections.base import Drawn, Section, write_csv
from analysis.sections.context import ReportContext, display_order
from analysis.sections.study.extrapolation.compute import (
    CSV_FILES,
    Extrapolation,
    analyse_extrapolation,
)
from analysis.sections.study.extrapolation.present import (
    extrapolation_figure,
    extrapolation_markdown,
    extrapolation_record,
    extrapolation_tables,
    written_files,
)


class ExtrapolationSection(Section):
    """Train short, test long (none without per-length metrics)."""

    study = True
    name = "extrapolation"

    def compute(self, ctx: ReportContext, warnings: list[str]) -> Extrapolation | None:
        """The analysis of the paired runs, its frames in display order; the truncation ladder
        reads the by-length predictions only with ``options.lengths``."""
        o, pairing = ctx.options, ctx.pairing
        if pairing.pairs.empty:
            return None
        ex = analyse_extrapolation(
            pairing,
            o.settings,
            read_predictions=o.lengths,
            tracking_uri=ctx.experiment.tracking_uri,
        )
        if ex is None:
            return None
        for name in ("accuracy", "stats", "slopes", "ladder"):
            frame = display_order(getattr(ex, name), ctx.datasets, ctx.operators, ctx.axis_levels)
            setattr(ex, name, frame)
        warnings += ex.warnings
        return ex

    def tables(self, result: Extrapolation, ctx: ReportContext) -> dict[str, Table]:
        return extrapolation_tables(result, ctx.keys, ctx.axes, ctx.record)

    def markdown(self, result: Extrapolation, ctx: ReportContext) -> list[str]:
        return extrapolation_markdown(result, self.tables(result, ctx), ctx)

    def figures(self, result: Extrapolation, ctx: ReportContext, fig_dir: Path) -> list[Drawn]:
        return extrapolation_figure(result, ctx, fig_dir)

    def data_files(self, result: Extrapolation, ctx: ReportContext) -> list[Path]:
        return [
            write_csv(getattr(result, attribute), ctx.out_dir / name)
            for attribute, name in CSV_FILES.items()
            if len(getattr(result, attribute))
        ]

    def record(self, result: Extrapolation | None, ctx: ReportContext) -> dict[str, Any]:
        return {"extrapolation": extrapolation_record(result)} if result is not None else {}

    def listed_files(self, result: Extrapolation | None) -> list[str]:
        return [f"`{name}`" for name in written_files(result)] if result is not None else []


EXTRAPOLATION = ExtrapolationSection()
