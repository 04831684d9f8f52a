"""The study's tables (Markdown, LaTeX, CSV) with significance marks that say what they mean.

- Table 1: dataset x operator, mean +- sd of test accuracy, in the main position setting.
- Table 2: accuracy and measured inference latency per operator (and dataset).
- Table 3: position family (and attention-level position) x operator, per dataset.
- Interaction tables: does the operator effect depend on an extra grid axis?

Extra grid axes (e.g. ``model.scale_embeddings``) add a column to every table: a row per level,
levels in the sweep file's order.

Every cell is mean +- sd (ddof = 1) over the operator's FINISHED seeds; ``*`` marks an operator
whose Holm-adjusted paired Wilcoxon p against the baseline is <= alpha, and the footnote names
the test, the correction, m and n. No cell is bolded as "best": a larger mean without a
significant paired test is not a finding.

Why one module of this size: each table is written three ways (Markdown, LaTeX, CSV) by one
``Table`` with one set of formatting rules; the paper's Tables 1-3 and the others share them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from analysis.render.escape import fence, md_cell, md_prose
from analysis.stats import hl_label, hl_marked, summary_cells
from fusion_ray.schema import BAG_OF_WORDS_METRIC, LATENCY_RATIO_METRIC, MAJORITY_METRIC

Label = TypeVar("Label", bound=Hashable)
"""A column label: a setting's names, whether typed as str or as pandas gives them back."""


def operator_order(operators: Iterable[str], baseline: str, known: Sequence[str] = ()) -> list[str]:
    """Baseline first, then the operators in ``known``'s order (the sweep's, as its fusion
    registry lists them: ``schema.DISPLAY_ORDER_TAG``), then the rest by name."""
    rank_of = {name: i for i, name in enumerate(known)}

    def rank(op: str) -> tuple[int, int, str]:
        return (0 if op == baseline else 1, rank_of.get(op.split("(", 1)[0], len(rank_of)), op)

    return sorted(set(operators), key=rank)


def dataset_order(
    datasets: Iterable[str], medians: dict[str, float] | None = None, known: Sequence[str] = ()
) -> list[str]:
    """Shortest to longest median test document where known; else in ``known``'s order (the
    sweep file's: ``schema.DISPLAY_ORDER_TAG``), then by name."""
    medians = medians or {}
    rank_of = {name: i for i, name in enumerate(known)}

    def rank(d: str) -> tuple[float, int, str]:
        return (medians.get(d, math.inf), rank_of.get(d, len(rank_of)), d)

    return sorted(set(datasets), key=rank)


