"""fusion-ray's adaptive seeds beside what a researcher would reach for instead, on the same
paired-seed data: fixed n seeds with exact Wilcoxon and Holm, AdaStop (its own package),
Optuna's WilcoxonPruner used as the stopping rule it is, and Ray Tune's Repeater (the mean of
repeated seeds, compared at fixed n). Needs the ``bench`` extra (``pip install -e '.[bench]'``:
adastop).

The family: the quickstart's 6 operator comparisons (3 regimes x 2 settings, one operator
against the baseline in each group); effects in paired-delta SD: 2 nulls, 2 at 0.5 SD, 2 at 1
SD (a third of the family null, as the quickstart's unscaled short regime and the rest of the
study's AG News / IMDB). Noise models (a run = the group's per-seed part + its arm's effect + its
own noise, scaled so a paired delta has SD 1):

- ``normal``: normal run noise, no per-seed part;
- ``binomial``: test-set counts of 400 documents at 80 % accuracy (paired-delta SD 2.8 points);
- ``shared``: as normal plus a per-seed part of SD 2 shared by both arms of a group (data order,
  initialisation: it cancels in a paired delta, not in a difference of means);
- ``heavy``: t with 3 degrees of freedom, scaled to the same SD;
- ``replayed``: the README quickstart's 20 logged seeds (``bench/results/quickstart_20_seeds.csv``)
  drawn again whole, each seed's arms swapped at random (no effect left), each group divided by
  its paired-delta SD, the effects added.

The methods (alpha 0.05 for every one that has a level):

- fusion-ray: the default rule (magnitude bets, closed test over the family, futility), first
  wave 6 seeds, cap 14 (``fusion_ray.decide.sequential.replay_adaptive``, the driver's rule);
- fixed n in {6, 8, 10, 14} + two-sided exact Wilcoxon signed-rank + Holm over the family;
- AdaStop 0.1.3 (``adastop.MultipleAgentsComparator``): n = 2 seeds per look, K = 7 looks (cap
  14, the same as fusion-ray's), B = 10,000 permutations (its default), beta = 0, the 6
  comparisons given; it compares agents' means, unpaired; and at its documented n = 5, K = 5
  (cap 25 seeds);
- Optuna's ``WilcoxonPruner`` (p_threshold 0.1, its default): the baseline's run of each seed
  reported as a finished trial's steps, the operator's reported step by step and pruned when
  the pruner says so, which it does only for an operator worse than the best trial: a prune is
  the decision "worse"; it never says "better"; no error control over steps or comparisons;
- Ray Tune's ``Repeater`` at n = 10: the mean of the repeats is all the searcher sees, so the
  higher mean is taken as the better (every comparison "decided", nulls included);
- a paired group-sequential design (``paired_group_sequential``): AdaStop's looks, spending and
  step-down on paired deltas with sign-flip permutations, the route the pilot pointed at.

The oracle ceiling beside each method: an allocator that knows the effects gives no seed to a
null and splits the method's mean trials between the 0.5-SD and the 1-SD comparisons as best
it can, tested as fixed n is (exact Wilcoxon, Holm over all 6); the split is chosen on the same
families it is scored on, so it is an upper bound for fixed-n allocation, not a method.

Counted per replication: correct decisions (the right direction on a non-null), the family-wise
error (any decision on a null, or a wrong direction), trials (runs); and correct decisions per
100 trials, so designs of different cost compare at matched trials.

    python bench/peers.py [--reps 100] [--processes 2] [--methods A,B] [--null]
    python bench/peers.py --adastop-level 300
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptive import REPLAY_CSV, read_runs  # noqa: E402  (bench/adaptive.py)

from fusion_ray.decide.sequential import replay_adaptive  # noqa: E402

ALPHA, FIRST, CAP = 0.05, 6, 14
LONG = 25  # AdaStop's documented n = 5, K = 5 needs 25 seeds
EFFECTS = np.array([0.0, 0.0, 0.5, 0.5, 1.0, 1.0])
NOISE = ("normal", "binomial", "shared", "heavy", "replayed")
FIXED = (6, 8, 10, 14)
TEST_DOCS, ACCURACY = 400, 0.80


@functools.cache
def logged() -> tuple[np.ndarray, np.ndarray]:
    """The quickstart's 20 logged seeds (``REPLAY_CSV``, read by ``adaptive.read_runs``):
    (baseline, operator) test accuracy [group, seed] of its 6 groups, each divided by its
    group's paired-delta SD."""
    runs, baselines = read_runs(REPLAY_CSV)
    groups = list(baselines)
    seeds = sorted(runs[groups[0], baselines[groups[0]]])
    other = {g: next(f for h, f in runs if h == g and f != baselines[g]) for g in groups}
    base = np.array([[runs[g, baselines[g]][s] for s in seeds] for g in groups])
    op = np.array([[runs[g, other[g]][s] for s in seeds] for g in groups])
    sd = (op - base).std(axis=1, ddof=1)[:, None]
    return base / sd, op / sd


