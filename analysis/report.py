"""The sweep report: ``python -m analysis.report --experiment NAME``.

Loads the experiment's runs from MLflow, pairs every operator with the baseline by seed,
runs the paired statistics, and writes into ``--out``:

    report.md            tables, figures, statistics, warnings, what is missing
    stats.csv            one row per comparison (stats.json: the same, plus every setting)
    length_stats.csv     per-length-bucket comparisons and long-minus-short contrasts
    length_accuracy.csv  accuracy by length bucket per operator
    runs.csv             the tidy frame of trial runs that was analysed
    tables/              Table 1, 2, 3 as .md, .tex and .csv
    figures/             PNG and PDF

then logs that folder as artifacts (under ``analysis/``) of the sweep's parent run, so the
report appears in the MLflow UI next to the trials.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import plots
from analysis.lengths import LengthAnalysis, analyse_lengths
from analysis.load import (
    AnalysisError,
    Experiment,
    Pairing,
    PairingError,
    load_experiment,
    pair_runs,
)
from analysis.paired import ALTERNATIVES, ZERO_METHODS, Comparisons, StatsSettings, compare
from analysis.tables import (
    Table,
    dataset_order,
    operator_order,
    operator_summary,
    stats_table,
    table1,
    table2,
    table3,
)

#: stats.csv leads with these columns (the contract of the issue), then everything else.
STATS_COLUMNS = [
    "dataset",
    "position",
    "attention_position",
    "operator",
    "baseline",
    "n_pairs",
    "mean_delta",
    "ci_low",
    "ci_high",
    "wilcoxon_stat",
    "p_wilcoxon",
    "p_holm",
    "wins",
    "sign_p",
    "hl_estimate",
    "rank_biserial",
    "d_z",
    "min_attainable_p",
]
ARTIFACT_PATH = "analysis"


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
    tables: dict[str, Table] = field(default_factory=dict)


def _main_setting(
    runs: pd.DataFrame, keys: Sequence[str], position: str | None, attention: str | None
) -> dict[str, Any]:
    """The setting of Tables 1 and 2: the study's sinusoidal input positions and no
    attention-level positions when present, else the most common value of each key."""
    setting: dict[str, Any] = {}
    prefer = {"position": position or "sinusoidal", "attention_position": attention or "none"}
    for key in keys:
        if key == "dataset":
            continue
        values = runs[key].value_counts()
        if values.empty:
            continue
        want = prefer.get(key)
        if want is not None and want in values.index:
            setting[key] = want
        elif key in prefer and (position if key == "position" else attention) is not None:
            raise AnalysisError(
                f"--{key.replace('_', '-')} {want!r}: no FINISHED run has it; "
                f"available: {', '.join(map(str, values.index))}"
            )
        else:
            setting[key] = values.index[0]
    return setting


def _restrict(
    runs: pd.DataFrame, column: str, wanted: Sequence[str], keep: str | None = None
) -> pd.DataFrame:
    """Only the runs whose ``column`` is in ``wanted`` (plus ``keep``); all when none given."""
    if not wanted:
        return runs
    have = set(runs[column].dropna())
    unknown = sorted(set(wanted) - have)
    if unknown:
        raise AnalysisError(
            f"--{column} {', '.join(unknown)}: no run has it; available: "
            + ", ".join(sorted(map(str, have)))
        )
    return runs[runs[column].isin({*wanted, keep})].reset_index(drop=True)


def _select(frame: pd.DataFrame, setting: dict[str, Any]) -> pd.DataFrame:
    for k, v in setting.items():
        frame = frame[frame[k] == v]
    return frame


def _ordered(
    table: pd.DataFrame, datasets: Sequence[str], operators: Sequence[str]
) -> pd.DataFrame:
    """Rows by dataset (shortest first), then setting, then operator (study order)."""
    if table.empty:
        return table
    rank_d = {d: i for i, d in enumerate(datasets)}
    rank_o = {o: i for i, o in enumerate(operators)}
    cols = [c for c in ("position", "attention_position") if c in table]
    key = table.assign(
        _d=table["dataset"].map(rank_d), _o=table["operator"].map(rank_o), _i=range(len(table))
    )
    return (
        key.sort_values(["_d", *cols, "_o", "_i"], kind="stable")
        .drop(columns=["_d", "_o", "_i"])
        .reset_index(drop=True)
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
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


def _records(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    if frame is None or frame.empty:
        return []
    return [_jsonable(r) for r in frame.astype(object).to_dict(orient="records")]


def _md_list(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    return [
        "- " + ", ".join(f"{c}={row[c]}" for c in columns if c in row and pd.notna(row[c]))
        for _, row in frame.iterrows()
    ]


def _fmt_p(p: float) -> str:
    return "–" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.4g}"


def build_report(
    experiment: str,
    tracking_uri: str | None = None,
    *,
    baseline: str = "add",
    out: str | Path | None = None,
    settings: StatsSettings | None = None,
    by: Sequence[str] = (),
    ignore_params: Sequence[str] = (),
    lengths: bool = True,
    length_buckets: int = 4,
    position: str | None = None,
    attention_position: str | None = None,
    log_to_mlflow: bool = True,
    load_method: str = "auto",
    make_figures: bool = True,
    only_operators: Sequence[str] = (),
    only_datasets: Sequence[str] = (),
) -> ReportResult:
    """Write the full report of ``experiment`` to ``out`` and log it to the sweep's parent run.

    Raises ExperimentNotFoundError / EmptyExperimentError / PairingError (all AnalysisError)
    with messages meant for the user.
    """
    settings = settings or StatsSettings()
    exp = load_experiment(experiment, tracking_uri, method=load_method)
    runs = _restrict(exp.runs, "operator", only_operators, keep=baseline)
    runs = _restrict(runs, "dataset", only_datasets)
    pairing = pair_runs(runs, baseline, by=by, ignore_params=ignore_params)
    comps = compare(pairing, settings)
    keys = list(pairing.keys)
    out_dir = Path(out) if out is not None else Path("reports") / plots.slug(experiment)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig_dir, tab_dir = out_dir / "figures", out_dir / "tables"
    files: list[Path] = []

    length_result = None
    if lengths and len(pairing.pairs):
        length_result = analyse_lengths(pairing, settings, n_buckets=length_buckets)
    medians = length_result.median_length if length_result else {}

    summary = operator_summary(pairing.runs, keys)
    datasets = dataset_order(pairing.runs["dataset"], medians)
    operators = operator_order(pairing.runs["operator"], baseline)
    setting = _main_setting(pairing.runs, keys, position, attention_position)
    table = _ordered(comps.table, datasets, operators)
    comps.table = table
    if length_result is not None and not length_result.stats.empty:
        length_result.stats = _ordered(length_result.stats, datasets, operators)
    rec = comps.settings

    # ---- tables
    tables = {
        "table1": table1(summary, table, rec, baseline, keys, setting, datasets),
        "table2": table2(summary, table, rec, baseline, keys, setting, datasets),
        "table3": table3(summary, table, rec, baseline, keys, datasets),
    }
    for t in tables.values():
        files += t.write(tab_dir)

    # ---- figures
    figures: list[tuple[str, Path]] = []
    if make_figures:
        figures, written = _make_figures(
            comps,
            pairing,
            summary,
            length_result,
            setting,
            keys,
            datasets,
            operators,
            medians,
            baseline,
            fig_dir,
        )
        files += written

    # ---- warnings
    warns = list(comps.warnings)
    if length_result is not None:
        warns += length_result.warnings
    warns += exp.notes + pairing.notes
    expected = pd.to_numeric(exp.parent_tags.get("cells"), errors="coerce")
    if expected is not None and not pd.isna(expected):
        cells = exp.runs["cell_id"].dropna()
        done = exp.runs.loc[exp.runs["status"] == "FINISHED", "cell_id"].dropna().nunique()
        if done < int(expected):
            warns.append(
                f"partial sweep: {done} of {int(expected)} cells (parent run tag `cells`) have a "
                f"FINISHED run; {max(0, int(expected) - cells.nunique())} have no run yet."
            )
    if len(pairing.incomplete):
        warns.append(
            f"partial sweep: {len(pairing.incomplete)} incomplete block(s) (group x seed missing "
            "an operator); only complete pairs are analysed. They are listed under "
            "'Incomplete blocks'."
        )
    if len(pairing.duplicates):
        warns.append(
            f"{len(pairing.duplicates)} cell(s) have several FINISHED runs; none of them is used "
            "(listed under 'Duplicate cells')."
        )
    if len(pairing.excluded):
        warns.append(
            f"{len(pairing.excluded)} FINISHED trial run(s) lack a tag or metric the analysis "
            "needs and are left out (listed under 'Excluded runs')."
        )
    if len(pairing.no_baseline):
        warns.append(
            f"{len(pairing.no_baseline)} group(s) have operators but no FINISHED `{baseline}` run, "
            "so nothing there is compared (listed under 'Groups without a baseline')."
        )

    # ---- stats files
    ordered = [c for c in STATS_COLUMNS if c in table] + [
        c for c in table if c not in STATS_COLUMNS
    ]
    stats_csv = out_dir / "stats.csv"
    (table[ordered] if len(table) else pd.DataFrame(columns=STATS_COLUMNS)).to_csv(
        stats_csv, index=False
    )
    files.append(stats_csv)
    if length_result is not None and not length_result.stats.empty:
        p1, p2 = out_dir / "length_stats.csv", out_dir / "length_accuracy.csv"
        length_result.stats.to_csv(p1, index=False)
        length_result.accuracy.to_csv(p2, index=False)
        files += [p1, p2]
    runs_csv = out_dir / "runs.csv"
    exp.runs.to_csv(runs_csv, index=False)
    files.append(runs_csv)

    logged_to = exp.parent_run_id if log_to_mlflow else None
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    stats_json = out_dir / "stats.json"
    payload = {
        "experiment": exp.name,
        "experiment_id": exp.experiment_id,
        "tracking_uri": exp.tracking_uri,
        "parent_run_id": exp.parent_run_id,
        "generated_at": now,
        "settings": {
            **rec,
            "baseline": baseline,
            "group_keys": keys,
            "by": list(by),
            "ignore_params": list(ignore_params),
            "length_buckets": length_buckets if lengths else None,
            "main_setting": setting,
            "operators": list(only_operators) or "all",
            "datasets": list(only_datasets) or "all",
        },
        "comparisons": _records(table[ordered] if len(table) else None),
        "length_comparisons": _records(length_result.stats if length_result else None),
        "warnings": warns,
        "incomplete_blocks": _records(pairing.incomplete),
        "duplicates": _records(pairing.duplicates),
        "excluded_runs": _records(pairing.excluded),
        "no_baseline": _records(pairing.no_baseline),
    }
    stats_json.write_text(json.dumps(_jsonable(payload), indent=2), encoding="utf-8")
    files.append(stats_json)

    # ---- report.md
    scope = ", ".join(
        f"{name} {', '.join(vals)}"
        for name, vals in (("operators", only_operators), ("datasets", only_datasets))
        if vals
    )
    md = _markdown(
        scope,
        exp,
        pairing,
        comps,
        length_result,
        tables,
        figures,
        warns,
        setting,
        baseline,
        settings,
        keys,
        logged_to,
        now,
        out_dir,
    )
    report_md = out_dir / "report.md"
    report_md.write_text(md, encoding="utf-8")
    files.append(report_md)

    if logged_to:
        from mlflow import MlflowClient

        MlflowClient(exp.tracking_uri).log_artifacts(logged_to, str(out_dir), ARTIFACT_PATH)
    return ReportResult(
        out_dir=out_dir,
        files=files,
        experiment=exp,
        pairing=pairing,
        comparisons=comps,
        lengths=length_result,
        warnings=warns,
        logged_to=logged_to,
        tables=tables,
    )


def _make_figures(
    comps: Comparisons,
    pairing: Pairing,
    summary: pd.DataFrame,
    length_result: LengthAnalysis | None,
    setting: dict[str, Any],
    keys: list[str],
    datasets: list[str],
    operators: list[str],
    medians: dict[str, float],
    baseline: str,
    fig_dir: Path,
) -> tuple[list[tuple[str, Path]], list[Path]]:
    """Every figure of the report; returns (caption, PNG path) pairs and all files written."""
    colors = plots.operator_colors(operators)
    files: list[Path] = []
    figures: list[tuple[str, Path]] = []
    settings_list = (
        pairing.runs[[k for k in keys if k != "dataset"]].drop_duplicates().to_dict("records")
    )
    where_main = ", ".join(f"{k}={v}" for k, v in setting.items())
    for s in settings_list:
        label = ", ".join(f"{k}={v}" for k, v in s.items())
        paths = plots.paired_deltas(
            _select(comps.deltas, s),
            "dataset",
            datasets,
            operators,
            baseline,
            f"Paired per-seed deltas vs {baseline} ({label})",
            fig_dir,
            "paired_deltas__" + "__".join(plots.slug(v) for v in s.values()),
            colors,
        )
        if paths:
            figures.append((f"Paired per-seed deltas vs `{baseline}` ({label})", paths[0]))
            files += paths
    if len(settings_list) > 1:
        deltas = comps.deltas.copy()
        other = [k for k in keys if k != "dataset"]
        deltas["setting"] = deltas[other].astype(str).agg(" / ".join, axis=1)
        setting_names = list(dict.fromkeys(deltas["setting"]))
        for d in datasets:
            paths = plots.paired_deltas(
                deltas[deltas["dataset"] == d],
                "setting",
                setting_names,
                operators,
                baseline,
                f"{d}: paired per-seed deltas vs {baseline} per position family "
                f"({' / '.join(other)})",
                fig_dir,
                f"paired_deltas_by_position__{plots.slug(d)}",
                colors,
            )
            if paths:
                figures.append((f"{d}: paired deltas per position family", paths[0]))
                files += paths
    main_summary = _select(summary, setting)
    paths = plots.accuracy_by_regime(
        main_summary,
        datasets,
        operators,
        medians,
        f"Accuracy by length regime ({where_main})",
        fig_dir,
        colors=colors,
    )
    if paths:
        figures.append(("Accuracy by length regime (datasets, shortest to longest)", paths[0]))
        files += paths
    paths = plots.accuracy_vs_latency(
        main_summary,
        datasets,
        operators,
        f"Accuracy vs latency ({where_main})",
        fig_dir,
        colors=colors,
    )
    if paths:
        figures.append(("Accuracy against measured latency", paths[0]))
        files += paths
    if length_result is not None and not length_result.accuracy.empty:
        paths = plots.accuracy_by_length_bucket(
            _select(length_result.accuracy, setting),
            _select(length_result.stats, setting),
            datasets,
            operators,
            baseline,
            f"Accuracy by document length inside each dataset ({where_main})",
            fig_dir,
            "accuracy_by_length_bucket",
            colors,
        )
        if paths:
            figures.append(("Accuracy by length quantile inside each dataset", paths[0]))
            files += paths

    return figures, files


def _markdown(
    scope: str,
    exp: Experiment,
    pairing: Pairing,
    comps: Comparisons,
    lengths: LengthAnalysis | None,
    tables: dict[str, Table],
    figures: list[tuple[str, Path]],
    warns: list[str],
    setting: dict[str, Any],
    baseline: str,
    settings: StatsSettings,
    keys: list[str],
    logged_to: str | None,
    now: str,
    out_dir: Path,
) -> str:
    runs = exp.runs
    status = ", ".join(f"{v} {k}" for k, v in runs["status"].value_counts().items())
    shas = sorted(set(runs["git_sha"].dropna()))
    table = comps.table
    m = len(table)
    lines = [
        f"# Fusion analysis: `{exp.name}`",
        "",
        f"- tracking URI: `{exp.tracking_uri}` (experiment id {exp.experiment_id})",
        f"- trial runs: {len(runs)} ({status}); analysed: {len(pairing.runs)} FINISHED runs, "
        f"{len(pairing.pairs)} seed pairs, {m} comparisons against `{baseline}`"
        + (f" (restricted to {scope})" if scope else ""),
        "- sweep parent run: "
        + (
            f"`{exp.parent_run_id}`; this report is logged to it under `{ARTIFACT_PATH}/`"
            if logged_to
            else (
                f"`{exp.parent_run_id}` (not logged: --no-log)"
                if exp.parent_run_id
                else "none (no run tagged role=sweep), so this report is on disk only"
            )
        ),
        f"- code: git_sha {', '.join(s[:12] for s in shas) if shas else 'not tagged'}",
        f"- generated {now}",
        "",
        "## Warnings",
        "",
    ]
    lines += [f"- {w}" for w in warns] if warns else ["- none"]
    alt = settings.alternative
    lines += [
        "",
        "## Method",
        "",
        f"Within each {' x '.join(keys)} group, each operator is paired with `{baseline}` by "
        "seed (same seed: same initialisation of shared modules, same batch order, same data "
        "split), using only seeds where both runs FINISHED and whose configs agree on every "
        "param except `model.fusion` and `model.fusion_kwargs.*`. A delta is "
        "(operator - baseline) test accuracy computed from the integer correct counts, shown in "
        "percentage points (pp); ranks and ties are taken on the integers, so round-off cannot "
        "create or break ties.",
        "",
        f"- **Wilcoxon signed-rank**, {alt}, exact: `scipy.stats.wilcoxon(method='exact')` when "
        "there are no zero or tied deltas; otherwise the exact permutation distribution "
        "conditional on the mid-ranks (never the normal approximation). "
        f"Zero policy: zero_method = `{settings.zero_method}` ({comps.settings['zero_policy']}). "
        "`V` is the sum of ranks of positive deltas (R's V).",
        f"- **Holm** step-down correction over all m = {m} comparisons of this report "
        "(statsmodels `multipletests(method='holm')`; its default, 'hs', is Holm-Sidak). The "
        "length analysis is a separate family.",
        f"- **Sign test**: wins k of n (ties dropped), exact binomial ({alt}), Clopper-Pearson "
        "interval of the win rate.",
        f"- **Mean delta** with a {settings.confidence:.0%} percentile paired-bootstrap interval "
        f"({settings.n_bootstrap} resamples, seeded); it under-covers at n <= 6.",
        f"- **Hodges-Lehmann** shift (median of Walsh averages) with its exact "
        f"{settings.confidence:.0%} interval; matched-pairs rank-biserial correlation; Cohen's "
        "d_z = mean / sd of the deltas.",
        "- **Attainable significance**: an exact test on n pairs cannot give p below "
        "2/2^n (two-sided) or 1/2^n (one-sided); after Holm over m comparisons the floor is "
        f"m times that. `min p (Holm)` shows it; comparisons whose floor exceeds alpha = "
        f"{settings.alpha} are named in the warnings with the seeds needed.",
        "",
    ]
    for key in ("table1", "table2", "table3"):
        lines += ["## " + tables[key].caption.split(".")[0], "", tables[key].to_markdown(), ""]
    lines += ["## Paired statistics", ""]
    if m:
        lines += [stats_table(table, keys, comps.settings).to_markdown(), ""]
        lines += [
            f"`*`: Holm-adjusted p ≤ {settings.alpha}. Every column, and more "
            "(Clopper-Pearson bounds, HL interval confidence, n_zeros, wilcoxon_method), is in "
            "`stats.csv`.",
            "",
        ]
    else:
        lines += ["No complete pair: nothing to compare yet.", ""]
    if lengths is not None and not lengths.stats.empty:
        lines += ["## Length-aware analysis", ""]
        lines += [
            "Test documents of each dataset are cut into length quantile buckets (tokens "
            "before truncation). Per bucket, paired deltas of correct counts get the same "
            "statistics as above (Holm over all bucket comparisons); `long-short` is, per seed, "
            "the delta in the longest bucket minus the delta in the shortest (Holm over the "
            "contrasts): a positive, significant contrast means the operator's advantage grows "
            "with length inside the dataset.",
            "",
        ]
        b = lengths.buckets
        lines += ["| dataset | bucket | tokens | documents | truncated |", "|---|---|---|---|---|"]
        for _, r in b.iterrows():
            trunc = "–" if pd.isna(r["truncated_share"]) else f"{r['truncated_share']:.0%}"
            lines.append(
                f"| {r['dataset']} | {r['bucket']} | {r['label']} | {r['n_docs']} | {trunc} |"
            )
        lines += [
            "",
            f"Contrasts and buckets in the main setting ({', '.join(f'{k}={v}' for k, v in setting.items())}):",
            "",
        ]
        st = _select(lengths.stats, setting)
        lines += [
            "| dataset | operator | bucket | n | Δ mean (pp) | HL | p | p Holm | wins |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for _, r in st.iterrows():
            lines.append(
                f"| {r['dataset']} | {r['operator']} | {r['bucket']} | {int(r['n_pairs'])} | "
                f"{r['mean_delta']:+.2f} | {r['hl_estimate']:+.2f} | {_fmt_p(r['p_wilcoxon'])} | "
                f"{_fmt_p(r['p_holm'])}{'*' if r['significant'] else ''} | "
                f"{int(r['wins'])}/{int(r['n_pairs'])} |"
            )
        lines += ["", "All settings: `length_stats.csv`, `length_accuracy.csv`.", ""]
    lines += ["## Figures", ""]
    if not figures:
        lines += ["None drawn (--no-figures, or nothing to draw).", ""]
    for caption, path in figures:
        rel = path.relative_to(out_dir).as_posix()
        lines += [f"**{caption}** (PDF: `{rel[:-4]}.pdf`)", "", f"![{caption}]({rel})", ""]
    lines += ["## Incomplete blocks", ""]
    if len(pairing.incomplete):
        lines += _md_list(pairing.incomplete, [*keys, "seed", "missing"])
    else:
        lines.append("- none: every seed of every group has every operator")
    lines += ["", "## Duplicate cells", ""]
    lines += (
        _md_list(pairing.duplicates, [*keys, "operator", "seed", "run_ids", "differing_params"])
        if len(pairing.duplicates)
        else ["- none"]
    )
    if len(pairing.excluded):
        lines += ["", "## Excluded runs", ""]
        lines += _md_list(pairing.excluded, ["run_id", "run_name", "missing"])
    if len(pairing.no_baseline):
        lines += ["", "## Groups without a baseline", ""]
        lines += _md_list(pairing.no_baseline, keys)
    lines += [
        "",
        "## Files",
        "",
        "`stats.csv`, `stats.json` (with every setting), `length_stats.csv`, "
        "`length_accuracy.csv`, `runs.csv`, `tables/` (Markdown, LaTeX, CSV), `figures/` "
        "(PNG, PDF).",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.report",
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
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm")
    p.add_argument("--alternative", choices=ALTERNATIVES, default="two-sided")
    p.add_argument("--zero-method", choices=ZERO_METHODS, default="wilcox")
    p.add_argument("--bootstrap", type=int, default=9999, help="bootstrap resamples (9999)")
    p.add_argument("--bootstrap-seed", type=int, default=0)
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
        help="skip the length analysis (does not read test_predictions.parquet)",
    )
    p.add_argument("--length-buckets", type=int, default=4, help="length quantile buckets (4)")
    p.add_argument(
        "--no-figures",
        action="store_true",
        help="skip the figures (about 1-2 s each; a large grid has one per position setting)",
    )
    p.add_argument(
        "--no-log", action="store_true", help="do not log the report to the sweep's parent run"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = StatsSettings(
            alpha=args.alpha,
            alternative=args.alternative,
            zero_method=args.zero_method,
            n_bootstrap=args.bootstrap,
            bootstrap_seed=args.bootstrap_seed,
        )
        result = build_report(
            args.experiment,
            args.tracking_uri,
            baseline=args.baseline,
            out=args.out,
            settings=settings,
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
        )
    except PairingError as err:
        print(f"error: experiment {args.experiment!r}: {err}", file=sys.stderr)
        return 3
    except (AnalysisError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table = result.comparisons.table
    sig = int(table["significant"].sum()) if len(table) else 0
    print(f"report: {result.out_dir / 'report.md'}")
    print(
        f"{len(result.pairing.runs)} finished runs, {len(result.pairing.pairs)} seed pairs, "
        f"{len(table)} comparisons, {sig} significant after Holm at alpha={settings.alpha}"
    )
    if len(result.pairing.incomplete):
        print(f"partial sweep: {len(result.pairing.incomplete)} incomplete block(s), see report.md")
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if result.logged_to:
        print(f"logged to run {result.logged_to} under artifacts/{ARTIFACT_PATH}/")
    elif result.experiment.parent_run_id is None:
        print("not logged to MLflow: the experiment has no sweep parent run (tag role=sweep)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
