"""The report of a trainable's sweep (``trainable: NAME``): what was compared, the decisions, the
paired statistics, the figures; the study's sections (datasets, positions, lengths, latency)
have nothing to say of a trainable's runs and are not written.

Written into the output folder and logged to the sweep's parent run (``report/``):

    report.md / report.html   the summary, the decisions, the paired statistics, the figures
    tables/decisions.*        an adaptive sweep's verdicts (md, tex, csv): the driver's own
                              decisions.csv, one row per hypothesis of the one closed family
    tables/paired.*           per comparison (a level against the baseline within a group of
                              the other axes): seeds paired, mean, SD, Hodges-Lehmann estimate
                              and interval, sign consistency, exact Wilcoxon p (descriptive
                              beside anytime decisions; Holm across the family decides a sweep
                              of fixed seeds)
    runs.csv                  the trial runs analysed
    figures/                  the decided effects with their intervals, and the e-processes

Values are points: 100 x the metric's difference, signed so that positive is better (a
``mode: min`` metric's difference is negated).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import store as load_store
from analysis.load.artifacts import read_logged_decisions
from analysis.load.frame import parse_grid_axes
from analysis.load.store import load_experiment, store_access
from analysis.render.drawing import forest, save
from analysis.render.tables import Table, fmt_p
from analysis.report.html import write_html
from analysis.stats.exact import hodges_lehmann, holm, wilcoxon_signed_rank
from fusion_ray.schema import (
    ADAPTIVE_TAG,
    DECISION_METRIC_PREFIX,
    DECISION_TAG_PREFIX,
    GRID_AXES_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
    TRAINABLE_TAG,
    returned_metrics,
)
from fusion_ray.store_errors import each_request_once

ALPHA = 0.05


@dataclass
class TrainableReport:
    """What the report of a trainable's sweep found, and where it wrote it."""

    out: Path
    trainable: str
    axis: str
    baseline: str
    metric: str
    mode: str
    paired: pd.DataFrame
    """One row per comparison (``paired_statistics``)."""
    decisions: pd.DataFrame | None
    """An adaptive sweep's decisions (the parent run's decisions.csv); None for fixed seeds."""
    written: list[Path] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        """What the console says of the report: each comparison's verdict, and where it is."""
        lines = [f"\nreport: {self.out / 'report.md'} (and report.html)"]
        for row in verdict_rows(self):
            lines.append(f"  {row['comparison']}: {row['verdict']} ({row['effect']})")
        return lines


def sweep_settings(tags: dict[str, str], client: Any, runs: pd.DataFrame) -> dict[str, Any]:
    """The parent run's ``trainable_sweep`` record, its metric named (null: the first metric
    the first finished run returned)."""
    if TRAINABLE_TAG not in tags:
        raise ValueError(
            "the experiment's parent run has no trainable_sweep tag: it is not a trainable's "
            "sweep (run python -m analysis.report for the study's)"
        )
    record = json.loads(tags[TRAINABLE_TAG])
    if record.get("metric") is None:
        finished = runs[runs["status"] == "FINISHED"]
        first = client.get_run(str(finished["run_id"].iloc[0])) if len(finished) else None
        names = returned_metrics(dict(first.data.tags)) if first is not None else []
        record["metric"] = names[0] if names else "metric"
    return record


def paired_statistics(
    runs: pd.DataFrame, levels: dict[str, list[str]], record: dict[str, Any]
) -> pd.DataFrame:
    """Each level of the compared axis against the baseline, within each group of the other
    axes, over the seeds where both finished (points, positive = better)."""
    axis, baseline, metric = record["axis"], record["baseline"], record["metric"]
    sign = 1.0 if record.get("mode", "max") == "max" else -1.0
    others = [k for k in levels if k != axis]
    finished = runs[runs["status"] == "FINISHED"]
    rows = []
    for group, part in _groups(finished, others, levels):
        base = part[part[axis] == baseline].set_index("seed")[metric]
        for level in [v for v in levels[axis] if v != baseline]:
            arm = part[part[axis] == level].set_index("seed")[metric]
            seeds = sorted(set(base.index) & set(arm.index), key=int)
            deltas = np.array([100.0 * sign * (arm[s] - base[s]) for s in seeds]).round(9)
            name = f"{axis}={level} vs {axis}={baseline}"
            failed = _failed(runs, others, group, axis, (level, baseline))
            rows.append(_paired_row(f"{group}: {name}" if group else name, deltas, failed))
    table = pd.DataFrame(rows)
    if len(table):
        table["p_holm"] = holm(table["wilcoxon_p"].fillna(1.0).to_numpy(dtype=float))
    return table


