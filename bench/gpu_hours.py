"""GPU-hours of a sweep file from measured epoch times (no GPU needed to run this).

Reads one machine's measurements in ``bench/results/`` (``--measured``; by default the H100 run of
2026-11-27, ``h100_2026-11-27/``; ``h200_2026-11-28/`` holds the same two files from an H200):
``epoch_profile.py``'s run
(``graphs`` for a preset with ``train.cuda_graphs``, ``lean`` (the profile's eager step)
otherwise), the loop's own epochs where ``loop_graphs.py`` measured them (ArXiv eager,
2026-11-27: the loop's eager ArXiv step is faster than the profile's ``lean``; then an epoch is
the loop's training time plus the profile's validation and checkpoint), ``packing.py``; and the
cells of the sweep file, then:

- per trial, alone on one card: epochs x (training + validation + checkpoint) + one test pass
  (the validation pass scaled to the test split's size). ``epochs`` is the preset's maximum: early
  stopping (ArXiv's patience 4) can only make it shorter, so this is an upper bound;
- card-hours: trials of a dataset packed ``k`` to a card take 1 / (measured aggregate speed-up
  at ``k``) of a card each, where that packing was measured (AG News eager and with graphs,
  IMDB eager, all on the H100); elsewhere one trial per card;
- the cluster of ``cluster.yaml`` (A10G GPUs): nothing was measured on an A10G, so H100 card-hours
  are multiplied by a range of published ratios, H100 SXM / A10: memory bandwidth 3.35 / 0.6 TB/s
  = 5.6x and dense bf16 tensor peak 989 / 125 TFLOP/s = 7.9x (NVIDIA's data sheets; AWS's A10G
  is the A10's data-centre variant). That assumes every step is GPU-bound, which holds for ArXiv
  (72-100 % busy on the H100) and for AG News and IMDB with graphs (79-82 %); packing on an
  A10G is assumed to gain nothing.

With adaptive seeds (a ``seeds: {adaptive: true, first: F, max: M}`` block, or ``--adaptive
F,M`` on a sweep with fixed seeds) how many seeds run depends on the effects, which are not
known before the sweep. The script prints the cost at F seeds per cell (every comparison decided
at its first look: the least an adaptive sweep spends), at M (none decided before the cap: the
most), and at any ``--seeds-per-cell`` given, e.g. the mean seeds per comparison of
``bench/adaptive.py``'s replay on logged runs (a baseline's cells run as many seeds as its
longest comparison, so that mean is a lower bound for its cells).

    python bench/gpu_hours.py [sweeps/full_grid.yaml] [--adaptive 6,20] [--seeds-per-cell 8.3]
        [--measured bench/results/h200_2026-11-28] [--export fusion_ray/study/measured_trials.json]

``--export`` adds the machine's per-dataset epoch and test times to the table ``fusion-ray plan
--chip`` reads (written from ``h100_2026-11-27`` and ``h200_2026-11-28``, 2026-12-02).
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
from fusion_ray.config.grid import expand  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MEASURED = RESULTS / "h100_2026-11-27"  # epoch_profile.json and loop_arxiv.json of one machine
PACKING = {  # (dataset, cuda_graphs): packing.py's measurement
    ("ag_news", False): RESULTS / "h100_2026-11-22" / "packing.json",
    ("ag_news", True): RESULTS / "h100_2026-11-23" / "packing_ag_news_graphs.json",
    ("imdb", False): RESULTS / "h100_2026-11-23" / "packing_imdb.json",
}
# The study's split sizes (bench/study_data.py): validation is what the epoch profile timed.
TEST_DOCS = {"ag_news": 7_600, "imdb": 25_000, "arxiv": 2_500}
A10G_RATIO = (3.35 / 0.6, 989 / 125)  # H100 SXM / A10: HBM bandwidth, dense bf16 peak
CLUSTER_GPUS = 8 * 1 + 2 * 4  # cluster.yaml: up to 8 gpu_1x and 2 gpu_4x nodes


def measured_epochs(measured: Path = MEASURED) -> dict[tuple[str, str], dict]:
    """Per (preset, variant): the epoch profile's plain run; where the loop's own epochs were
    measured (``loop_arxiv.json``), its training time (the mean of the epochs after the first,
    which captures graphs and warms up) replaces the profile's, scaled to the full split."""
    runs = {
        (run["preset"], run["variant"]): {**run, "source": "profile " + run["variant"]}
        for run in json.loads((measured / "epoch_profile.json").read_text())["runs"]
        if run.get("mode") == "plain" and "error" not in run
    }
    for loop in json.loads((measured / "loop_arxiv.json").read_text()):
        key = (loop["preset"], "graphs" if loop["cuda_graphs"] else "lean")
        if "error" in loop or key not in runs or len(loop["epoch_seconds"]) < 2:
            continue
        run = runs[key]
        steady = loop["epoch_seconds"][1:]
        train_s = sum(steady) / len(steady) / loop["scale"]
        rest = run["epoch_seconds"] - run["epoch_train_seconds"]  # validation + checkpoint
        runs[key] = {
            **run,
            "epoch_seconds": train_s + rest,
            "source": "loop " + ("graphs" if loop["cuda_graphs"] else "eager"),
        }
    return runs


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
    parser.add_argument(
        "--adaptive",
        metavar="FIRST,MAX",
        help="cost the sweep's grid with adaptive seeds {adaptive: true, first: FIRST, max: MAX}",
    )
    parser.add_argument(
        "--seeds-per-cell",
        type=float,
        nargs="*",
        default=[],
        help="with adaptive seeds: also the cost at these mean seeds per cell",
    )
    parser.add_argument(
        "--measured",
        type=Path,
        default=MEASURED,
        help="folder of one machine's epoch_profile.json and loop_arxiv.json "
        f"(default {MEASURED.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        help="add this machine's per-dataset epoch and test times to a JSON file (the table "
        "`fusion-ray plan --chip` reads: fusion_ray/study/measured_trials.json)",
    )
    args = parser.parse_args()
    overrides = []
    if args.adaptive:
        first, cap = (int(v) for v in args.adaptive.split(","))
        overrides.append(f"seeds={{adaptive: true, first: {first}, max: {cap}}}")
    spec = load_sweep(args.sweep, overrides=overrides)
    cells = Counter(cell.dataset for cell in expand(spec))
    epochs = measured_epochs(args.measured)
    chip = _chip(epochs)
    total_card_s = 0.0
    exported: dict[str, dict] = {}
    print(
        f"{spec.name}: {sum(cells.values())} cells; {chip} epoch times from "
        f"{_shown(args.measured / 'epoch_profile.json')} and "
        f"{_shown(args.measured / 'loop_arxiv.json')}"
    )
    print(
        f"{'dataset':<8} {'cells':>5} {'epoch s':>8} {'epochs':>6} {'trial s':>8} "
        f"{'per card':>8} {'card h':>7}  step"
    )
    for dataset, n in cells.items():
        card_s, exported[dataset] = _dataset_row(spec, dataset, n, epochs)
        total_card_s += card_s
    hours = total_card_s / 3600
    if args.export is not None:
        _export(args.export, chip, args.measured, spec.name, exported)
    if spec.adaptive is None:
        print(f"one {chip}: {hours:.1f} GPU-hours (upper bound: every trial runs all its epochs)")
        _cluster_line(chip, hours)
        return
    seeds = len(spec.seeds)  # 0 .. max-1: the cells above are the cap's
    first = spec.adaptive.first
    print(
        f"adaptive seeds (first {first}, max {seeds}): the table counts every cell at the cap; "
        "every trial runs all its epochs"
    )
    for per_cell, what in [
        (first, "every comparison decided at its first look"),
        *((k, "given") for k in args.seeds_per_cell),
        (seeds, "none decided before the cap"),
    ]:
        at = hours * per_cell / seeds
        print(f"  {per_cell:>5g} seeds per cell ({what}): {at:.1f} {chip}-hours")
    _cluster_line(chip, hours * first / seeds, hours)