def draw(kind: str, rng: np.random.Generator, seeds: int = CAP) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, operator) runs [group, seed], scaled so a paired delta has SD 1. ``replayed``:
    the quickstart's logged seeds drawn again whole (the same logged seed for every group of a
    drawn seed, so what a seed shares across groups stays), each seed's two arms swapped with
    probability 1/2 (its delta's sign a fair coin: no effect left), the effects then added."""
    shape = (len(EFFECTS), seeds)
    if kind == "replayed":
        base_log, op_log = logged()
        pick = rng.integers(base_log.shape[1], size=seeds)
        swap = rng.random(seeds) < 0.5
        base, op = base_log[:, pick], op_log[:, pick]
        base, op = np.where(swap, op, base), np.where(swap, base, op)
        return base, op + EFFECTS[:, None]
    if kind == "binomial":
        sd = np.sqrt(2 * ACCURACY * (1 - ACCURACY) / TEST_DOCS)
        p_op = ACCURACY + EFFECTS[:, None] * sd
        base = rng.binomial(TEST_DOCS, ACCURACY, shape) / TEST_DOCS / sd
        op = rng.binomial(TEST_DOCS, np.broadcast_to(p_op, shape)) / TEST_DOCS / sd
        return base, op
    if kind == "heavy":
        e0, e1 = (rng.standard_t(3, shape) / np.sqrt(3) / np.sqrt(2) for _ in range(2))
    else:
        e0, e1 = (rng.normal(0, 1 / np.sqrt(2), shape) for _ in range(2))
    common = rng.normal(0, 2.0, shape) if kind == "shared" else 0.0
    return common + e0, common + EFFECTS[:, None] + e1


def score(decisions: list[int]) -> tuple[int, bool]:
    """decisions per comparison: +1 better, -1 worse, 0 none -> (correct, family-wise error)."""
    truth = np.sign(EFFECTS)
    correct = sum(1 for d, t in zip(decisions, truth, strict=True) if d != 0 and d == t)
    wrong = any(d != 0 and d != t for d, t in zip(decisions, truth, strict=True))
    return correct, wrong


def fusion_ray(base: np.ndarray, op: np.ndarray, first: int = FIRST) -> tuple[list[int], int]:
    deltas = {f"c{g}": list(op[g] - base[g]) for g in range(len(EFFECTS))}
    states = replay_adaptive(deltas, first=first, max_seeds=CAP)
    sign = {"better": 1, "worse": -1}
    decisions = [sign.get(states[f"c{g}"][-1], 0) for g in range(len(EFFECTS))]
    return decisions, 2 * sum(len(s) for s in states.values())


def holm(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p)
    reject = np.zeros(len(p), bool)
    for rank, i in enumerate(order):
        if p[i] > ALPHA / (len(p) - rank):
            break
        reject[i] = True
    return reject


def fixed(base: np.ndarray, op: np.ndarray, n: int) -> tuple[list[int], int]:
    d = op[:, :n] - base[:, :n]
    p = np.array([wilcoxon(row, method="exact").pvalue if np.any(row) else 1.0 for row in d])
    reject = holm(p)
    decisions = [int(np.sign(np.median(row))) if r else 0 for row, r in zip(d, reject, strict=True)]
    return decisions, 2 * d.size


def adastop(
    base: np.ndarray, op: np.ndarray, seed: int, n: int = 2, looks: int = CAP // 2
) -> tuple[list[int], int]:
    from adastop import MultipleAgentsComparator

    comparisons = np.array([(2 * g, 2 * g + 1) for g in range(len(EFFECTS))])
    comparator = MultipleAgentsComparator(
        n=n, K=looks, B=10_000, comparisons=comparisons, alpha=ALPHA, beta=0, seed=seed
    )
    runs = [row for g in range(len(EFFECTS)) for row in (base[g], op[g])]
    values = {f"agent{j}": np.zeros(0) for j in range(len(runs))}
    trials = 0
    for k in range(looks):
        for j, name in enumerate(values):
            wanted = k == 0 or any(j in pair for pair in comparator.current_comparisons)
            block = runs[j][k * n : (k + 1) * n] if wanted else np.full(n, np.nan)
            trials += n if wanted else 0
            values[name] = np.concatenate([values[name], block])
        comparator.partial_compare(values, verbose=False)
        if comparator.is_finished:
            break
    # "smaller": the first agent (the baseline) has the smaller mean: the operator is better
    sign = {"smaller": 1, "larger": -1}
    decisions = [sign.get(comparator.decisions[str(pair)], 0) for pair in comparisons]
    return decisions, trials


def adastop_level(reps: int, comparisons: int = 1, n: int = 5, looks: int = 5) -> int:
    """AdaStop alone, outside this harness: ``comparisons`` pairs of agents with no difference
    (normal runs), every agent given every look's runs (no agent left out once its comparison
    ends), at its documented n = 5, K = 5: the number of the ``reps`` families with any
    decision, where alpha 0.05 would give 0.05 x reps."""
    from adastop import MultipleAgentsComparator

    pairs = np.array([(2 * g, 2 * g + 1) for g in range(comparisons)])
    decided = 0
    for seed in range(reps):
        runs = np.random.default_rng(seed).normal(size=(2 * comparisons, n * looks))
        comparator = MultipleAgentsComparator(
            n=n, K=looks, B=10_000, comparisons=pairs, alpha=ALPHA, beta=0, seed=seed
        )
        for k in range(looks):
            seen = {f"agent{j}": runs[j, : (k + 1) * n] for j in range(len(runs))}
            comparator.partial_compare(seen, verbose=False)
            if comparator.is_finished:
                break
        decided += any(comparator.decisions[str(pair)] in ("smaller", "larger") for pair in pairs)
    return decided


def wilcoxon_pruner(base: np.ndarray, op: np.ndarray) -> tuple[list[int], int]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    decisions, trials = [], 0
    for g in range(len(EFFECTS)):
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.WilcoxonPruner())
        reference = study.ask()
        for step in range(CAP):
            reference.report(float(base[g, step]), step)
        study.tell(reference, float(base[g].mean()))
        trial, decided, steps = study.ask(), 0, CAP
        for step in range(CAP):
            trial.report(float(op[g, step]), step)
            if trial.should_prune():
                decided, steps = -1, step + 1
                break
        study.tell(
            trial,
            state=optuna.trial.TrialState.PRUNED if decided else None,
            values=None if decided else float(op[g, :steps].mean()),
        )
        decisions.append(decided)
        trials += CAP + steps
    return decisions, trials