def operator_summary(runs: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per (group, operator): seeds, mean and sd of accuracy (%), latency and size; with
    ``latency_ratio_median`` (median over seeds of the logged ``latency_ratio_to_baseline``)
    when the runs carry that metric."""
    df = runs.copy()
    df["acc"] = 100.0 * df["test_correct"].astype(float) / df["test_total"].astype(float)
    grouped = df.groupby([*keys, "operator"], sort=True)
    ratio = (
        {"latency_ratio_median": (LATENCY_RATIO_METRIC, "median")}
        if LATENCY_RATIO_METRIC in df
        else {}
    )
    for column, metric in (("bow_acc", BAG_OF_WORDS_METRIC), ("majority_acc", MAJORITY_METRIC)):
        if metric in df:
            df[column] = 100.0 * df[metric]
            ratio[column] = (column, "mean")
    out = grouped.agg(
        n=("acc", "size"),
        acc_mean=("acc", "mean"),
        acc_sd=("acc", lambda s: s.std(ddof=1)),
        latency_mean=("latency_ms_per_sample", "mean"),
        latency_sd=("latency_ms_per_sample", lambda s: s.std(ddof=1)),
        latency_min=("latency_ms_per_sample", "min"),
        latency_max=("latency_ms_per_sample", "max"),
        num_params=("num_params", "median"),
        train_seconds=("train_seconds", "mean"),
        n_test=("test_total", "median"),
        **ratio,
    ).reset_index()
    out["seeds"] = grouped["seed"].agg(lambda s: ",".join(map(str, sorted(s)))).to_numpy()
    return out


def level_ranks(levels: Mapping[str, Sequence[str]]) -> dict[str, dict[str, int]]:
    """axis -> {level: its place in the sweep file's order}."""
    return {axis: {str(v): i for i, v in enumerate(vals)} for axis, vals in levels.items()}


def axis_combinations(
    frame: pd.DataFrame, axes: Sequence[str], levels: Mapping[str, Sequence[str]]
) -> list[tuple]:
    """The combinations of axis levels present in ``frame``, in the sweep file's order."""
    if not axes:
        return [()]
    ranks = level_ranks(levels)
    combos = set(map(tuple, frame[list(axes)].astype(str).to_numpy()))

    def rank(combo: tuple) -> tuple:
        return tuple(
            (ranks.get(a, {}).get(v, len(ranks.get(a, {}))), v)
            for a, v in zip(axes, combo, strict=True)
        )

    return sorted(combos, key=rank)


def column_label(key: str, axes: Sequence[str] = ()) -> str:
    """A key's column header: ``attention_position`` -> ``attention position``; an axis keeps
    its dotted name."""
    return key if key in axes else key.replace("_", " ")


def select(frame: pd.DataFrame, setting: Mapping[Label, Any]) -> pd.DataFrame:
    """The rows of ``frame`` in ``setting`` (column -> value)."""
    for k, v in setting.items():
        frame = frame[frame[k] == v]
    return frame


def describe_setting(setting: Mapping[Label, Any], sep: str = "=") -> str:
    """``position=sinusoidal, attention_position=none`` (``sep`` between name and value)."""
    return ", ".join(f"{k}{sep}{v}" for k, v in setting.items())


def fmt(mean: float, sd: float, digits: int = 2) -> str:
    """``mean ± sd`` (sd omitted for a single run)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if sd is None or (isinstance(sd, float) and math.isnan(sd)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


@dataclass
class Table:
    """One table: the displayed strings, the numbers behind them, and its footnotes."""

    name: str
    caption: str
    display: pd.DataFrame
    data: pd.DataFrame
    footnotes: list[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        """The table in Markdown: every header and cell through ``md_cell``, the caption and
        footnotes (raw text with code spans, as LaTeX reads them) through ``md_prose``."""
        cols = [md_cell(c) for c in self.display.columns]
        lines = [f"**{md_prose(self.caption)}**", "", "| " + " | ".join(cols) + " |"]
        lines.append("|" + "|".join(["---"] * len(cols)) + "|")
        for _, row in self.display.iterrows():
            lines.append("| " + " | ".join(md_cell(v) for v in row) + " |")
        if self.footnotes:
            lines.append("")
            lines += [f"{md_prose(note)}  " for note in self.footnotes]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        cols = [str(c) for c in self.display.columns]
        lines = [
            "% generated by python -m analysis.report; needs \\usepackage{booktabs}",
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{latex_cell(self.caption)}}}",
            f"\\label{{tab:{self.name}}}",
            "\\begin{tabular}{" + "l" * len(cols) + "}",
            "\\toprule",
            " & ".join(latex_cell(c) for c in cols) + " \\\\",
            "\\midrule",
        ]
        for _, row in self.display.iterrows():
            lines.append(" & ".join(latex_cell(str(v)) for v in row) + " \\\\")
        lines += ["\\bottomrule", "\\end{tabular}"]
        if self.footnotes:
            lines.append("\\par\\smallskip\\footnotesize")
            lines += [latex_cell(note) + "\\\\" for note in self.footnotes]
        lines.append("\\end{table}")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path) -> list[Path]:
        """Write ``<name>.md``, ``<name>.tex`` and ``<name>.csv`` (the numbers) to out_dir."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [out_dir / f"{self.name}.{ext}" for ext in ("md", "tex", "csv")]
        paths[0].write_text(self.to_markdown(), encoding="utf-8")
        paths[1].write_text(self.to_latex(), encoding="utf-8")
        self.data.to_csv(paths[2], index=False)
        return paths


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "[": "{[}",
    "]": "{]}",
}
"""ASCII characters LaTeX would read as markup (or, in its default OT1 font encoding, as other
glyphs), as commands that print them; brackets braced, so that none after a ``\\\\`` is read
as its optional argument."""
_LATEX_SYMBOLS = {
    "±": r"$\pm$", "≤": r"$\le$", "≥": r"$\ge$", "≈": r"$\approx$", "×": r"$\times$",
    "α": r"$\alpha$", "θ": r"$\theta$", "Δ": r"$\Delta$", "δ": r"$\delta$", "−": r"$-$",
    "↑": r"$\uparrow$", "↓": r"$\downarrow$", "→": r"$\rightarrow$", "·": r"$\cdot$",
    "√": r"$\surd$", "∞": r"$\infty$", "–": "--", "—": "---", "…": r"\ldots{}",
    "‘": "`", "’": "'", "“": "``", "”": "''", "\u00a0": "~",
}  # fmt: skip
"""The symbols the report writes, as pdflatex typesets them with no package but booktabs."""
_MARKS_AFTER_NUMBER = {"*": "$^{*}$", "↑": "$^{\\uparrow}$", "↓": "$^{\\downarrow}$"}
_MARKS_AFTER_NUMBER["≈"] = "$^{\\approx}$"
"""A mark right after a number (a significance star, an anytime decision): a superscript."""
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\x0b\x0c\x85\u2028\u2029]")


