"""Training-step throughput and model FLOP utilisation by sequence length, per fusion operator.

The study's ArXiv preset (d_model 128, 8 heads, 2 layers, feed-forward 256, dropout 0.1, 11
classes) trains on full-length batches without padding (the flash-eligible path on a GPU) for
``add``, ``gate_scalar`` and ``gate_cnn``, measured side by side in one run: the models of one
length are timed in interleaved rounds and the median round counts.

    python bench/throughput.py --device cpu --steps 2 --batch-size 1
    python bench/throughput.py --device cuda --dtype bf16 --batch-size 16 --steps 20

FLOPs per token are ``fusion_ray.model.flops_per_token`` (6 x non-embedding parameters plus
12 x layers x L x d for attention). MFU is printed only when a peak is known: ``--peak-tflops``
or, for CUDA devices, a small table of dense peaks. Imports only torch and fusion_ray.model.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from fusion_ray.model import ModelSpec, build_classifier, count_parameters, flops_per_token

FUSIONS = ("add", "gate_scalar", "gate_cnn")
NUM_CLASSES = 11

# Dense peak FLOP/s from the vendors' data sheets (no sparsity). fp32 means plain FP32 (PyTorch's
# default matmul precision does not use TF32). More specific names first.
PEAK_FLOPS = [
    ("H100 PCIe", {"bf16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp32": 67e12}),
    ("H200", {"bf16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
]


def arxiv_spec(fusion: str, max_len: int) -> ModelSpec:
    return ModelSpec(
        d_model=128,
        n_heads=8,
        n_layers=2,
        d_ff=256,
        dropout=0.1,
        max_len=max_len,
        fusion=fusion,
        position="sinusoidal",
    )


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            names = [
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            ]
            model = names[0] if names else model
    return f"{model} ({torch.get_num_threads()} threads)"


def peak_flops(device: torch.device, dtype: str, override_tflops: float | None) -> float | None:
    if override_tflops is not None:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_FLOPS:
        if key in name:
            return peaks[dtype]
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: torch.nn.Module, device: torch.device, dtype: str, batch: int, length: int):
    """One training step (forward, loss, backward, AdamW) on a fixed random batch."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.embedding.num_embeddings, (batch, length), generator=g).to(device)
    labels = torch.randint(0, NUM_CLASSES, (batch,), generator=g).to(device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if dtype == "bf16"
        else contextlib.nullcontext()
    )

    def step() -> None:
        with autocast:
            loss = F.cross_entropy(model(ids), labels)  # no mask: equal lengths, no padding
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)

    return step


def time_steps(step, steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 1 on CPU, 16 on GPU")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps per round (2 CPU, 20 GPU)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per model first")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median counts")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--vocab-size", type=int, default=50000, help="the study's word vocabulary")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak for MFU")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    args = parser.parse_args()

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    batch = args.batch_size or (16 if on_gpu else 1)
    steps = args.steps or (20 if on_gpu else 2)
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = peak_flops(device, args.dtype, args.peak_tflops)

    print(
        f"device: {device_name(device)} | dtype {args.dtype} | batch {batch} | steps {steps} "
        f"x {args.rounds} rounds | torch {torch.__version__}"
    )
    header = (
        f"{'length':>6} {'fusion':<12} {'params':>9} {'ms/step':>9} {'tokens/s':>11} "
        f"{'GFLOP/tok':>9} {'TFLOP/s':>8} {'MFU':>7} {'vs add':>7} {'spread':>7}"
    )
    print(header)
    print("-" * len(header))

    summary = []
    for length in args.lengths:
        models, step_fns = {}, {}
        for fusion in FUSIONS:
            spec = arxiv_spec(fusion, max(args.lengths))
            models[fusion] = build_classifier(spec, args.vocab_size, NUM_CLASSES, seed=0).to(device)
            models[fusion].train()
            step_fns[fusion] = make_step(models[fusion], device, args.dtype, batch, length)
            for _ in range(args.warmup):
                step_fns[fusion]()
        seconds: dict[str, list[float]] = {f: [] for f in FUSIONS}
        for _ in range(args.rounds):
            for fusion in FUSIONS:
                seconds[fusion].append(time_steps(step_fns[fusion], steps, device))

        tokens_per_s = {}
        for fusion in FUSIONS:
            per_step = statistics.median(seconds[fusion])
            tokens_per_s[fusion] = batch * length / per_step
            flops = flops_per_token(arxiv_spec(fusion, length), length)
            achieved = flops * tokens_per_s[fusion]
            mfu = f"{100 * achieved / peak:6.2f}%" if peak else "    n/a"
            ratio = tokens_per_s[fusion] / tokens_per_s["add"]
            spread = (
                max(seconds[fusion]) - min(seconds[fusion])
            ) / per_step  # round-to-round noise
            print(
                f"{length:>6} {fusion:<12} {count_parameters(models[fusion]):>9,} "
                f"{1e3 * per_step:>9.1f} {tokens_per_s[fusion]:>11,.0f} {flops / 1e9:>9.4f} "
                f"{achieved / 1e12:>8.3f} {mfu:>7} {ratio:>6.3f}x {100 * spread:>6.1f}%"
            )
        summary.append(
            f"L={length}: add {tokens_per_s['add']:,.0f} tok/s, "
            f"gate_scalar/add {tokens_per_s['gate_scalar'] / tokens_per_s['add']:.3f}, "
            f"gate_cnn/add {tokens_per_s['gate_cnn'] / tokens_per_s['add']:.3f}"
        )
        del models, step_fns
        if on_gpu:
            torch.cuda.empty_cache()

    print(f"summary ({device.type}, {args.dtype}, batch {batch}): " + "; ".join(summary))


if __name__ == "__main__":
    main()
