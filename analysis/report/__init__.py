"""The sweep report: ``python -m analysis.report --experiment NAME``.

Loads the experiment's runs from MLflow, pairs every operator with the baseline by seed,
runs the paired statistics (the paired core, ``analysis.sections.context``), computes every section of
registered section (``analysis.sections.registry``) and writes into ``--out``:

    report.md            a summary first, decisions, tables, figures, statistics, what is
                         missing, and the warnings last (one line each; warnings.md in full)
    report.html          report.md as one self-contained page (figures embedded, tables
                         styled, no script, nothing fetched), which the MLflow UI shows rendered
    stats.csv            one row per comparison (stats.json: the same, plus every setting)
    interaction.csv      one row per interaction test (only for grids with extra axes)
    length_stats.csv     per-length-bucket comparisons and long-minus-short contrasts
    length_accuracy.csv  accuracy by length bucket per operator
    extrapolation.csv    train short, test long (only for runs with data.eval_lengths): one row
                         per comparison and evaluation length; extrapolation_accuracy.csv, the
                         accuracy curves; extrapolation_interaction.csv, the slope of each
                         operator effect against log2(evaluation length); truncation_ladder.csv,
                         accuracy gained from a longer truncation on the same documents
    gates_by_position.csv  gated operators' gate on E per position bucket, over seeds (only
                         when gated runs logged gate_by_position.parquet; not with --no-figures)
    runs.csv             the tidy frame of trial runs that was analysed
    tables/              Table 1, 2, 3 as .md, .tex and .csv; reproduction.csv, the study's
                         published numbers beside ours (only when runs match its cells)
    figures/             PNG and PDF

then logs that folder as artifacts (under ``analysis/``) of the sweep's parent run, so the
report appears in the MLflow UI next to the trials, and sets the experiment's description to
the sweep, its trial runs and where the report is (``analysis.report.html``).

From Python::

    from analysis.report import ReportOptions, build_report
    result = build_report("quickstart", "sqlite:///mlflow.db", ReportOptions(baseline="add"))
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import AnalysisError, Experiment, StoreAccessError
from analysis.load.other_settings import OtherSettings
from analysis.render.tables import Table
from analysis.report.html import describe_experiment, describe_parent, write_html
from analysis.report.markdown import WARNINGS_FILE, render_report, warnings_text
from analysis.report.trainable import report_if_trainable
from analysis.sections.base import Section, jsonable, records
from analysis.sections.context import (
    ARTIFACT_PATH,
    ReportContext,
    ReportOptions,
    arrange,
    loading_warnings,
    mark_decisions,
    paired_core,
    read_labels,
)
from analysis.sections.figures import core_figures
from analysis.sections.registry import sections as registered_sections
from analysis.sections.study.lengths import LENGTHS, LengthAnalysis
from analysis.stats import ALTERNATIVES, ZERO_METHODS, Comparisons, StatsSettings, headline_columns
from analysis.stats.pairing import GROUP_KEYS, NothingToCompareError, Pairing, PairingError
from fusion_ray.redact import credentials_problem, redact
from fusion_ray.schema import (
    ADAPTIVE_TAG,
    LENGTH_PREDICTIONS_FILE,
    PREDICTIONS_FILE,
    ROLE_SWEEP,
    ROLE_TAG,
)

__all__ = ["STATS_COLUMNS", "ReportOptions", "ReportResult", "build_report", "main"]


def _sections(given: Sequence[Section] | None) -> list[Section]:
    """``given``, or else the registered sections in their order (``analysis.sections.registry``)."""
    return list(given) if given is not None else registered_sections()


def stats_columns(axes: Sequence[str] = ()) -> list[str]:
    """stats.csv leads with these: the comparison (with a column per extra grid axis), then the
    registered statistics' headline columns (``analysis.stats.statistics()``); every other
    column follows."""
    return [*GROUP_KEYS, *axes, "operator", "baseline", *headline_columns()]


#: stats.csv's leading columns with the built-in statistics (the contract of stats.csv).
STATS_COLUMNS = stats_columns()


@dataclass
class ReportResult:
    """What a report run produced, for callers and tests."""

    out_dir: Path
    files: list[Path]
    experiment: Experiment
    pairing: Pairing
    comparisons: Comparisons
    lengths: LengthAnalysis | None
    warnings: list[str]
    logged_to: str | None = None
    """The parent run the files were logged to, if any."""
    console_warnings: list[str] = field(default_factory=list)
    """The warnings ``print_summary`` prints (``ReportContext.console_warnings``)."""
    tables: dict[str, Table] = field(default_factory=dict)
    other_settings: OtherSettings = field(default_factory=OtherSettings)
    """The trial runs left out as other settings: ``.finished``, ``.left_out``, ``.sentence``."""
    results: dict[str, Any] = field(default_factory=dict)
    """Every section's result by name (``ReportContext.results``)."""