def latex_escape(text: str) -> str:
    """``text`` (any data) as LaTeX text that prints it and compiles with pdflatex: markup
    characters as commands, the report's symbols typeset, line breaks as spaces, and every
    other character pdflatex's default set-up cannot print (a control character, CJK, an
    emoji) as its code point, ``[U+540D]`` (brackets braced); Latin letters with accents as they
    are."""
    out: list[str] = []
    text = _LINE_BREAKS.sub(" ", text)
    for i, ch in enumerate(text):
        if ch in _LATEX_SPECIAL:
            out.append(_LATEX_SPECIAL[ch])
        elif ch in _MARKS_AFTER_NUMBER and i and text[i - 1].isdigit():
            out.append(_MARKS_AFTER_NUMBER[ch])
        elif ch in _LATEX_SYMBOLS:
            out.append(_LATEX_SYMBOLS[ch])
        elif " " <= ch <= "~" or ("\u00c0" <= ch <= "\u017f" and ch not in "\u00d7\u00f7"):
            out.append(ch)
        else:
            out.append(f"{{[}}U+{ord(ch):04X}{{]}}")
    return "".join(out)


#: A code span (``fence`` writes a longer fence around a name holding backticks).
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def _span_text(inner: str) -> str:
    """A code span's text: the padding ``fence`` adds (a space on both sides) taken off."""
    return inner[1:-1] if len(inner) > 2 and inner[0] == inner[-1] == " " else inner


def latex_cell(text: str) -> str:
    """A cell, caption or footnote of the report (text with code spans around raw data) as
    LaTeX: each code span as ``\\texttt`` of its escaped text, the rest escaped
    (``latex_escape``), a mark right after a number as a superscript."""
    out, pos = [], 0
    for span in _CODE_SPAN.finditer(text):
        out.append(latex_escape(text[pos : span.start()]))
        out.append("\\texttt{" + latex_escape(_span_text(span.group(2))) + "}")
        pos = span.end()
    out.append(latex_escape(text[pos:]))
    return "".join(out)


ANYTIME_MARKS = {"better": "↑", "worse": "↓", "equivalent": "≈"}
"""An adaptive sweep's cells carry its anytime decision, never a fixed-n star."""


