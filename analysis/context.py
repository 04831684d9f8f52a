"""What a report is made of: its options, and everything computed once from the runs.

``build_context`` loads the experiment (only its sweep's cells, when the parent run lists them),
counts the runs of other settings, pairs the runs within every combination of the grid's
non-fusion axes (refusing a report with nothing to compare), runs the statistics, the
interaction tests of the extra grid axes, the length analysis and, for runs evaluated at several
truncation lengths, the train-short-test-long analysis (``analysis.extrapolation``), checks the
embedding-scale confound, orders datasets and operators, builds the tables, sets the study's
published numbers beside ours (``analysis.reproduction``), reads the gated runs' gate by
position (``analysis.gates``) and gathers the warnings. The writers (``analysis.report``,
``analysis.figures``, ``analysis.report_md``) read the resulting ``ReportContext`` and compute
nothing of their own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.drawing import slug
from analysis.extrapolation import Extrapolation, analyse_extrapolation, extrapolation_tables
from analysis.gates import gate_ends, gate_frame, gate_summary, is_gated
from analysis.interaction import (
    Interactions,
    ScalingCheck,
    interaction_tests,
    scaling_check,
)
from analysis.lengths import LengthAnalysis, analyse_lengths
from analysis.load import FINISHED, AnalysisError, Experiment, load_experiment
from analysis.other_settings import OtherSettings, describe_other_settings
from analysis.pairing import NothingToCompareError, Pairing, pair_runs, why_nothing_to_compare
from analysis.reproduction import reproduction_table
from analysis.stats import Comparisons, StatsSettings, compare
from analysis.tables import (
    Table,
    TableInputs,
    dataset_order,
    interaction_table,
    level_ranks,
    operator_order,
    operator_summary,
    table1,
    table2,
    table3,
)
from fusion_ray.schema import CELLS_ARTIFACT, GATE_COLUMNS, GATES_FILE

#: Where the report goes among the sweep parent run's artifacts.
ARTIFACT_PATH = "analysis"
#: The main setting of Tables 1 and 2 when the runs have it: the study's.
STUDY_SETTING = {"position": "sinusoidal", "attention_position": "none"}


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

    def __post_init__(self) -> None:
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
class GateAnalysis:
    """Where the gated operators' gate g (H = g E + (1 - g) P) puts its weight along the
    document, for the analysed runs that logged ``schema.GATES_FILE``."""

    frame: pd.DataFrame
    """One row per (run, position bucket): ``run_id``, the report's group keys, ``operator``,
    ``seed``, then ``schema.GATE_COLUMNS`` (from ``gates.gate_frame``)."""
    summary: pd.DataFrame
    """Per (group, operator, bucket holding tokens): mean, min and max over seeds
    (``gates.gate_summary``); written as ``gates_by_position.csv``."""
    ends: pd.DataFrame
    """Per (group, operator): the first and the last bucket holding tokens
    (``gates.gate_ends``)."""
    runs: int
    """How many runs logged their gates."""


@dataclass
class ReportContext:
    """Everything a report shows, computed once; the writers only read it."""

    options: ReportOptions
    experiment: Experiment
    other_settings: OtherSettings
    """The experiment's trial runs left out as other settings (none without sweep_cells.json)."""
    pairing: Pairing
    comparisons: Comparisons
    """The stats table, its rows in display order (dataset, setting, operator)."""
    lengths: LengthAnalysis | None
    summary: pd.DataFrame
    """Per (group, operator): seeds, accuracy, latency, size (``tables.operator_summary``)."""
    datasets: list[str]
    """Shortest to longest median test document when known."""
    operators: list[str]
    """The baseline first, then the study's order."""
    main_setting: dict[str, Any]
    """The setting of Tables 1 and 2 and of the summary figures (column -> value)."""
    tables: dict[str, Table]
    warnings: list[str]
    out_dir: Path
    generated_at: str
    figures: list[tuple[str, Path]] = field(default_factory=list)
    """(caption, PNG path) of every figure drawn, for report.md."""
    axis_levels: dict[str, list[str]] = field(default_factory=dict)
    """The extra grid axes compared within (columns of every table) -> their levels, the
    reference first; empty for a grid without extra axes."""
    interactions: Interactions | None = None
    """The interaction tests of the extra grid axes (None without extra axes)."""
    scaling: ScalingCheck = field(default_factory=ScalingCheck)
    """The embedding-scale confound check against ``add``."""
    reproduction: pd.DataFrame | None = None
    """The study's published cells our runs reproduce, its numbers beside ours
    (``reproduction.reproduction_table``); None when no run matches a cell."""
    gates: GateAnalysis | None = None
    """The gate of the gated operators by position (None when no analysed run logged it, or
    with ``make_figures`` off)."""
    extrapolation: Extrapolation | None = None
    """Train short, test long: accuracy and the operator effect at each evaluation length
    (None when no analysed run logged per-length metrics)."""

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
        return self.lengths.median_length if self.lengths else {}

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