def build_report(
    experiment: str, tracking_uri: str | None = None, options: ReportOptions | None = None
) -> ReportResult:
    """Write the full report of ``experiment`` to ``options.out`` and log it to the sweep's
    parent run (unless ``options.log_to_mlflow`` is False), then describe the experiment
    (``analysis.report.html.describe_experiment``). Prints nothing.

    Raises ExperimentNotFoundError / EmptyExperimentError / ImpossibleMetricsError /
    PairingError / NothingToCompareError (all AnalysisError) with messages meant for the user.
    """
    ctx = build_context(experiment, tracking_uri, options or ReportOptions())
    files = write_report(ctx)
    if ctx.logged_to:
        from mlflow import MlflowClient

        client = MlflowClient(ctx.experiment.tracking_uri)
        client.log_artifacts(ctx.logged_to, str(ctx.out_dir), ARTIFACT_PATH)
        describe_experiment(client, ctx.experiment, ARTIFACT_PATH, ctx.generated_at)
        describe_parent(client, ctx.experiment, ARTIFACT_PATH)
    return ReportResult(
        out_dir=ctx.out_dir,
        files=files,
        experiment=ctx.experiment,
        pairing=ctx.pairing,
        comparisons=ctx.comparisons,
        lengths=ctx.results.get(LENGTHS.name),
        warnings=ctx.warnings,
        console_warnings=ctx.console_warnings,
        logged_to=ctx.logged_to,
        tables=all_tables(ctx),
        other_settings=ctx.other_settings,
        results=ctx.results,
    )


def build_context(
    experiment: str,
    tracking_uri: str | None,
    options: ReportOptions,
    sections: Sequence[Section] | None = None,
) -> ReportContext:
    """The paired core of ``experiment`` and the result of every section. Sections marked
    ``before_order`` run before the core is put in display order, the others after it."""
    sections = _sections(sections)
    ctx = paired_core(experiment, tracking_uri, options)
    warned: dict[str, list[str]] = {}
    for early in (True, False):
        if not early:
            arrange(ctx)
        for section in sections:
            if section.before_order == early:
                warned[section.name] = []
                ctx.results[section.name] = section.compute(ctx, warned[section.name])
    ctx.results = {s.name: ctx.results[s.name] for s in sections}
    decided = ctx.results.get("decisions")
    # an adaptive sweep: its tables mark its decisions
    if decided is not None and getattr(decided, "primary", False):
        mark_decisions(ctx, decided.marks, decided.table_note(str(ctx.options.baseline)))

    def placed(where: str) -> list[str]:
        return [w for s in sections if s.warns_with == where for w in warned[s.name]]

    loading = loading_warnings(ctx.experiment, ctx.pairing)
    ctx.warnings = [
        *placed("start"),
        *ctx.comparisons.warnings,
        *placed("statistics"),
        *loading,
        *placed("end"),
    ]
    adaptive = ADAPTIVE_TAG in ctx.experiment.parent_tags
    ctx.console_warnings = [*placed("start"), *loading] if adaptive else list(ctx.warnings)
    return ctx


def shown(
    ctx: ReportContext, sections: Sequence[Section] | None = None
) -> list[tuple[Section, Any]]:
    """(section, result) of every section with something to show, in list order."""
    sections = _sections(sections)
    return [(s, ctx.results[s.name]) for s in sections if ctx.results.get(s.name) is not None]


