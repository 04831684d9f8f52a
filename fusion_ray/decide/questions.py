"""The study's questions as hypotheses of one family (pure: no Ray, no MLflow).

Every hypothesis is a signed sum of runs' test accuracies at one seed, in points, so its value at
seed t is a number that is symmetric about 0 under its null, and the decision rules of
``fusion_ray.decide.rules`` turn its values in seed order into e-processes like any comparison's:

- ``operator``: the operator's delta against the baseline inside one group (dataset, position,
  attention position, setting-axis levels): acc(op) - acc(base). Null: the operator has no
  effect there (swapping its run and the baseline's run of a seed is as likely as not).
- ``length``: per operator and setting arm (everything but the dataset), the delta on the
  longest regime minus the delta on the shortest, regimes in the sweep file's order of
  ``grid.datasets`` (the study's order of length): [acc(op, long) - acc(base, long)] -
  [acc(op, short) - acc(base, short)]. Null: the operator's effect is the same on both regimes
  (both regimes' deltas symmetric about one centre, any centre). "grows" / "shrinks".
- ``length_within``: per operator and group, inside its dataset, the delta on the longest
  quarter of the test documents (by length before truncation) minus the delta on the shortest
  quarter (``QUARTER_METRICS``, which every trial reports). Null: the operator's effect is the
  same on a dataset's long and short documents. "grows" / "shrinks". A grid with one regime
  decides it by default; with several, the sweep asks for it (``decide``).
- ``interaction``: per operator, group and setting axis, the delta at a level minus the delta
  at the axis's reference level (its first in the sweep file). Null: the operator's effect does
  not depend on that axis. "larger" / "smaller".

The four runs of a contrast are independent runs of one seed, so under its null the contrast is
symmetric about 0 given the past, and one closed test over every hypothesis keeps one alpha
(``fusion_ray.decide.sequential``).

Failed runs count (``failure_value``): a seed where one of a hypothesis's runs failed takes
the value -c when the failed runs are on its positive side (the operator's run of an operator
comparison), +c when on its negative side (the baseline's), 0 when both sides failed alike,
where c is ``FAILURE_SCALE`` (0.5) times the root mean square of the hypothesis's values at its
earlier seeds with no failure (0 before it has one). So a failure is a clear loss for the arm
whose run failed, on the scale of the hypothesis's own values: not the -85 points a failed run
scored as 0 accuracy would add (which wiped out every later bet), and not a dropped seed (which
an outcome-dependent failure, the operator's worst runs failing, would turn into a false
"better"). c depends on earlier seeds only and the value's sign on which arm failed, so under a
null that swapping a seed's two runs is as likely as not (their failures swapped with them),
the value is still symmetric about 0 given the past, and the closed test's guarantee holds;
with no failure the values are the accuracies' signed sums, exactly as before.

Names are built here and nowhere else, so the console, decisions.csv, the MLflow metrics and the
report spell a hypothesis the same way: the group's values joined by ``/`` (a setting axis as
``scale_embeddings=true``), then ``: OP vs BASE``; the slot a contrast varies shows both ends,
``long-short`` or ``scale_embeddings=false-true`` (the first end minus the second).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusion_ray.schema import LENGTH_QUARTER_METRICS

KINDS = ("operator", "length", "length_within", "interaction")
"""The questions a sweep can decide, in the order the console and the report list them."""
PARTS = ("all", "shortest", "longest")
"""Which documents of a run's test split a term scores: all of them, or the shortest or the
longest quarter by length."""
QUARTER_METRICS = {
    "shortest": LENGTH_QUARTER_METRICS[:2],
    "longest": LENGTH_QUARTER_METRICS[2:],
}
"""Per part: the final metrics (correct, total) every trial reports for it (the schema's
``LENGTH_QUARTER_METRICS``)."""
FIXED_KEYS = ("dataset", "position", "attention_position")
REGIME_KEY = "dataset"
"""The group axis the study's regimes are levels of (a trainable names its own: ``trend:``)."""
"""The group keys every cell has; setting axes (dotted keys) follow them."""
FAILURE_SCALE = 0.5
"""A failed run counts as a loss (a gain, for the other side's run) of this many times the root
mean square of the hypothesis's values without failures so far (see the module notes). Measured
(``bench/questions.py``, "failed runs"): the smallest of 0.25 / 0.5 / 1 / 2 that keeps false
"better" at or below alpha when up to 40 % of a null operator's worst runs fail, while keeping
85 % of the correct decisions at 5 % failures independent of the outcome (2 x the RMS kept 60 %,
a failed run scored 0 accuracy 41 %)."""
VERDICTS = {
    "operator": {"better": "better", "worse": "worse"},
    "length": {"better": "grows", "worse": "shrinks"},
    "length_within": {"better": "grows", "worse": "shrinks"},
    "interaction": {"better": "larger", "worse": "smaller"},
}
"""What a rejection in each direction means, per kind (a positive value: ``better``)."""
ESTIMANDS = {
    "operator": "acc(operator) - acc(baseline) on one seed, points",
    "length": "[delta on the longest regime] - [delta on the shortest] on one seed, points",
    "length_within": "[delta on a dataset's longest quarter] - [on its shortest] on one seed",
    "interaction": "[delta at the level] - [delta at the reference level] on one seed, points",
}