def build_context(
    experiment: str, tracking_uri: str | None, options: ReportOptions
) -> ReportContext:
    """Load, pair, compare and tabulate ``experiment``; raises AnalysisError subclasses with
    messages meant for the user (NothingToCompareError when no operator has a seed pair with
    the baseline)."""
    o = options
    exp = load_experiment(experiment, tracking_uri, method=o.load_method)
    other = describe_other_settings(exp)
    runs = restrict(exp.runs, "operator", o.only_operators, keep=o.baseline)
    runs = restrict(runs, "dataset", o.only_datasets)
    pairing = pair_runs(runs, o.baseline, by=o.by, ignore_params=o.ignore_params, axes=exp.axes)
    require_comparisons(exp, pairing, other, scope_of(o))
    levels = {a: exp.axis_levels[a] for a in pairing.axes}
    comps = compare(pairing, o.settings)
    lengths = None
    if o.lengths and len(pairing.pairs):
        lengths = analyse_lengths(pairing, o.settings, n_buckets=o.length_buckets)
    keys = list(pairing.keys)
    datasets = dataset_order(pairing.runs["dataset"], lengths.median_length if lengths else {})
    operators = operator_order(pairing.runs["operator"], o.baseline)
    not_axes = [k for k in keys if k not in levels]
    setting = main_setting(pairing.runs, not_axes, o.position, o.attention_position)
    comps.table = display_order(comps.table, datasets, operators, levels)
    if lengths is not None and not lengths.stats.empty:
        lengths.stats = display_order(lengths.stats, datasets, operators, levels)
    interactions = None
    if levels:
        interactions = interaction_tests(pairing, levels, o.settings)
        interactions.table = interaction_order(interactions.table, datasets, operators, levels)
    scaling = scaling_check(pairing, comps.table, interactions)
    summary = operator_summary(pairing.runs, keys)
    inputs = TableInputs(
        summary, comps.table, comps.settings, o.baseline, keys, datasets, setting, [*levels], levels
    )
    tables = {"table1": table1(inputs), "table2": table2(inputs), "table3": table3(inputs)}
    tables["table3"].footnotes += alias_footnotes(pairing)
    tables |= interaction_tables(interactions, keys, comps.settings, list(levels))
    extrapolation = extrapolate(pairing, o, datasets, operators, levels)
    tables |= extrapolation_tables(extrapolation, keys, list(levels), comps.settings)
    warnings = ([scaling.warning] if scaling.warning else []) + collect_warnings(
        exp, pairing, comps, lengths
    )
    warnings += interactions.warnings if interactions is not None else []
    warnings += extrapolation.warnings if extrapolation is not None else []
    gates = None
    if o.make_figures:
        gates = analyse_gates(exp, pairing, datasets, operators, levels, warnings)
    out_dir = Path(o.out) if o.out is not None else Path("reports") / slug(experiment)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    return ReportContext(
        options=o,
        experiment=exp,
        other_settings=other,
        pairing=pairing,
        comparisons=comps,
        lengths=lengths,
        summary=summary,
        datasets=datasets,
        operators=operators,
        main_setting=setting,
        tables=tables,
        warnings=warnings,
        out_dir=out_dir,
        generated_at=now,
        axis_levels=levels,
        interactions=interactions,
        scaling=scaling,
        reproduction=reproduction_table(pairing.runs),
        gates=gates,
        extrapolation=extrapolation,
    )


def extrapolate(
    pairing: Pairing,
    options: ReportOptions,
    datasets: Sequence[str],
    operators: Sequence[str],
    levels: dict[str, list[str]],
) -> Extrapolation | None:
    """The train-short-test-long analysis of the paired runs, its frames in display order;
    None when no run logged per-length metrics. The truncation ladder reads the by-length
    predictions only with ``options.lengths``."""
    if pairing.pairs.empty:
        return None
    ex = analyse_extrapolation(pairing, options.settings, read_predictions=options.lengths)
    if ex is None:
        return None
    for name in ("accuracy", "stats", "slopes", "ladder"):
        setattr(ex, name, display_order(getattr(ex, name), datasets, operators, levels))
    return ex