def _groups(
    runs: pd.DataFrame, others: list[str], levels: dict[str, list[str]]
) -> list[tuple[str, pd.DataFrame]]:
    """The runs of each group of the other axes (``k=v k=v``), in the grid's order of levels."""
    if not others:
        return [("", runs)]
    found = []
    for key, part in runs.groupby(others, sort=False):
        values = key if isinstance(key, tuple) else (key,)
        rank = tuple(_rank(levels[k], str(v)) for k, v in zip(others, values, strict=True))
        name = " ".join(f"{k}={v}" for k, v in zip(others, values, strict=True))
        found.append((rank, name, part))
    return [(name, part) for _, name, part in sorted(found, key=lambda f: f[0])]


def _rank(levels: list[str], value: str) -> int:
    return levels.index(value) if value in levels else len(levels)


def _failed(
    runs: pd.DataFrame, others: list[str], group: str, axis: str, arms: tuple[str, str]
) -> int:
    """FAILED runs of the comparison's two arms in its group (its paired seeds leave them out;
    an adaptive sweep's decision counts them as a loss of their arm)."""
    failed = runs[(runs["status"] == "FAILED") & runs[axis].isin(arms)]
    for key, value in (item.split("=", 1) for item in group.split(" ") if item):
        failed = failed[failed[key] == value]
    return len(failed) if others or not group else 0


def _paired_row(name: str, d: np.ndarray, failed: int) -> dict[str, Any]:
    n = len(d)
    row: dict[str, Any] = {"comparison": name, "n_seeds": n, "failed_runs": failed}
    row["mean"] = float(d.mean()) if n else math.nan
    row["sd"] = float(d.std(ddof=1)) if n > 1 else math.nan
    hl = hodges_lehmann(d)
    row |= {"hodges_lehmann": hl.estimate, "hl_low": hl.low, "hl_high": hl.high}
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    row["sign_consistency"] = max(wins, losses) / (wins + losses) if wins + losses else math.nan
    row["wilcoxon_p"] = wilcoxon_signed_rank(d).pvalue if n else math.nan
    return row


def verdict_rows(report: TrainableReport) -> list[dict[str, str]]:
    """Each comparison's verdict in words: the anytime decision of an adaptive sweep (the
    driver's), else Holm's on the fixed seeds' exact Wilcoxon p-values."""
    out = []
    if report.decisions is not None:
        for r in report.decisions.to_dict(orient="records"):
            effect = f"mean {_num(r['mean'])} points"
            if r["state"] not in ("open", "futile"):
                effect += f", {_num(r['ci_level'] * 100, 0)} % interval {_interval(r)}"
            out.append({"comparison": r["comparison"], "verdict": r["verdict"], "effect": effect})
        return out
    for r in report.paired.to_dict(orient="records"):
        verdict = "differs (Holm)" if r.get("p_holm", 1.0) <= ALPHA else "no difference shown"
        effect = f"mean {_num(r['mean'])} points over {r['n_seeds']} seeds"
        out.append({"comparison": r["comparison"], "verdict": verdict, "effect": effect})
    return out


def _num(value: Any, digits: int = 2) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{float(value):+.{digits}f}"


def _interval(r: Any) -> str:
    return f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]"


