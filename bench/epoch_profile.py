"""Where one training epoch of each study preset spends its time, and what the loop's fixes buy.

For AG News, IMDB and ArXiv (the presets of ``sweeps/_study_datasets.yaml``, ``add``, sinusoidal P,
on the stand-ins of ``bench/study_data.py``), each variant runs in a fresh process (its own CUDA
context and environment), on the same documents in the same batch order:

- ``baseline``: the loop as it was before these fixes: pageable host-to-device copies, the padding
  mask always sent (and the model checking ``mask.all()`` on the device, a host sync per step),
  the loss read back every step (``isfinite`` and ``.item()``: two more syncs), and no
  ``CUBLAS_WORKSPACE_CONFIG`` although deterministic algorithms are on;
- ``cublas``: baseline + ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (what the loop now sets on CUDA);
- ``nosync``: the loop as it is now: + pinned, non-blocking copies, the mask dropped on the host
  when nothing is padded, the loss summed on the device and read once per epoch;
- ``bucket``: ``nosync`` + batch lengths rounded up to a multiple of 64 (``train.pad_to_multiple:
  64``): a few shapes instead of one per length, so cuDNN's attention plans and cuBLAS's
  heuristics are built a few times, not at every new length;
- ``lean``: ``bucket`` + fused AdamW/Adam kernels and no NaN-filling of new tensors under
  deterministic mode (both now the loop's behaviour on CUDA);
- ``compile``: ``lean`` + ``torch.compile(dynamic=True)`` of the model (not in the loop: measured
  on the H100, its one-off compile costs more than it saves over a study trial; bench/RESULTS.md).
- ``graphs``: ``lean`` with the loop's ``train.cuda_graphs`` (``fusion_ray/train/graphs.py``):
  the whole training step (forward, loss, backward, clipping, optimiser) captured once per batch
  shape as a CUDA graph and replayed (padding to multiples of 64 leaves a few shapes). A batch
  of another size (an epoch's last) runs eagerly. CUDA only.

Two ways of timing each variant: ``plain`` runs ``--steps`` training steps as the loop does
(one sync at the end) and reads the GPU's busy fraction from NVML meanwhile; ``phases`` puts a
sync between the phases of every step (host batch, host-to-device, forward, backward, optimiser)
to attribute time, which itself slows the step a little. Both also time one validation pass and
one checkpoint (state copy + ``torch.save``). An epoch's time is ``plain`` seconds per step x steps
per epoch + validation + checkpoint. A short ``torch.profiler`` window lists the attention and
matrix-product kernels actually used (flash or not, bf16 or not).

    python bench/epoch_profile.py --out epoch_profile.json                # all presets, GPU
    python bench/epoch_profile.py --device cpu --presets ag_news --steps 5 --scale 0.01  # smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from study_data import study_specs  # noqa: E402

from fusion_ray.data import LengthGroupedSampler, collate, prepare_data  # noqa: E402
from fusion_ray.model import build_classifier  # noqa: E402
from fusion_ray.seeds import derive_seed  # noqa: E402
from fusion_ray.train.checkpoint import state_dict_copy  # noqa: E402
from fusion_ray.train.evaluate import device_batch, evaluate, precision_context  # noqa: E402
from fusion_ray.train.loop import graphed_steps, lr_lambda, make_optimizer  # noqa: E402

VARIANTS = ("baseline", "cublas", "nosync", "bucket", "lean", "compile", "graphs")
PHASES = ("host_batch", "h2d", "forward", "backward", "optimizer")


class Utilisation:
    """NVML GPU utilisation (percent of time a kernel ran) sampled every 50 ms in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._handle = None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception as e:  # noqa: BLE001 - optional: report why and go on
                print(f"NVML unavailable: {e}", file=sys.stderr)

    def __enter__(self) -> Utilisation:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._handle is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) / 100 if self.samples else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_kernels(
    step, batches, device: torch.device, steps: int
) -> tuple[dict[str, float], float]:
    """GPU time by kernel (ms) over ``steps`` steps, and the kernels' share of the wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step(next(batches), False)
        sync(device)
        wall = time.perf_counter() - t
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", 0.0) or 0.0
        if us > 0 and evt.device_type.name == "CUDA":
            kernels[evt.key] = kernels.get(evt.key, 0.0) + us / 1e3
    return kernels, sum(kernels.values()) / 1e3 / wall


# ----------------------------------------------------------------------------- one variant


class Stepper:
    """One trial's training steps for a preset and variant, phase by phase (the loop's order)."""

    def __init__(
        self,
        preset: str,
        variant: str,
        device: torch.device,
        *,
        data_root: str,
        scale: float,
        cache_dir: str | None,
        seed: int = 0,
    ) -> None:
        self.device, self.variant = device, variant
        self.old_loop = variant in ("baseline", "cublas")
        lean = variant in ("lean", "compile", "graphs")
        self.multiple = 64 if variant in ("bucket", "lean", "compile", "graphs") else 1
        if variant == "graphs" and device.type != "cuda":
            raise SystemExit("the graphs variant needs a CUDA device")
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        torch.utils.deterministic.fill_uninitialized_memory = not lean
        torch.use_deterministic_algorithms(True, warn_only=True)  # as the loop does
        self.data_spec, model_spec, spec = study_specs(
            preset, Path(data_root), scale=scale, cache_dir=cache_dir
        )
        # validation pads like the variant's training batches
        self.spec = dataclasses.replace(spec, pad_to_multiple=self.multiple)
        started = time.perf_counter()
        self.data = prepare_data(self.data_spec)
        self.load_seconds = time.perf_counter() - started
        self.sampler = LengthGroupedSampler(
            self.data.train.lengths.clip(max=self.data_spec.max_length),
            self.spec.batch_size,
            seed=seed,
        )
        self.sampler.set_epoch(0)
        self.model = build_classifier(
            model_spec, self.data.vocab_size, self.data.num_classes, seed
        ).to(device)
        if lean:
            self.optimizer = make_optimizer(self.model, self.spec)  # fused, capturable on CUDA
        else:  # before: the default (for-each) implementation
            cls = torch.optim.AdamW if self.spec.optimizer == "adamw" else torch.optim.Adam
            self.optimizer = cls(
                self.model.parameters(), lr=self.spec.lr, weight_decay=self.spec.weight_decay
            )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.spec, self.spec.epochs * len(self.sampler))
        )
        self.graphed = None
        if variant == "graphs":  # the loop's own CUDA-graph steps (train.cuda_graphs)
            self.graphed = graphed_steps(
                self.model,
                self.optimizer,
                dataclasses.replace(self.spec, cuda_graphs=True),
                device,
                1,
            )
        torch.manual_seed(derive_seed(seed, "train/rank0"))
        self.step_model = (
            torch.compile(self.model, dynamic=True) if variant == "compile" else self.model
        )
        self.model.train()
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.timings = dict.fromkeys(PHASES, 0.0)

    def to_device(self, batch: dict[str, torch.Tensor]):
        if not self.old_loop:
            return device_batch(batch, self.device)
        # before: pageable synchronous copies, the mask always sent, the model testing it on
        # the device (``bool(keep.all())``, a host sync), as the classifier did
        ids, mask, labels = (
            batch[k].to(self.device) for k in ("input_ids", "attention_mask", "labels")
        )
        return ids, None if bool(mask.all()) else mask, labels

    def step(self, indices: list[int], timed_phases: bool = False) -> None:
        device, spec = self.device, self.spec
        t0 = time.perf_counter()
        batch = collate(self.data.train, indices, multiple=self.multiple)
        t1 = time.perf_counter()
        ids, mask, labels = self.to_device(batch)
        if self.graphed is not None and self.graphed.handles(len(indices)):
            self.loss_sum += self.graphed.step(ids, mask, labels)
            self.scheduler.step()
            return
        if timed_phases:
            sync(device)
        t2 = time.perf_counter()
        with precision_context(device, spec):
            logits = self.step_model(ids, mask)
        batch_loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        loss = batch_loss / len(indices)
        if self.old_loop and not torch.isfinite(loss):
            raise FloatingPointError("non-finite loss")
        if timed_phases:
            sync(device)
        t3 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if timed_phases:
            sync(device)
        t4 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), spec.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if self.old_loop:
            self.loss_sum += batch_loss.item()
        else:
            self.loss_sum += batch_loss.detach()
        if timed_phases:
            sync(device)
            t5 = time.perf_counter()
            for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                self.timings[name] += dt


def time_steps(
    trainer: Stepper, batches, steps: int, phases: bool
) -> tuple[float, int, float | None]:
    """(seconds, documents, NVML busy fraction) of ``steps`` training steps, synced at the end
    only (plus between phases when ``phases``); the loss sum is read once, as the loop does."""
    device = trainer.device
    with Utilisation(device) as util:
        sync(device)
        t, docs = time.perf_counter(), 0
        for _ in range(steps):
            indices = next(batches)
            docs += len(indices)
            trainer.step(indices, phases)
        float(trainer.loss_sum)
        sync(device)
        seconds = time.perf_counter() - t
    return seconds, docs, util.mean


def time_eval_and_checkpoint(trainer: Stepper) -> tuple[float, float]:
    """Seconds of one validation pass and of one checkpoint (state copies + ``torch.save``)."""
    t = time.perf_counter()
    evaluate(
        trainer.step_model,
        trainer.data.validation,
        batch_size=trainer.spec.eval_batch_size,
        device=trainer.device,
        spec=trainer.spec,
        pad_to=None,
    )
    sync(trainer.device)
    eval_seconds = time.perf_counter() - t
    t = time.perf_counter()
    model, optimizer = trainer.model, trainer.optimizer
    state = {
        "model": state_dict_copy(model),
        "optimizer": optimizer.state_dict(),
        "best_model": state_dict_copy(model),
    }
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(state, Path(tmp, "state.pt"))
    return eval_seconds, time.perf_counter() - t


def capture_all_shapes(trainer: Stepper) -> float:
    """Seconds to capture a graph for every batch shape of the epoch (one training step each),
    so that no capture falls inside the timed steps."""
    started, seen = time.perf_counter(), set()
    for indices in list(trainer.sampler):
        batch = collate(trainer.data.train, indices, multiple=trainer.multiple)
        key = (tuple(batch["input_ids"].shape), not bool(batch["attention_mask"].all()))
        if key not in seen:
            seen.add(key)
            trainer.step(indices)
    sync(trainer.device)
    return time.perf_counter() - started


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    trainer = Stepper(
        args.preset,
        args.variant,
        device,
        data_root=args.data_root,
        scale=args.scale,
        cache_dir=args.cache_dir,
    )
    capture_seconds = capture_all_shapes(trainer) if trainer.graphed is not None else None
    batches, steps_per_epoch = iter(trainer.sampler), len(trainer.sampler)
    warmup = min(args.warmup, steps_per_epoch - 1)
    timed = min(args.steps, steps_per_epoch - warmup)
    warmup_seconds = time_steps(trainer, batches, warmup, False)[0]
    timed_seconds, timed_docs, busy = time_steps(trainer, batches, timed, args.mode == "phases")
    kernels, busy_from_kernels = {}, None
    if args.mode == "plain" and device.type == "cuda" and args.profile_steps:
        try:
            left = steps_per_epoch - warmup - timed
            kernels, busy_from_kernels = profile_kernels(
                trainer.step, batches, device, min(args.profile_steps, left)
            )
        except Exception as e:  # noqa: BLE001 - the profile is extra; the timings stand without it
            kernels = {f"profiler failed: {type(e).__name__}: {e}": 0.0}
    eval_seconds, checkpoint_seconds = time_eval_and_checkpoint(trainer)
    per_step, optimizer = timed_seconds / timed, trainer.optimizer
    result = {
        "preset": args.preset,
        "variant": args.variant,
        "mode": args.mode,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "scale": args.scale,
        "train_docs": len(trainer.data.train),
        "validation_docs": len(trainer.data.validation),
        "steps_per_epoch": steps_per_epoch,
        "batch_size": trainer.spec.batch_size,
        "load_seconds": trainer.load_seconds,
        "warmup_steps": warmup,
        "warmup_seconds": warmup_seconds,
        "timed_steps": timed,
        "timed_docs": timed_docs,
        "seconds_per_step": per_step,
        "gpu_busy_nvml": busy,
        "gpu_busy_kernels": busy_from_kernels,
        "eval_seconds": eval_seconds,
        "checkpoint_seconds": checkpoint_seconds,
        # a generated fraction ``scale`` of each split: the full epoch has 1/scale as many steps
        # and validation documents (the checkpoint does not grow with the data)
        "epoch_train_seconds": per_step * steps_per_epoch / args.scale,
        "epoch_seconds": (per_step * steps_per_epoch + eval_seconds) / args.scale
        + checkpoint_seconds,
        "phase_seconds_per_step": (
            {k: v / timed for k, v in trainer.timings.items()} if args.mode == "phases" else None
        ),
        "pad_to_multiple": trainer.multiple,
        "optimizer": type(optimizer).__name__
        + (" (fused)" if optimizer.defaults.get("fused") else ""),
        "top_kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:25]),
    }
    if args.variant == "graphs":
        result["graphs_captured"] = len(trainer.graphed.graphs)
        result["capture_seconds"] = capture_seconds
        result["graphs_deterministic"] = torch.are_deterministic_algorithms_enabled()
    if args.variant == "compile":
        from torch._dynamo.utils import counters

        result["compiled_graphs"] = counters["stats"]["unique_graphs"]
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


# ----------------------------------------------------------------------------- driver


def prepare_once(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Write the stand-in and tokenise it (once per node; later loads are cache hits)."""
    t = time.perf_counter()
    data_spec, _, _ = study_specs(
        preset, Path(args.data_root), scale=args.scale, cache_dir=args.cache_dir
    )
    written = time.perf_counter() - t
    t = time.perf_counter()
    data = prepare_data(data_spec)
    return {
        "write_seconds": written,
        "tokenise_seconds": time.perf_counter() - t,
        "cache_hit": data.cache_hit,
        "stats": data.stats,
    }