def analyse_gates(
    exp: Experiment,
    pairing: Pairing,
    datasets: Sequence[str],
    operators: Sequence[str],
    levels: dict[str, list[str]],
    warnings: list[str],
) -> GateAnalysis | None:
    """The gate by position of the analysed runs of gated operators, grouped by the report's
    keys and in display order; None when none of them logged it. Downloads one artifact per
    gated run (ungated runs are not searched). When the artifacts cannot be read, or only some
    gated runs have one, says so in ``warnings``."""
    gated = pairing.runs[pairing.runs["operator"].map(is_gated)]
    if gated.empty:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        logged = gate_frame(MlflowClient(exp.tracking_uri), list(gated["run_id"]))
    except (MlflowException, OSError, ValueError) as err:
        warnings.append(
            f"gates: the {GATES_FILE} artifacts of the {len(gated)} gated runs could not be "
            f"read ({err!r}), so the report has no gate figure or section; check that the "
            "artifact store of the runs is reachable from here."
        )
        return None
    have = logged["run_id"].nunique()
    if have and have < len(gated):
        warnings.append(
            f"gates: {len(gated) - have} of the {len(gated)} analysed runs of gated operators "
            f"have no {GATES_FILE}; the gate figure and section show the other {have}."
        )
    keys = list(pairing.keys)
    ids = gated[["run_id", *keys, "operator", "seed"]]
    frame = ids.merge(logged[["run_id", *GATE_COLUMNS]], on="run_id", how="inner")
    summary = gate_summary(frame, keys)
    if summary.empty:
        return None
    summary = display_order(summary, datasets, operators, levels)
    return GateAnalysis(frame, summary, gate_ends(summary, keys), int(have))


def interaction_tables(
    interactions: Interactions | None, keys: list[str], settings: Any, axes: list[str]
) -> dict[str, Any]:
    """One "does the operator effect depend on <axis>?" table per setting axis."""
    if interactions is None:
        return {}
    return {
        f"interaction:{axis}": interaction_table(
            interactions.for_axis(axis), axis, keys, settings, interactions.m, axes
        )
        for axis in interactions.levels
    }


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


def interaction_order(
    table: pd.DataFrame,
    datasets: Sequence[str],
    operators: Sequence[str],
    levels: dict[str, list[str]],
) -> pd.DataFrame:
    """Interaction tests by axis and level (sweep file's order), then as ``display_order``."""
    if table.empty:
        return table
    ordered = display_order(table, datasets, operators, levels)
    axis_rank = {a: i for i, a in enumerate(levels)}
    level_rank = ordered.apply(lambda r: levels[r["axis"]].index(str(r["level"])), axis=1)
    return (
        ordered.assign(_x=ordered["axis"].map(axis_rank), _l=level_rank)
        .sort_values(["_x", "_l"], kind="stable")
        .drop(columns=["_x", "_l"])
        .reset_index(drop=True)
    )


def collect_warnings(
    exp: Experiment,
    pairing: Pairing,
    comps: Comparisons,
    lengths: LengthAnalysis | None,
) -> list[str]:
    """Every warning of the report: statistics first, then loading, pairing and gaps."""
    warns = list(comps.warnings)
    if lengths is not None:
        warns += lengths.warnings
    warns += exp.notes + pairing.notes
    expected = pd.to_numeric(exp.parent_tags.get("cells"), errors="coerce")
    if expected is not None and not pd.isna(expected):
        cells = exp.runs["cell_id"].dropna()
        done = exp.runs.loc[exp.runs["status"] == FINISHED, "cell_id"].dropna().nunique()
        if done < int(expected):
            warns.append(
                f"partial sweep: {done} of {int(expected)} cells (parent run tag `cells`) have a "
                f"FINISHED run; {max(0, int(expected) - cells.nunique())} have no run yet."
            )
    return warns + _gap_warnings(pairing)


def _gap_warnings(pairing: Pairing) -> list[str]:
    """One warning per kind of gap the pairing found; report.md lists each."""
    gaps = [
        (
            pairing.incomplete,
            "partial sweep: {n} incomplete block(s) (group x seed missing an operator); only "
            "complete pairs are analysed. They are listed under 'Incomplete blocks'.",
        ),
        (
            pairing.duplicates,
            "{n} cell(s) have several FINISHED runs; none of them is used (listed under "
            "'Duplicate cells').",
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