def all_tables(ctx: ReportContext, sections: Sequence[Section] | None = None) -> dict[str, Table]:
    """Tables 1-3, then every section's tables."""
    sections = _sections(sections)
    tables = dict(ctx.tables)
    for section, result in shown(ctx, sections):
        tables |= section.tables(result, ctx)
    return tables


def write_report(ctx: ReportContext, sections: Sequence[Section] | None = None) -> list[Path]:
    """Write every file of the report into ``ctx.out_dir``; returns their paths."""
    sections = _sections(sections)
    out_dir = ctx.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for table in all_tables(ctx, sections).values():
        files += table.write(out_dir / "tables")
    if ctx.options.make_figures:
        drawn = core_figures(ctx, out_dir / "figures")
        for section, result in shown(ctx, sections):
            drawn += section.figures(result, ctx, out_dir / "figures")
        ctx.figures = [(caption, paths[0]) for caption, paths in drawn if paths]
        files += [path for _, paths in drawn for path in paths]
    files += write_data_files(ctx, sections)
    report_md = out_dir / "report.md"
    text = render_report(ctx, sections)
    report_md.write_text(text, encoding="utf-8")
    report_html = write_html(text, out_dir, f"Fusion analysis: {ctx.experiment.name}")
    warnings_md = out_dir / WARNINGS_FILE
    warnings_md.write_text(warnings_text(ctx), encoding="utf-8")
    return [*files, report_md, report_html, warnings_md]


def write_data_files(ctx: ReportContext, sections: Sequence[Section] | None = None) -> list[Path]:
    """stats.csv, every section's data files, runs.csv and stats.json."""
    sections = _sections(sections)
    out_dir, table = ctx.out_dir, ctx.comparisons.table
    lead = stats_columns(ctx.axes)
    ordered = [c for c in lead if c in table] + [c for c in table if c not in lead]
    stats_csv = out_dir / "stats.csv"
    (table[ordered] if len(table) else pd.DataFrame(columns=lead)).to_csv(stats_csv, index=False)
    files = [stats_csv]
    for section, result in shown(ctx, sections):
        files += section.data_files(result, ctx)
    runs_csv = out_dir / "runs.csv"
    ctx.experiment.runs.to_csv(runs_csv, index=False)
    stats_json = out_dir / "stats.json"
    payload = stats_payload(ctx, table[ordered] if len(table) else None, sections)
    stats_json.write_text(json.dumps(jsonable(payload), indent=2), encoding="utf-8")
    return [*files, runs_csv, stats_json]


def stats_payload(
    ctx: ReportContext, comparisons: pd.DataFrame | None, sections: Sequence[Section] | None = None
) -> dict[str, Any]:
    """stats.json: the experiment, every setting, the comparisons, the warnings, what could not
    be paired, then every section's record."""
    sections = _sections(sections)
    exp, o, pairing = ctx.experiment, ctx.options, ctx.pairing
    payload: dict[str, Any] = {
        "experiment": exp.name,
        "experiment_id": exp.experiment_id,
        "tracking_uri": redact(exp.tracking_uri),
        "parent_run_id": exp.parent_run_id,
        "generated_at": ctx.generated_at,
        "settings": {
            **ctx.record,
            "baseline": o.baseline,
            "group_keys": ctx.keys,
            "by": list(o.by),
            "ignore_params": list(o.ignore_params),
            "length_buckets": o.length_buckets if o.lengths else None,
            "main_setting": ctx.main_setting,
            "operators": list(o.only_operators) or "all",
            "datasets": list(o.only_datasets) or "all",
        },
        "comparisons": records(comparisons),
        "set_aside": records(ctx.pairing.set_aside),
        "warnings": ctx.warnings,
        "other_settings": _other_settings_record(ctx.other_settings),
        "incomplete_blocks": records(pairing.incomplete),
        "duplicates": records(pairing.duplicates),
        "excluded_runs": records(pairing.excluded),
        "no_baseline": records(pairing.no_baseline),
    }
    if ctx.axis_levels:
        payload["settings"]["grid_axes"] = ctx.axis_levels
    if not pairing.aliases.empty:
        payload["position_aliases"] = records(pairing.aliases)
    for section in sections:
        payload |= section.record(ctx.results.get(section.name), ctx)
    return payload


