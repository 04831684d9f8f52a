"""The study's questions decided in one family, measured: operator comparisons, length contrasts
and interactions under one closed test (``fusion_ray.decide.questions``). Run by
``python bench/adaptive.py --questions`` (and by a plain ``python bench/adaptive.py``).

The design is the quickstart's: three regimes (short, medium, long) x two setting arms (A, B: say
``scale_embeddings`` true and false) x the baseline and one operator, so 12 arms of runs; a
family of 6 operator comparisons, 2 length contrasts (per arm, long minus short) and 3
interactions (per regime, arm B minus arm A), m = 11. Each run's test accuracy (points) is its
cell's mean plus noise: normal with SD 3.5 (a paired delta's SD is about 5 points, a contrast's
about 7), or a binomial count of the regime's test documents (400 / 300 / 200). First wave 6, a
look after every seed, cap 14 or 20, alpha 0.05. A hypothesis gets its next seed while it is
open; trials per family are the distinct (arm, seed) runs its hypotheses used.

Sections:
- validity: the family-wise error (any false rejection of a true null, or a wrong direction)
  with length and interaction hypotheses in the family, under nulls with equal non-zero effects
  in every regime, heteroscedastic regimes (SD 2 / 3.5 / 6), binomial test-set counts, and t3;
- power of a length trend of 5 and 10 points within the cap, and what the contrasts cost the
  operator comparisons (trials, correct decisions of 6 with and without contrasts in the family);
- the futility stop for contrasts: how many trends stopped as futile would 20 fixed seeds have
  decided (exact Wilcoxon + Holm over the family's contrasts);
- intervals at decision: e-BY (each decided hypothesis's sequence at alpha * R / m) against the
  simultaneous sequence at alpha / m: the share bounded, median width, false coverage;
- the estimate after adaptive stopping: the mean of a decided hypothesis's values over its true
  effect, by effect size;
- failed runs: the shipped rule (a failure is a loss for its arm of 0.5 x the RMS of the
  hypothesis's earlier values) against scoring a failed run 0 accuracy and against dropping
  its seed: power with failures independent of the outcome (0 / 2 / 5 / 10 %), the error when
  a null operator's worst runs fail (5 / 10 / 20 %) or when runs of both arms fail at random,
  and an operator that diverges in 10 % of its runs;
- efficiency against 10 fixed seeds with exact Wilcoxon of every hypothesis + Holm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.stats import signed_rank_null_cdf
from fusion_ray.decide.questions import FAILURE_SCALE
from fusion_ray.decide.sequential import FUTILITY

ALPHA, FIRST, THETA = 0.05, 6, 1.5
REGIMES = ("short", "medium", "long")
SETTINGS = ("A", "B")
TEST_DOCS = {"short": 400, "medium": 300, "long": 200}
SD = 3.5
OPEN, BETTER, WORSE, FUTILE = 0, 1, -1, 3

# arms: (regime, setting, fusion) with fusion 0 = baseline, 1 = operator
ARMS = [(r, s, f) for r in REGIMES for s in SETTINGS for f in (0, 1)]
ARM = {a: i for i, a in enumerate(ARMS)}


@dataclass(frozen=True)
class Family:
    """Hypotheses as signed sums of arms: names, kinds and a sign matrix [m, arms]."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    signs: np.ndarray

    @property
    def m(self) -> int:
        return len(self.names)


def _delta(r: str, s: str, sign: int = 1) -> list[tuple[tuple[str, str, int], int]]:
    return [((r, s, 1), sign), ((r, s, 0), -sign)]


def _terms(kinds: tuple[str, ...]) -> list[tuple[str, str, list]]:
    out = []
    if "operator" in kinds:
        out += [(f"{r}/{s}", "operator", _delta(r, s)) for r in REGIMES for s in SETTINGS]
    if "length" in kinds:
        out += [
            (f"long-short/{s}", "length", _delta("long", s) + _delta("short", s, -1))
            for s in SETTINGS
        ]
    if "interaction" in kinds:
        out += [(f"{r}/B-A", "interaction", _delta(r, "B") + _delta(r, "A", -1)) for r in REGIMES]
    return out


def family(kinds: tuple[str, ...] = ("operator", "length", "interaction")) -> Family:
    """The hypotheses of the design as signed sums of arms (``fusion_ray.decide.questions``)."""
    names, out_kinds, rows = [], [], []
    for name, kind, terms in _terms(kinds):
        row = np.zeros(len(ARMS))
        for arm, sign in terms:
            row[ARM[arm]] += sign
        names.append(name)
        out_kinds.append(kind)
        rows.append(row)
    return Family(tuple(names), tuple(out_kinds), np.array(rows))