# ----------------------------------------------------------------------------- the tables


def _marks(comparisons: pd.DataFrame, keys: Sequence[str]) -> dict[tuple, bool]:
    if comparisons is None or comparisons.empty:
        return {}
    cols = [*keys, "operator"]
    return {
        tuple(r[c] for c in cols): bool(r["significant"])
        for _, r in comparisons[[*cols, "significant"]].iterrows()
    }


def significance_footnote(
    comparisons: pd.DataFrame, settings: dict[str, Any], baseline: str
) -> list[str]:
    """The footnote every table with marks carries: test, sidedness, correction, m, n, guard."""
    m = int(settings.get("m", len(comparisons)))
    alt = settings.get("alternative", "two-sided")
    alpha = settings.get("alpha", 0.05)
    notes = [
        f"Mean ± sd (ddof = 1) of test accuracy (%) over seeds. `*`: Holm-adjusted p ≤ {alpha} "
        f"in an exact {alt} Wilcoxon signed-rank test of the paired per-seed deltas against "
        f"{fence(baseline)} (zero_method = {settings.get('zero_method', 'wilcox')}; Holm over all "
        f"m = {m} comparisons of the report)."
    ]
    if comparisons is not None and len(comparisons):
        ns = sorted(set(comparisons["n_pairs"].astype(int)))
        unreachable = comparisons[~comparisons["can_reach_alpha"]]
        notes[0] += f" Paired seeds per comparison: {', '.join(map(str, ns))}."
        if len(unreachable):
            notes.append(
                f"{len(unreachable)} of {len(comparisons)} comparisons cannot reach {alpha} "
                f"with their number of seeds (smallest attainable Holm-adjusted p = "
                f"{unreachable['min_attainable_p_holm'].min():.3g}); an unmarked cell there "
                "says nothing about the effect."
            )
    return notes


def _cell(summary_row: Any, mark: str, n_typical: int) -> str:
    text = fmt(summary_row["acc_mean"], summary_row["acc_sd"]) + mark
    if int(summary_row["n"]) != n_typical:
        text += f" (n={int(summary_row['n'])})"
    return text


@dataclass(frozen=True, eq=False)
class TableInputs:
    """What the study's tables are made from."""

    summary: pd.DataFrame
    """Per (group, operator): seeds, accuracy, latency, size (``operator_summary``)."""
    comparisons: pd.DataFrame
    """The stats table: its ``significant`` column gives the marks."""
    settings: dict[str, Any]
    """The settings record of the statistics, for the footnotes."""
    baseline: str
    keys: Sequence[str]
    """The group key columns."""
    datasets: Sequence[str]
    """Datasets in display order."""
    setting: dict[str, Any] = field(default_factory=dict)
    """The main setting (column -> value) of Tables 1 and 2."""
    axes: Sequence[str] = ()
    """The extra grid axes among ``keys``: Tables 1 and 2 get a row per level."""
    levels: Mapping[str, Sequence[str]] = field(default_factory=dict)
    known_operators: Sequence[str] = ()
    """The sweep's operators in its display order (``schema.DISPLAY_ORDER_TAG``)."""
    """axis -> its levels, the reference first (the order of rows)."""
    decided: Mapping[tuple, str] | None = None
    """An adaptive sweep's decisions, (group..., operator) -> state: the marks come from them
    (``ANYTIME_MARKS``) instead of the fixed-n tests, which are descriptive after adaptive
    stopping."""
    decided_note: str = ""
    """The footnote that says which rule, null, alpha and margin decided the marks."""

    @cached_property
    def marks(self) -> dict[tuple, str]:
        """(group..., operator) -> its mark: the anytime decision's, or ``*`` for significant
        after Holm."""
        if self.decided is not None:
            return {_text_key(k): ANYTIME_MARKS.get(v, "") for k, v in self.decided.items()}
        marks = _marks(self.comparisons, self.keys)
        return {_text_key(k): "*" if v else "" for k, v in marks.items()}

    def footnotes(self) -> list[str]:
        if self.decided is not None:
            return [self.decided_note]
        return significance_footnote(self.comparisons, self.settings, self.baseline)

    def marked(self, group: tuple, op: str) -> str:
        return self.marks.get(_text_key((*group, op)), "")