def _other_settings_record(other: OtherSettings) -> dict[str, Any]:
    return {
        "sweep_cells": other.sweep_cells,
        "finished": other.finished,
        "unfinished": other.unfinished,
        "differences": list(other.differences),
        "without_counterpart": other.without_counterpart,
        "same_params": other.same_params,
        "sentence": other.sentence,
    }


# ----------------------------------------------------------------------------- CLI


def _statistics_options(p: argparse.ArgumentParser) -> None:
    """The fixed-n tests' options: alpha, alternative, zero deltas, the bootstrap."""
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm")
    p.add_argument(
        "--alternative",
        choices=ALTERNATIVES,
        default="two-sided",
        help="the fixed-n tests' alternative: operator differs from the baseline (two-sided), "
        "is better (greater) or worse (less); the anytime-valid decisions are two-sided",
    )
    p.add_argument(
        "--zero-method",
        choices=ZERO_METHODS,
        default="wilcox",
        help="how Wilcoxon's signed-rank test treats seed pairs with a zero delta: wilcox "
        "drops them, pratt ranks them and then drops them, zsplit splits their ranks",
    )
    p.add_argument("--bootstrap", type=int, default=9999, help="bootstrap resamples (9999)")
    p.add_argument(
        "--bootstrap-seed",
        type=int,
        default=0,
        help="seed of the bootstrap's resampling (0): the same seed gives the same intervals",
    )


def build_parser(prog: str = "python -m analysis.report") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Paired-seed statistics, the study's tables and figures, from an MLflow "
        "experiment (one sweep).",
    )
    p.add_argument("--experiment", required=True, help="experiment name (the sweep's name)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default, "
        "sqlite:///mlflow.db)",
    )
    p.add_argument("--baseline", default="add", help="operator label to compare against (add)")
    p.add_argument("--out", default=None, help="output folder (default reports/<experiment>)")
    _statistics_options(p)
    p.add_argument(
        "--by",
        action="append",
        default=[],
        metavar="PARAM",
        help="also group by this param (a hyperparameter the sweep varies), e.g. train.lr",
    )
    p.add_argument(
        "--ignore-param",
        action="append",
        default=[],
        metavar="PARAM",
        help="a param allowed to differ inside a pair (e.g. data.cache_dir)",
    )
    p.add_argument(
        "--operator",
        action="append",
        default=[],
        metavar="LABEL",
        help="compare only this operator with the baseline (repeatable); fewer comparisons "
        "make Holm's correction less severe",
    )
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME",
        help="only this dataset (repeatable)",
    )
    p.add_argument("--position", default=None, help="position family of Tables 1-2 (sinusoidal)")
    p.add_argument(
        "--attention-position", default=None, help="attention-level position of Tables 1-2 (none)"
    )
    p.add_argument(
        "--no-lengths",
        action="store_true",
        help=f"skip the length analysis and the truncation ladder (reads neither "
        f"{PREDICTIONS_FILE} nor {LENGTH_PREDICTIONS_FILE})",
    )
    p.add_argument("--length-buckets", type=int, default=4, help="length quantile buckets (4)")
    p.add_argument(
        "--labels",
        default=None,
        metavar="FILE",
        help="YAML display names for figures and Tables 1-3: {operators: {gate_scalar: Scalar "
        "gate}, datasets: {...}, positions: {...}}",
    )
    p.add_argument(
        "--no-figures",
        action="store_true",
        help="skip the figures (about 1-2 s each; a large grid has one per position setting) "
        "and the gate analysis, which downloads gate_by_position.parquet of every gated run",
    )
    p.add_argument(
        "--no-log", action="store_true", help="do not log the report to the sweep's parent run"
    )
    return p