Group = tuple[tuple[str, str], ...]
"""A group of cells: (key, value) pairs, the fixed keys first, then the setting axes."""


@dataclass(frozen=True)
class Arm:
    """One operator's runs inside one group (one run per seed)."""

    group: Group
    fusion: str


@dataclass(frozen=True)
class Hypothesis:
    """One question: its name, its kind, the operator it is about and its signed arms."""

    name: str
    kind: str
    operator: str
    terms: tuple[tuple[Arm, int, str], ...]
    """(arm, +1 or -1, part): the value at a seed is 100 * sum of sign * the accuracy of the
    arm's run on that part of its test split (``PARTS``)."""

    @property
    def arms(self) -> tuple[Arm, ...]:
        return tuple(dict.fromkeys(arm for arm, _, _ in self.terms))

    def verdict(self, state: str) -> str:
        """The state in this kind's words (``better`` of a length contrast is ``grows``)."""
        return VERDICTS[self.kind].get(state, state)


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _slot(key: str, value: str) -> str:
    return value if key in FIXED_KEYS else f"{_short(key)}={value}"


def group_parts(
    group: Group, varied: str | None = None, ends: tuple[str, str] = ("", "")
) -> list[str]:
    """The group's slots as a name shows them, one per key; ``varied`` names the key a
    contrast varies, shown as ``first-second``."""
    parts = []
    for key, value in group:
        if key == varied:
            shown = f"{ends[0]}-{ends[1]}"
            parts.append(shown if key in FIXED_KEYS else f"{_short(key)}={shown}")
        else:
            parts.append(_slot(key, value))
    return parts


def group_text(group: Group, varied: str | None = None, ends: tuple[str, str] = ("", "")) -> str:
    """The group as a name shows it (``group_parts`` joined by ``/``)."""
    return "/".join(group_parts(group, varied, ends))


def _with(group: Group, key: str, value: str) -> Group:
    return tuple((k, value if k == key else v) for k, v in group)


def operator_hypothesis(group: Group, operator: str, baseline: str) -> Hypothesis:
    """The comparison of ``operator`` with ``baseline`` inside ``group``."""
    terms = ((Arm(group, operator), 1, "all"), (Arm(group, baseline), -1, "all"))
    where = f"{group_text(group)}: " if group else ""  # a grid of the compared axis alone
    return Hypothesis(f"{where}{operator} vs {baseline}", "operator", operator, terms)


def within_hypothesis(group: Group, operator: str, baseline: str) -> Hypothesis:
    """Inside ``group``'s dataset: the operator's delta on the longest quarter of the test
    documents minus its delta on the shortest."""
    op, base = Arm(group, operator), Arm(group, baseline)
    terms = ((op, 1, "longest"), (base, -1, "longest"), (op, -1, "shortest"), (base, 1, "shortest"))
    parts = [
        f"{value}:longest-shortest" if key == "dataset" else part
        for (key, value), part in zip(group, group_parts(group), strict=True)
    ]
    text = "/".join(parts)
    return Hypothesis(f"{text}: {operator} vs {baseline}", "length_within", operator, terms)


def contrast_hypothesis(
    kind: str, group: Group, key: str, ends: tuple[str, str], operator: str, baseline: str
) -> Hypothesis:
    """The operator's delta at ``key = ends[0]`` minus its delta at ``key = ends[1]``."""
    high, low = _with(group, key, ends[0]), _with(group, key, ends[1])
    terms = (
        (Arm(high, operator), 1, "all"),
        (Arm(high, baseline), -1, "all"),
        (Arm(low, operator), -1, "all"),
        (Arm(low, baseline), 1, "all"),
    )
    name = f"{group_text(group, key, ends)}: {operator} vs {baseline}"
    return Hypothesis(name, kind, operator, terms)


def possible(
    groups: Iterable[Group],
    regimes: Sequence[str],
    levels: Mapping[str, Sequence[str]],
    regime_key: str = REGIME_KEY,
) -> tuple[str, ...]:
    """The kinds a grid of ``groups`` decides by default: ``operator`` always; ``length`` with
    two regimes or more, else ``length_within`` (one regime: its long against its short
    documents; none for groups without a dataset: a trainable's); ``interaction`` with a
    setting axis of two levels or more."""
    present = {dict(g).get(regime_key) for g in groups} - {None}
    kinds = ["operator"]
    if sum(r in present for r in regimes) >= 2:
        kinds.append("length")
    elif present and regime_key == REGIME_KEY:  # a dataset's quarters: the study's trials only
        kinds.append("length_within")
    if any(len(v) >= 2 for v in levels.values()):
        kinds.append("interaction")
    return tuple(kinds)


