"""The study's whole question family beside the designs that can decide it: the quickstart's
design (``bench/questions.py``: 3 regimes x 2 setting arms x baseline and one operator, 12 arms;
6 operator comparisons, 2 length trends, 3 interactions, m = 11) with the length trend of
``questions.TRENDS`` planted in arm A.

AdaStop, Optuna's WilcoxonPruner and Ray Tune's Repeater compare two arms' means and have no
contrasts, so they are not here (``bench/peers.py`` measures them on operator comparisons). Here:

- fusion-ray: the shipped rule on the whole family (``questions.simulate``: magnitude bets,
  one closed test at every look, futility), first wave 6, cap 20;
- fixed n in {6, 8, 10, 14, 20} seeds of every arm + exact two-sided Wilcoxon of every
  hypothesis + Holm over the 11;
- a paired group-sequential design on the family: 10 looks of 2 seeds (cap 20), alpha spent
  linearly, at each look a max statistic over the open hypotheses with step-down; each
  hypothesis's statistic is its self-normalised sum (sum / root of the sum of squares of its
  values so far: contrasts and comparisons of different spread on one scale), its null from
  2,000 sign flips of whole seeds (every hypothesis of a seed flipped together: the arms of
  every group swapped at once, which keeps the dependence between hypotheses that share arms);
  an arm runs at a look while any open hypothesis needs it;
- the oracle ceiling: an allocator that knows which hypotheses are null gives them no seeds and
  gives each kind of real effect (operator, length, interaction) its own n in {8, 10, ..., 30},
  an arm running as long as its longest hypothesis; tested as fixed n is (Holm over all 11); the
  best split within a method's mean trials, chosen on the same families it is scored on.

Counted per family: correct decisions (a real effect decided in its direction), the family-wise
error (a decision on a null hypothesis, or a wrong direction), trials (distinct arm-seed runs).

    python bench/family_peers.py [--reps 1000] [--seed 0]
    python bench/family_peers.py --full-grid 0.3 --reps 100   # the full grid's own family
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import questions  # noqa: E402  (bench/questions.py)
from peers import step_down_look  # noqa: E402  (bench/peers.py)

ALPHA, CAP = 0.05, 20
FIXED = (6, 8, 10, 14, 20)
ORACLE_SEEDS = (8, 10, 12, 14, 16, 18, 20, 25, 30)
NOISES = ("normal", "binomial", "t3")
KINDS = ("operator", "length", "interaction")


def outcome(decided: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correct [F], family-wise error [F]) of decisions [F, m] (+1, -1, 0) against ``true``."""
    correct = ((decided == true) & (true != 0)).sum(axis=1)
    wrong = ((decided != 0) & (decided != true)).any(axis=1)
    return correct, wrong


def fixed(fam: questions.Family, d: np.ndarray, n: int) -> np.ndarray:
    return questions.fixed_wilcoxon(d, n, ALPHA)


def group_sequential(
    fam: questions.Family, d: np.ndarray, rng: np.random.Generator, n: int = 2, b: int = 2000
) -> tuple[np.ndarray, np.ndarray]:
    """Decisions [F, m] and trials [F] of the paired group-sequential design (module docstring)."""
    families, m, _ = d.shape
    looks = CAP // n
    touches = fam.signs != 0  # [m, arms]
    decided = np.zeros((families, m), dtype=int)
    trials = np.zeros(families)
    for f in range(families):
        flips = rng.choice([-1.0, 1.0], size=(b, CAP))
        alive = np.ones(b, bool)  # flips that crossed no earlier boundary
        spent, open_ = 0.0, list(range(m))
        for k in range(looks):
            seen = (k + 1) * n
            trials[f] += n * touches[open_].any(axis=0).sum()
            x = d[f, :, :seen]
            norm = np.sqrt((x**2).sum(axis=1))
            with np.errstate(divide="ignore", invalid="ignore"):
                observed = np.where(norm > 0, np.abs(x.sum(axis=1)) / norm, 0.0)
                null = np.where(norm > 0, np.abs(flips[:, :seen] @ x.T) / norm, 0.0)  # [b, m]
            crossed, spent, alive = step_down_look(
                observed, null, alive, spent, ALPHA * (k + 1) / looks, open_
            )
            for h in crossed:
                decided[f, h] = int(np.sign(x[h].sum()))
            open_ = [h for h in open_ if h not in crossed]
            if not open_:
                break
    return decided, trials


