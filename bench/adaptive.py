"""Adaptive seeds measured for every built-in decision rule (``fusion_ray.decide.rules``): are the
decisions valid under optional stopping, and how many correct decisions do they buy per trial
against 10 fixed seeds with exact tests. Prints rates and ratios; asserts nothing.

    python bench/adaptive.py                      # 10,000 families per setting
    python bench/adaptive.py --reps 2000          # quicker
    python bench/adaptive.py --replay             # the rules on the quickstart's 20 logged seeds
    python bench/adaptive.py --replay --csv FILE  # ... on another per-seed accuracy CSV
    python bench/adaptive.py --export EXPERIMENT --tracking-uri URI --csv FILE  # make one
    python bench/adaptive.py --questions          # only the study's questions (bench/questions.py)

Settings: first wave 6, cap 20, a look after every seed, a comparison stops when decided (or
futile), alpha 0.05; m comparisons share each seed's baseline run (deltas are each operator's
score minus the baseline's, so they are correlated).

- validity: the largest family-wise error over symmetric nulls (normal, t3, Cauchy, contaminated
  normal, tie-heavy integers; m = 1, 4, 6, 12), counting every decision type: all-null families
  (a false better/worse), mixed families with a margin of 1 paired SD (half the comparisons at 0, half at
  exactly the margin: a false better/worse, a false equivalent, a wrong direction) and families
  of small effects (+0.2 paired SD: a "worse" is a wrong direction);
- efficiency: correct decisions per trial (baseline runs included) over the same for 10 fixed
  seeds with exact Wilcoxon + Holm, at 0.5, 1 and 2 paired SD and m = 4, 6, 12, and at effect 0
  with a margin of 1 paired SD against 10 fixed seeds with an exact Wilcoxon TOST + Holm; the geometric
  mean of the 12 ratios last;
- the skewed-null caveat: median 0, mean 0.31 SD (centred exponential), m = 1;
- a check that the vectorised simulation takes the decisions of ``fusion_ray.decide.sequential``;
- the study's questions in one family (``bench/questions.py``): length contrasts and
  interactions beside the operator comparisons, their error, power and cost, intervals at
  decision, the estimate's bias, failed runs, efficiency against 10 fixed seeds.

Units: effects and margins are in paired SD, the SD of a paired delta (its scale for Cauchy):
each arm's noise is drawn with its own spread and the effect is added in units of the delta's
(``UNITS``), so "1 paired SD" is the same signal-to-noise for every noise. bench/questions.py
works in accuracy points (a paired delta's SD about 5).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import questions  # noqa: E402  (bench/questions.py)
from questions import closure_p, fixed_wilcoxon, holm_reject  # noqa: E402  (vectorised)

from analysis.stats import holm, signed_rank_null_cdf, wilcoxon_signed_rank  # noqa: E402
from fusion_ray.decide.rules import log_e  # noqa: E402
from fusion_ray.decide.sequential import (  # noqa: E402
    FUTILE_AFTER,
    FUTILE_BELOW,
    family_evidence,
    replay_adaptive,
)

ALPHA, FIRST, CAP, THETA = 0.05, 6, 20, 1.5
RULES = ("sign", "magnitude")
REPLAY_CSV = Path(__file__).resolve().parent / "results" / "quickstart_20_seeds.csv"
# state codes
OPEN, BETTER, WORSE, EQUIV, FUTILE = 0, 1, -1, 2, 3
CODES = {"open": OPEN, "better": BETTER, "worse": WORSE, "equivalent": EQUIV, "futile": FUTILE}


# ----------------------------------------------------------------------------- the e-processes


def magnitude_bets(d: np.ndarray, first: int = FIRST) -> tuple[np.ndarray, np.ndarray]:
    """P and N [F, m, T] of the magnitude rule on full paths (the prefix property makes the
    value at seed t depend on seeds <= max(t, first - 1) only)."""
    scale = np.sqrt(np.cumsum(d**2, axis=2) / np.arange(1, d.shape[2] + 1))
    scale_at = scale[:, :, np.maximum(np.arange(d.shape[2]), first - 1)]
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(scale_at > 0, np.tanh(THETA * d / scale_at), 0.0)
    return np.cumprod(1 + step, axis=2), np.cumprod(1 - step, axis=2)


def equivalence_bets(d: np.ndarray, margin: float) -> np.ndarray:
    """Q = min(L, U) [F, m, T] with predictable SD scales (margin until two deltas are seen, and
    while the deltas seen are all equal), as ``fusion_ray.decide.rules`` computes them."""
    prev = np.full(d.shape, margin)
    for t in range(2, d.shape[2]):
        seen = d[:, :, :t]
        sd = np.std(seen, axis=2, ddof=1)
        size = np.maximum(1.0, np.abs(seen).max(axis=2))
        prev[:, :, t] = np.where(sd > 1e-9 * size, sd, margin)
    low = np.cumprod(1 + np.tanh((margin - d) / prev), axis=2)
    up = np.cumprod(1 + np.tanh((d + margin) / prev), axis=2)
    return np.minimum(low, up)


def sign_log_e(d: np.ndarray, shift: float = 0.0) -> np.ndarray:
    """log of the two-sided KT sign e-value [F, m, T] of ``d - shift``."""
    table = np.array(
        [[log_e(w, n) if w <= n else 0.0 for n in range(CAP + 1)] for w in range(CAP + 1)]
    )
    wins = np.cumsum(d > shift, axis=2)
    losses = np.cumsum(d < shift, axis=2)
    return table[wins, wins + losses]


# ----------------------------------------------------------------------------- the families


class _Sign:
    """The sign rule's looks: Holm on running maxima, equivalence from its sequence at a / m,
    futility when no run of wins up to the cap could reach 1 / alpha."""

    def __init__(self, d: np.ndarray, margin: float | None, alpha: float):
        m, cap = d.shape[1], d.shape[2]
        self.alpha, self.margin, self.cap = alpha, margin, cap
        self.log_two = sign_log_e(d)
        self.wins, self.losses = np.cumsum(d > 0, axis=2), np.cumsum(d < 0, axis=2)
        self.e_max = np.zeros(d.shape[:2])
        self.table = np.array(
            [
                [log_e(a, b) if a <= b else 0.0 for b in range(2 * cap + 1)]
                for a in range(2 * cap + 1)
            ]
        )
        if margin:
            level = math.log(m / alpha)
            hi = np.maximum.accumulate(sign_log_e(d, margin), axis=2) >= level
            lo = np.maximum.accumulate(sign_log_e(d, -margin), axis=2) >= level
            self.inside = hi & lo

    def look(self, t: int, at: tuple) -> tuple:
        self.e_max = np.maximum(self.e_max, self.log_two[at])
        rejected = holm_reject(np.exp(-self.e_max), self.alpha)
        wins, losses = self.wins[at], self.losses[at]
        direction = np.where(wins >= losses, BETTER, WORSE)
        equivalent = self.inside[at] if self.margin else None
        remaining = self.cap - t - 1
        n = wins + losses + remaining
        best = np.maximum(self.table[wins + remaining, n], self.table[losses + remaining, n])
        hopeless = np.maximum(best, self.e_max) < math.log(1 / self.alpha)
        if self.margin:
            hopeless &= False  # its equivalence can always still come
        return rejected, direction, equivalent, hopeless


class _Magnitude:
    """The magnitude rule's looks: the closed test on current e-values, permanent rejections,
    non-binding futility."""

    def __init__(self, d: np.ndarray, margin: float | None, alpha: float):
        self.alpha, self.margin, self.cap = alpha, margin, d.shape[2]
        self.up, self.down = magnitude_bets(d)
        self.two = (self.up + self.down) / 2
        self.q = equivalence_bets(d, margin) if margin else None
        self.best_p = np.ones(d.shape[:2])

    def look(self, t: int, at: tuple) -> tuple:
        e_now = self.two[at]
        q_now = self.q[at] if self.margin else None
        floor = np.minimum(e_now, q_now) if self.margin else e_now
        self.best_p = np.minimum(self.best_p, closure_p(e_now, floor))
        direction = np.where(self.up[at] >= self.down[at], BETTER, WORSE)
        equivalent = closure_p(q_now, floor) <= self.alpha if self.margin else None
        remaining = self.cap - t - 1

        def hopeless(e: np.ndarray) -> np.ndarray:
            late = (t + 1 >= FUTILE_AFTER) & (e < FUTILE_BELOW)
            return (e * 2.0**remaining < 1 / self.alpha) | late

        stop = hopeless(e_now) & (hopeless(q_now) if self.margin else True)
        return self.best_p <= self.alpha, direction, equivalent, stop


def simulate(rule: str, d: np.ndarray, margin: float | None = None, alpha: float = ALPHA):
    """A rule on deltas [F, m, CAP], seed by seed with stopping: (state codes [F, m], seeds
    used [F, m]). The final state is the family's decision with everything known."""
    families, m, cap = d.shape
    looks = (_Sign if rule == "sign" else _Magnitude)(d, margin, alpha)
    state = np.zeros((families, m), dtype=int)
    used = np.full((families, m), min(FIRST, cap))
    active = np.ones((families, m), dtype=bool)
    rows, cols = np.arange(families)[:, None], np.arange(m)[None, :]
    for t in range(cap):
        at = (rows, cols, np.minimum(used - 1, t))  # stopped comparisons keep their last value
        if t + 1 < FIRST:
            if rule == "sign":
                looks.look(t, at)  # the running maximum starts at the first seed
            continue
        rejected, direction, equivalent, hopeless = looks.look(t, at)
        newly = rejected & np.isin(state, (OPEN, EQUIV, FUTILE))
        state[newly] = direction[newly]
        if margin:
            state[equivalent & (state == OPEN)] = EQUIV
        remaining = cap - t - 1
        state[active & (state == OPEN) & hopeless & (remaining > 0)] = FUTILE
        active &= state == OPEN
        if t + 1 < cap:
            used = np.where(active & (used == t + 1), t + 2, used)
    return state, used


