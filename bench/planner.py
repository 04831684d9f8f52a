"""How well ``fusion-ray plan --pilot`` foresees what an adaptive sweep then does: worlds with
known effects, a 6-seed pilot drawn from each, the planner's forecast from that pilot alone
(``fusion_ray.study.forecast``, the sweep's own schedule and rule), then the sweep itself
continued in the same world from the same pilot. Counted: how often the seeds a hypothesis was
decided after (or stopped, or left open at the cap) fell inside the forecast's 5-95 % band, how
often the sweep's trials did, and the forecast's probability to decide against how often it
was decided, by smoothing ``h`` of the pilot bootstrap.

The design is the quickstart's (``sweeps/quickstart.yaml``: 3 regimes x 2 settings x add /
gate_scalar, 11 hypotheses, seeds 6 to 14, alpha 0.05). A world: each group's operator effect
drawn from 0 / 2.5 / 5 / 10 points (a paired delta's SD is about 5), the same or different
across settings, a run's noise normal with SD 3.5 points or t with 3 degrees of freedom
scaled to it.

    python bench/planner.py [--worlds 40] [--replays 100] [--smoothing 0,0.5,1]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusion_ray.config import load_sweep  # noqa: E402
from fusion_ray.config.grid import expand  # noqa: E402
from fusion_ray.decide.questions import Arm  # noqa: E402
from fusion_ray.policy.schedule import SeedSchedule, arm_of  # noqa: E402
from fusion_ray.study.forecast import (  # noqa: E402
    PilotWorld,
    Row,
    decided_after,
    forecast,
    pilot_rows,
)

SD = 3.5
EFFECTS = (0.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class TruthWorld:
    """Runs of known means: base + the group's operator effect, plus normal or t3 noise."""

    means: dict[Arm, float]
    heavy: bool

    def replay(self, rng: np.random.Generator, arms: Sequence[Arm]) -> Callable[[int], Row]:
        drawn: dict[int, Row] = {}

        def noise() -> float:
            if self.heavy:
                return float(rng.standard_t(3)) * SD / np.sqrt(3.0)
            return float(rng.normal(0.0, SD))

        def at(seed: int) -> Row:
            if seed not in drawn:
                drawn[seed] = {a: (self.means[a] + noise()) / 100 for a in arms}
            return drawn[seed]

        return at


def world(arms: list[Arm], rng: np.random.Generator) -> TruthWorld:
    effects: dict[tuple, float] = {}
    for arm in arms:
        group = dict(arm.group)
        key = (group["dataset"], group.get("model.scale_embeddings"))
        if key not in effects:
            effects[key] = float(rng.choice(EFFECTS)) * float(rng.choice((-1, 1)))
    means = {}
    for arm in arms:
        group = dict(arm.group)
        key = (group["dataset"], group.get("model.scale_embeddings"))
        means[arm] = 80.0 + (effects[key] if arm.fusion != "add" else 0.0)
    return TruthWorld(means, heavy=bool(rng.integers(2)))


def actual(cells, spec, truth: TruthWorld, known: dict, rng) -> tuple[dict[str, int], dict, int]:
    """The sweep continued in the true world from its pilot: seeds per hypothesis, whether it
    was decided, trials."""
    results = dict(known)
    schedule = SeedSchedule(
        list(cells), spec.baseline_label, spec.adaptive, results, regimes=spec.grid.datasets
    )
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    at = truth.replay(rng, arms)
    # the pilot's seeds are the truth's own: continue with fresh seeds from the same world
    while needed := schedule.needed():
        for cell in needed:
            results[cell.cell_id] = at(cell.seed)[arm_of(cell)]
    deltas, states = schedule.deltas(), schedule.states()
    decided = {
        h: bool(states[h]) and states[h][-1] in ("better", "worse", "equivalent") for h in deltas
    }
    return {h: decided_after(states[h], len(deltas[h])) for h in deltas}, decided, len(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, default=40)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--smoothing", default="0,0.5,1")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    spec = load_sweep(ROOT / "sweeps" / "quickstart.yaml")
    cells = expand(spec)
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    first = spec.adaptive.first
    print(
        f"planner calibration: quickstart design, {args.worlds} worlds, pilot {first} seeds, "
        f"{args.replays} replays per forecast"
    )
    print("h     seeds in band  trials in band  P(decide) forecast / observed  s")
    for h in (float(x) for x in args.smoothing.split(",")):
        rng = np.random.default_rng(args.seed)
        inside = total = trials_in = 0
        forecast_p, observed_p = [], []
        started = time.perf_counter()
        for w in range(args.worlds):
            truth = world(arms, rng)
            at = truth.replay(rng, arms)
            pilot = {c.cell_id: at(c.seed)[arm_of(c)] for c in cells if c.seed < first}
            rows, known = pilot_rows(cells, pilot)
            fc = forecast(
                cells,
                spec.baseline_label,
                spec.adaptive,
                PilotWorld(rows, smoothing=h),
                regimes=spec.grid.datasets,
                known=known,
                replays=args.replays,
                seed=w,
            )
            seeds, decided, trials = actual(cells, spec, truth, known, rng)
            for hyp in fc.hypotheses:
                lo, hi = hyp.band
                inside += lo <= seeds[hyp.name] <= hi
                total += 1
                forecast_p.append(hyp.decided)
                observed_p.append(float(decided[hyp.name]))
            lo_t, hi_t = np.quantile(fc.trials, [0.05, 0.95])
            trials_in += lo_t <= trials <= hi_t
        print(
            f"{h:<5g} {inside / total:>13.0%}  {trials_in / args.worlds:>14.0%}  "
            f"{np.mean(forecast_p):>18.2f} / {np.mean(observed_p):.2f}  "
            f"{time.perf_counter() - started:>5.0f}"
        )


if __name__ == "__main__":
    main()
