"""Peak GPU memory of one training step of the ArXiv preset at L = 4096, per position method.

Every attention-level position (``none``, ``rope``, ``alibi``, ``t5_bias``, with sinusoidal P) and
every input-level position (with no attention-level one) trains one step (forward, loss,
backward, AdamW, bf16 autocast as the loop uses on GPUs) on a batch of full-length documents,
once unpadded (every document 4,096 tokens: the mask is dropped, the flash-eligible case) and
once padded (one document shorter, so a padding mask is needed). Starting at the preset's
batch of 64, the batch halves until the step fits; the table gives the largest batch that
fits, its peak memory (``torch.cuda.max_memory_allocated``), its step time, and the gradient
accumulation needed to keep the preset's 64 documents per optimiser step.

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

from fusion_ray.model import ATTENTION_POSITIONS, POSITIONS, ModelSpec, build_classifier  # noqa: E402

VOCAB, CLASSES = 50_000, 11


def arxiv_spec(length: int, position: str, attention_position: str) -> ModelSpec:
    return ModelSpec(
        d_model=128,
        n_heads=8,
        n_layers=2,
        d_ff=256,
        dropout=0.1,
        max_len=length,
        fusion="add",
        position=position,
        attention_position=attention_position,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64, help="the preset's documents per step")
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
        f"{'position':<16} {'attention':<9} {'batch':<8} {'fits':>5} {'peak GiB':>9} "
        f"{'s/step':>7} {'accum':>5}"
    )
    rows = []
    for position, attention in methods:
        for padded in (False, True):
            batch, row = args.batch, None
            while batch >= 1:
                try:
                    peak, seconds = one_step(
                        arxiv_spec(args.length, position, attention),
                        batch,
                        args.length,
                        padded,
                        device,
                    )
                    row = {
                        "position": position,
                        "attention_position": attention,
                        "padded": padded,
                        "batch": batch,
                        "peak_gib": peak,
                        "seconds_per_step": seconds,
                        "accumulation": math.ceil(args.batch / batch),
                    }
                    break
                except torch.OutOfMemoryError:
                    batch //= 2
            if row is None:
                row = {
                    "position": position,
                    "attention_position": attention,
                    "padded": padded,
                    "batch": 0,
                    "peak_gib": None,
                    "seconds_per_step": None,
                    "accumulation": None,
                }
                print(
                    f"{position:<16} {attention:<9} {'padded' if padded else 'unpadded':<8} "
                    f"{'none':>5}: not even one document fits"
                )
            else:
                print(
                    f"{position:<16} {attention:<9} {'padded' if padded else 'unpadded':<8} "
                    f"{row['batch']:>5} {row['peak_gib']:>9.2f} {row['seconds_per_step']:>7.3f} "
                    f"{row['accumulation']:>5}"
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