def step_down_look(
    observed: np.ndarray,
    null: np.ndarray,
    alive: np.ndarray,
    spent: float,
    level: float,
    active: list[int],
) -> tuple[list[int], float, np.ndarray]:
    """One look of a group-sequential design with a max statistic (AdaStop's): the hypotheses of
    ``active`` whose ``observed`` statistic crosses the boundary, step-down (the boundary found
    again over the rest after each crossing), then what the look spends: the permutations
    (``null`` [b, hypotheses], ``alive``: those across no earlier boundary) newly across the
    boundary of every active one. The boundary is the smallest value whose exceedances among the
    live permutations keep the level spent so far at ``level``. Returns (crossed, spent, alive)."""
    b, rest, crossed = len(alive), list(active), []

    def boundary(top: np.ndarray) -> float:
        stats = np.sort(top[alive])[::-1]
        room = int(np.floor((level - spent) * b))
        return stats[room] if 0 <= room < len(stats) else np.inf

    while rest:
        threshold = boundary(null[:, rest].max(axis=1))
        winners = [h for h in rest if observed[h] > threshold]
        if not winners:
            break
        crossed += winners
        rest = [h for h in rest if h not in winners]
    if active:
        top = null[:, active].max(axis=1)
        newly = alive & (top > boundary(top))
        spent += newly.sum() / b
        alive = alive & ~newly
    return crossed, spent, alive