def _dataset_row(spec, dataset: str, n: int, epochs: dict) -> tuple[float, dict]:
    """One dataset's line of the table, printed: its card-seconds and its entry for ``--export``."""
    trial_spec = next(c for c in expand(spec) if c.dataset == dataset).trial.train
    run = epochs[(dataset, "graphs" if trial_spec.cuda_graphs else "lean")]
    val_docs = run["validation_docs"] / run["scale"]
    test_s = run["eval_seconds"] / run["scale"] * TEST_DOCS[dataset] / val_docs
    trial_s = trial_spec.epochs * run["epoch_seconds"] + test_s
    gpus = (spec.datasets[dataset].resources or spec.resources).gpus_per_worker
    per_card = round(1 / gpus) if gpus and gpus < 1 else 1
    speedup = packing_speedup(dataset, trial_spec.cuda_graphs, per_card) if per_card > 1 else None
    if speedup is None:
        per_card, speedup = 1, 1.0
    card_s = n * trial_s / speedup
    print(
        f"{dataset:<8} {n:>5} {run['epoch_seconds']:>8.1f} {trial_spec.epochs:>6} "
        f"{trial_s:>8.0f} {per_card:>5} ({speedup:.2f}x) {card_s / 3600:>6.1f}  {run['source']}"
    )
    return card_s, {
        "cuda_graphs": trial_spec.cuda_graphs,
        "epoch_seconds": round(run["epoch_seconds"], 3),
        "test_seconds": round(test_s, 3),
        "trials_per_card": per_card,
        "speedup": round(speedup, 4),
        "step": run["source"],
    }


def _export(path: Path, chip: str, measured: Path, sweep: str, datasets: dict) -> None:
    """This machine's entry of the planner's table: per dataset, one epoch's seconds (training,
    validation, checkpoint) and one test pass's, as measured for ``sweep``'s presets."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    table[chip] = {
        "measured": _shown(measured),
        "presets": sweep,
        "datasets": datasets,
    }
    path.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"wrote {chip} to {_shown(path)}")


def _chip(epochs: dict[tuple[str, str], dict]) -> str:
    """The card the epochs were measured on, shortened as in the tables: ``H100``, ``H200``."""
    names = {run["device"] for run in epochs.values()}
    if len(names) != 1:
        sys.exit(f"the epoch profile mixes devices {sorted(names)}: give one machine's folder")
    return names.pop().removeprefix("NVIDIA ").split()[0]  # "NVIDIA H100 80GB HBM3" -> "H100"


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _cluster_line(chip: str, hours: float, most: float | None = None) -> None:
    """The cluster of cluster.yaml: A10G-hours from H100 hours (a range of ratios); with
    ``most``, from ``hours`` (the least) to ``most``. The ratios are the H100's alone."""
    if chip != "H100":
        print(f"cluster.yaml (A10G): scaled from H100 measurements only, not from {chip} ones")
        return
    low = hours * A10G_RATIO[0]
    high = (most if most is not None else hours) * A10G_RATIO[1]
    print(
        f"cluster.yaml (A10G, scaled {A10G_RATIO[0]:.1f}x-{A10G_RATIO[1]:.1f}x): {low:.0f}-{high:.0f} "
        f"A10G-hours, {low / CLUSTER_GPUS:.0f}-{high / CLUSTER_GPUS:.0f} h of wall time on its "
        f"{CLUSTER_GPUS} GPUs"
    )


if __name__ == "__main__":
    main()
