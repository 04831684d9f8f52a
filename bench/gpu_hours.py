"""GPU-hours of a sweep file from measured epoch times (no GPU needed to run this).

Reads the H100 measurements in ``bench/results/`` (``epoch_profile.py``'s run 6 of 2026-11-23,
every variant of every preset in one run: ``graphs`` for a preset with ``train.cuda_graphs``,
``lean`` (the loop's eager step) otherwise; and ``packing.py``) and the cells of the sweep
file, then:

- per trial, alone on one H100: epochs x (training + validation + checkpoint) + one test pass
  (the validation pass scaled to the test split's size). ``epochs`` is the preset's maximum: early
  stopping (ArXiv's patience 4) can only make it shorter, so this is an upper bound;
- card-hours: trials of a dataset packed ``k`` to a card take 1 / (measured aggregate speed-up
  at ``k``) of a card each, where that packing was measured (AG News eager and with graphs,
  IMDB eager); elsewhere one trial per card;
- the cluster of ``cluster.yaml`` (A10G GPUs): nothing was measured on an A10G, so H100 card-hours
  are multiplied by a range of published ratios, H100 SXM / A10: memory bandwidth 3.35 / 0.6 TB/s
  = 5.6x and dense bf16 tensor peak 989 / 125 TFLOP/s = 7.9x (NVIDIA's data sheets; AWS's A10G
  is the A10's data-centre variant). That assumes every step is GPU-bound, which holds for ArXiv
  (72-100 % busy on the H100) and for AG News and IMDB with graphs (79-82 %); packing on an
  A10G is assumed to gain nothing.

    python bench/gpu_hours.py [sweeps/full_grid.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusion_ray.config import load_sweep  # noqa: E402
from fusion_ray.grid import expand  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EPOCH_PROFILE = RESULTS / "h100_2026-11-23" / "epoch_profile_run6.json"
PACKING = {  # (dataset, cuda_graphs): packing.py's measurement
    ("ag_news", False): RESULTS / "h100_2026-11-22" / "packing.json",
    ("ag_news", True): RESULTS / "h100_2026-11-23" / "packing_ag_news_graphs.json",
    ("imdb", False): RESULTS / "h100_2026-11-23" / "packing_imdb.json",
}
# The study's split sizes (bench/study_data.py): validation is what the epoch profile timed.
TEST_DOCS = {"ag_news": 7_600, "imdb": 25_000, "arxiv": 2_500}
A10G_RATIO = (3.35 / 0.6, 989 / 125)  # H100 SXM / A10: HBM bandwidth, dense bf16 peak
CLUSTER_GPUS = 8 * 1 + 2 * 4  # cluster.yaml: up to 8 gpu_1x and 2 gpu_4x nodes


def measured_epochs() -> dict[tuple[str, str], dict]:
    """The plain run of each (preset, variant) in the epoch profile."""
    return {
        (run["preset"], run["variant"]): {**run, "source": EPOCH_PROFILE.name}
        for run in json.loads(EPOCH_PROFILE.read_text())["runs"]
        if run.get("mode") == "plain" and "error" not in run
    }


def packing_speedup(dataset: str, graphs: bool, trials: int) -> float | None:
    path = PACKING.get((dataset, graphs))
    if path is None:
        return None
    for row in json.loads(path.read_text())["runs"]:
        if row["mode"] == "time-slicing" and row["trials"] == trials:
            return row["vs_one_trial"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", nargs="?", default=str(ROOT / "sweeps" / "full_grid.yaml"))
    args = parser.parse_args()
    spec = load_sweep(args.sweep)
    cells = Counter(cell.dataset for cell in expand(spec))
    epochs = measured_epochs()
    total_card_s = 0.0
    print(
        f"{spec.name}: {sum(cells.values())} cells; H100 epoch times from "
        f"{EPOCH_PROFILE.relative_to(ROOT)}"
    )
    print(
        f"{'dataset':<8} {'cells':>5} {'epoch s':>8} {'epochs':>6} {'trial s':>8} "
        f"{'per card':>8} {'card h':>7}  step"
    )
    for dataset, n in cells.items():
        trial_spec = next(c for c in expand(spec) if c.dataset == dataset).trial.train
        run = epochs[(dataset, "graphs" if trial_spec.cuda_graphs else "lean")]
        val_docs = run["validation_docs"] / run["scale"]
        test_s = run["eval_seconds"] / run["scale"] * TEST_DOCS[dataset] / val_docs
        trial_s = trial_spec.epochs * run["epoch_seconds"] + test_s
        gpus = (spec.datasets[dataset].resources or spec.resources).gpus_per_worker
        per_card = round(1 / gpus) if gpus and gpus < 1 else 1
        speedup = (
            packing_speedup(dataset, trial_spec.cuda_graphs, per_card) if per_card > 1 else None
        )
        if speedup is None:
            per_card, speedup = 1, 1.0
        card_s = n * trial_s / speedup
        total_card_s += card_s
        print(
            f"{dataset:<8} {n:>5} {run['epoch_seconds']:>8.1f} {trial_spec.epochs:>6} "
            f"{trial_s:>8.0f} {per_card:>5} ({speedup:.2f}x) {card_s / 3600:>6.1f}  {run['variant']}"
        )
    hours = total_card_s / 3600
    low, high = (hours * r for r in A10G_RATIO)
    print(f"one H100: {hours:.1f} GPU-hours (upper bound: every trial runs all its epochs)")
    print(
        f"cluster.yaml (A10G, scaled {A10G_RATIO[0]:.1f}x-{A10G_RATIO[1]:.1f}x): {low:.0f}-{high:.0f} "
        f"A10G-hours, {low / CLUSTER_GPUS:.0f}-{high / CLUSTER_GPUS:.0f} h of wall time on its "
        f"{CLUSTER_GPUS} GPUs"
    )


if __name__ == "__main__":
    main()