def _text_key(key: tuple) -> tuple[str, ...]:
    """A (group..., operator) key with every value as text, so tags and typed columns match."""
    return tuple(str(v) for v in key)


def accuracy_table(
    inputs: TableInputs,
    name: str,
    caption: str,
    summary: pd.DataFrame,
    row_keys: Sequence[str],
    row_order: Sequence[tuple] | None = None,
    reference: bool = False,
) -> Table:
    """Rows = ``row_keys`` combinations of ``summary``, columns = operators, cells = mean ± sd
    with marks; with ``reference``, a last column "bag-of-words" (the row's reference baseline,
    when its runs logged one)."""
    keys = inputs.keys
    ops = operator_order(summary["operator"], inputs.baseline, inputs.known_operators)
    n_typical = int(summary["n"].mode().iloc[0]) if len(summary) else 0
    rows = row_order or list(dict.fromkeys(map(tuple, summary[list(row_keys)].to_numpy())))
    index = summary.set_index([*row_keys, "operator"])
    show_reference = reference and "bow_acc" in summary and summary["bow_acc"].notna().any()
    bow = summary.groupby(list(row_keys))["bow_acc"].mean() if show_reference else None
    display_rows, data_rows = [], []
    for rkey in rows:
        rkey = tuple(rkey)
        full = dict(zip(row_keys, rkey, strict=True))
        disp = dict(full)
        for op in ops:
            at = (*rkey, op)
            if at not in index.index:
                disp[op] = "–"
                continue
            srow = index.loc[at]
            # callers filter the summary so that a row and an operator name one group
            assert isinstance(srow, pd.Series), f"several groups for {rkey} {op}"
            mark = inputs.marked(tuple(full[k] if k in full else srow[k] for k in keys), op)
            disp[op] = _cell(srow, mark, n_typical)
            data_rows.append(
                {
                    **full,
                    "operator": op,
                    "n": int(srow["n"]),
                    "acc_mean": srow["acc_mean"],
                    "acc_sd": srow["acc_sd"],
                    "significant": mark == "*",
                    "mark": mark,
                }
            )
        if bow is not None:  # show_reference: a bag-of-words column
            mean = bow.get(rkey if len(row_keys) > 1 else rkey[0], math.nan)
            disp[BAG_OF_WORDS_COLUMN] = "–" if pd.isna(mean) else f"{mean:.2f}"
        display_rows.append(disp)
    extra = [BAG_OF_WORDS_COLUMN] if show_reference else []
    display = pd.DataFrame(display_rows, columns=[*row_keys, *ops, *extra])
    display.columns = [
        column_label(c, inputs.axes) if c in row_keys else c for c in display.columns
    ]
    footnotes = inputs.footnotes()
    if any(int(n) != n_typical for n in summary["n"]):
        footnotes.append(
            f"(n=k): a cell with k seeds; every other cell has {n_typical}, the most common count."
        )
    return Table(name, caption, display, pd.DataFrame(data_rows), footnotes)


def _dataset_rows(inputs: TableInputs, frame: pd.DataFrame) -> list[tuple]:
    """(dataset, *axis levels) rows of ``frame``: datasets in display order, then levels."""
    axes = list(inputs.axes)
    rows = []
    for d in inputs.datasets:
        sub = frame[frame["dataset"] == d]
        if len(sub):
            rows += [(d, *combo) for combo in axis_combinations(sub, axes, inputs.levels)]
    return rows


