"""Adaptive seeds measured: is the decision rule (analysis.sequential) valid under optional
stopping, what does it cost or save against a fixed number of seeds, and what would it have
done on real runs. Prints rates and ratios; asserts nothing.

    python bench/adaptive.py                       # 10,000 families per setting (about 10 s on 2 cores)
    python bench/adaptive.py --reps 2000           # quicker
    python bench/adaptive.py --replay --experiment quickstart20 --tracking-uri sqlite:///mlflow.db

- exactness: the e-process against the product of the Krichevsky-Trofimov bets, and the exact
  chance under the null of ever crossing 1/alpha, by enumerating every sign sequence (n <= 12);
- validity: the family-wise type-I error under optional stopping (each comparison sampled seed
  by seed up to the cap, stopped when decided) for null deltas from a normal, a t with 3 degrees
  of freedom and a tie-heavy integer distribution (differences of binomial correct counts), m =
  1, 4 and 12 comparisons sharing each seed's baseline; the last line is the largest rate;
- efficiency: decisions, errors and mean seeds against 10 fixed seeds with the exact Wilcoxon
  signed-rank test and Holm, at effects of 0, 0.5, 1 and 2 paired SDs, m = 4 and 12;
- replay (--replay): the adaptive rule on a logged experiment's per-seed deltas in seed order:
  the seeds it would have used and whether it agrees with exact Wilcoxon + Holm on every seed.

The simulation is vectorised over families; on a sample of families its states are checked
against ``analysis.sequential.replay_adaptive`` (the rule itself) and the agreement printed.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.sequential import log_e, replay_adaptive, sign_e_values  # noqa: E402
from analysis.stats import signed_rank_null_cdf, wilcoxon_signed_rank  # noqa: E402

ALPHA, FIRST, CAP = 0.05, 6, 20


def log_e_table(cap: int) -> np.ndarray:
    """log E[w, n] for 0 <= w <= n <= cap (the KT sign e-value)."""
    table = np.zeros((cap + 1, cap + 1))
    for n in range(cap + 1):
        for w in range(n + 1):
            table[w, n] = log_e(w, n)
    return table


def holm_reject(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's rejections per row of ``p`` [families, m]."""
    m = p.shape[1]
    order = np.argsort(p, axis=1)
    ranked = np.take_along_axis(p, order, axis=1)
    adjusted = np.maximum.accumulate(np.minimum(1.0, ranked * (m - np.arange(m))), axis=1)
    out = np.empty_like(p, dtype=bool)
    np.put_along_axis(out, order, adjusted <= alpha, axis=1)
    return out


def simulate(deltas: np.ndarray, first: int = FIRST, cap: int = CAP, alpha: float = ALPHA):
    """The adaptive rule on deltas [families, m, cap], seed by seed with stopping: returns
    (state codes [F, m]: 0 open, 1 better, -1 worse, 2 futile; seeds used [F, m])."""
    families, m, _ = deltas.shape
    table = log_e_table(cap)
    wins = np.zeros((families, m), dtype=int)
    losses = np.zeros((families, m), dtype=int)
    log_max = np.zeros((families, m))
    state = np.zeros((families, m), dtype=int)
    used = np.zeros((families, m), dtype=int)
    threshold = math.log(1 / alpha)
    for t in range(cap):
        active = state == 0
        d = deltas[:, :, t]
        wins += active & (d > 0)
        losses += active & (d < 0)
        used += active
        log_max = np.maximum(log_max, table[wins, wins + losses])
        if t + 1 < first:
            continue
        rejected = holm_reject(np.exp(-log_max), alpha) & active
        state[rejected] = np.where(wins > losses, 1, -1)[rejected]
        remaining = cap - t - 1
        n = wins + losses + remaining
        best = np.maximum(
            table[np.minimum(wins + remaining, cap), np.minimum(n, cap)],
            table[np.minimum(losses + remaining, cap), np.minimum(n, cap)],
        )
        hopeless = (state == 0) & (remaining > 0) & (np.maximum(best, log_max) < threshold)
        state[hopeless] = 2
    return state, used