def oracle_table(
    fam: questions.Family, d: np.ndarray, true: np.ndarray
) -> dict[tuple[int, ...], tuple[float, float]]:
    """(n per kind) -> (mean correct, trials) of the allocator that knows the effects."""
    tests = {n: questions.exact_p(d, n) for n in ORACLE_SEEDS}
    kinds = np.array([KINDS.index(k) for k in fam.kinds])
    real = true != 0
    touches = fam.signs != 0
    out = {}
    for split in itertools.product(ORACLE_SEEDS, repeat=len(KINDS)):
        seeds = np.where(real, np.array(split)[kinds], 0)  # [m]
        if not real.any():
            break
        p = np.ones(d.shape[:2])
        sign = np.zeros(d.shape[:2])
        for n in set(seeds[real].tolist()):
            at = seeds == n
            p[:, at], sign[:, at] = tests[n][0][:, at], tests[n][1][:, at]
        decided = np.where(questions.holm_reject(p, ALPHA), sign, 0).astype(int)
        correct, _ = outcome(decided, true)
        trials = np.where(touches, seeds[:, None], 0).max(axis=0).sum()
        out[split] = (float(correct.mean()), float(trials))
    return out


def ceiling(table: dict[tuple[int, ...], tuple[float, float]], budget: float) -> str:
    within = [(c, t, s) for s, (c, t) in table.items() if t <= budget]
    if not within:
        return "-"
    correct, trials, split = max(within)
    return f"{correct:.2f} in {trials:.0f} (n {'/'.join(map(str, split))})"


def matched(rows: dict[str, tuple[float, float, float]], trials: float) -> float:
    """Fixed n + Holm's correct decisions interpolated at ``trials`` (nan outside its range)."""
    points = sorted((t, c) for name, (c, _, t) in rows.items() if name.startswith("fixed"))
    ts, cs = zip(*points, strict=True)
    return float(np.interp(trials, ts, cs)) if ts[0] <= trials <= ts[-1] else float("nan")


def scenario(trend: str, noise: str, reps: int, rng: np.random.Generator) -> None:
    fam = questions.family()
    effects = questions.TRENDS[trend]
    true = np.sign(questions.truth(fam, effects)).astype(int)
    d = questions.values(fam, questions.scores(effects, reps, max(ORACLE_SEEDS), rng, noise))
    rows: dict[str, tuple[float, float, float]] = {}
    state, used, _ = questions.simulate(fam, d, CAP)
    decided = np.where(np.isin(state, (questions.BETTER, questions.WORSE)), state, 0)
    correct, wrong = outcome(decided, true)
    rows["fusion-ray"] = (correct.mean(), wrong.mean(), questions.trials(fam, used).mean())
    for n in FIXED:
        correct, wrong = outcome(fixed(fam, d, n), true)
        rows[f"fixed {n} + Holm"] = (correct.mean(), wrong.mean(), float(n * len(questions.ARMS)))
    gs, gs_trials = group_sequential(fam, d, rng)
    correct, wrong = outcome(gs, true)
    rows["paired GS n=2 K=10"] = (correct.mean(), wrong.mean(), gs_trials.mean())
    table = oracle_table(fam, d, true)
    print(f"\ntrend {trend}, noise {noise}: {int((true != 0).sum())} real effects of {fam.m}")
    print(f"{'method':<20} {'correct':>7} {'FWER':>6} {'trials':>7} {'per 100':>7} "
          f"{'fixed n at its trials':>21}  oracle within its trials")  # fmt: skip
    for name, (correct, wrong, trials) in rows.items():
        at = matched(rows, trials)
        ratio = f"{at:.2f} ({correct / at:.2f}x)" if at > 0 else "-"
        print(f"{name:<20} {correct:>7.2f} {wrong:>6.3f} {trials:>7.1f} "
              f"{100 * correct / trials:>7.2f} {ratio:>21}  {ceiling(table, trials)}")  # fmt: skip


STUDY_EFFECTS = {  # the study's Table 1 and 2 (points against add), as docs/how-to/plan.md
    "ag_news/concat": -0.22,
    "ag_news/gate_scalar": -0.08,
    "imdb/concat": 0.5,
    "imdb/gate_scalar": 0.12,
    "arxiv/concat": 4.22,
    "arxiv/gate_scalar": 6.51,
    "arxiv/gate_cnn": 2.0,
}