def scores(
    effects: dict[tuple[str, str], float],
    reps: int,
    cap: int,
    rng: np.random.Generator,
    noise: str = "normal",
    sds: dict[str, float] | None = None,
) -> np.ndarray:
    """Run accuracies (points) [reps, arms, cap]: the baseline at 85 %, the operator at 85 % plus
    its effect in the arm's (regime, setting)."""
    mean = np.array([85.0 + (effects.get((r, s), 0.0) if f else 0.0) for r, s, f in ARMS])
    if noise == "binomial":
        n = np.array([TEST_DOCS[r] for r, _, _ in ARMS])
        p = np.clip(mean / 100, 0, 1)
        counts = rng.binomial(n[None, :, None], p[None, :, None], (reps, len(ARMS), cap))
        return 100.0 * counts / n[None, :, None]
    sd = np.array([(sds or {}).get(r, SD) for r, _, _ in ARMS])
    if noise == "t3":
        eps = rng.standard_t(3, (reps, len(ARMS), cap)) / math.sqrt(3.0)
    else:
        eps = rng.standard_normal((reps, len(ARMS), cap))
    return mean[None, :, None] + sd[None, :, None] * eps


def values(fam: Family, runs: np.ndarray) -> np.ndarray:
    """Hypothesis values [reps, m, cap] from run accuracies [reps, arms, cap]; nan where one of
    a hypothesis's own runs is nan (a dropped run)."""
    missing = np.isnan(runs)
    out = np.einsum("ha,fat->fht", fam.signs, np.where(missing, 0.0, runs))
    gone = np.einsum("ha,fat->fht", np.abs(fam.signs), missing.astype(float)) > 0
    return np.where(gone, np.nan, out)


def truth(fam: Family, effects: dict[tuple[str, str], float]) -> np.ndarray:
    mean = np.array([(effects.get((r, s), 0.0) if f else 0.0) for r, s, f in ARMS])
    return fam.signs @ mean


# ----------------------------------------------------------------------------- the rule


def bets(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P and N [F, m, T] of the magnitude rule (``fusion_ray.decide.rules.MagnitudeRule``)."""
    scale = np.sqrt(np.cumsum(d**2, axis=2) / np.arange(1, d.shape[2] + 1))
    scale_at = scale[:, :, np.maximum(np.arange(d.shape[2]), FIRST - 1)]
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(scale_at > 0, np.tanh(THETA * d / scale_at), 0.0)
    return np.cumprod(1 + step, axis=2), np.cumprod(1 - step, axis=2)


def closure_p(own: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Closed-test p [F, m] for each hypothesis's ``own`` e-value against the others'
    ``floor`` (min of their e-values): 1 / min over r of (own + r smallest others) / (r + 1)."""
    families, m = floor.shape
    order = np.argsort(floor, axis=1)
    ranked = np.take_along_axis(floor, order, axis=1)
    rank = np.argsort(order, axis=1)
    csum = np.concatenate([np.zeros((families, 1)), np.cumsum(ranked, axis=1)], axis=1)
    r = np.arange(m)[None, None, :]
    pos = rank[:, :, None]
    take = np.where(r < pos, r, r + 1)
    total = np.take_along_axis(
        np.broadcast_to(csum[:, None, :], (families, m, m + 1)), take, axis=2
    )
    others = total - np.where(r < pos, 0.0, floor[:, :, None])
    worst = ((own[:, :, None] + others) / (r + 1)).min(axis=2)
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, np.where(worst > 0, 1.0 / worst, 1.0))