def paired_table(paired: pd.DataFrame, adaptive: bool) -> Table:
    """The paired statistics as a table; the p-values said to be descriptive beside anytime
    decisions (no mark: the decisions table decides)."""
    display = pd.DataFrame(
        {
            "comparison": paired["comparison"],
            "seeds": paired["n_seeds"].astype(int),
            "failed": paired["failed_runs"].astype(int),
            "mean ± SD": [f"{_num(m)} ± {abs(s):.2f}" if s == s else _num(m)
                          for m, s in zip(paired["mean"], paired["sd"], strict=True)],
            "HL [95 %]": [f"{_num(e)} [{_num(lo)}, {_num(hi)}]" for e, lo, hi in
                          zip(paired["hodges_lehmann"], paired["hl_low"], paired["hl_high"], strict=True)],
            "same sign": [f"{v:.0%}" if v == v else "n/a" for v in paired["sign_consistency"]],
            "Wilcoxon p": [fmt_p(p) for p in paired["wilcoxon_p"]],
            "Holm p": [fmt_p(p) for p in paired["p_holm"]],
        }
    )  # fmt: skip
    note = (
        "fixed-n p-values, descriptive only: an adaptive sweep's seeds were chosen by its "
        "anytime-valid decisions, which are the verdicts (decisions table)"
        if adaptive
        else f"Holm across the {len(paired)} comparisons decides at alpha {ALPHA}"
    )
    footnotes = [
        "points: 100 x the metric's difference, positive = better; paired on the seeds where "
        "both arms finished (failed runs left out)",
        note,
    ]
    return Table("paired", "Paired statistics per comparison", display, paired, footnotes)


def decisions_table(decisions: pd.DataFrame) -> Table:
    display = pd.DataFrame(
        {
            "hypothesis": decisions["comparison"],
            "verdict": decisions["verdict"],
            "seeds": decisions["seeds_used"],
            "mean": [_num(v) for v in decisions["mean"]],
            "interval": [
                _interval(r) if r["state"] not in ("open", "futile") else "—"
                for r in decisions.to_dict(orient="records")
            ],
            "p family": [fmt_p(p) for p in decisions["p_family"]],
        }
    )
    footnotes = [
        "one closed family, anytime-valid: every hypothesis's verdict holds at the family's "
        "level whenever it was reached; the interval is the e-BY interval of a decided one"
    ]
    return Table("decisions", "Decisions (adaptive seeds)", display, decisions, footnotes)