def _levels_in_order(
    rows: list[tuple], keys: Sequence[str], axes: Sequence[str], levels: Mapping[str, Sequence[str]]
) -> list[tuple]:
    """Rows of key values with each setting's axis levels in the sweep file's order (the
    settings before the axes keep their order of first appearance)."""
    if not axes:
        return rows
    ranks = level_ranks(levels)
    cut = min(keys.index(a) for a in axes)
    first: dict[tuple, int] = {}
    for row in rows:
        first.setdefault(row[:cut], len(first))

    def rank(row: tuple) -> tuple:
        places = [
            ranks.get(a, {}).get(str(row[keys.index(a)]), len(levels.get(a, ()))) for a in axes
        ]
        return (first[row[:cut]], *places)

    return sorted(rows, key=rank)


BAG_OF_WORDS_COLUMN = "bag-of-words"
"""Table 1's reference column: TF-IDF + logistic regression on the same tokens (position-blind)."""


def table1(inputs: TableInputs) -> Table:
    """Table 1: dataset (x extra axis levels) x operator in the main setting (the study:
    sinusoidal, no attention PE)."""
    sel = select(inputs.summary, inputs.setting)
    table = accuracy_table(
        inputs,
        "table1_accuracy",
        "Table 1. Test accuracy (%) per dataset and fusion operator "
        f"({describe_setting(inputs.setting, ' = ')}).",
        sel,
        row_keys=["dataset", *inputs.axes],
        row_order=_dataset_rows(inputs, sel),
        reference=True,
    )
    if BAG_OF_WORDS_COLUMN in table.display:
        table.footnotes.append(
            f"{BAG_OF_WORDS_COLUMN}: TF-IDF + logistic regression on the same tokens, fitted on "
            "the training split (position-blind; see Reference baselines)."
        )
    return table


def table3(inputs: TableInputs) -> Table:
    """Table 3: (dataset, position family, attention position, ...) x operator."""
    keys = list(inputs.keys)
    rows = []
    for d in inputs.datasets:
        sub = inputs.summary[inputs.summary["dataset"] == d]
        found = list(dict.fromkeys(map(tuple, sub[keys].to_numpy())))
        rows += _levels_in_order(found, keys, inputs.axes, inputs.levels)
    table = accuracy_table(
        inputs,
        "table3_positions",
        "Table 3. Test accuracy (%) per position family and fusion operator.",
        inputs.summary,
        row_keys=keys,
        row_order=rows,
    )
    if _has_order_blind_control(inputs.summary):
        table.footnotes.append(
            "position `none` with attention position `none` is the order-blind control: no "
            "position information reaches the model, which then sees a bag of words."
        )
    return table


def _has_order_blind_control(summary: pd.DataFrame) -> bool:
    """Whether any row has no position signal at either level."""
    if not {"position", "attention_position"} <= set(summary.columns):
        return False
    return bool(((summary["position"] == "none") & (summary["attention_position"] == "none")).any())


LATENCY_LOGGED = "logged"
LATENCY_MEANS = "mean latencies"


def latency_note(sources: Iterable[str], baseline: str) -> list[str]:
    """How Table 2's latency ratio was obtained, one sentence per source used: the per-run
    ``latency_ratio_to_baseline`` (measured in one process) or the ratio of mean latencies of
    separate runs (which may depend on the trials that shared the device)."""
    found = set(sources)
    notes = []
    if LATENCY_LOGGED in found:
        notes.append(
            f"median over seeds of each run's `{LATENCY_RATIO_METRIC}`, its model's inference "
            f"latency over that of {fence(baseline)} built with the same settings, timed interleaved "
            "on the same batches in the run's own process, so it does not depend on which "
            "trials shared the device."
        )
    if LATENCY_MEANS in found:
        marked = " (cells marked †)" if LATENCY_LOGGED in found else ""
        notes.append(
            f"mean latency of the operator's runs over that of {fence(baseline)}'s runs{marked}, "
            "timed in separate processes, so it may depend on which trials were co-scheduled on "
            f"the device (runs that log `{LATENCY_RATIO_METRIC}` measure it in one process)."
        )
    return notes


