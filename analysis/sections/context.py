"""What a report is made of: its options, and the paired core every section reads.

``paired_core`` loads the experiment (only its sweep's cells, when the parent run lists them),
counts the runs of other settings, pairs the runs within every combination of the grid's
non-fusion axes (refusing a report with nothing to compare) and runs the statistics of the main
comparisons. ``arrange`` then puts the core in display order (datasets shortest to longest by
median test document, from the length section's result; operators in the study's order), picks
the main setting and builds Tables 1-3. The analyses beside the core are sections
(``analysis.sections.base``): their results are kept in ``ReportContext.results`` by name, and
``analysis.report`` runs them. The writers (``analysis.report``, ``analysis.sections.figures``,
``analysis.report.markdown``) read the resulting ``ReportContext`` and compute nothing of their own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis.load import FINISHED, AnalysisError, Experiment, load_experiment, recorded_order
from analysis.load.other_settings import OtherSettings, describe_other_settings
from analysis.render.drawing import slug
from analysis.render.tables import (
    Table,
    TableInputs,
    dataset_order,
    level_ranks,
    operator_order,
    operator_summary,
    table1,
    table2,
    table3,
)
from analysis.stats import Comparisons, StatsSettings, compare
from analysis.stats.pairing import NothingToCompareError, Pairing, pair_runs, why_nothing_to_compare
from fusion_ray.schema import ADAPTIVE_TAG, CELLS_ARTIFACT

#: Where the report goes among the sweep parent run's artifacts.
ARTIFACT_PATH = "analysis"
#: The main setting of Tables 1 and 2 when the runs have it: the study's.
STUDY_SETTING = {"position": "sinusoidal", "attention_position": "none"}


LABEL_KINDS = {"operators": "operator", "datasets": "dataset", "positions": "position"}
"""The kinds of names the report can show under display names, and the column each sits in."""


def relabel(frame: pd.DataFrame, labels: dict[str, dict[str, str]]) -> pd.DataFrame:
    """``frame`` with the names of ``labels`` shown as their display names: in the columns of
    ``LABEL_KINDS`` and, for operators, as column names (Tables 1-3 have a column each)."""
    if not labels or frame.empty:
        return frame
    out = frame.copy()
    for kind, column in LABEL_KINDS.items():
        names = labels.get(kind) or {}
        if column in out:
            out[column] = out[column].map(lambda v, names=names: names.get(str(v), v))
    ops = labels.get("operators") or {}
    return out.rename(columns={c: ops[c] for c in out.columns if c in ops})


def read_labels(path: str | Path) -> dict[str, dict[str, str]]:
    """A ``--labels`` file: YAML mapping each kind (operators, datasets, positions) to a
    mapping of names to display names; ``ValueError`` naming the file and what is wrong."""
    where = Path(path)
    if not where.is_file():
        raise ValueError(f"--labels {where}: no such file")
    try:
        raw = yaml.safe_load(where.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"--labels {where}: not valid YAML ({exc})") from None
    kinds = ", ".join(LABEL_KINDS)
    if not isinstance(raw, dict) or any(k not in LABEL_KINDS for k in raw):
        raise ValueError(
            f"--labels {where}: a mapping with the keys {kinds}, e.g. operators: {{gate_scalar: Scalar gate}}"
        )
    out = {}
    for kind, names in raw.items():
        if not isinstance(names, dict):
            raise ValueError(f"--labels {where}: {kind}: a mapping of names to display names")
        out[kind] = {str(k): str(v) for k, v in names.items()}
    return out


def shown(names: Sequence[str], kind: str, labels: dict[str, dict[str, str]]) -> list[str]:
    """``names`` of one kind as the report shows them."""
    return [(labels.get(kind) or {}).get(n, n) for n in names]


@dataclass(frozen=True)
class ReportOptions:
    """How to build a report; the CLI flags of ``python -m analysis.report`` map onto these."""

    baseline: str = "add"
    """Operator label every other operator is compared against."""
    out: str | Path | None = None
    """Output folder; default ``reports/<experiment>``."""
    settings: StatsSettings = field(default_factory=StatsSettings)
    """Every choice that changes a statistic (alpha, alternative, zero method, bootstrap)."""
    by: Sequence[str] = ()
    """Params added to the group key, for sweeps that vary a hyperparameter."""
    ignore_params: Sequence[str] = ()
    """Params allowed to differ inside a pair (e.g. a cache directory)."""
    lengths: bool = True
    """Run the length analysis (reads every paired run's test_predictions.parquet) and, for
    runs evaluated at several lengths, the truncation ladder (reads every paired run's
    test_predictions_by_length.parquet)."""
    length_buckets: int = 4
    """Length quantile buckets of the length analysis."""
    position: str | None = None
    """Position family of Tables 1-2; default sinusoidal when present."""
    attention_position: str | None = None
    """Attention-level position of Tables 1-2; default none when present."""
    log_to_mlflow: bool = True
    """Log the report folder to the sweep's parent run (when there is one)."""
    load_method: str = "auto"
    """How runs are loaded: auto, sql or search_runs (see ``load_experiment``)."""
    make_figures: bool = True
    """Draw the figures (about 1-2 s each), and read the gate by position of every gated run
    (one download per run) for the gate figure, ``gates_by_position.csv`` and its section."""
    only_operators: Sequence[str] = ()
    """Compare only these operators with the baseline (all when empty)."""
    only_datasets: Sequence[str] = ()
    """Analyse only these datasets (all when empty)."""
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Display names for a paper, by kind (``LABEL_KINDS``): ``{"operators": {"gate_scalar":
    "Scalar gate"}, "datasets": {...}, "positions": {...}}``; the figures and Tables 1-3 show
    them, the CSVs, stats and decisions keep the names the runs carry."""

    def __post_init__(self) -> None:
        unknown = set(self.labels) - set(LABEL_KINDS)
        if unknown:
            raise ValueError(
                f"labels: unknown kind(s) {sorted(unknown)}; use {', '.join(LABEL_KINDS)}"
            )
        for name in ("by", "ignore_params", "only_operators", "only_datasets"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(
                    f"ReportOptions.{name} must be a sequence of names, not the string "
                    f"{value!r}; write {name}=({value!r},)"
                )
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.settings, StatsSettings):
            raise TypeError(
                "ReportOptions.settings must be an analysis.stats.StatsSettings, e.g. "
                f"StatsSettings(alpha=0.05), not {self.settings!r}"
            )


@dataclass
class ReportContext:
    """The paired core of a report and every section's result, computed once; the writers
    only read it."""

    options: ReportOptions
    experiment: Experiment
    other_settings: OtherSettings
    """The experiment's trial runs left out as other settings (none without sweep_cells.json)."""
    pairing: Pairing
    comparisons: Comparisons
    """The stats table, its rows in display order (dataset, setting, operator) once arranged."""
    out_dir: Path
    generated_at: str
    axis_levels: dict[str, list[str]] = field(default_factory=dict)
    """The extra grid axes compared within (columns of every table) -> their levels, the
    reference first; empty for a grid without extra axes."""
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per (group, operator): seeds, accuracy, latency, size (``tables.operator_summary``)."""
    datasets: list[str] = field(default_factory=list)
    """Shortest to longest median test document when known."""
    operators: list[str] = field(default_factory=list)
    """The baseline first, then the study's order."""
    main_setting: dict[str, Any] = field(default_factory=dict)
    """The setting of Tables 1 and 2 and of the summary figures (column -> value)."""
    tables: dict[str, Table] = field(default_factory=dict)
    """Tables 1, 2 and 3 (the sections' tables are theirs: ``Section.tables``)."""
    table_inputs: TableInputs | None = None
    """What Tables 1-3 were made from (``mark_decisions`` makes them again)."""
    results: dict[str, Any] = field(default_factory=dict)
    """Section name -> its result (None: nothing to show), in the order computed."""
    warnings: list[str] = field(default_factory=list)
    """Every warning of the report, the sections' among them, in report.md's order."""
    console_warnings: list[str] = field(default_factory=list)
    """The warnings the console prints: all of them for a fixed-seed sweep; for an adaptive one
    those that can change what its decisions say (loading, pairing, the reference baselines
    and the confound check), not the fixed-n statistics', which it reports as descriptive
    (they stay in warnings.md)."""
    figures: list[tuple[str, Path]] = field(default_factory=list)
    """(caption, PNG path) of every figure drawn, for report.md."""

    @property
    def keys(self) -> list[str]:
        return list(self.pairing.keys)

    @property
    def axes(self) -> list[str]:
        """The extra grid axes among the group keys."""
        return list(self.axis_levels)

    @property
    def baseline(self) -> str:
        return self.options.baseline

    @property
    def record(self) -> dict[str, Any]:
        """The settings record of the statistics (``paired.settings_record``)."""
        return self.comparisons.settings

    @property
    def logged_to(self) -> str | None:
        """The parent run the report is logged to, if any."""
        return self.experiment.parent_run_id if self.options.log_to_mlflow else None

    @property
    def medians(self) -> dict[str, float]:
        """Median test length per dataset, from the length section ({} when it did not run)."""
        lengths = self.results.get("lengths")
        return lengths.median_length if lengths is not None else {}

    @property
    def scope(self) -> str:
        """The --operator / --dataset restriction in words ('' when none)."""
        return scope_of(self.options)


def scope_of(o: ReportOptions) -> str:
    """The --operator / --dataset restriction of ``o`` in words ('' when none)."""
    return ", ".join(
        f"{name} {', '.join(vals)}"
        for name, vals in (("operators", o.only_operators), ("datasets", o.only_datasets))
        if vals
    )


def paired_core(experiment: str, tracking_uri: str | None, options: ReportOptions) -> ReportContext:
    """Load, pair and compare ``experiment`` (not yet in display order: see ``arrange``);
    raises AnalysisError subclasses with messages meant for the user (NothingToCompareError
    when no operator has a seed pair with the baseline)."""
    o = options
    exp = load_experiment(experiment, tracking_uri, method=o.load_method)
    if ADAPTIVE_TAG in exp.parent_tags and not o.settings.descriptive:
        # the seeds each cell got depended on the decisions: every fixed-n test is descriptive
        o = replace(o, settings=replace(o.settings, descriptive=True))
    other = describe_other_settings(exp)
    runs = restrict(exp.runs, "operator", o.only_operators, keep=o.baseline)
    runs = restrict(runs, "dataset", o.only_datasets)
    pairing = pair_runs(runs, o.baseline, by=o.by, ignore_params=o.ignore_params, axes=exp.axes)
    require_comparisons(exp, pairing, other, scope_of(o))
    out_dir = Path(o.out) if o.out is not None else Path("reports") / slug(experiment)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    return ReportContext(
        options=o,
        experiment=exp,
        other_settings=other,
        pairing=pairing,
        comparisons=compare(pairing, o.settings),
        out_dir=out_dir,
        generated_at=now,
        axis_levels={a: exp.axis_levels[a] for a in pairing.axes},
    )


def arrange(ctx: ReportContext) -> None:
    """Put the core in display order (datasets by ``ctx.medians``, then both datasets and
    operators as the sweep recorded them: ``analysis.load.recorded_order``), pick the main setting and build Tables 1-3."""
    o, pairing, levels = ctx.options, ctx.pairing, ctx.axis_levels
    keys = list(pairing.keys)
    known = recorded_order(ctx.experiment.parent_tags)
    ctx.datasets = dataset_order(pairing.runs["dataset"], ctx.medians, known.get("dataset", ()))
    ctx.operators = operator_order(pairing.runs["operator"], o.baseline, known.get("operator", ()))
    not_axes = [k for k in keys if k not in levels]
    ctx.main_setting = main_setting(pairing.runs, not_axes, o.position, o.attention_position)
    comps = ctx.comparisons
    comps.table = display_order(comps.table, ctx.datasets, ctx.operators, levels)
    ctx.summary = operator_summary(pairing.runs, keys)
    inputs = TableInputs(
        ctx.summary,
        comps.table,
        comps.settings,
        o.baseline,
        keys,
        ctx.datasets,
        ctx.main_setting,
        [*levels],
        levels,
        known_operators=known.get("operator", ()),
    )
    ctx.table_inputs = inputs
    ctx.tables = study_tables(inputs, pairing, o.labels)


def study_tables(
    inputs: TableInputs, pairing: Pairing, labels: dict[str, dict[str, str]] | None = None
) -> dict[str, Table]:
    """Tables 1, 2 and 3 from ``inputs``, shown with the display names of ``labels`` (their
    data keeps the runs' names)."""
    tables = {"table1": table1(inputs), "table2": table2(inputs), "table3": table3(inputs)}
    tables["table3"].footnotes += alias_footnotes(pairing)
    for table in tables.values():
        table.display = relabel(table.display, labels or {})
    return tables


def mark_decisions(ctx: ReportContext, decided: dict[tuple, str], note: str) -> None:
    """Tables 1-3 again, their cells marked with an adaptive sweep's anytime decisions
    (``decided``: (group..., operator) -> state) and ``note`` as their footnote, instead of the
    fixed-n tests' stars."""
    assert ctx.table_inputs is not None, "arrange(ctx) makes Tables 1-3 first"
    inputs = replace(ctx.table_inputs, decided=decided, decided_note=note)
    ctx.tables = study_tables(inputs, ctx.pairing, ctx.options.labels)


def alias_footnotes(pairing: Pairing) -> list[str]:
    """Table 3's note on positions that are another position under a second name: their cells
    carry no mark, the model being tested once, under the position it repeats."""
    if pairing.aliases.empty:
        return []
    names = pairing.aliases[["position", "alias_of"]].drop_duplicates()
    return [
        f"{alias} is the same model as {target}: each comparison both have is tested once, "
        f"under {target}, so {alias}'s cell carries no mark."
        for alias, target in names.itertuples(index=False, name=None)
    ]


def require_comparisons(
    exp: Experiment, pairing: Pairing, other: OtherSettings, scope: str = ""
) -> None:
    """Raise NothingToCompareError, naming the reason, when no operator has a seed pair with
    the baseline: every FINISHED run left out as other settings, or ``why_nothing_to_compare``
    (``scope``: the --operator / --dataset restriction, said when there is one)."""
    if len(pairing.pairs):
        return
    if other.finished and not (exp.runs["status"] == FINISHED).any():
        reason = (
            f"none of the {other.sweep_cells} cells in the sweep's {CELLS_ARTIFACT} has a "
            f"FINISHED run, and {other.sentence}"
        )
    else:
        reason = why_nothing_to_compare(pairing)
        if scope:
            reason += f" Only the runs of {scope} were selected (--operator, --dataset)."
        if other.finished:
            reason += f" Besides, {other.sentence}"
    raise NothingToCompareError(f"nothing to compare in experiment {exp.name!r}: {reason}")


def restrict(
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


def main_setting(
    runs: pd.DataFrame, keys: Sequence[str], position: str | None, attention: str | None
) -> dict[str, Any]:
    """The setting of Tables 1 and 2: the study's sinusoidal input positions and no
    attention-level positions when present, else the most common value of each key."""
    asked = {"position": position, "attention_position": attention}
    setting: dict[str, Any] = {}
    for key in keys:
        if key == "dataset":
            continue
        values = runs[key].value_counts()
        if values.empty:
            continue
        want = asked.get(key) or STUDY_SETTING.get(key)
        if want is not None and want in values.index:
            setting[key] = want
        elif asked.get(key) is not None:
            raise AnalysisError(
                f"--{key.replace('_', '-')} {want!r}: no FINISHED run has it; "
                f"available: {', '.join(map(str, values.index))}"
            )
        else:
            setting[key] = values.index[0]
    return setting


def display_order(
    table: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    levels: dict[str, list[str]] | None = None,
) -> pd.DataFrame:
    """Rows by dataset (shortest first), then setting (extra axis levels in the sweep file's
    order), then operator (study order)."""
    if table.empty:
        return table
    rank_d = {d: i for i, d in enumerate(datasets)}
    rank_o = {o: i for i, o in enumerate(operators)}
    cols = [c for c in ("position", "attention_position") if c in table]
    ranks = {f"_a{i}": (a, r) for i, (a, r) in enumerate(level_ranks(levels or {}).items())}
    axis_cols = {c: table[a].astype(str).map(r) for c, (a, r) in ranks.items() if a in table}
    key = table.assign(
        _d=table["dataset"].map(rank_d),
        _o=table["operator"].map(rank_o),
        _i=range(len(table)),
        **axis_cols,
    )
    order = ["_d", *cols, *axis_cols, "_o", "_i"]
    return (
        key.sort_values(order, kind="stable")
        .drop(columns=["_d", "_o", "_i", *axis_cols])
        .reset_index(drop=True)
    )


def loading_warnings(exp: Experiment, pairing: Pairing) -> list[str]:
    """The warnings of loading and pairing: the loader's and the pairing's notes, a partial
    sweep, then one per kind of gap the pairing found."""
    warns = exp.notes + pairing.notes
    cells_tag = exp.parent_tags.get("cells")
    expected = None if cells_tag is None else pd.to_numeric(cells_tag, errors="coerce")
    # an adaptive sweep's `cells` is its worst case: the evidence decides how many run
    adaptive = ADAPTIVE_TAG in exp.parent_tags
    if expected is not None and not pd.isna(expected) and not adaptive:
        cells = exp.runs["cell_id"].dropna()
        done = exp.runs.loc[exp.runs["status"] == FINISHED, "cell_id"].dropna().nunique()
        if done < int(expected):
            warns.append(
                f"partial sweep: {done} of {int(expected)} cells (parent run tag `cells`) have a "
                f"FINISHED run; {max(0, int(expected) - cells.nunique())} have no run yet."
            )
    return warns + _gap_warnings(pairing, adaptive)


def _gap_warnings(pairing: Pairing, adaptive: bool = False) -> list[str]:
    """One warning per kind of gap the pairing found; report.md lists each."""
    gaps = [
        (
            # adaptive seeds leave blocks incomplete by design (a decided operator's seed is
            # not run); report.md still lists them
            pairing.incomplete.iloc[0:0] if adaptive else pairing.incomplete,
            "partial sweep: {n} incomplete block(s) (group x seed missing an operator); only "
            "complete pairs are analysed. They are listed under 'Incomplete blocks'.",
        ),
        (
            pairing.duplicates,
            "{n} cell(s) have several FINISHED runs with different configs; none of them is "
            "used (listed under 'Duplicate cells').",
        ),
        (
            pairing.set_aside,
            "{n} FINISHED run(s) set aside: their cell id already had a FINISHED run of the "
            "same config (two drivers ran it); the run that finished first is used, so no cell "
            "counts twice (set-aside runs in stats.json, `set_aside`).",
        ),
        (
            pairing.excluded,
            "{n} FINISHED trial run(s) lack a tag or metric the analysis needs and are left "
            "out (listed under 'Excluded runs').",
        ),
        (
            pairing.no_baseline,
            "{n} group(s) have operators but no FINISHED `{baseline}` run, so nothing there is "
            "compared (listed under 'Groups without a baseline').",
        ),
    ]
    return [
        text.format(n=len(frame), baseline=pairing.baseline) for frame, text in gaps if len(frame)
    ]
