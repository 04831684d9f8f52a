"""Aggregate throughput of 1, 2, 4 and 8 AG News (or IMDB) trials sharing one GPU through Ray Tune.

Each trial is a Ray Tune function trainable holding the resources the sweep gives a one-worker
trial (``fusion_ray.driver.trial.trial_resources``: ``cpus_per_worker`` CPUs and ``1 / n`` GPU,
Ray's fractional GPUs), and trains the ``--preset`` (AG News by default) (``add``, sinusoidal P, the stand-in of
``bench/study_data.py``) with the loop's step (``bench/epoch_profile.Stepper``, variant
``lean``: the loop as it is on CUDA, batches padded to multiples of 64). Every trial first loads the data and warms up, then waits at a
barrier (a Ray actor) so that all ``n`` train at the same time; the aggregate throughput is all
trials' training documents divided by the span from the first start to the last end.

``--mps`` runs the same after starting NVIDIA's MPS control daemon (kernels of different
processes then share the GPU at once instead of time-slicing), when it can be started.

    python bench/packing.py --trials 1 2 4 8 [--mps] [--steps 300] [--out packing.json]
    python bench/packing.py --device cpu --trials 1 2 --steps 3 --scale 0.01   # smoke, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def packed_trial(config: dict[str, Any]) -> None:
    """One Tune trial: load, warm up, wait for the others, train ``steps`` steps, report."""
    import ray
    import torch
    from epoch_profile import Stepper, sync
    from ray import tune

    device = torch.device(config["device"])
    stepper = Stepper(
        config["preset"],
        config["variant"],
        device,
        data_root=config["data_root"],
        scale=config["scale"],
        cache_dir=config["cache_dir"],
        seed=config["seed"],
    )
    batches = iter(stepper.sampler)
    for _ in range(config["warmup"]):
        stepper.step(next(batches))
    sync(device)
    barrier = ray.get_actor(config["barrier"])
    ray.get(barrier.arrive.remote())
    while ray.get(barrier.count.remote()) < config["trials"]:
        time.sleep(0.01)
    lengths = stepper.data.train.input_lengths
    start, docs, tokens = time.time(), 0, 0
    for _ in range(config["steps"]):
        indices = next(batches)
        docs += len(indices)
        tokens += int(lengths[indices].sum())
        stepper.step(indices)
    float(stepper.loss_sum)
    sync(device)
    end = time.time()
    tune.report(
        {
            "start": start,
            "end": end,
            "docs": docs,
            "tokens": tokens,
            "seconds_per_step": (end - start) / config["steps"],
        }
    )


def run_packed(n: int, args: argparse.Namespace, label: str) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune import PlacementGroupFactory

    from fusion_ray.config import Resources
    from fusion_ray.driver.trial import trial_resources

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self) -> None:
            self.n = 0

        def arrive(self) -> int:
            self.n += 1
            return self.n

        def count(self) -> int:
            return self.n

    name = f"barrier_{label}_{n}_{time.time_ns()}"
    barrier = Barrier.options(name=name).remote()  # noqa: F841 - held until the trials end
    on_gpu = args.device == "cuda"
    res = Resources(
        workers=1,
        use_gpu=on_gpu,
        gpus_per_worker=1 / n if on_gpu else 0,
        cpus_per_worker=args.cpus_per_trial,
    )
    trainable = tune.with_resources(packed_trial, PlacementGroupFactory([trial_resources(res)]))
    base = {
        "device": args.device,
        "data_root": args.data_root,
        "scale": args.scale,
        "cache_dir": args.cache_dir,
        "warmup": args.warmup,
        "steps": args.steps,
        "barrier": name,
        "trials": n,
        "variant": args.variant,
        "preset": args.preset,
    }
    tuner = tune.Tuner(
        trainable,
        param_space={**base, "seed": tune.grid_search(list(range(n)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=n),
        run_config=tune.RunConfig(
            name=f"packing_{args.preset}_{label}_{n}", storage_path=args.storage, verbose=0
        ),
    )
    results = tuner.fit()
    rows = [r.metrics for r in results if r.error is None]
    errors = [str(r.error)[-500:] for r in results if r.error is not None]
    if not rows:
        return {"trials": n, "mode": label, "errors": errors}
    span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    docs = sum(r["docs"] for r in rows)
    return {
        "trials": n,
        "mode": label,
        "finished": len(rows),
        "errors": errors,
        "span_seconds": span,
        "docs": docs,
        "tokens": sum(r["tokens"] for r in rows),
        "docs_per_second": docs / span,
        "tokens_per_second": sum(r["tokens"] for r in rows) / span,
        "seconds_per_step": sorted(r["seconds_per_step"] for r in rows),
        "start_skew_seconds": max(r["start"] for r in rows) - min(r["start"] for r in rows),
    }


def start_mps() -> str | None:
    """Start the MPS control daemon; None when it runs, else why not."""
    try:
        proc = subprocess.run(
            ["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
    time.sleep(1)
    return None


def stop_mps() -> None:
    subprocess.run(
        ["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True, timeout=30
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--trials", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--preset", default="ag_news", choices=["ag_news", "imdb"])
    p.add_argument("--steps", type=int, default=300, help="timed steps per trial")
    p.add_argument("--variant", default="lean", help="bench/epoch_profile.py's step variant")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--cpus-per-trial", type=float, default=2, help="the presets' cpus_per_worker")
    p.add_argument("--mps", action="store_true", help="also measure with the MPS daemon")
    p.add_argument("--scale", type=float, default=1.0)
    tmp = Path(tempfile.gettempdir())
    p.add_argument("--data-root", default=str(tmp / "fusion_ray_stand_ins"))
    p.add_argument("--cache-dir", default=str(tmp / "fusion_ray_bench_cache"))
    p.add_argument("--storage", default=str(tmp / "fusion_ray_packing"))
    p.add_argument("--out", default=None)
    return p


def measure_mode(mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every packing level of ``--trials`` on a fresh local Ray (started after MPS, if used)."""
    import ray

    pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])
    ray.init(
        include_dashboard=False,
        log_to_driver=False,
        num_gpus=1 if args.device == "cuda" else 0,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}},
    )
    rows = []
    try:
        for n in args.trials:
            t = time.perf_counter()
            row = run_packed(n, args, mode)
            row["wall_seconds"] = time.perf_counter() - t
            rows.append(row)
            if "docs_per_second" not in row:
                print(f"{mode:12} {n} trials FAILED: {row['errors']}", flush=True)
                continue
            print(
                f"{mode:12} {n} trials: {row['docs_per_second']:8.0f} docs/s, "
                f"{row['tokens_per_second']:9.0f} tok/s aggregate; s/step per trial "
                f"{', '.join(f'{1e3 * x:.1f} ms' for x in row['seconds_per_step'])}; "
                f"start skew {row['start_skew_seconds']:.2f} s",
                flush=True,
            )
    finally:
        ray.shutdown()
    return rows


def main() -> None:
    args = parser().parse_args()
    from study_data import study_specs

    from fusion_ray.data import prepare_data

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    t = time.perf_counter()
    data_spec, _, _ = study_specs(
        args.preset, Path(args.data_root), scale=args.scale, cache_dir=args.cache_dir
    )
    prepare_data(data_spec)  # tokenised once here; the trials load the cache
    print(f"data ready in {time.perf_counter() - t:.1f} s", flush=True)
    out: dict[str, Any] = {"runs": measure_mode("time-slicing", args), "notes": []}
    if args.mps:
        why = start_mps()
        if why:
            out["notes"].append(f"MPS not measured: the daemon did not start ({why})")
            print(out["notes"][-1], flush=True)
        else:
            try:
                out["runs"] += measure_mode("mps", args)
            finally:
                stop_mps()
    ones = [r for r in out["runs"] if r["mode"] == "time-slicing" and r["trials"] == 1]
    for r in out["runs"]:
        if "docs_per_second" in r and ones and "docs_per_second" in ones[0]:
            r["vs_one_trial"] = r["docs_per_second"] / ones[0]["docs_per_second"]
            print(f"{r['mode']:12} {r['trials']} trials: {r['vs_one_trial']:.2f}x one trial alone")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