DEFAULT_STEPS = {"ag_news": 300, "imdb": 100, "arxiv": 25}
DEFAULT_WARMUP = {"ag_news": 20, "imdb": 10, "arxiv": 3}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--presets", nargs="+", default=["ag_news", "imdb", "arxiv"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument(
        "--phases",
        nargs="*",
        default=["baseline", "nosync"],
        choices=VARIANTS,
        help="variants also timed phase by phase",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default per preset)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default per preset)"
    )
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each split to generate")
    p.add_argument("--arxiv-scale", type=float, default=0.1)
    p.add_argument("--data-root", default=str(Path(tempfile.gettempdir()) / "fusion_ray_stand_ins"))
    p.add_argument(
        "--cache-dir", default=str(Path(tempfile.gettempdir()) / "fusion_ray_bench_cache")
    )
    p.add_argument(
        "--deadline", type=float, default=None, help="skip variants after this many seconds"
    )
    p.add_argument("--out", default=None, help="JSON results file")
    # one variant in this process (the driver runs each so)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--preset", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    return p


def run_in_subprocess(
    preset: str, variant: str, mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One variant in a fresh process (its own CUDA context and environment)."""
    env = dict(os.environ)
    if variant == "baseline":
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    warmup = args.warmup or DEFAULT_WARMUP[preset] * (3 if variant == "compile" else 1)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--device",
        args.device,
        "--preset",
        preset,
        "--variant",
        variant,
        "--mode",
        mode,
        "--scale",
        str(args.arxiv_scale if preset == "arxiv" else args.scale),
        "--steps",
        str(args.steps or DEFAULT_STEPS[preset]),
        "--warmup",
        str(warmup),
        "--profile-steps",
        str(args.profile_steps),
        "--data-root",
        args.data_root,
        "--cache-dir",
        args.cache_dir,
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{preset}/{variant}/{mode} FAILED:\n{proc.stderr[-3000:]}", flush=True)
        return {"preset": preset, "variant": variant, "mode": mode, "error": proc.stderr[-3000:]}
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    run["process_seconds"] = time.perf_counter() - t
    busy = run["gpu_busy_nvml"]
    print(
        f"{preset:8} {variant:9} {mode:6} {1e3 * run['seconds_per_step']:8.2f} ms/step "
        f"epoch {run['epoch_seconds']:8.1f} s (train {run['epoch_train_seconds']:.1f}, "
        f"eval {run['eval_seconds']:.2f}, ckpt {run['checkpoint_seconds']:.2f}) "
        f"busy {'n/a' if busy is None else f'{100 * busy:.0f}%'} warmup {run['warmup_seconds']:.1f} s",
        flush=True,
    )
    if run["phase_seconds_per_step"]:
        print(
            "    phases ms/step: "
            + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in run["phase_seconds_per_step"].items()),
            flush=True,
        )
    return run


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        print(json.dumps(run_variant(args)))
        return
    started = time.perf_counter()
    results: dict[str, Any] = {"prepare": {}, "runs": [], "skipped": []}
    for preset in args.presets:
        scale = args.arxiv_scale if preset == "arxiv" else args.scale
        results["prepare"][preset] = prepare_once(
            preset, argparse.Namespace(**{**vars(args), "scale": scale})
        )
        print(f"{preset}: prepared {results['prepare'][preset]['stats']['train']}", flush=True)
    # every variant timed plainly for every preset (the before/after ratios of one run), then
    # the phase-by-phase timings, until the deadline
    plan = [(p, v, "plain") for p in args.presets for v in args.variants]
    plan += [(p, v, "phases") for p in args.presets for v in args.phases]
    for preset, variant, mode in plan:
        if args.deadline and time.perf_counter() - started > args.deadline:
            results["skipped"].append(f"{preset}/{variant}/{mode}")
            continue
        results["runs"].append(run_in_subprocess(preset, variant, mode, args))
        if args.out:  # after every run: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"total {time.perf_counter() - started:.0f} s; skipped: {results['skipped'] or 'none'}")


if __name__ == "__main__":
    main()