def hypotheses(
    arms: Iterable[Arm],
    baseline: str,
    regimes: Sequence[str],
    levels: Mapping[str, Sequence[str]],
    decide: Sequence[str] | None = None,
    regime_key: str = REGIME_KEY,
) -> list[Hypothesis]:
    """Every hypothesis of the family, in the order every surface lists them: kinds in
    ``KINDS`` order; within a kind by regime (in the order of length), position, attention
    position, setting levels (the reference first), then operator by name, whatever order
    ``arms`` come in (the driver's cells and the report's runs give the same list).

    ``arms``: every (group, operator) of the grid, in the grid's order; ``regimes``: the
    datasets in the order of length (the sweep file's ``grid.datasets``); ``levels``: each
    setting axis's levels, the reference first; ``decide``: the kinds to include (None: every
    kind the grid makes possible); ``regime_key``: the group's axis the regimes are levels of
    (the study's ``dataset``; a trainable's ``trend:`` axis)."""
    arms = list(arms)
    order = _rank(regimes, levels, regime_key)
    groups = sorted(dict.fromkeys(a.group for a in arms), key=order)
    have = {(a.group, a.fusion) for a in arms}
    kinds = possible(groups, regimes, levels, regime_key) if decide is None else tuple(decide)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"decide: unknown question(s) {unknown}; choose from {list(KINDS)}")
    operators = sorted({a.fusion for a in arms} - {baseline})
    out: list[Hypothesis] = []

    def complete(*gs: Group, op: str) -> bool:
        return all((g, f) in have for g in gs for f in (op, baseline))

    def per_group(make: Callable[[Group, str, str], Hypothesis]) -> list[Hypothesis]:
        return [make(g, op, baseline) for g in groups for op in operators if complete(g, op=op)]

    if "operator" in kinds:
        out += per_group(operator_hypothesis)
    if "length" in kinds:
        out += _length(groups, operators, baseline, (regime_key, regimes), complete)
    if "length_within" in kinds:
        out += per_group(within_hypothesis)
    if "interaction" in kinds:
        out += _interactions(groups, operators, baseline, levels, complete)
    return out


def _rank(
    regimes: Sequence[str], levels: Mapping[str, Sequence[str]], regime_key: str = REGIME_KEY
) -> Callable:
    """A group's sort key: regime by length, position, attention position, then each setting
    axis's level in the sweep file's order (unknown values last, by text)."""

    def key(group: Group) -> tuple:
        out: list[tuple[int, str]] = []
        for k, v in group:
            order = list(regimes) if k == regime_key else list(levels.get(k, ()))
            out.append((order.index(v) if v in order else len(order), v))
        return tuple(out)

    return key


def _length(groups, operators, baseline, regime, complete) -> list[Hypothesis]:
    """The trend contrasts: per operator and the rest of a group, its delta at the last regime
    minus at the first (``regime``: the regime key and the regimes in order)."""
    key, regimes = regime
    out, seen = [], set()
    for g in groups:
        rest = tuple((k, v) for k, v in g if k != key)
        if rest in seen or key not in dict(g):
            continue
        seen.add(rest)
        present = [r for r in regimes if _with(g, key, r) in groups]
        if len(present) < 2:
            continue
        ends = (present[-1], present[0])
        anchor = _with(g, key, ends[0])
        for op in operators:
            if complete(_with(g, key, ends[0]), _with(g, key, ends[1]), op=op):
                out.append(contrast_hypothesis("length", anchor, key, ends, op, baseline))
    return out


def _interactions(groups, operators, baseline, levels, complete) -> list[Hypothesis]:
    out = []
    for key, values in levels.items():
        if len(values) < 2:
            continue
        reference = values[0]
        for g in groups:
            if dict(g).get(key) != reference:
                continue
            for level in values[1:]:
                other = _with(g, key, level)
                if other not in groups:
                    continue
                for op in operators:
                    if complete(g, other, op=op):
                        ends = (level, reference)
                        out.append(
                            contrast_hypothesis("interaction", other, key, ends, op, baseline)
                        )
    return out


Resolved = Callable[[Arm, int], bool]
"""Whether an arm's run of a seed has ended (finished or failed), or does not exist."""
Accuracy = Callable[[Arm, int, str], float | None]
"""An arm's test accuracy (0-1) at a seed on a part of its test split (``PARTS``); None when its
run failed; nan when the run did not report that part (the hypothesis's row stops there)."""