def _latency_ratio(row: pd.Series, base_lat: float) -> tuple[float, str]:
    """(the row's latency ratio to the baseline, its source): the median logged per-run ratio
    when the row's runs carry it, else its mean latency over the baseline's."""
    logged = row.get("latency_ratio_median", math.nan)
    if pd.notna(logged):
        return float(logged), LATENCY_LOGGED
    ok = base_lat and not math.isnan(base_lat)
    return (row["latency_mean"] / base_lat if ok else math.nan), LATENCY_MEANS


def table2(inputs: TableInputs) -> Table:
    """Table 2: accuracy and measured latency per operator (the study gave latency in words)."""
    baseline = inputs.baseline
    axes = list(inputs.axes)
    sel = select(inputs.summary, inputs.setting)
    display_rows, data_rows, sources = [], [], []
    for d, *combo in _dataset_rows(inputs, sel):
        level = dict(zip(axes, combo, strict=True))
        sub = sel[sel["dataset"] == d]
        for axis, value in level.items():
            sub = sub[sub[axis].astype(str) == value]
        base = sub[sub["operator"] == baseline]
        base_lat = float(base["latency_mean"].iloc[0]) if len(base) else math.nan
        for op in operator_order(sub["operator"], baseline, inputs.known_operators):
            r = sub[sub["operator"] == op].iloc[0]
            mark = inputs.marked(tuple(r[k] for k in inputs.keys), op)
            ratio, source = _latency_ratio(r, base_lat)
            sources.append(source)
            display_rows.append(
                {
                    "dataset": d,
                    **level,
                    "operator": op,
                    "accuracy (%)": fmt(r["acc_mean"], r["acc_sd"]) + mark,
                    "latency (ms/sample)": fmt(r["latency_mean"], r["latency_sd"], 3),
                    f"latency / {baseline}": "–" if math.isnan(ratio) else f"{ratio:.2f}×",
                    "params": "–" if pd.isna(r["num_params"]) else f"{int(r['num_params']):,}",
                    "n": int(r["n"]),
                }
            )
            data_rows.append(
                {
                    "dataset": d,
                    **level,
                    "operator": op,
                    "n": int(r["n"]),
                    "acc_mean": r["acc_mean"],
                    "acc_sd": r["acc_sd"],
                    "latency_ms_mean": r["latency_mean"],
                    "latency_ms_sd": r["latency_sd"],
                    "latency_ratio": ratio,
                    "latency_ratio_source": source,
                    "num_params": r["num_params"],
                    "significant": mark == "*",
                    "mark": mark,
                }
            )
    if set(sources) == {LATENCY_LOGGED, LATENCY_MEANS}:
        ratio_col = f"latency / {baseline}"
        for row, source in zip(display_rows, sources, strict=True):
            if source == LATENCY_MEANS and row[ratio_col] != "–":
                row[ratio_col] += "†"
    notes = inputs.footnotes()
    notes.append(
        "Latency: median over timed repeats of inference milliseconds per document, as logged "
        "by each run (`latency_ms_per_sample`), then mean ± sd over seeds; runs on different "
        "hardware are not comparable."
    )
    notes += [f"Latency / {fence(baseline)}: {note}" for note in latency_note(sources, baseline)]
    return Table(
        "table2_latency",
        "Table 2. Accuracy and measured inference latency per fusion operator "
        f"({describe_setting(inputs.setting, ' = ')}).",
        pd.DataFrame(display_rows),
        pd.DataFrame(data_rows),
        notes,
    )