def late_rules(fam: Family, futility: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per hypothesis: the heuristic futility stop's seed count and threshold (inf / 0: none)."""
    rules = FUTILITY if futility is None else futility
    after, below = [], []
    for kind in fam.kinds:
        rule = rules.get(kind)
        after.append(math.inf if rule is None else rule[0])
        below.append(0.0 if rule is None else rule[1])
    return np.array(after), np.array(below)


def simulate(
    fam: Family, d: np.ndarray, cap: int, futility: dict | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The schedule on values [F, m, cap]: (states [F, m], seeds used [F, m], the look each
    hypothesis was decided at [F, m] or -1), as ``fusion_ray.decide.sequential`` decides."""
    families, m, _ = d.shape
    up, down = bets(d)
    two = (up + down) / 2
    after, below = late_rules(fam, futility)
    state = np.zeros((families, m), dtype=int)
    decided_at = np.full((families, m), -1)
    used = np.full((families, m), FIRST)
    active = np.ones((families, m), dtype=bool)
    best = np.ones((families, m))
    rows, cols = np.arange(families)[:, None], np.arange(m)[None, :]
    for t in range(FIRST - 1, cap):
        at = (rows, cols, np.minimum(used - 1, t))
        e_now = two[at]
        best = np.minimum(best, closure_p(e_now, e_now))
        direction = np.where(up[at] >= down[at], BETTER, WORSE)
        newly = (best <= ALPHA) & np.isin(state, (OPEN, FUTILE))
        state[newly] = direction[newly]
        decided_at[newly & (decided_at < 0)] = t
        remaining = cap - t - 1
        late = (t + 1 >= after[None, :]) & (e_now < below[None, :])
        hopeless = (e_now * 2.0**remaining < 1 / ALPHA) | late
        state[active & (state == OPEN) & hopeless & (remaining > 0)] = FUTILE
        active &= state == OPEN
        if t + 1 < cap:
            used = np.where(active & (used == t + 1), t + 2, used)
    return state, used, decided_at


def trials(fam: Family, used: np.ndarray) -> np.ndarray:
    """Distinct (arm, seed) runs per family: each arm runs as long as its longest hypothesis."""
    touches = fam.signs != 0  # [m, arms]
    per_arm = np.where(touches[None, :, :], used[:, :, None], 0).max(axis=1)
    return per_arm.sum(axis=1)


# ----------------------------------------------------------------------------- fixed 10


def holm_reject(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's rejections per row of ``p`` [families, m]."""
    m = p.shape[1]
    order = np.argsort(p, axis=1)
    ranked = np.take_along_axis(p, order, axis=1)
    adjusted = np.maximum.accumulate(np.minimum(1.0, ranked * (m - np.arange(m))), axis=1)
    out = np.empty_like(p, dtype=bool)
    np.put_along_axis(out, order, adjusted <= alpha, axis=1)
    return out


def exact_p(d: np.ndarray, seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided exact Wilcoxon p and the median's sign [F, m] of each hypothesis's first
    ``seeds`` values (ties broken by rank order: continuous noise)."""
    x = d[:, :, :seeds]
    ranks = np.argsort(np.argsort(np.abs(x), axis=2), axis=2) + 1
    t_plus = np.where(x > 0, ranks, 0).sum(axis=2)
    cdf = signed_rank_null_cdf(seeds)
    p = np.minimum(1.0, 2 * np.minimum(cdf[t_plus], 1 - np.concatenate([[0.0], cdf])[t_plus]))
    return p, np.sign(np.median(x, axis=2))


def fixed_wilcoxon(d: np.ndarray, seeds: int = 10, alpha: float = ALPHA) -> np.ndarray:
    """Exact two-sided Wilcoxon + Holm over each row's hypotheses on their first ``seeds``
    values: the sign of the median where rejected, else 0 [F, m]."""
    p, sign = exact_p(d, seeds)
    return np.where(holm_reject(p, alpha), sign, 0).astype(int)


# ----------------------------------------------------------------------------- intervals


def two_sided_at(d: np.ndarray, shifts: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """The two-sided e-value of (values - shift) at each hypothesis's last look [G, F, m]."""
    centred = d[None, :, :, :] - shifts[:, None, None, None]  # [G, F, m, T]
    up, down = bets(centred.reshape(-1, *d.shape[1:]))
    two = ((up + down) / 2).reshape(centred.shape)
    idx = np.broadcast_to((stop - 1)[None, :, :, None], (*centred.shape[:3], 1))
    return np.take_along_axis(two, idx, axis=3)[..., 0]


def intervals(
    d: np.ndarray, used: np.ndarray, level: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each hypothesis's set {mu : E(values - mu at its last look) < 1 / level}, as its hull
    on ``grid`` (offsets from the hypothesis's mean), infinite where a grid end is kept.
    ``level`` [F, m]. Returns (low, high) [F, m]."""
    seeds = np.arange(d.shape[2])[None, None, :]
    mask = seeds < used[:, :, None]
    centre = (np.where(mask, d, 0).sum(axis=2)) / used
    lows, highs = np.empty(used.shape), np.empty(used.shape)
    chunk = max(1, 40_000 // (len(grid) * d.shape[1]))
    for start in range(0, d.shape[0], chunk):
        part = slice(start, start + chunk)
        dd = d[part] - centre[part][:, :, None]
        e = two_sided_at(dd, grid, used[part])  # [G, F, m]
        kept = e < 1 / level[part][None, :, :]
        any_kept = kept.any(axis=0)
        first = np.argmax(kept, axis=0)
        last = len(grid) - 1 - np.argmax(kept[::-1], axis=0)
        low = np.where(first == 0, -np.inf, grid[first])
        high = np.where(last == len(grid) - 1, np.inf, grid[last])
        lows[part] = np.where(any_kept, low, np.nan) + centre[part]
        highs[part] = np.where(any_kept, high, np.nan) + centre[part]
    return lows, highs


# ----------------------------------------------------------------------------- sections

TRENDS = {
    "none": {},
    "+5 (5/7.5/10)": {("short", "A"): 5.0, ("medium", "A"): 7.5, ("long", "A"): 10.0},
    "+10 (5/10/15)": {("short", "A"): 5.0, ("medium", "A"): 10.0, ("long", "A"): 15.0},
}


def _rate(x: np.ndarray) -> str:
    se = math.sqrt(max(float(x.mean()) * (1 - float(x.mean())), 1e-12) / x.size)
    flag = "!" if float(x.mean()) > ALPHA + 3 * se else " "
    return f"{float(x.mean()):.4f} ({se:.4f}){flag}"


def validity(reps: int, rng: np.random.Generator) -> float:
    print(
        f"== questions: family-wise error with contrasts in the family (m = 11), {reps:,} families"
    )
    fam = family()
    worst = 0.0
    same = {(r, s): 5.0 for r in REGIMES for s in SETTINGS}
    cases = [
        ("all null", {}, "normal", None),
        ("equal +5 effects, every regime and arm", same, "normal", None),
        ("equal +5, heteroscedastic regimes", same, "normal", {"short": 2.0, "long": 6.0}),
        ("equal +5, binomial test sets", same, "binomial", None),
        ("equal +5, t3", same, "t3", None),
        ("+5 in arm A only (length null)", {(r, "A"): 5.0 for r in REGIMES}, "binomial", None),
    ]
    for cap in (14, 20):
        for label, effects, noise, sds in cases:
            d = values(fam, scores(effects, reps, cap, rng, noise, sds))
            state, _, _ = simulate(fam, d, cap)
            true = truth(fam, effects)
            null = np.isclose(true, 0.0)[None, :]
            wrong = null & np.isin(state, (BETTER, WORSE))
            wrong |= (~null) & (state == np.where(true > 0, WORSE, BETTER)[None, :])
            fwer = wrong.any(axis=1)
            worst = max(worst, float(fwer.mean()))
            print(f"  cap {cap:>2} {label:<42} {noise:<9} FWER {_rate(fwer)}")
    print(f"  largest {worst:.4f} (alpha {ALPHA}; '!': above alpha + 3 SE)")
    return worst


def power(reps: int, rng: np.random.Generator) -> dict[str, float]:
    print(f"\n== questions: length trends in arm A, arm B null; {reps:,} families, normal noise")
    print(
        "  trials and correct operator decisions of 6 (the 3 of arm A), with contrasts and without"
    )
    with_all, ops_only = family(), family(("operator",))
    out = {}
    for cap in (14, 20):
        for label, effects in TRENDS.items():
            runs = scores(effects, reps, cap, rng)
            d = values(with_all, runs)
            state, used, _ = simulate(with_all, d, cap)
            trend = np.array([k == "length" for k in with_all.kinds])
            arm_a = np.array([n.endswith("/A") for n in with_all.names])
            true = truth(with_all, effects)
            grows = (state[:, trend & arm_a] == BETTER).mean()
            false_trend = np.isin(state[:, trend & ~arm_a], (BETTER, WORSE)).any(axis=1).mean()
            ops = np.array([k == "operator" for k in with_all.kinds])
            correct_ops = state[:, ops] == np.sign(true[ops]).astype(int)[None, :]
            correct_ops &= (true[ops] != 0)[None, :]
            d0 = values(ops_only, runs)
            state0, used0, _ = simulate(ops_only, d0, cap)
            true0 = truth(ops_only, effects)
            correct0 = (state0 == np.sign(true0).astype(int)[None, :]) & (true0 != 0)[None, :]
            seeds_trend = used[:, trend & arm_a][state[:, trend & arm_a] == BETTER]
            median_seeds = float(np.median(seeds_trend)) if seeds_trend.size else math.nan
            print(
                f"  cap {cap:>2} trend {label:<14} grows {grows:.3f} (median seeds "
                f"{median_seeds:.0f}); false trend in arm B {false_trend:.4f}; trials "
                f"{trials(with_all, used).mean():.1f} ({trials(ops_only, used0).mean():.1f} "
                f"without); correct operator decisions {correct_ops.sum(axis=1).mean():.2f} "
                f"({correct0.sum(axis=1).mean():.2f} without)"
            )
            if label.startswith("+10"):
                out[f"cap{cap}"] = float(grows)
    return out


def futility(reps: int, rng: np.random.Generator) -> None:
    print(
        f"\n== questions: the futility stop for contrasts, cap 20, {reps:,} families, normal noise"
    )
    print("  contrasts stopped as futile that the rule would have decided by seed 20 without the")
    print(
        "  heuristic stop (lost), contrasts 20 fixed seeds decide (exact Wilcoxon + Holm over the"
    )
    print("  family's contrasts) that ended futile, and trials, by the stop used for contrasts")
    fam = family()
    contrast = np.array([k != "operator" for k in fam.kinds])
    exact = {**FUTILITY, "length": None, "interaction": None}
    settings = {
        "exact only": exact,
        "as operators (8, 0.3)": {**FUTILITY, "length": (8, 0.3), "interaction": (8, 0.3)},
        "(12, 0.2)": {**FUTILITY, "length": (12, 0.2), "interaction": (12, 0.2)},
    }
    shipped = [k for k, v in settings.items() if all(v[x] == FUTILITY[x] for x in FUTILITY)]
    for label, effects in TRENDS.items():
        runs = scores(effects, reps, 20, rng)
        d = values(fam, runs)
        fixed = fixed_wilcoxon(d[:, contrast, :], seeds=20)
        reference, _, _ = simulate(fam, d, 20, exact)
        decidable = np.isin(reference[:, contrast], (BETTER, WORSE))
        for name, rule in settings.items():
            state, used, _ = simulate(fam, d, 20, rule)
            futile = state[:, contrast] == FUTILE
            lost = (futile & decidable).sum(axis=1).mean()
            fixed_lost = (futile & (fixed != 0)).sum(axis=1).mean()
            mark = " (shipped)" if name in shipped else ""
            print(
                f"  trend {label:<14} {name + mark:<33} lost {lost:.3f} per family; futile but "
                f"decided at 20 fixed {fixed_lost:.3f}; trials {trials(fam, used).mean():.1f}"
            )


def coverage(reps: int, rng: np.random.Generator) -> dict[str, float]:
    print(f"\n== questions: intervals at decision, cap 20, {reps:,} families, normal noise")
    print("  decided hypotheses: share bounded, median width (points), false coverage rate")
    fam = family()
    grid = np.linspace(-60, 60, 241)
    out = {}
    for label, effects in [
        ("effects 5 in arm A", {(r, "A"): 5.0 for r in REGIMES}),
        ("effects 10 in arm A", {(r, "A"): 10.0 for r in REGIMES}),
        ("trend +10 in arm A", TRENDS["+10 (5/10/15)"]),
        ("quickstart-like (+35 / -8)", {**{(r, "A"): 35.0 for r in REGIMES},
                                        **{(r, "B"): -8.0 for r in REGIMES}}),
    ]:  # fmt: skip
        runs = scores(effects, reps, 20, rng)
        d = values(fam, runs)
        state, used, _ = simulate(fam, d, 20)
        decided = np.isin(state, (BETTER, WORSE))
        r = decided.sum(axis=1, keepdims=True)
        true = truth(fam, effects)
        for method, level in [
            ("e-BY", np.where(r > 0, ALPHA * np.maximum(r, 1) / fam.m, ALPHA / fam.m)),
            ("alpha / m", np.full(state.shape, ALPHA / fam.m)),
        ]:
            low, high = intervals(d, used, np.broadcast_to(level, state.shape), grid)
            bounded = decided & np.isfinite(low) & np.isfinite(high)
            width = (high - low)[bounded]
            miss = decided & ~((low < true[None, :]) & (true[None, :] < high))
            fcr = (miss.sum(axis=1) / np.maximum(r[:, 0], 1)).mean()
            share = bounded.sum() / max(decided.sum(), 1)
            med = float(np.median(width)) if width.size else math.nan
            print(f"  {label:<28} {method:<9} bounded {share:.3f}, median width {med:.1f}, "
                  f"false coverage {fcr:.4f}")  # fmt: skip
            out[f"{label}/{method}"] = share
    return out


def bias(reps: int, rng: np.random.Generator) -> None:
    print(f"\n== questions: the printed mean after adaptive stopping, cap 20, {reps:,} families")
    print("  mean of a hypothesis decided in the right direction / its true effect (paired SD ~5),")
    print("  all of them and split by the flag 'the e-BY interval reaches below half the mean'")
    fam = family(("operator",))
    grid = np.linspace(-60, 60, 241)
    for effect in (2.5, 5.0, 10.0, 20.0):
        effects = {(r, "A"): effect for r in REGIMES}
        d = values(fam, scores(effects, reps, 20, rng))
        state, used, _ = simulate(fam, d, 20)
        true = truth(fam, effects)
        seeds = np.arange(20)[None, None, :]
        mean = np.where(seeds < used[:, :, None], d, 0).sum(axis=2) / used
        decided = np.isin(state, (BETTER, WORSE))
        r = np.maximum(decided.sum(axis=1, keepdims=True), 1)
        low, _ = intervals(d, used, np.broadcast_to(ALPHA * r / fam.m, state.shape), grid)
        right = (state == BETTER) & (true > 0)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = mean / np.broadcast_to(true[None, :], state.shape)
        flagged = right & (low < mean / 2)
        plain = right & ~flagged

        def avg(mask: np.ndarray, ratio: np.ndarray = ratio) -> str:
            return f"{ratio[mask].mean():.2f}" if mask.any() else "-"

        print(f"  true effect {effect:>4g} points ({effect / (SD * math.sqrt(2)):.2f} paired SD): "
              f"decided {right.sum() / (reps * 3):.3f}, mean / truth {avg(right)}; flagged "
              f"{flagged.sum() / max(right.sum(), 1):.2f} of them, mean / truth {avg(flagged)}; "
              f"not flagged {avg(plain)}")  # fmt: skip


def imputed(
    fam: Family, runs: np.ndarray, failed: np.ndarray, rule: str, scale: float = FAILURE_SCALE
) -> np.ndarray:
    """Hypothesis values [F, m, T] from run accuracies [F, arms, T] where ``failed`` runs
    failed, by ``rule``: "imputed" (the shipped rule, ``questions.failure_value``: -c when the
    failed runs are on the hypothesis's positive side, +c on its negative side, 0 when both,
    c = FAILURE_SCALE x the RMS of its earlier values without a failure), "scored 0" (a failed run's
    accuracy is 0) or "dropped" (the seed left out: the next one moves up)."""
    if rule == "scored 0":
        return values(fam, np.where(failed, 0.0, runs))
    if rule == "dropped":
        d = values(fam, np.where(failed, np.nan, runs))
        d = np.stack([_compact(row) for row in d.reshape(-1, d.shape[2])])
        return d.reshape(runs.shape[0], fam.m, -1)
    d = values(fam, np.where(failed, 0.0, runs))
    net = np.einsum("ha,fat->fht", fam.signs, failed.astype(float))
    touched = np.einsum("ha,fat->fht", np.abs(fam.signs), failed.astype(float)) > 0
    completed = ~touched
    sq = np.where(completed, d**2, 0.0)
    before_sq = np.cumsum(sq, axis=2) - sq  # over earlier seeds only
    before_n = np.cumsum(completed, axis=2) - completed
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = np.where(before_n > 0, np.sqrt(before_sq / np.maximum(before_n, 1)), 0.0)
    return np.where(touched, -np.sign(net) * scale * rms, d)


FAILURE_RULES = ("imputed", "scored 0", "dropped")


def _agrees_with_rows(fam: Family, runs: np.ndarray, failed: np.ndarray) -> bool:
    """The vectorised rule gives the values of ``fusion_ray.decide.questions.rows`` (the
    driver's and the report's) on the same runs and failures."""
    from fusion_ray.decide.questions import Arm, Hypothesis, rows

    arms = [Arm((("dataset", r), ("setting", s)), "op" if f else "base") for r, s, f in ARMS]
    hyps = [
        Hypothesis(name, kind, "op", tuple((arms[a], int(sign), "all")
                                           for a, sign in enumerate(fam.signs[h]) if sign))
        for h, (name, kind) in enumerate(zip(fam.names, fam.kinds, strict=True))
    ]  # fmt: skip
    mine = imputed(fam, runs, failed, "imputed")
    for f in range(runs.shape[0]):

        def accuracy(arm: Arm, seed: int, part: str, f: int = f) -> float | None:
            a = arms.index(arm)
            return None if failed[f, a, seed] else runs[f, a, seed] / 100.0

        theirs = rows(hyps, lambda arm, seed: True, accuracy, runs.shape[2])
        if not np.allclose([theirs[n] for n in fam.names], mine[f], atol=1e-6):
            return False
    return True


def failures(reps: int, rng: np.random.Generator) -> None:
    print(f"\n== questions: failed runs, 6 operator comparisons, cap 20, {reps:,} families each")
    print("  rules: imputed (shipped: a failure is a loss for its arm of 0.5 x the RMS of the")
    print("  hypothesis's earlier values), scored 0 (a failed run's accuracy 0), dropped (the")
    print("  seed left out). Noise normal, SD 3.5 points per run (paired SD 4.9)")
    for part in (_independent, _worst_fail, _both_fail, _diverging, _loss_size):
        part(reps, rng)


_FAM = family(("operator",))
_IS_OP = np.array([f == 1 for _, _, f in ARMS])
_PARTNER = np.array([ARM[(r, s, 0)] for r, s, _ in ARMS])
_EFFECT = {(r, s): 5.0 for r in REGIMES for s in SETTINGS}


def _worst(null: np.ndarray, share: float) -> np.ndarray:
    """The operator's runs whose delta against the seed's baseline run is among the lowest."""
    delta = null - null[:, _PARTNER, :]
    return _IS_OP[None, :, None] & (delta < np.quantile(delta[:, _IS_OP, :], share))


def _independent(reps: int, rng: np.random.Generator) -> None:
    fam = _FAM
    print("  a) every comparison +5 points (1.0 paired SD); each run fails with probability p,")
    print("     whatever its outcome: correct 'better' of 6 and its share of p = 0")
    check = scores(_EFFECT, 50, 20, rng)
    print(
        "  the vectorised rule gives fusion_ray.decide.questions.rows' values on 50 families "
        f"with 10 % failures: {_agrees_with_rows(fam, check, rng.random(check.shape) < 0.1)}"
    )
    base = {}
    for p in (0.0, 0.02, 0.05, 0.10):
        runs = scores(_EFFECT, reps, 20, rng)
        failed = rng.random(runs.shape) < p
        line = []
        for rule in FAILURE_RULES:
            state, used, _ = simulate(fam, imputed(fam, runs, failed, rule), 20)
            correct = (state == BETTER).sum(axis=1).mean()
            base.setdefault(rule, correct)
            line.append(f"{rule} {correct:.2f} ({correct / base[rule]:.0%})")
        print(f"     p = {p:>4.0%}: " + "; ".join(line))


def _worst_fail(reps: int, rng: np.random.Generator) -> None:
    fam = _FAM
    print("  b) a null operator whose worst runs fail (its delta against the seed's baseline")
    print("     run among the lowest): false 'better' (any of 6, rate (SE); ! above alpha + 3 SE),")
    print("     and 'worse' (the failures are real losses)")
    for share in (0.05, 0.10, 0.20):
        runs = scores({}, reps, 20, rng)
        failed = _worst(runs, share)
        for rule in FAILURE_RULES:
            state, _, _ = simulate(fam, imputed(fam, runs, failed, rule), 20)
            print(f"     {share:.0%} fail, {rule:<9} false better "
                  f"{_rate((state == BETTER).any(axis=1))}, worse {(state == WORSE).any(axis=1).mean():.3f}")  # fmt: skip


def _both_fail(reps: int, rng: np.random.Generator) -> None:
    fam = _FAM
    print("  c) a null operator and baseline, each run failing with probability 10 %, whatever")
    print("     its outcome: false 'better' and false 'worse' (any of 6)")
    runs = scores({}, reps, 20, rng)
    failed = rng.random(runs.shape) < 0.10
    for rule in FAILURE_RULES:
        state, _, _ = simulate(fam, imputed(fam, runs, failed, rule), 20)
        print(f"     {rule:<9} false better {_rate((state == BETTER).any(axis=1))}, "
              f"false worse {_rate((state == WORSE).any(axis=1))}")  # fmt: skip


def _diverging(reps: int, rng: np.random.Generator) -> None:
    fam = _FAM
    print("  d) an operator +5 points in 90 % of its runs whose other 10 % diverge (mean effect")
    print("     -3.5 points): as runs that end near chance (25 %), or as runs that fail; per")
    print("     comparison: called better / worse, and the better ones with a note (estimates")
    print("     differing in sign, or failed runs named)")
    for how in ("end near chance", "fail"):
        runs = scores(_EFFECT, reps, 20, rng)
        diverged = _IS_OP[None, :, None] & (rng.random(runs.shape) < 0.10)
        if how == "end near chance":
            runs = np.where(diverged, 25.0 + rng.standard_normal(runs.shape), runs)
            failed = np.zeros_like(diverged)
        else:
            failed = diverged
        d = imputed(fam, runs, failed, "imputed")
        state, used, _ = simulate(fam, d, 20)
        better = state == BETTER
        inside = np.arange(d.shape[2])[None, None, :] < used[:, :, None]
        mean = np.where(inside, values(fam, np.where(failed, 0.0, runs)), 0).sum(axis=2) / used
        median = np.nanmedian(np.where(inside, d, np.nan), axis=2)
        touched = np.einsum("ha,fat->fht", np.abs(fam.signs), failed.astype(float)) > 0
        noted = better & ((np.sign(mean) != np.sign(median)) | (touched & inside).any(axis=2))
        print(f"     {how:<15}: better {better.mean():.3f}, worse {(state == WORSE).mean():.3f}; "
              f"noted {noted.sum() / max(better.sum(), 1):.2f} of the better ones")  # fmt: skip


def _loss_size(reps: int, rng: np.random.Generator) -> None:
    fam = _FAM
    print(
        "  e) the loss's size (x the RMS; the shipped FAILURE_SCALE is "
        f"{FAILURE_SCALE:g}): share of p = 0's correct 'better' at 5 % independent failures,"
    )
    print("     and false 'better' when 20 % / 40 % of a null operator's worst runs fail")
    runs = scores(_EFFECT, reps, 20, rng)
    failed = rng.random(runs.shape) < 0.05
    clean = (simulate(fam, values(fam, runs), 20)[0] == BETTER).sum(axis=1).mean()
    null = scores({}, reps, 20, rng)
    worst = [_worst(null, share) for share in (0.2, 0.4)]
    for scale in (0.25, 0.5, 1.0, 2.0):
        state = simulate(fam, imputed(fam, runs, failed, "imputed", scale), 20)[0]
        kept = (state == BETTER).sum(axis=1).mean() / clean
        false = [
            _rate((simulate(fam, imputed(fam, null, w, "imputed", scale), 20)[0] == BETTER).any(axis=1))
            for w in worst
        ]  # fmt: skip
        print(f"     {scale:>4g} x RMS: kept {kept:.0%}; false better {false[0]} / {false[1]}")


def _compact(row: np.ndarray) -> np.ndarray:
    kept = row[~np.isnan(row)]
    return np.concatenate([kept, np.zeros(len(row) - len(kept))])


def efficiency(reps: int, rng: np.random.Generator) -> None:
    print(f"\n== questions: correct decisions per trial against 10 fixed seeds, {reps:,} families")
    print("  (exact Wilcoxon of every hypothesis + Holm over the family; cap 20; normal noise)")
    fam = family()
    for label, effects in TRENDS.items():
        runs = scores(effects, reps, 20, rng)
        d = values(fam, runs)
        true = np.sign(truth(fam, effects)).astype(int)
        state, used, _ = simulate(fam, d, 20)
        correct = ((state == true[None, :]) & (true != 0)[None, :]).sum(axis=1).mean()
        fixed = fixed_wilcoxon(d)
        fixed_correct = ((fixed == true[None, :]) & (true != 0)[None, :]).sum(axis=1).mean()
        rate = correct / trials(fam, used).mean()
        fixed_rate = fixed_correct / (10 * len(ARMS))
        ratio = rate / fixed_rate if fixed_rate > 0 else math.nan
        print(f"  trend {label:<14} adaptive {correct:.2f} correct in {trials(fam, used).mean():.1f} "
              f"trials; fixed 10: {fixed_correct:.2f} in {10 * len(ARMS)}; ratio {ratio:.2f}x")  # fmt: skip


def run(reps: int, rng: np.random.Generator) -> None:
    validity(reps, rng)
    power(reps, rng)
    futility(reps, rng)
    coverage(max(reps // 5, 200), rng)
    bias(reps, rng)
    failures(reps, rng)
    efficiency(reps, rng)