def full_grid(reps: int, spread: float, seed: int) -> None:
    """``sweeps/full_grid.yaml``'s own family (the engine's cells and hypotheses, m = 19) on
    runs from the study's effects with SD ``spread``: fusion-ray's schedule run to its end
    (``SeedSchedule``, as ``fusion-ray plan`` runs it) against fixed n + Holm on the same runs."""
    from scipy.stats import wilcoxon

    from fusion_ray import api
    from fusion_ray.config.grid import expand
    from fusion_ray.policy.schedule import SeedSchedule, arm_of
    from fusion_ray.study.forecast import StatedWorld

    spec = api.load(ROOT.parent / "sweeps" / "full_grid.yaml", ["seeds={adaptive: true, max: 20}"])
    assert spec.adaptive is not None
    cells, regimes = expand(spec), list(spec.grid.datasets)
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    world = StatedWorld(STUDY_EFFECTS, spread=spread)
    family = SeedSchedule(cells, spec.baseline_label, spec.adaptive, {}, regimes=regimes).family
    true = np.array(
        [np.sign(round(sum(s * world.effect(a) for a, s, _ in h.terms), 9)) for h in family]
    )
    rng = np.random.default_rng(seed)
    rows: dict[str, list[tuple[int, bool, int]]] = {"fusion-ray": []}
    for _ in range(reps):
        at = world.replay(rng, arms)
        results: dict = {}
        schedule = SeedSchedule(cells, spec.baseline_label, spec.adaptive, results, regimes=regimes)
        while needed := schedule.needed():
            results.update({c.cell_id: at(c.seed)[arm_of(c)] for c in needed})
        states = schedule.states()
        sign = {"better": 1, "worse": -1}
        decided = np.array(
            [[sign.get(states[h.name][-1] if states[h.name] else "", 0) for h in family]]
        )
        correct, wrong = outcome(decided, true[None, :])
        rows["fusion-ray"].append((int(correct[0]), bool(wrong[0]), len(results)))
        for n in FIXED:
            rule = spec.adaptive.model_copy(update={"max": n})
            known = {c.cell_id: at(c.seed)[arm_of(c)] for c in cells if c.seed < n}
            values = SeedSchedule(cells, spec.baseline_label, rule, known, regimes=regimes).deltas()
            p = np.array([[wilcoxon(values[h.name], method="exact").pvalue for h in family]])
            med = np.array([[np.sign(np.median(values[h.name])) for h in family]])
            decided = np.where(questions.holm_reject(p, ALPHA), med, 0).astype(int)
            correct, wrong = outcome(decided, true[None, :])
            trials = sum(1 for c in cells if c.seed < n)
            rows.setdefault(f"fixed {n} + Holm", []).append(
                (int(correct[0]), bool(wrong[0]), trials)
            )
    print(f"\nsweeps/full_grid.yaml's family: {len(family)} hypotheses, {int((true != 0).sum())} "
          f"real effects (the study's Table 1/2), run SD {spread:g} points, {reps} sweeps")  # fmt: skip
    means = {name: tuple(np.array(r, dtype=float).mean(axis=0)) for name, r in rows.items()}
    print(
        f"{'method':<20} {'correct':>7} {'FWER':>6} {'trials':>7} {'per 100':>7} {'fixed n at its trials':>21}"
    )
    for name, (correct, wrong, trials) in means.items():
        at_trials = matched({k: v for k, v in means.items()}, trials)
        ratio = f"{at_trials:.2f} ({correct / at_trials:.2f}x)" if at_trials > 0 else "-"
        print(
            f"{name:<20} {correct:>7.2f} {wrong:>6.3f} {trials:>7.1f} {100 * correct / trials:>7.2f} {ratio:>21}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trends", default=",".join(questions.TRENDS))
    parser.add_argument("--noises", default=",".join(NOISES))
    parser.add_argument(
        "--full-grid",
        type=float,
        metavar="SD",
        help="only sweeps/full_grid.yaml's family on the study's effects, run SD in points",
    )
    args = parser.parse_args()
    if args.full_grid is not None:
        started = time.perf_counter()
        full_grid(args.reps, args.full_grid, args.seed)
        print(f"\n{time.perf_counter() - started:.0f} s")
        return
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(f"the quickstart's whole family (m = 11), {args.reps} families each, alpha {ALPHA}")
    for trend in args.trends.split(","):
        for noise in args.noises.split(","):
            scenario(trend, noise, args.reps, rng)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