def stats_table(
    comparisons: pd.DataFrame,
    keys: Sequence[str],
    settings: dict[str, Any],
    axes: Sequence[str] = (),
) -> Table:
    """The paired statistics, compact, for report.md (every column is in stats.csv); the cells
    come from the statistic registry (``analysis.stats.statistics()``)."""
    rows = [
        {
            **{column_label(k, axes): r[k] for k in keys},
            "operator": r["operator"],
            **summary_cells(r, settings),
        }
        for _, r in comparisons.iterrows()
    ]
    return Table(
        "paired_stats",
        "Paired statistics against the baseline (deltas in percentage points).",
        pd.DataFrame(rows),
        comparisons,
        [],
    )


def interaction_caption(axis: str) -> str:
    """The title of an axis's interaction table."""
    return f"Does the operator effect depend on {axis}?"


def interaction_table(
    tests: pd.DataFrame,
    axis: str,
    keys: Sequence[str],
    settings: Mapping[str, Any],
    m: int,
    axes: Sequence[str] = (),
    stars: bool = True,
) -> Table:
    """One axis's interaction tests (``analysis.sections.interaction``), compact: per comparison, the
    median delta at the reference and at the level, the per-seed difference (level minus
    reference) and its Holm-adjusted p over the interaction family of size ``m``; ``stars``
    False (an adaptive sweep, where these tests are descriptive): no significance mark."""
    others = [k for k in keys if k != axis]
    reference = str(tests["reference"].iloc[0]) if len(tests) else "reference"
    levels = list(dict.fromkeys(tests["level"].astype(str))) if len(tests) else []
    at_level = f"at {levels[0]}" if len(levels) == 1 else "at the level"
    rows = []
    for _, r in tests.iterrows():
        n = int(r["n_pairs"])
        rows.append(
            {
                **{column_label(k, axes): r[k] for k in others},
                "operator": r["operator"],
                axis: f"{r['level']} vs {r['reference']}",
                "n": n,
                f"Δ median at {reference} (pp)": f"{r['median_delta_reference']:+.2f}",
                f"Δ median {at_level} (pp)": f"{r['median_delta_level']:+.2f}",
                f"difference: median [{hl_label(settings)}]": hl_marked(
                    f"{r['median_interaction']:+.2f} [{r['hl_ci_low']:+.2f}, {r['hl_ci_high']:+.2f}]",
                    r["hl_ci_method"],
                ),
                "wins": f"{int(r['wins'])}/{n}",
                "p": f"{r['p_wilcoxon']:.4g}",
                "p Holm": f"{r['p_holm']:.4g}" + ("*" if r["significant"] and stars else ""),
            }
        )
    alpha = settings.get("alpha", 0.05)
    baseline = fence(tests["baseline"].iloc[0]) if len(tests) else "the baseline"
    notes = [
        f"Per seed: the operator's paired delta against {baseline} at the level minus its delta at the reference level {fence(reference)}, within each "
        "combination of the other group keys (pp; the interval is the Hodges-Lehmann one, "
        "`(approx.)` where zeros or tied differences make its coverage approximate). "
        "Exact two-sided Wilcoxon signed-rank test of those differences (zero_method = "
        f"{settings.get('zero_method', 'wilcox')}); `*`: Holm-adjusted p ≤ {alpha}, Holm over "
        f"all m = {m} interaction tests of the report (a family apart from the comparisons "
        "against the baseline)."
    ]
    if len(tests) and (~tests["can_reach_alpha"].astype(bool)).any():
        k = int((~tests["can_reach_alpha"].astype(bool)).sum())
        notes.append(
            f"{k} of {len(tests)} tests cannot reach {alpha} with their number of seeds "
            f"(smallest attainable Holm-adjusted p = {tests['min_attainable_p_holm'].min():.3g})."
        )
    return Table(
        f"interaction__{re.sub(r'[^A-Za-z0-9._-]+', '-', axis)}",
        interaction_caption(axis),
        pd.DataFrame(rows),
        tests.reset_index(drop=True),
        notes,
    )


def fmt_p(p: float | None) -> str:
    """A p-value with four significant digits ('–' when there is none)."""
    return "–" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.4g}"