CODES = {"open": 0, "better": 1, "worse": -1, "futile": 2}


def check_against_the_rule(deltas: np.ndarray, sample: int = 300) -> float:
    """Share of comparisons whose simulated final state equals ``replay_adaptive``'s."""
    state, used = simulate(deltas[:sample])
    agree = total = 0
    for f in range(min(sample, len(deltas))):
        rows = {str(i): [float(x) for x in deltas[f, i]] for i in range(deltas.shape[1])}
        states = replay_adaptive(rows, first=FIRST, alpha=ALPHA, max_seeds=CAP)
        for i in range(deltas.shape[1]):
            total += 1
            agree += CODES[states[str(i)][-1]] == state[f, i] and len(states[str(i)]) == used[f, i]
    return agree / total


def null_deltas(kind: str, families: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Paired deltas under the null: each operator's score minus its seed's shared baseline."""
    shape = (families, m + 1, CAP)
    if kind == "normal":
        scores = rng.standard_normal(shape)
    elif kind == "t3":
        scores = rng.standard_t(3, shape)
    else:  # correct counts of 40 test documents at 90 % accuracy: many exact ties
        scores = rng.binomial(40, 0.9, shape).astype(float)
    return scores[:, 1:, :] - scores[:, :1, :]


def exactness() -> None:
    print("== exactness (every sign sequence, n <= 12)")
    worst_diff, worst_rate = 0.0, 0.0
    for n in range(1, 13):
        crossing = 0
        for signs in itertools.product((1.0, -1.0), repeat=n):
            wealth, wins, bets = 1.0, 0, []
            for k, s in enumerate(signs):
                p_win = (wins + 0.5) / (k + 1)
                wealth *= 2 * (p_win if s > 0 else 1 - p_win)
                wins += s > 0
                bets.append(wealth)
            values = sign_e_values(signs)
            worst_diff = max(
                worst_diff, max(abs(a - b) / b for a, b in zip(values, bets, strict=True))
            )
            crossing += max(values) >= 1 / ALPHA
        rate = crossing / 2**n
        worst_rate = max(worst_rate, rate)
        print(f"  n = {n:>2}: P(sup E >= 20) = {rate:.5f}")
    print(f"  largest relative difference from the product of bets: {worst_diff:.2e}")
    print(f"  largest exact type-I error: {worst_rate:.5f} (alpha {ALPHA})")


def validity(reps: int, rng: np.random.Generator) -> float:
    print(f"\n== validity under optional stopping: first {FIRST}, cap {CAP}, {reps:,} families")
    worst = 0.0
    for kind in ("normal", "t3", "ties"):
        for m in (1, 4, 12):
            deltas = null_deltas(kind, reps, m, rng)
            state, used = simulate(deltas)
            rate = float(np.mean(np.any((state == 1) | (state == -1), axis=1)))
            se = math.sqrt(max(rate * (1 - rate), 1e-12) / reps)
            flag = "  FAIL: above alpha + 3 SE" if rate > ALPHA + 3 * se else ""
            print(
                f"  {kind:<6} m = {m:>2}: family-wise type-I {rate:.4f} (SE {se:.4f}), "
                f"mean seeds {used.mean():.1f}{flag}"
            )
            worst = max(worst, rate)
    sample = null_deltas("ties", 300, 4, rng)
    print(
        f"  simulation = rule (replay_adaptive) on {300 * 4} tie-heavy comparisons: "
        f"{check_against_the_rule(sample):.1%}"
    )
    return worst


def fixed_wilcoxon_holm(deltas: np.ndarray, seeds: int = 10) -> np.ndarray:
    """Exact two-sided Wilcoxon + Holm on the first ``seeds`` deltas (continuous: no ties):
    code 1 / -1 for a rejection by sign, 0 otherwise."""
    d = deltas[:, :, :seeds]
    ranks = np.argsort(np.argsort(np.abs(d), axis=2), axis=2) + 1
    t_plus = np.where(d > 0, ranks, 0).sum(axis=2)
    cdf = signed_rank_null_cdf(seeds)
    lower = cdf[t_plus]
    upper = 1 - np.concatenate([[0.0], cdf])[t_plus]
    p = np.minimum(1.0, 2 * np.minimum(lower, upper))
    rejected = holm_reject(p, ALPHA)
    return np.where(rejected, np.sign(np.median(d, axis=2)), 0).astype(int)


def efficiency(reps: int, rng: np.random.Generator) -> None:
    print(f"\n== efficiency against 10 fixed seeds (exact Wilcoxon + Holm), {reps:,} families")
    print("  (rates are shares of comparisons; wrong: a rejection of a null, or the wrong sign)")
    print("  effect (SD)  m   adaptive: decided  wrong  mean seeds | fixed 10: decided  wrong")
    for m in (4, 12):
        for effect in (0.0, 0.5, 1.0, 2.0):
            noise = rng.standard_normal((reps, m + 1, CAP))
            deltas = effect + (noise[:, 1:, :] - noise[:, :1, :]) / math.sqrt(2)
            state, used = simulate(deltas)
            fixed = fixed_wilcoxon_holm(deltas)
            wrong_sign = -1 if effect > 0 else None
            adaptive_rej = (state == 1) | (state == -1)
            adaptive_wrong = (state == wrong_sign) if wrong_sign else adaptive_rej
            fixed_wrong = (fixed == wrong_sign) if wrong_sign else fixed != 0
            print(
                f"  {effect:>11.1f} {m:>3}   {adaptive_rej.mean():>16.3f} "
                f"{adaptive_wrong.mean():>6.3f} {used.mean():>11.1f} | "
                f"{(fixed != 0).mean():>16.3f} {fixed_wrong.mean():>6.3f}"
            )


def replay(experiment: str, tracking_uri: str, baseline: str, first: int, cap: int | None) -> None:
    from analysis.decisions import comparison_deltas
    from analysis.load import load_experiment
    from analysis.pairing import pair_runs
    from analysis.stats import holm

    pairing = pair_runs(load_experiment(experiment, tracking_uri).runs, baseline=baseline)
    deltas = comparison_deltas(pairing)
    states = replay_adaptive(deltas, first=first, alpha=ALPHA, max_seeds=cap)
    names = list(deltas)
    p = [wilcoxon_signed_rank([d for d in deltas[n] if d is not None]).pvalue for n in names]
    fixed = dict(zip(names, holm(p), strict=True))
    seeds = max(len(r) for r in deltas.values())
    print(
        f"== replay on {experiment}: {len(names)} comparisons, {seeds} seeds logged, "
        f"adaptive first {first}, cap {cap or seeds}, alpha {ALPHA}"
    )
    used_total, agree = 0, 0
    for name in names:
        used = len(states[name])
        used_total += used
        final = states[name][-1]
        wilcoxon = "rejected" if fixed[name] <= ALPHA else "not rejected"
        same = (final in ("better", "worse")) == (fixed[name] <= ALPHA)
        agree += same
        print(
            f"  {name}: {final} after {used} seeds | fixed {seeds}: p Holm {fixed[name]:.4g} "
            f"({wilcoxon}){'' if same else '  DISAGREE'}"
        )
    print(
        f"  seeds used {used_total} of {seeds * len(names)} "
        f"({used_total / (seeds * len(names)):.0%}); decisions agree on {agree} of {len(names)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--experiment")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--baseline", default="add")
    parser.add_argument("--first", type=int, default=FIRST)
    parser.add_argument("--cap", type=int, default=None)
    args = parser.parse_args()
    if args.replay:
        replay(args.experiment, args.tracking_uri, args.baseline, args.first, args.cap)
        return
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    exactness()
    worst = validity(args.reps, rng)
    efficiency(args.reps, rng)
    print(f"\n({time.perf_counter() - started:.0f} s)")
    print(f"max type-I error {worst:.4f} (alpha {ALPHA})")


if __name__ == "__main__":
    main()