def e_process_figure(client: Any, parent_id: str, parent: Any, fig_dir: Path) -> list[Path]:
    """Each hypothesis's log10 e-value by seed, from the parent run's decision metrics, with
    the thresholds log10(1/alpha) and log10(m/alpha)."""
    from matplotlib.figure import Figure

    names = {
        k.removeprefix(DECISION_TAG_PREFIX): v
        for k, v in parent.data.tags.items()
        if k.startswith(DECISION_TAG_PREFIX) and not k.endswith(".state")
    }
    if not names:
        return []
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for key, name in sorted(names.items()):
        history = client.get_metric_history(
            parent_id, f"{DECISION_METRIC_PREFIX}{key}.log10_e_value"
        )
        points = sorted((m.step, m.value) for m in history)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=name[:70])
    for which in ("least", "enough"):
        history = client.get_metric_history(
            parent_id, f"{DECISION_METRIC_PREFIX}log10_threshold_{which}"
        )
        if history:
            ax.axhline(history[-1].value, color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel("seeds", fontsize=8)
    ax.set_ylabel("log10 e-value", fontsize=8)
    ax.legend(fontsize=6, loc="upper left")
    ax.set_title("e-processes (dotted: log10 1/alpha and log10 m/alpha)", fontsize=9)
    return save(fig, fig_dir, "e_processes")


def is_trainable_sweep(name: str, tracking_uri: str | None) -> bool:
    """Whether experiment ``name`` is a trainable's sweep (its parent run's ``trainable_sweep``
    tag). A store that refuses or does not answer within the report's first-contact wait is a
    ``StoreAccessError``, as for the study's report; False for anything else it cannot tell
    (no such store or experiment: the study's report says what is wrong)."""
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not _sqlite_file(Path(uri.removeprefix("sqlite:///"))):
        return False  # no store there: the study's report says so (MLflow would make one)
    http = uri.startswith(("http://", "https://"))
    once = each_request_once(load_store.FIRST_CONTACT_S) if http else contextlib.nullcontext()
    with once, store_access(uri):
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            return False
        parents = client.search_runs(
            [experiment.experiment_id], filter_string=f"tags.{ROLE_TAG} = '{ROLE_SWEEP}'",
            max_results=1,
        )  # fmt: skip
    return bool(parents) and TRAINABLE_TAG in parents[0].data.tags


def _sqlite_file(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def report_if_trainable(name: str, tracking_uri: str | None, out: str | None) -> bool:
    """For ``python -m analysis.report``: when ``name`` is a trainable's sweep, its report
    written to ``out`` (default ``reports/<name>``) and summed up on the console; False (and
    nothing done) for the study's."""
    if not is_trainable_sweep(name, tracking_uri):
        return False
    import mlflow

    uri = tracking_uri or mlflow.get_tracking_uri()
    report = build_trainable_report(name, uri, out or str(Path("reports") / name))
    print("\n".join(report.summary_lines()))
    return True


def build_trainable_report(name: str, tracking_uri: str, out: str | Path) -> TrainableReport:
    """Load the experiment of a trainable's sweep, write its report into ``out`` and log it
    to the sweep's parent run."""
    from mlflow import MlflowClient

    experiment = load_experiment(name, tracking_uri)
    with store_access(tracking_uri):
        client = MlflowClient(tracking_uri)
        parent = client.get_run(experiment.parent_run_id) if experiment.parent_run_id else None
    tags = dict(parent.data.tags) if parent is not None else {}
    runs = experiment.runs
    record = sweep_settings(tags, client, runs)
    levels = parse_grid_axes(tags.get(GRID_AXES_TAG), experiment.notes)
    runs = runs.assign(seed=runs["seed"].astype(str))
    decisions = read_logged_decisions(client, parent) if ADAPTIVE_TAG in tags else None
    paired = paired_statistics(runs, levels, record)
    report = TrainableReport(
        Path(out), record["trainable"], record["axis"], record["baseline"], record["metric"],
        record.get("mode", "max"), paired, decisions,
    )  # fmt: skip
    report.written = write_report(report, runs, client, parent)
    if parent is not None:
        client.log_artifacts(parent.info.run_id, str(report.out), artifact_path="report")
    return report


def write_report(
    report: TrainableReport, runs: pd.DataFrame, client: Any, parent: Any
) -> list[Path]:
    """report.md, report.html, the tables, runs.csv and the figures."""
    out, tables_dir, fig_dir = report.out, report.out / "tables", report.out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    better = "more" if report.mode == "max" else "less"
    lines = [
        f"# {report.trainable}: {report.axis} against {report.baseline}",
        "",
        f"Metric `{report.metric}` ({better} is better); values in points (100 x its "
        "difference, positive = better), paired by seed within each group of the other axes.",
        "",
        "## Verdicts",
        "",
    ]
    lines += [
        f"- {r['comparison']}: **{r['verdict']}** ({r['effect']})" for r in verdict_rows(report)
    ]
    tables = [paired_table(report.paired, report.decisions is not None)]
    if report.decisions is not None:
        tables.insert(0, decisions_table(report.decisions))
    for table in tables:
        written += table.write(tables_dir)
        lines += ["", table.to_markdown()]
    figures = []
    if report.decisions is not None and len(report.decisions):
        figures += forest(report.decisions, fig_dir, "decided_effects", "decided effects")
        if parent is not None:
            figures += e_process_figure(client, parent.info.run_id, parent, fig_dir)
    pngs = [p for p in figures if p.suffix == ".png"]
    if pngs:
        lines += ["", "## Figures", ""] + [f"![{p.stem}](figures/{p.name})" for p in pngs]
    runs.to_csv(out / "runs.csv", index=False)
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")
    written += [out / "report.md", write_html(text, out, f"{report.trainable} report")]
    return written + figures + [out / "runs.csv"]
