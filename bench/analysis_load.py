"""How long the analysis takes on a large sweep: load N finished runs from MLflow, pair them,
run the paired statistics.

    python bench/analysis_load.py --runs 10000 [--db /dev/shm/fusion_ray_bench/mlflow.db]

Setting up logs N synthetic runs that follow the MLflow schema (one ``log_batch`` per run) into
a sqlite store; it takes minutes and is reused when the store already holds the experiment.
Put the store on a RAM disk (the default uses /dev/shm when it exists): sqlite's fsync per
commit, not MLflow, dominates the setup on a real disk. The timed part uses the same public
entry points as ``python -m analysis.report`` and prints its total on the last line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

# The synthetic sweep builder is a test helper of the checkout (tests/synthetic.py), not part of
# the installed package: run from the checkout, with its root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.synthetic import SyntheticSweep, log_synthetic_sweep  # noqa: E402

DATASETS = {"ag_news": "short", "imdb": "medium", "arxiv": "long"}
POSITIONS = ("sinusoidal", "learned", "rope_features", "relative_table")
ATTENTION = ("none", "rotary", "alibi")
OPERATORS = (
    "add",
    "concat",
    "gate_scalar",
    "gate_vector",
    "gate_mlp",
    "mlp",
    "gate_cnn(kernel_size=3)",
)


def _default_db() -> Path:
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return root / "fusion_ray_bench" / "mlflow.db"


def _count_runs(uri: str, name: str) -> int:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return 0
    n, token = 0, None
    while True:
        page = client.search_runs(
            [exp.experiment_id], "tags.role = 'trial'", max_results=50000, page_token=token
        )
        n += len(page)
        token = page.token
        if not token:
            return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=10_000, help="trial runs to analyse (default 10000)")
    p.add_argument("--db", type=Path, default=_default_db(), help="sqlite file of the store")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is printed")
    p.add_argument(
        "--skip-search-runs",
        action="store_true",
        help="do not time the slower public search_runs loading path side by side",
    )
    args = p.parse_args()

    per_seed = len(DATASETS) * len(POSITIONS) * len(ATTENTION) * len(OPERATORS)
    seeds = max(2, math.ceil(args.runs / per_seed))
    name = f"bench_{seeds}seeds"
    args.db.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{args.db}"
    n_runs = _count_runs(uri, name)
    if n_runs != seeds * per_seed:
        if n_runs:
            raise SystemExit(f"{args.db} holds a partial {name!r} ({n_runs} runs); delete it first")
        print(f"setting up {seeds * per_seed} runs ({seeds} seeds x {per_seed} cells) in {uri}")
        t0 = time.perf_counter()
        spec = SyntheticSweep(
            name=name,
            datasets=DATASETS,
            positions=POSITIONS,
            attention_positions=ATTENTION,
            operators=OPERATORS,
            seeds=tuple(range(seeds)),
            effects={"gate_scalar": 0.1, "gate_mlp": 0.08, "concat": 0.04},
            predictions=False,
        )
        log_synthetic_sweep(
            spec, uri, artifact_location=str(args.db.parent / "artifacts"), progress=True
        )
        print(f"set up in {time.perf_counter() - t0:.0f} s")
        n_runs = seeds * per_seed

    from analysis.load import load_experiment
    from analysis.stats import StatsSettings, compare
    from analysis.stats.pairing import pair_runs

    timings = []
    for _ in range(max(1, args.repeats)):
        c0, t0 = time.process_time(), time.perf_counter()
        exp = load_experiment(name, uri)
        t1 = time.perf_counter()
        pairing = pair_runs(exp.runs, baseline="add")
        t2 = time.perf_counter()
        stats = compare(pairing, StatsSettings())
        t3, c3 = time.perf_counter(), time.process_time()
        timings.append((t3 - t0, c3 - c0))
        print(
            f"load {t1 - t0:.2f} s ({len(exp.runs)} runs), pair+check {t2 - t1:.2f} s "
            f"({len(pairing.pairs)} pairs), stats {t3 - t2:.2f} s ({len(stats.table)} "
            f"comparisons); total {t3 - t0:.2f} s wall, {c3 - c0:.2f} s CPU"
        )
    timings.sort()
    wall, cpu = timings[len(timings) // 2]
    if not args.skip_search_runs:
        # side by side: the same frame through the public MlflowClient.search_runs pages
        t0 = time.perf_counter()
        slow = load_experiment(name, uri, method="search_runs")
        t_slow = time.perf_counter() - t0
        t0 = time.perf_counter()
        fast = load_experiment(name, uri, method="sql")
        t_fast = time.perf_counter() - t0
        assert len(slow.runs) == len(fast.runs)
        print(
            f"load via search_runs {t_slow:.2f} s vs sqlite tables {t_fast:.2f} s: "
            f"{t_slow / t_fast:.1f}x"
        )
    print(f"cpu cores visible: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    print(
        f"load+stats of {n_runs} runs: {wall:.2f} s wall ({cpu:.2f} s CPU), "
        f"median of {len(timings)}"
    )


if __name__ == "__main__":
    main()
