"""The report of a trainable's sweep (``trainable: NAME``): what was compared, the decisions, the
paired statistics, the figures; the study's sections (datasets, positions, lengths, latency)
have nothing to say of a trainable's runs and are not written.

Written into the output folder and logged to the sweep's parent run (``report/``):

    report.md / report.html   the summary, the decisions, the paired statistics, the figures
    tables/decisions.*        an adaptive sweep's verdicts (md, tex, csv), one row per
                              hypothesis of the one closed family, recomputed from the runs
                              (``analysis.stats.trainable``); a verdict that differs from the
                              driver's decisions.csv is said
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import Experiment
from analysis.load import store as load_store
from analysis.load.store import load_experiment, store_access
from analysis.render.drawing import forest, save
from analysis.render.tables import Table, fmt_p
from analysis.report.html import write_html
from analysis.stats.trainable import ALPHA, TrainableComparison, compare_trainable
from fusion_ray.schema import (
    DECISION_METRIC_PREFIX,
    DECISION_TAG_PREFIX,
    ROLE_SWEEP,
    ROLE_TAG,
    TRAINABLE_TAG,
)
from fusion_ray.store_errors import each_request_once


@dataclass
class TrainableReport:
    """What the report of a trainable's sweep found, and where it wrote it."""

    out: Path
    comparison: TrainableComparison
    notes: list[str] = field(default_factory=list)
    """What the report noticed (a verdict that differs from the driver's decisions.csv)."""
    written: list[Path] = field(default_factory=list)

    @property
    def paired(self) -> pd.DataFrame:
        """One row per comparison (``analysis.stats.trainable.paired_statistics``)."""
        return self.comparison.paired

    @property
    def decisions(self) -> pd.DataFrame | None:
        """An adaptive sweep's decisions, recomputed from its runs; None for fixed seeds."""
        return self.comparison.decisions

    def summary_lines(self) -> list[str]:
        """What the console says of the report: each comparison's verdict, and where it is."""
        lines = [f"\nreport: {self.out / 'report.md'} (and report.html)"]
        for row in verdict_rows(self):
            lines.append(f"  {row['comparison']}: {row['verdict']} ({row['effect']})")
        return lines


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
    report = TrainableReport(Path(out), compare_trainable(experiment))
    report.notes = logged_disagreements(experiment, report.decisions)
    with store_access(tracking_uri):
        client = MlflowClient(tracking_uri)
        parent = client.get_run(experiment.parent_run_id) if experiment.parent_run_id else None
    report.written = write_report(report, experiment.runs, client, parent)
    if parent is not None:
        client.log_artifacts(parent.info.run_id, str(report.out), artifact_path="report")
    return report


def logged_disagreements(experiment: Experiment, decisions: pd.DataFrame | None) -> list[str]:
    """Each hypothesis whose verdict recomputed from the runs differs from the driver's
    decisions.csv (runs changed, deleted or added in MLflow since the sweep ended)."""
    logged = experiment.decisions
    if decisions is None or logged is None or not len(logged):
        return []
    said = dict(zip(logged["comparison"], logged["verdict"], strict=True))
    return [
        f"{row['comparison']}: {row['verdict']} from the runs now, {said[row['comparison']]} in "
        "the driver's decisions.csv (its runs changed in MLflow since)"
        for row in decisions.to_dict(orient="records")
        if row["comparison"] in said and said[row["comparison"]] != row["verdict"]
    ]


def write_report(
    report: TrainableReport, runs: pd.DataFrame, client: Any, parent: Any
) -> list[Path]:
    """report.md, report.html, the tables, runs.csv and the figures."""
    out, tables_dir, fig_dir = report.out, report.out / "tables", report.out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    record = report.comparison.record
    better = "more" if record.mode == "max" else "less"
    lines = [
        f"# {record.trainable}: {record.axis} against {record.baseline}",
        "",
        f"Metric `{record.metric}` ({better} is better); values in points (100 x its "
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
    written += [out / "report.md", write_html(text, out, f"{record.trainable} report")]
    return written + figures + [out / "runs.csv"]