# ----------------------------------------------------------------------------- the data


def noise(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Per-run scores; a comparison's delta is its run minus the seed's shared baseline run."""
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "t3":
        return rng.standard_t(3, shape)
    if kind == "cauchy":
        return rng.standard_cauchy(shape)
    if kind == "contaminated":  # 90 % N(0, 1), 10 % N(0, 25)
        return rng.standard_normal(shape) * np.where(rng.random(shape) < 0.1, 5.0, 1.0)
    if kind == "ties":  # correct counts of 40 test documents at 90 %: many exact ties
        return rng.binomial(40, 0.9, shape).astype(float)
    raise ValueError(kind)


NOISES = ("normal", "t3", "cauchy", "contaminated", "ties")


def paired(
    kind: str, reps: int, m: int, effects: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Deltas [reps, m, CAP] with effects [m] in units of the paired delta's SD (its scale for
    Cauchy; for ties, of the integer deltas' SD)."""
    scores = noise(kind, (reps, m + 1, CAP), rng)
    d = scores[:, 1:, :] - scores[:, :1, :]
    d = d + (effects[None, :, None] * UNITS[kind])
    return np.round(d) if kind == "ties" else d


UNITS = {
    "normal": math.sqrt(2.0),
    "t3": math.sqrt(6.0),
    "cauchy": 2.0,
    "contaminated": math.sqrt(2 * 3.4),
    "ties": math.sqrt(2 * 40 * 0.9 * 0.1),
}
"""The paired delta's SD (Cauchy: its scale) per noise: one paired SD in the noise's units."""


# ----------------------------------------------------------------------------- the baseline


def fixed_tost(d: np.ndarray, margin: float, seeds: int = 10, alpha: float = ALPHA) -> np.ndarray:
    """Exact Wilcoxon TOST + Holm on the first ``seeds`` deltas: True where equivalent."""
    cdf = signed_rank_null_cdf(seeds)

    def one_sided_low(x: np.ndarray) -> np.ndarray:  # p of H0: centre >= 0 against < 0
        ranks = np.argsort(np.argsort(np.abs(x), axis=2), axis=2) + 1
        return cdf[np.where(x > 0, ranks, 0).sum(axis=2)]

    x = d[:, :, :seeds]
    p = np.maximum(one_sided_low(x - margin), one_sided_low(-(x + margin)))
    return holm_reject(p, alpha)


# ----------------------------------------------------------------------------- the sections


def validity(reps: int, rng: np.random.Generator) -> dict[str, float]:
    print(f"== validity: family-wise error, every decision type, {reps:,} families per row")
    print("  (first 6, cap 20, alpha 0.05; SE = binomial standard error)")
    print(f"  {'family':<34} {'noise':<13} {'m':>3}  " + "  ".join(f"{r:>16}" for r in RULES))
    worst = dict.fromkeys(RULES, 0.0)
    settings = (
        [("all null", None, 0.0)]
        + [("half null, half at the margin", 1.0, None)]
        + [("all at +0.2 paired SD (direction)", None, 0.2)]
    )
    for label, margin, effect in settings:
        for kind in NOISES:
            for m in (1, 4, 6, 12):
                if effect is None and m == 1:
                    continue
                if effect is None:
                    effects = np.array([0.0] * (m // 2) + [1.0] * (m - m // 2))
                else:
                    effects = np.full(m, effect)
                d = paired(kind, reps, m, effects, rng)
                cells = []
                for rule in RULES:
                    state, _ = simulate(rule, d, margin=margin and margin * UNITS[kind])
                    null = effects[None, :] == 0
                    wrong = null & ((state == BETTER) | (state == WORSE))
                    wrong |= ~null & (state == WORSE)  # effects are positive here
                    if margin:
                        wrong |= (effects[None, :] >= margin) & (state == EQUIV)
                    rate = float(wrong.any(axis=1).mean())
                    se = math.sqrt(max(rate * (1 - rate), 1e-12) / reps)
                    flag = "!" if rate > ALPHA + 3 * se else " "
                    cells.append(f"{rate:.4f} ({se:.4f}){flag}")
                    worst[rule] = max(worst[rule], rate)
                print(f"  {label:<34} {kind:<13} {m:>3}  " + "  ".join(f"{c:>16}" for c in cells))
    print(
        "  largest: "
        + ", ".join(f"{r} {worst[r]:.4f}" for r in RULES)
        + "  ('!': above alpha + 3 SE)"
    )
    return worst


def trials(used: np.ndarray) -> np.ndarray:
    """Trials per family: every comparison's seeds plus the baseline's (as long as the longest)."""
    return used.sum(axis=1) + used.max(axis=1)


def efficiency(reps: int, rng: np.random.Generator) -> dict[str, list[float]]:
    print(
        f"\n== efficiency: correct decisions per trial / the same for 10 fixed seeds, {reps:,} families"
    )
    print(
        "  (normal deltas; fixed 10: exact Wilcoxon + Holm, or exact Wilcoxon TOST + Holm at effect 0)"
    )
    head = "  ".join(f"{r + ': correct  trials  ratio':>32}" for r in RULES)
    print(f"  {'effect':>10} {'m':>3}  {'fixed 10: correct':>18}  {head}")
    ratios: dict[str, list[float]] = defaultdict(list)
    for effect, margin in [(0.5, None), (1.0, None), (2.0, None), (0.0, 1.0)]:
        for m in (4, 6, 12):
            d = paired("normal", reps, m, np.full(m, effect), rng)
            margin = margin and margin * UNITS["normal"]
            if margin:
                fixed_correct = fixed_tost(d, margin).sum(axis=1).mean()
            else:
                fixed_correct = (fixed_wilcoxon(d) == 1).sum(axis=1).mean()
            fixed_rate = fixed_correct / (10 * (m + 1))
            cells = []
            for rule in RULES:
                state, used = simulate(rule, d, margin=margin)
                good = EQUIV if margin else BETTER
                correct = (state == good).sum(axis=1).mean()
                ratio = (correct / trials(used).mean()) / fixed_rate if fixed_rate > 0 else math.nan
                ratios[rule].append(ratio)
                cells.append(f"{correct:>15.2f} {trials(used).mean():>7.1f} {ratio:>6.2f}x")
            label = f"{effect:g} paired SD" + (" (margin 1)" if margin else "")
            print(
                f"  {label:>10} {m:>3}  {fixed_correct:>18.2f}  "
                + "  ".join(f"{c:>32}" for c in cells)
            )
    for rule in RULES:
        values = np.array(ratios[rule])
        print(f"  {rule}: geometric mean of the 12 ratios {math.exp(np.log(values).mean()):.2f}x, "
              f"lowest {values.min():.2f}x")  # fmt: skip
    return ratios


def skewed(reps: int, rng: np.random.Generator) -> None:
    print(f"\n== skewed null (median 0, mean +0.31 SD: centred exponential), m = 1, {reps:,} runs")
    d = (rng.exponential(1.0, (reps, 1, CAP)) - math.log(2.0)) / 1.0
    for rule in RULES:
        state, _ = simulate(rule, d)
        print(f"  {rule}: rejections {np.isin(state, (BETTER, WORSE)).mean():.4f} "
              f"(better {(state == BETTER).mean():.4f})")  # fmt: skip


def agreement(rng: np.random.Generator, families: int = 150) -> None:
    print(
        f"\n== the simulation against fusion_ray.decide.sequential.replay_adaptive ({families} families each)"
    )
    for rule in RULES:
        for margin, m, kind in [(None, 4, "ties"), (None, 6, "normal"), (1.0, 4, "normal")]:
            effects = np.array([0.0, 0.5, 1.0, 2.0, 0.0, -1.0][:m])
            d = paired(kind, families, m, effects, rng)
            margin = margin and margin * UNITS[kind]
            state, used = simulate(rule, d, margin=margin)
            same = total = 0
            for f in range(families):
                rows = {str(i): [float(x) for x in d[f, i]] for i in range(m)}
                states = replay_adaptive(
                    rows, first=FIRST, alpha=ALPHA, max_seeds=CAP, margin=margin, rule=rule
                )
                for i in range(m):
                    total += 1
                    same += (
                        CODES[states[str(i)][-1]] == state[f, i]
                        and len(states[str(i)]) == used[f, i]
                    )
            print(
                f"  {rule:<9} m = {m:>2} {kind:<7} margin {margin}: same state and seeds {same / total:.1%}"
            )


# ----------------------------------------------------------------------------- the replay


def read_runs(path: Path) -> tuple[dict[tuple[str, str], dict[int, float]], dict[str, str]]:
    """A per-seed accuracy CSV (columns group, fusion, seed, test_acc): (group, fusion) -> seed
    -> test accuracy, and each group's baseline (its first fusion)."""
    acc: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    baselines: dict[str, str] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            baselines.setdefault(row["group"], row["fusion"])
            acc[row["group"], row["fusion"]][int(row["seed"])] = float(row["test_acc"])
    return acc, baselines


def read_replay(path: Path) -> dict[str, list[float | None]]:
    """Per comparison: the deltas (points) in seed order from a per-seed accuracy CSV
    (``read_runs``)."""
    acc, baselines = read_runs(path)
    out = {}
    for (group, fusion), by_seed in acc.items():
        base = acc[group, baselines[group]]
        if fusion == baselines[group]:
            continue
        seeds = range(max(by_seed) + 1)
        out[f"{group}: {fusion} vs {baselines[group]}"] = [
            100 * (by_seed[s] - base[s]) if s in by_seed and s in base else None for s in seeds
        ]
    return out


def export(experiment: str, tracking_uri: str, path: Path) -> None:
    """Write a logged experiment's per-seed test accuracies as the replay CSV (columns group,
    fusion, seed, test_acc; the baseline's rows first in each group)."""
    from analysis.load import load_experiment
    from analysis.stats.pairing import pair_runs

    pairing = pair_runs(load_experiment(experiment, tracking_uri).runs)
    runs = pairing.runs
    keys = list(pairing.keys)
    rows = []
    for _, r in runs.iterrows():
        group = "/".join(str(r[k]) for k in keys)
        first = r["operator"] != pairing.baseline
        rows.append((group, first, r["operator"], int(r["seed"]), float(r["test_acc"])))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["group", "fusion", "seed", "test_acc"])
        for group, _, fusion, seed, acc in sorted(rows):
            writer.writerow([group, fusion, seed, f"{acc:.6f}"])
    print(f"wrote {len(rows)} runs of {experiment} to {path}")


def replay(path: Path, first: int, caps: list[int]) -> None:
    deltas = read_replay(path)
    names = list(deltas)
    seeds = max(len(r) for r in deltas.values())
    p = [wilcoxon_signed_rank([d for d in deltas[n] if d is not None]).pvalue for n in names]
    fixed = dict(zip(names, holm(p), strict=True))
    print(
        f"== replay on {path.name}: {len(names)} comparisons, {seeds} seeds logged, first {first}"
    )
    for name in names:
        mean = np.mean([d for d in deltas[name] if d is not None])
        print(
            f"  {name}: mean delta {mean:+.2f} points; fixed {seeds}: exact Wilcoxon p Holm {fixed[name]:.3g}"
        )
    for cap in caps:
        for rule in RULES:
            states = replay_adaptive(deltas, first=first, alpha=ALPHA, max_seeds=cap, rule=rule)
            used = sum(len(s) for s in states.values())
            agree = sum(
                (states[n][-1] in ("better", "worse")) == (fixed[n] <= ALPHA) for n in names
            )
            ran = {n: deltas[n][: len(states[n])] for n in names}
            evidence = family_evidence(ran, alpha=ALPHA, max_seeds=cap, first=first, rule=rule)
            print(f"  cap {cap}, rule {rule}:")
            for n in names:
                last = evidence[n][-1]
                print(
                    f"    {n}: {last.state} after {len(states[n])} seeds, "
                    f"CS ({last.cs_low:+.2f}, {last.cs_high:+.2f})"
                )
            print(
                f"    comparison-seeds {used} of {seeds * len(names)}; agrees with fixed-{seeds} on {agree} of {len(names)}"
            )


def replay_questions(path: Path, first: int, caps: list[int]) -> None:
    """The whole family on the logged runs (operator comparisons, the length contrasts and the
    interactions with the last group part, e.g. scale_embeddings), replayed as adaptive seeds
    with the default rule: each hypothesis's verdict, seeds, estimates and e-BY interval."""
    from fusion_ray.decide.questions import Arm, hypotheses, rows
    from fusion_ray.decide.sequential import decision_rows

    acc: dict[tuple[Arm, int], float] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            regime, position, attention, setting = row["group"].split("/")
            group = (("dataset", regime), ("position", position),
                     ("attention_position", attention), ("model.scale_embeddings", setting))  # fmt: skip
            acc[Arm(group, row["fusion"]), int(row["seed"])] = float(row["test_acc"])
    arms = list(dict.fromkeys(arm for arm, _ in acc))
    baseline = next(a.fusion for a in arms)
    regimes = [r for r in ("short", "medium", "long") if any(a.group[0][1] == r for a in arms)]
    levels = {"model.scale_embeddings": ["true", "false"]}
    family = hypotheses(arms, baseline, regimes, levels)
    seeds = max(s for _, s in acc) + 1
    values = rows(family, lambda a, s: (a, s) in acc, lambda a, s, _: acc.get((a, s)), seeds)
    kinds = {h.name: h.kind for h in family}
    print(
        f"\n== replay of the whole family on {path.name}: {len(family)} hypotheses, first {first}"
    )
    for cap in caps:
        states = replay_adaptive(values, first=first, alpha=ALPHA, max_seeds=cap, kinds=kinds)
        used = {n: values[n][: len(states[n])] for n in values}
        evidence = family_evidence(used, alpha=ALPHA, max_seeds=cap, first=first, kinds=kinds)
        table = decision_rows(evidence, values=used, kinds=kinds, alpha=ALPHA, first=first)
        print(f"  cap {cap}:")
        for r in table:
            mean20 = np.mean(values[r["comparison"]])
            print(f"    {r['kind']:<11} {r['comparison']}: {r['verdict']} after "
                  f"{r['seeds_used']} seeds, mean {r['mean']:+.2f} (all {seeds}: {mean20:+.2f}), "
                  f"e-BY ({r['ci_low']:+.2f}, {r['ci_high']:+.2f})")  # fmt: skip
        runs = len({(a, s) for h in family for a in h.arms for s in range(len(states[h.name]))})
        print(f"    runs used {runs} of {len(acc)}")


def interval_widths(deltas: dict[str, list[float | None]], at: tuple[int, ...] = (10, 14, 20)):
    """Each rule's confidence sequence (at alpha / m) after the same number of seeds."""
    from fusion_ray.decide.rules import build_rule

    level = ALPHA / len(deltas)
    print(
        f"  confidence sequences after the same seeds (alpha / m = {level:.4g}), width in points:"
    )
    for n in at:
        widths = {r: [] for r in RULES}
        for row in deltas.values():
            for rule in RULES:
                low, high = build_rule(rule).interval(row[:n], level=level, first=FIRST)
                widths[rule].append(high - low)
        text = "; ".join(f"{r} " + ", ".join(f"{w:.1f}" for w in widths[r]) for r in RULES)
        narrower = sum(a < b for a, b in zip(widths["magnitude"], widths["sign"], strict=True))
        print(f"    {n} seeds: {text} (magnitude narrower in {narrower} of {len(deltas)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--csv", type=Path, default=REPLAY_CSV)
    parser.add_argument("--first", type=int, default=FIRST)
    parser.add_argument("--caps", type=int, nargs="+", default=[14, 20])
    parser.add_argument("--export", metavar="EXPERIMENT", help="write its runs to --csv")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--questions", action="store_true", help="only bench/questions.py")
    args = parser.parse_args()
    if args.export:
        export(args.export, args.tracking_uri, args.csv)
        return
    if args.replay:
        replay(args.csv, args.first, args.caps)
        interval_widths(read_replay(args.csv))
        replay_questions(args.csv, args.first, args.caps)
        return
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    if args.questions:
        questions.run(args.reps, rng)
        print(f"\n({time.perf_counter() - started:.0f} s)")
        return
    worst = validity(args.reps, rng)
    ratios = efficiency(args.reps, rng)
    skewed(args.reps, rng)
    agreement(rng)
    print()
    questions.run(args.reps, rng)
    print(f"\n({time.perf_counter() - started:.0f} s)")
    for rule in RULES:
        values = np.array(ratios[rule])
        print(f"{rule}: largest family-wise error {worst[rule]:.4f} (alpha {ALPHA}); "
              f"efficiency geometric mean {math.exp(np.log(values).mean()):.2f}x, lowest {values.min():.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
