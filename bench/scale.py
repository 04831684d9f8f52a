"""How the driver holds up as sweeps grow: a 100,000-cell dry run, and a 1,000-cell sweep.

- dry run: ``python -m fusion_ray.sweep FILE --dry-run`` on a quickstart-shaped grid with enough
  seeds for ``--dry-run-cells`` cells, timed as a whole process (imports, validation, expansion,
  printing every cell), with the process's peak memory. Goals: 100,000 cells in under 5 s,
  1,000,000 in under 60 s and within 2 GiB; a run above its goal prints a FAIL line.
- sweep: ``--sweep-cells`` one-step trials (a tiny model, one batch of 32 documents, one epoch)
  run by ``run_sweep`` in this process on a local Ray, one trial at a time, while a thread
  samples the driver's resident memory every second. From the MLflow runs afterwards, each
  trial's driver-side overhead is its run's wall time minus the time inside the training loop
  (``loop_seconds``). The last lines compare the first and the last tenth of the trials: the
  goal is both overhead and memory flat from the first hundred cells to the last.

    python bench/scale.py --dry-run-cells 100000 --sweep-cells 1000
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    """This process's resident memory now (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


DRY_RUN_GOALS = {100_000: 5.0, 1_000_000: 60.0}
"""Seconds a dry run of this many cells may take (the nearest goal at or above it applies)."""
DRY_RUN_MEMORY_GOAL_MIB = 2048


def dry_run_verdict(cells: int, seconds: float, peak_mib: float) -> str:
    """The printed line of a dry run against its goals: FAIL when above either."""
    goal = next((s for n, s in sorted(DRY_RUN_GOALS.items()) if cells <= n), None)
    failed = (goal is not None and seconds > goal) or peak_mib > DRY_RUN_MEMORY_GOAL_MIB
    goals = f"goal < {goal:g} s, " if goal is not None else ""
    line = (
        f"dry run of {cells:,} cells: {seconds:.1f} s, peak {peak_mib:.0f} MiB "
        f"({goals}< {DRY_RUN_MEMORY_GOAL_MIB} MiB)"
    )
    return f"FAIL {line}" if failed else line


def dry_run(root: Path, cells: int) -> tuple[float, float]:
    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import points

    quickstart = ROOT / "sweeps" / "quickstart.yaml"
    per_seed = len(points(load_sweep(quickstart)))
    spec = yaml.safe_load(quickstart.read_text())
    spec.update(name="scale_dry", seeds=list(range(-(-cells // per_seed))))
    spec["tracking_uri"] = f"sqlite:///{root / 'dry.db'}"
    path = root / "dry.yaml"
    path.write_text(yaml.safe_dump(spec))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - started
    print(proc.stdout.splitlines()[0])
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, peak_mib


def sweep_file(root: Path, cells: int) -> Path:
    spec = {
        "name": "scale_sweep",
        "seeds": list(range(-(-cells // 2))),
        "grid": {"datasets": ["short"], "fusions": ["add", "gate_scalar"]},
        "datasets": {
            "short": {
                "data": {
                    "source": "synthetic",
                    "source_kwargs": {
                        "regime": "short",
                        "n_train": 32,
                        "n_validation": 16,
                        "n_test": 16,
                        "window": 48,
                    },
                    "tokenizer": "word",
                    "max_length": 64,
                    "cache_dir": str(root / "cache"),
                }
            }
        },
        "defaults": {
            "model": {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "max_len": 64},
            "train": {"epochs": 1, "batch_size": 32, "latency_repeats": 1, "latency_batch_size": 4},
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage_path": str(root / "ray_results"),
        "tracking_uri": f"sqlite:///{root / 'sweep.db'}",
        "retries": 0,
    }
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_big_sweep(root: Path, cells: int) -> None:
    from mlflow.tracking import MlflowClient

    from fusion_ray.config import load_sweep
    from fusion_ray.driver.runner import run_sweep

    path = sweep_file(root, cells)
    spec = load_sweep(path)
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            samples.append((time.time(), rss_mib()))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.perf_counter()
    outcome = run_sweep(spec, str(path))
    wall = time.perf_counter() - started
    stop.set()
    thread.join()
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([exp.experiment_id], "tags.role = 'trial'", max_results=50000)
    runs = sorted(runs, key=lambda r: r.info.start_time)
    overhead = [
        (r.info.end_time - r.info.start_time) / 1000 - r.data.metrics["loop_seconds"]
        for r in runs
        if r.info.end_time and "loop_seconds" in r.data.metrics
    ]
    tenth = max(1, len(overhead) // 10)
    ends = [r.info.end_time / 1000 for r in runs]

    def rss_at(t: float) -> float:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    print(
        f"sweep: {len(outcome.finished)} finished, {len(outcome.failed)} failed, "
        f"{wall:.0f} s ({wall / max(1, len(runs)):.2f} s per trial end to end)"
    )
    print(
        f"driver overhead per trial, median: first {tenth} {statistics.median(overhead[:tenth]):.3f} s, "
        f"last {tenth} {statistics.median(overhead[-tenth:]):.3f} s"
    )
    print(
        f"driver memory: after trial {tenth} {rss_at(ends[tenth - 1]):.0f} MiB, "
        f"after trial {len(ends)} {rss_at(ends[-1]):.0f} MiB, peak {max(s[1] for s in samples):.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run-cells", type=int, default=100_000)
    parser.add_argument("--sweep-cells", type=int, default=1_000, help="0 skips the sweep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seconds, peak_mib = dry_run(root, args.dry_run_cells)
        print(dry_run_verdict(args.dry_run_cells, seconds, peak_mib))
        if args.sweep_cells:
            run_big_sweep(root, args.sweep_cells)


if __name__ == "__main__":
    main()