def options_from_args(args: argparse.Namespace) -> ReportOptions:
    """The ReportOptions the command-line flags ask for."""
    return ReportOptions(
        baseline=args.baseline,
        out=args.out,
        settings=StatsSettings(
            alpha=args.alpha,
            alternative=args.alternative,
            zero_method=args.zero_method,
            n_bootstrap=args.bootstrap,
            bootstrap_seed=args.bootstrap_seed,
        ),
        by=args.by,
        ignore_params=args.ignore_param,
        lengths=not args.no_lengths,
        length_buckets=args.length_buckets,
        position=args.position,
        attention_position=args.attention_position,
        log_to_mlflow=not args.no_log,
        make_figures=not args.no_figures,
        only_operators=args.operator,
        only_datasets=args.dataset,
        labels=read_labels(args.labels) if args.labels else {},
    )


def main(argv: Sequence[str] | None = None, prog: str = "python -m analysis.report") -> int:
    """The CLI: 0 on success; 2 for an unknown or empty experiment, impossible logged metrics,
    a bad option, a tracking URI that names no store, or a report that cannot be written; 3 when
    runs cannot be paired or nothing can be compared; 8, 9, 10, 12 as the sweep's for a tracking
    store that refused the credentials, stayed locked, did not answer or has no space left."""
    args = build_parser(prog).parse_args(argv)
    problem = (
        credentials_problem(args.tracking_uri, "--tracking-uri") if args.tracking_uri else None
    )
    if problem:
        print(f"error: {redact(problem)}", file=sys.stderr)
        return 2
    try:
        options = options_from_args(args)
        if report_if_trainable(args.experiment, args.tracking_uri, args.out):
            return 0
        result = build_report(args.experiment, args.tracking_uri, options)
    except StoreAccessError as err:
        print(f"error: {redact(err)}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # the report's folder: no space left, no permission
        where = f" {err.filename}" if err.filename else ""
        print(
            f"error: the report could not be written ({err.strerror or err}{where}); free space "
            "there or pass --out with a folder that can be written",
            file=sys.stderr,
        )
        return 2
    except PairingError as err:
        print(f"error: experiment {args.experiment!r}: {redact(err)}", file=sys.stderr)
        return 3
    except NothingToCompareError as err:
        print(f"error: {redact(err)}", file=sys.stderr)
        return 3
    except (AnalysisError, ValueError) as err:
        print(f"error: {redact(err)}", file=sys.stderr)
        return 2
    print_summary(result, options.settings.alpha)
    return 0


def print_summary(result: ReportResult, alpha: float) -> None:
    table = result.comparisons.table
    print(f"report: {result.out_dir / 'report.md'}")
    adaptive = ADAPTIVE_TAG in result.experiment.parent_tags
    counted = f"{len(result.pairing.runs)} finished runs, {len(result.pairing.pairs)} seed pairs"
    decided = result.results.get("decisions")
    if adaptive and decided is not None and getattr(decided, "primary", False):
        verdicts: Counter[str] = (
            Counter(decided.table["verdict"]) if len(decided.table) else Counter()
        )
        said = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(), key=lambda x: -x[1]))
        print(
            f"{counted}; decisions (anytime-valid, one closed test over the "
            f"{len(decided.table)} hypotheses, alpha={alpha}): {said or 'none'} (the fixed-n "
            "tests are descriptive after adaptive seeds: none is called significant)"
        )
    else:
        sig = int(table["significant"].sum()) if len(table) else 0
        print(f"{counted}, {len(table)} comparisons, {sig} significant after Holm at alpha={alpha}")
    if result.other_settings.left_out:
        print(result.other_settings.sentence)
    if len(result.pairing.incomplete) and not adaptive:
        print(f"partial sweep: {len(result.pairing.incomplete)} incomplete block(s), see report.md")
    for w in result.console_warnings:
        print(f"warning: {w}", file=sys.stderr)
    more = len(result.warnings) - len(result.console_warnings)
    if more:
        print(
            f"{more} more warning(s) about the fixed-n statistics, descriptive in an adaptive "
            f"sweep: {result.out_dir / WARNINGS_FILE}",
            file=sys.stderr,
        )
    if result.logged_to:
        print(f"logged to run {result.logged_to} under artifacts/{ARTIFACT_PATH}/")
    elif result.experiment.parent_run_id is None:
        print(
            f"not logged to MLflow: the experiment has no sweep parent run (tag "
            f"{ROLE_TAG}={ROLE_SWEEP})"
        )