def paired_group_sequential(
    base: np.ndarray, op: np.ndarray, seed: int, n: int = 2, looks: int = CAP // 2, b: int = 4000
) -> tuple[list[int], int]:
    """What the pilot pointed at, measured: AdaStop's design (K looks of n seeds, alpha spent
    linearly over the looks, a max statistic over the open comparisons, step-down within a look)
    on paired deltas: each comparison's statistic |sum d| over its seeds so far (AdaStop's
    (k + 1) x |mean difference|), its null distribution from sign flips of whole seeds (the
    pairing kept), b of them."""
    d = op - base
    groups = d.shape[0]
    flips = np.random.default_rng(seed).choice([-1.0, 1.0], size=(b, 1, looks * n))
    alive = np.ones(b, bool)  # permutations that crossed no earlier boundary
    open_, decisions, spent, trials = list(range(groups)), [0] * groups, 0.0, 0
    for k in range(looks):
        seen = (k + 1) * n
        trials += 2 * n * len(open_)
        x = d[:, :seen]
        null = np.abs((flips[:, :, :seen] * x[None]).sum(axis=2))  # [b, groups]
        crossed, spent, alive = step_down_look(
            np.abs(x.sum(axis=1)), null, alive, spent, ALPHA * (k + 1) / looks, open_
        )
        for g in crossed:
            decisions[g] = int(np.sign(x[g].sum()))
        open_ = [g for g in open_ if g not in crossed]
        if not open_:
            break
    return decisions, trials


# none, or 8-25: an exact Wilcoxon + Holm over 6 decides nothing below 8 seeds
ORACLE_SEEDS = (0, *range(8, LONG + 1))


def oracle_table(base: np.ndarray, op: np.ndarray) -> np.ndarray:
    """The allocator that knows the effects: no seed to a null, n_half seeds to each 0.5-SD
    comparison and n_one to each 1-SD one, tested as fixed n is (exact two-sided Wilcoxon, Holm
    over all 6: the test does not know which are null; 0 seeds, never decided). Correct decisions for every (n_half,
    n_one) in ORACLE_SEEDS x ORACLE_SEEDS; ``ceiling`` picks the best split within a budget."""
    d = op - base
    truth = np.sign(EFFECTS)
    p = {  # comparison -> n -> (p, sign)
        g: {
            n: (wilcoxon(d[g, :n], method="exact").pvalue, np.sign(np.median(d[g, :n])))
            if n and np.any(d[g, :n])
            else (1.0, 0.0)
            for n in ORACLE_SEEDS
        }
        for g in range(len(EFFECTS))
        if EFFECTS[g] != 0
    }
    table = np.zeros((len(ORACLE_SEEDS), len(ORACLE_SEEDS)))
    for i, n_half in enumerate(ORACLE_SEEDS):
        for j, n_one in enumerate(ORACLE_SEEDS):
            seeds = {g: n_half if EFFECTS[g] < 1 else n_one for g in p}
            pvalues = np.ones(len(EFFECTS))
            for g, n in seeds.items():
                pvalues[g] = p[g][n][0]
            reject = holm(pvalues)
            table[i, j] = sum(1 for g, n in seeds.items() if reject[g] and p[g][n][1] == truth[g])
    return table


def ceiling(tables: np.ndarray, budget: float) -> tuple[float, int, int, int]:
    """The oracle's best mean correct decisions within ``budget`` trials: (correct, trials,
    n_half, n_one), the split chosen on the same families it is scored on (a ceiling)."""
    mean = tables.mean(axis=0)
    best = (0.0, 0, 0, 0)
    for i, n_half in enumerate(ORACLE_SEEDS):
        for j, n_one in enumerate(ORACLE_SEEDS):
            trials = 2 * 2 * (n_half + n_one)  # two comparisons at each size, two arms each
            if trials <= budget and mean[i, j] > best[0]:
                best = (float(mean[i, j]), trials, n_half, n_one)
    return best


def repeater(base: np.ndarray, op: np.ndarray, n: int = 10) -> tuple[list[int], int]:
    means = op[:, :n].mean(axis=1) - base[:, :n].mean(axis=1)
    return [int(np.sign(m)) for m in means], 2 * op[:, :n].size


METHODS = [
    "fusion-ray",
    *(f"fixed {n} + Holm" for n in FIXED),
    "AdaStop n=2 K=7",
    "AdaStop n=5 K=5",
    "WilcoxonPruner",
    "Repeater n=10",
]


