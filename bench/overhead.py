"""Per-trial orchestration overhead of a sweep on this machine.

Two views, for one-worker trials (the loop runs directly in the Tune trial) and for two-worker
Ray Train DDP trials (TorchTrainer, gloo); trials run one at a time so they do not share cores:

- per trial: the trial's wall time as the sweep driver sees it (its MLflow run opens when Tune
  reports the trial started and closes when Tune reports it complete) minus the time spent inside
  the training loop (the ``loop_seconds`` metric); the median over N trials;
- end to end: (wall time of the whole sweep call - sum of loop_seconds) / N, which also counts
  starting each trial's actor, Tune's own start-up and the MLflow bookkeeping, amortised.

    python bench/overhead.py [--trials 6]

Goal: at most 5 s for a one-worker trial. The last line prints both medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sweep_file(root: Path, name: str, trials: int, workers: int) -> Path:
    spec = {
        "name": name,
        "seeds": list(range(trials)),
        "grid": {"datasets": ["short"], "fusions": ["add"]},
        "datasets": {
            "short": {
                "data": {
                    "source": "synthetic",
                    "source_kwargs": {
                        "regime": "short",
                        "n_train": 256,
                        "n_validation": 64,
                        "n_test": 64,
                        "window": 48,
                    },
                    "tokenizer": "word",
                    "max_length": 64,
                    "cache_dir": str(root / "cache"),
                }
            }
        },
        "defaults": {
            "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_len": 64},
            "train": {"epochs": 2, "batch_size": 32, "latency_repeats": 2, "latency_batch_size": 4},
        },
        "resources": {"workers": workers, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage_path": str(root / "ray_results"),
        "tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "retries": 0,
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def overheads(path: Path) -> tuple[list[float], float]:
    from mlflow.tracking import MlflowClient

    from fusion_ray.config import load_sweep
    from fusion_ray.driver.runner import run_sweep

    spec = load_sweep(path)
    started = time.perf_counter()
    outcome = run_sweep(spec, str(path), verbose=0)
    wall = time.perf_counter() - started
    if outcome.failed:
        raise SystemExit(f"trials failed: {outcome.failed}")
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    per_trial = [
        (r.info.end_time - r.info.start_time) / 1000 - r.data.metrics["loop_seconds"] for r in runs
    ]
    end_to_end = (wall - sum(r.data.metrics["loop_seconds"] for r in runs)) / len(runs)
    return per_trial, end_to_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument(
        "--only", type=int, choices=[1, 2], default=None, help="measure only this many workers"
    )
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        one, one_e2e = [float("nan")], float("nan")
        two, two_e2e = [float("nan")], float("nan")
        if args.only in (None, 1):
            one, one_e2e = overheads(sweep_file(root, "overhead_1worker", args.trials, workers=1))
        if args.only in (None, 2):
            two, two_e2e = overheads(sweep_file(root, "overhead_2workers", args.trials, workers=2))
    ray.shutdown()
    for label, values, e2e in (
        ("1 worker (direct)", one, one_e2e),
        ("2 workers (TorchTrainer DDP)", two, two_e2e),
    ):
        print(
            f"{label:<30} per trial, s: "
            + " ".join(f"{v:.2f}" for v in sorted(values))
            + f"; end to end {e2e:.2f} s/trial"
        )
    print(
        f"median overhead per trial: 1 worker {statistics.median(one):.2f} s (end to end {one_e2e:.2f} s), "
        f"2-worker DDP {statistics.median(two):.2f} s (end to end {two_e2e:.2f} s); goal for 1 worker: <= 5 s"
    )


if __name__ == "__main__":
    main()