def failure_value(failed_signs: Sequence[int], completed: Sequence[float]) -> float:
    """A seed's value when the runs of its terms with ``failed_signs`` (+1: the hypothesis's
    positive side, -1: its negative side) failed: -c, +c or 0 (see the module notes), c from
    the ``completed`` values of its earlier seeds without a failure."""
    net = sum(failed_signs)
    if net == 0 or not completed:
        return 0.0
    scale = FAILURE_SCALE * math.sqrt(sum(v * v for v in completed) / len(completed))
    return round(-scale if net > 0 else scale, 9)


def rows(
    family: Sequence[Hypothesis], resolved: Resolved, accuracy: Accuracy, max_seeds: int
) -> dict[str, list[float]]:
    """Each hypothesis's values (points) in seed order, up to its first seed with a run not yet
    resolved (or not reporting a part it needs); a seed with a failed run takes
    ``failure_value``."""
    out: dict[str, list[float]] = {}
    for h in family:
        row: list[float] = []
        completed: list[float] = []
        for seed in range(max_seeds):
            if not all(resolved(arm, seed) for arm in h.arms):
                break
            scores = [(sign, accuracy(arm, seed, part)) for arm, sign, part in h.terms]
            if any(acc is not None and math.isnan(acc) for _, acc in scores):
                break
            failed = [sign for sign, acc in scores if acc is None]
            if failed:
                row.append(failure_value(failed, completed))
                continue
            # rounded as the report's values from correct counts are, so both see equal ties
            # (none of the accuracies is None here: a failed run's seed took failure_value)
            value = round(100.0 * sum(sign * acc for sign, acc in scores if acc is not None), 9)
            row.append(value)
            completed.append(value)
        out[h.name] = row
    return out


def failed_runs_by_operator(
    family: Sequence[Hypothesis], accuracy: Accuracy, seeds: Mapping[str, int]
) -> dict[str, dict[str, tuple[int, int]]]:
    """Per hypothesis and operator (its operator and the baseline): (failed runs, runs) over its
    first ``seeds[name]`` seeds, for the note beside a verdict."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for h in family:
        counts: dict[str, list[int]] = {}
        for arm in h.arms:
            failed_total = counts.setdefault(arm.fusion, [0, 0])
            for seed in range(seeds[h.name]):
                failed_total[0] += accuracy(arm, seed, "all") is None
                failed_total[1] += 1
        out[h.name] = {fusion: (f, n) for fusion, (f, n) in counts.items()}
    return out


def failures(
    family: Sequence[Hypothesis], accuracy: Accuracy, seeds: Mapping[str, int]
) -> dict[str, int]:
    """Per hypothesis: how many of its runs over its first ``seeds[name]`` seeds failed."""
    return {
        h.name: sum(accuracy(arm, s, "all") is None for arm in h.arms for s in range(seeds[h.name]))
        for h in family
    }


def bucket_edges(lengths: Sequence[int] | np.ndarray, n_buckets: int = 4) -> np.ndarray:
    """Lower bounds of the length buckets 1.. of a test split (bucket 0 starts at the shortest
    document), from its length quantiles; with many documents of one length, buckets merge
    rather than come out empty. The report's length section cuts its buckets with it too."""
    length = np.asarray(lengths, dtype=np.int64)
    qs = np.quantile(length, np.linspace(0, 1, n_buckets + 1))
    edges = np.unique(np.round(qs[1:-1]).astype(np.int64))
    bucket = np.searchsorted(edges, length, side="right")
    nonempty = np.unique(bucket)
    return np.array([length[bucket == b].min() for b in nonempty[1:]], dtype=np.int64)


def quarter_accuracy(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The accuracy on each length quarter a run's metrics hold (``QUARTER_METRICS``)."""
    out = {}
    for part, (correct, total) in QUARTER_METRICS.items():
        c, t = metrics.get(correct), metrics.get(total)
        if c is not None and t is not None and float(t) > 0:
            out[part] = float(c) / float(t)
    return out


def quarter_metrics(
    lengths: Sequence[int] | np.ndarray, correct: Sequence[bool] | np.ndarray
) -> dict[str, int]:
    """``QUARTER_METRICS`` of one run: correct and total documents in the shortest and the
    longest length quarter of its test split (``bucket_edges``)."""
    length = np.asarray(lengths, dtype=np.int64)
    right = np.asarray(correct, dtype=bool)
    if length.size == 0:
        return {}
    bucket = np.searchsorted(bucket_edges(length), length, side="right")
    out = {}
    for part, b in (("shortest", 0), ("longest", int(bucket.max()))):
        correct_name, total_name = QUARTER_METRICS[part]
        out[correct_name] = int(right[bucket == b].sum())
        out[total_name] = int((bucket == b).sum())
    return out