def _methods(
    base: np.ndarray, op: np.ndarray, r: int, long: tuple[np.ndarray, np.ndarray]
) -> dict[str, Callable[[], tuple[list[int], int]]]:
    """Each method on one family's runs, to be called (only the chosen ones run); ``long``: the
    same runs with seeds up to LONG, for AdaStop's documented n = 5, K = 5."""
    return {
        "fusion-ray": lambda: fusion_ray(base, op),
        **{f"fusion-ray first {k}": (lambda k=k: fusion_ray(base, op, k)) for k in (3, 4, 8)},
        **{f"fixed {n} + Holm": (lambda n=n: fixed(base, op, n)) for n in FIXED},
        "AdaStop n=2 K=7": lambda: adastop(base, op, seed=r),
        "AdaStop n=5 K=5": lambda: adastop(*long, seed=r, n=5, looks=5),
        "paired GS n=2 K=7": lambda: paired_group_sequential(base, op, seed=r),
        "WilcoxonPruner": lambda: wilcoxon_pruner(base, op),
        "Repeater n=10": lambda: repeater(base, op),
    }


def replicate(
    args: tuple[str, int, int, list[str]],
) -> tuple[dict[str, list[tuple[int, bool, int]]], np.ndarray]:
    """``reps`` families of one noise model through the ``methods`` (every method sees the same
    data: the draws do not depend on which methods run; seeds 15-25 come from a stream of their
    own, so the first 14 are those of runs without them), and the oracle's table per family."""
    kind, reps, seed, methods = args
    logging.disable(logging.WARNING)
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[int, bool, int]]] = {m: [] for m in methods}
    tables = []
    for r in range(reps):
        base, op = draw(kind, rng)
        more = draw(kind, np.random.default_rng([seed, r]), seeds=LONG - CAP)
        long = (np.hstack([base, more[0]]), np.hstack([op, more[1]]))
        runs = _methods(base, op, r, long)
        for method in methods:
            decisions, trials = runs[method]()
            correct, wrong = score(decisions)
            out[method].append((correct, wrong, trials))
        tables.append(oracle_table(*long))
    return out, np.array(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="a comma-separated subset (same data)"
    )
    parser.add_argument(
        "--null", action="store_true", help="every effect 0: the family-wise error alone"
    )
    parser.add_argument("--noises", default=",".join(NOISE), help="a comma-separated subset")
    parser.add_argument(
        "--adastop-level",
        type=int,
        metavar="REPS",
        help="only AdaStop's own level: one null comparison, n = 5, K = 5, REPS families",
    )
    args = parser.parse_args()
    if args.adastop_level:
        logging.disable(logging.WARNING)
        decided = adastop_level(args.adastop_level)
        print(
            f"AdaStop n=5 K=5, one comparison with no difference, normal runs, alpha {ALPHA}: "
            f"{decided} of {args.adastop_level} families decided ({decided / args.adastop_level:.3f})"
        )
        return
    if args.null:  # before the pool: its workers are forked with it
        global EFFECTS
        EFFECTS = np.zeros(len(EFFECTS))
    methods = [m.strip() for m in args.methods.split(",")]
    started = time.perf_counter()
    chosen = [kind.strip() for kind in args.noises.split(",")]
    jobs = [
        (kind, args.reps, args.seed + i, methods) for i, kind in enumerate(NOISE) if kind in chosen
    ]
    with Pool(args.processes) as pool:
        results = pool.map(replicate, jobs)
    print(
        f"peers: 6 operator comparisons (effects {', '.join(f'{e:g}' for e in EFFECTS)} paired "
        f"SD), {args.reps} replications per noise model, alpha {ALPHA}"
    )
    for (kind, *_), (result, tables) in zip(jobs, results, strict=True):
        print(f"\nnoise {kind}")
        print(
            f"{'method':<18} {'correct of 4':>12} {'FWER':>6} {'trials':>7} "
            f"{'correct / 100 trials':>21}  oracle within its trials (n 0.5 SD / 1 SD)"
        )
        for method in methods:
            rows = np.array(result[method], dtype=float)
            correct, wrong, trials = rows.mean(axis=0)
            best, _, n_half, n_one = ceiling(tables, trials)
            oracle = f"{best:.2f} ({n_half} / {n_one})" if best else "-"
            print(
                f"{method:<18} {correct:>12.2f} {wrong:>6.3f} {trials:>7.1f} "
                f"{100 * correct / trials:>21.2f}  {oracle}"
            )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
