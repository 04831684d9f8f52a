"""Peak GPU memory of one training step of the ArXiv preset at L = 4096, per position method.

Every attention-level position (``none``, ``rope``, ``alibi``, ``t5_bias``, with sinusoidal P) and
every input-level position (with no attention-level one) trains one step (forward, loss,
backward, AdamW, bf16 autocast as the loop uses on GPUs) on a batch of full-length documents,
once unpadded (every document 4,096 tokens: the mask is dropped, the flash-eligible case) and
once padded (one document shorter, so a padding mask is needed). Starting at the preset's
batch of 64, the batch halves until the step fits; the table gives the largest batch that
fits, its peak memory (``torch.cuda.max_memory_allocated``), its step time, and the gradient
accumulation needed to keep the preset's 64 documents per optimiser step. Then the same for
evaluation (``model.eval()``, no gradients, bf16 autocast): the largest batch up to
``--eval-batch`` (the loop's ``train.eval_batch_size``, 128) whose forward pass fits, and its peak.

    python bench/attention_memory.py [--length 4096] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_data import preset_model  # noqa: E402

from fusion_ray.model import ATTENTION_POSITIONS, POSITIONS, ModelSpec, build_classifier  # noqa: E402

VOCAB, CLASSES = 50_000, 11


def arxiv_spec(length: int, position: str, attention_position: str) -> ModelSpec:
    """The ArXiv preset's model at ``length`` tokens with these positions."""
    return preset_model(
        "arxiv", max_len=length, position=position, attention_position=attention_position
    )


def one_step(
    spec: ModelSpec, batch: int, length: int, padded: bool, device: torch.device
) -> tuple[float, float]:
    """(peak GiB, seconds) of one training step; raises torch.OutOfMemoryError when it does not fit."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    model = build_classifier(spec, VOCAB, CLASSES, seed=0).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(1, VOCAB, (batch, length), device=device)
    labels = torch.randint(0, CLASSES, (batch,), device=device)
    mask = None
    if padded:
        mask = torch.ones(batch, length, dtype=torch.bool, device=device)
        mask[-1, length // 2 :] = False
    try:
        seconds = []
        for _ in range(2):  # the second step has the optimiser state allocated
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(ids, mask).float(), labels)
            loss.backward()
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - t)
        return torch.cuda.max_memory_allocated(device) / 2**30, seconds[-1]
    finally:
        del model, optimiser, ids, labels, mask
        torch.cuda.empty_cache()


@torch.no_grad()
def eval_pass(
    spec: ModelSpec, batch: int, length: int, padded: bool, device: torch.device
) -> tuple[float, float]:
    """(peak GiB, seconds) of one evaluation forward pass, as ``one_step`` for training."""
    torch.cuda.empty_cache()
    model = build_classifier(spec, VOCAB, CLASSES, seed=0).to(device).eval()
    ids = torch.randint(1, VOCAB, (batch, length), device=device)
    mask = None
    if padded:
        mask = torch.ones(batch, length, dtype=torch.bool, device=device)
        mask[-1, length // 2 :] = False
    torch.cuda.reset_peak_memory_stats(device)
    try:
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(ids, mask).float().argmax(-1)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**30, time.perf_counter() - t
    finally:
        del model, ids, mask
        torch.cuda.empty_cache()


def largest_fitting(measure, batch: int) -> tuple[int, float | None, float | None]:
    """(batch, peak GiB, seconds) of the largest batch, halving from ``batch``, that fits."""
    while batch >= 1:
        try:
            return (batch, *measure(batch))
        except torch.OutOfMemoryError:
            batch //= 2
    return 0, None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64, help="the preset's documents per step")
    parser.add_argument(
        "--eval-batch", type=int, default=128, help="the loop's train.eval_batch_size"
    )
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args()
    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    print(
        f"device: {torch.cuda.get_device_name(device)} ({total:.1f} GiB) | torch {torch.__version__} "
        f"| L = {args.length} | bf16 autocast"
    )
    methods = [("sinusoidal", a) for a in ATTENTION_POSITIONS.names()]
    methods += [(p, "none") for p in POSITIONS.names() if p != "sinusoidal"]
    print(
        f"{'position':<16} {'attention':<12} {'batch':<8} {'fits':>5} {'peak GiB':>9} "
        f"{'s/step':>7} {'accum':>5}  {'eval':>6} {'peak GiB':>9} {'s/pass':>7}"
    )
    rows = []
    for position, attention in methods:
        spec = arxiv_spec(args.length, position, attention)
        for padded in (False, True):
            batch, peak, seconds = largest_fitting(
                lambda b, spec=spec, padded=padded: one_step(spec, b, args.length, padded, device),
                args.batch,
            )
            eval_batch, eval_peak, eval_seconds = largest_fitting(
                lambda b, spec=spec, padded=padded: eval_pass(spec, b, args.length, padded, device),
                args.eval_batch,
            )
            row = {
                "position": position,
                "attention_position": attention,
                "padded": padded,
                "batch": batch,
                "peak_gib": peak,
                "seconds_per_step": seconds,
                "accumulation": math.ceil(args.batch / batch) if batch else None,
                "eval_batch": eval_batch,
                "eval_peak_gib": eval_peak,
                "eval_seconds": eval_seconds,
            }
            padding = "padded" if padded else "unpadded"
            train_text = (
                f"{batch:>5} {peak:>9.2f} {seconds:>7.3f} {row['accumulation']:>5}"
                if batch
                else f"{'none':>5} {'-':>9} {'-':>7} {'-':>5}"
            )
            eval_text = (
                f"{eval_batch:>6} {eval_peak:>9.2f} {eval_seconds:>7.3f}"
                if eval_batch
                else f"{'none':>6} {'-':>9} {'-':>7}"
            )
            print(
                f"{position:<16} {attention:<12} {padding:<8} {train_text}  {eval_text}", flush=True
            )
            rows.append(row)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(device),
                    "total_gib": total,
                    "length": args.length,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
