"""The training loop itself with and without ``train.cuda_graphs``, per study preset.

Each run is one whole trial of ``fusion_ray.train.run_local`` (no Ray) in a fresh process: the
preset of ``sweeps/_study_datasets.yaml`` (``add``, sinusoidal P) on the stand-in of
``bench/study_data.py``, ``--epochs`` epochs, then test scoring and the latency measurement as
in a sweep. Reported per run: the loop's own ``epoch_seconds`` of each epoch (training steps only;
the first epoch includes capturing the graphs), the trial's wall time, and the per-epoch losses,
which must be identical with and without graphs (same kernels, same inputs).

    python bench/loop_graphs.py [--presets ag_news imdb arxiv] [--epochs 2] [--out loop.json]
    python bench/loop_graphs.py --device cpu --presets imdb --epochs 1 --scale 0.005  # smoke

With ``--at-once 1 2 4``: instead, eager trials of each preset sharing the device, 1, 2 and 4
processes started together; reported per count, the middle epochs' mean (not the first, which
loads and warms up, nor the last, which may run partly alone once the others finish) and the
documents per second of all trials against one alone (the count 1 is always run first).

    python bench/loop_graphs.py --presets arxiv --epochs 4 --at-once 1 2 4 [--out at_once.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SCALES = {"ag_news": 1.0, "imdb": 1.0, "arxiv": 0.1}


def one_run(preset: str, graphs: bool, args: argparse.Namespace) -> dict:
    import torch
    from study_data import study_specs

    from fusion_ray.train import TrialConfig, run_local

    data, model, train = study_specs(
        preset, Path(args.data_root), scale=SCALES[preset] * args.scale, cache_dir=args.cache_dir
    )
    train = dataclasses.replace(train, epochs=args.epochs, cuda_graphs=graphs, patience=None)
    trial = TrialConfig(dataset=preset, data=data, model=model, train=train, seed=0)
    device = torch.device(args.device)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        final = run_local(trial, out, device=device)
        rows = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "epoch_seconds" in r and "test_acc" not in r]
    return {
        "preset": preset,
        "cuda_graphs": graphs,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "scale": SCALES[preset] * args.scale,
        "epoch_seconds": [r["epoch_seconds"] for r in epochs],
        "train_loss": [r["train_loss"] for r in epochs],
        "val_loss": [r["val_loss"] for r in epochs],
        "val_acc": [r["val_acc"] for r in epochs],
        "test_acc": final["test_acc"],
        "trial_seconds": time.perf_counter() - started,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None,
    }


def child(args: argparse.Namespace, preset: str, graphs: bool) -> list[str]:
    """The command of one trial in a fresh process (``--one``)."""
    return [
        *(sys.executable, __file__, "--one", f"{preset}:{int(graphs)}"),
        *("--device", args.device, "--epochs", str(args.epochs), "--scale", str(args.scale)),
        *("--data-root", args.data_root, "--cache-dir", args.cache_dir),
    ]


def at_once(args: argparse.Namespace) -> None:
    """Eager trials of each preset started ``n`` at a time on one device, for each ``n``."""
    if args.epochs < 3:
        raise SystemExit("--at-once needs --epochs 3 or more (it times the middle epochs)")
    results = []
    for preset in args.presets:
        alone = None
        for n in [1, *(k for k in args.at_once if k != 1)]:
            procs = [
                subprocess.Popen(child(args, preset, False), stdout=subprocess.PIPE, text=True)
                for _ in range(n)
            ]
            outputs = [proc.communicate()[0] for proc in procs]
            if any(proc.returncode != 0 for proc in procs):
                raise SystemExit(f"{preset}: a trial of {n} at once failed (its stderr is above)")
            runs = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
            middle = [s for run in runs for s in run["epoch_seconds"][1:-1]]
            mean = sum(middle) / len(middle)
            alone = alone or mean
            row = {
                "preset": preset,
                "at_once": n,
                "middle_epoch_seconds": mean,
                "range": [min(middle), max(middle)],
                "vs_one_alone": n * alone / mean,
                "trial_seconds": [run["trial_seconds"] for run in runs],
                "runs": runs,
            }
            results.append(row)
            print(
                f"{preset:8} {n} at once: middle epochs {mean:.2f} s "
                f"({min(middle):.2f}-{max(middle):.2f}); all trials' documents per second "
                f"{row['vs_one_alone']:.2f}x one alone; trials "
                f"{', '.join(f'{t:.1f}' for t in row['trial_seconds'])} s",
                flush=True,
            )
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--presets", nargs="+", default=["ag_news", "imdb", "arxiv"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="times each preset's stand-in size")
    tmp = Path(tempfile.gettempdir())
    p.add_argument("--data-root", default=str(tmp / "fusion_ray_stand_ins"))
    p.add_argument("--cache-dir", default=str(tmp / "fusion_ray_bench_cache"))
    p.add_argument("--out", default=None)
    p.add_argument(
        "--at-once",
        type=int,
        nargs="+",
        default=None,
        help="eager trials sharing the device: these numbers of processes started together",
    )
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # preset:graphs, in a child
    args = p.parse_args()
    if args.one:
        preset, graphs = args.one.split(":")
        print(json.dumps(one_run(preset, graphs == "1", args)))
        return
    if args.at_once:
        at_once(args)
        return
    runs = []
    for preset in args.presets:
        for graphs in (False, True):
            proc = subprocess.run(child(args, preset, graphs), capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{preset} cuda_graphs={graphs} FAILED:\n{proc.stderr[-3000:]}", flush=True)
                runs.append({"preset": preset, "cuda_graphs": graphs, "error": proc.stderr[-3000:]})
                continue
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            runs.append(run)
            print(
                f"{preset:8} cuda_graphs={str(graphs):5} epoch s "
                f"{' '.join(f'{s:.2f}' for s in run['epoch_seconds'])}  trial {run['trial_seconds']:.1f} s"
                f"  train_loss {run['train_loss']}  test_acc {run['test_acc']:.4f}",
                flush=True,
            )
        pair = [r for r in runs if r["preset"] == preset and "error" not in r]
        if len(pair) == 2:
            eager, graphed = pair
            same = all(eager[k] == graphed[k] for k in ("train_loss", "val_loss", "val_acc"))
            speedup = eager["epoch_seconds"][-1] / graphed["epoch_seconds"][-1]
            print(
                f"{preset}: last epoch {speedup:.2f}x faster with graphs; losses identical: {same}",
                flush=True,
            )
        if args.out:
            Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
