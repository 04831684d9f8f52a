"""Epoch throughput of length-grouped dynamic padding against the study's fixed padding.

Same model, same seed, same documents, measured side by side in one run: one training epoch
with ``LengthGroupedSampler`` + dynamic padding, and one with shuffled batches padded to
``max_length`` (what the study's notebooks did). Throughput counts real (non-pad) tokens per
second. Two length distributions, max length 512:

- AG-News-like: log-normal lengths, mean about 45 tokens;
- IMDB-like: log-normal with a long right tail, mean about 300 tokens.

    python bench/padding.py [--docs 1024] [--d-model 128] [--layers 2]

The last line prints the two ratios (dynamic / fixed). Goal: at least 4x on AG-News-like.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusion_ray.data import LengthGroupedSampler, TokenizedSplit, collate  # noqa: E402
from fusion_ray.model import ModelSpec, build_classifier  # noqa: E402

MAX_LENGTH = 512
VOCAB = 8000


def lengths_like(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "ag_news":  # mean ~45, narrow
        raw = rng.lognormal(mean=np.log(42), sigma=0.35, size=n)
    else:  # IMDB: median ~230, mean ~300, long right tail
        raw = rng.lognormal(mean=np.log(225), sigma=0.75, size=n)
    return np.clip(np.round(raw), 4, 5000).astype(np.int64)


def split_like(kind: str, n: int, seed: int = 0) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    lengths = lengths_like(kind, n, rng)
    ids = [rng.integers(2, VOCAB, size=min(int(n_tok), MAX_LENGTH)) for n_tok in lengths]
    labels = rng.integers(0, 4, size=n)
    return TokenizedSplit(ids=ids, labels=labels, lengths=lengths)


def epoch_tokens_per_second(
    split: TokenizedSplit, spec: ModelSpec, batch_size: int, dynamic: bool
) -> tuple[float, float]:
    model = build_classifier(spec, VOCAB, 4, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sampler = LengthGroupedSampler(
        np.minimum(split.lengths, MAX_LENGTH), batch_size, seed=0, group_by_length=dynamic
    )
    sampler.set_epoch(0)
    pad_to = None if dynamic else MAX_LENGTH
    real_tokens, started = 0, time.perf_counter()
    model.train()
    for indices in sampler:
        batch = collate(split, indices, pad_to=pad_to)
        logits = model(batch["input_ids"], batch["attention_mask"])  # [B, C]
        loss = F.cross_entropy(logits, batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        real_tokens += int(batch["attention_mask"].sum())
    seconds = time.perf_counter() - started
    return real_tokens / seconds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1024, help="documents per epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = ModelSpec(
        d_model=args.d_model,
        n_heads=8,
        n_layers=args.layers,
        d_ff=2 * args.d_model,
        dropout=0.1,
        max_len=MAX_LENGTH,
        fusion="add",
    )
    print(
        f"model d_model={args.d_model} layers={args.layers}; {args.docs} docs/epoch, batch {args.batch_size}, "
        f"max length {MAX_LENGTH}, torch threads {torch.get_num_threads()}"
    )
    ratios = {}
    for kind in ("ag_news", "imdb"):
        split = split_like(kind, args.docs)
        clipped = np.minimum(split.lengths, MAX_LENGTH)
        fixed_tps, fixed_s = epoch_tokens_per_second(split, spec, args.batch_size, dynamic=False)
        dyn_tps, dyn_s = epoch_tokens_per_second(split, spec, args.batch_size, dynamic=True)
        ratios[kind] = dyn_tps / fixed_tps
        print(
            f"{kind + '-like':<13} mean {split.lengths.mean():6.1f} tokens (clip rate {np.mean(split.lengths > MAX_LENGTH):.1%}, "
            f"{clipped.sum()} real tokens): fixed {fixed_tps:9.0f} tok/s ({fixed_s:6.1f} s), "
            f"dynamic {dyn_tps:9.0f} tok/s ({dyn_s:6.1f} s)"
        )
    print(
        f"dynamic/fixed epoch throughput: ag_news-like {ratios['ag_news']:.2f}x, imdb-like {ratios['imdb']:.2f}x (goal >= 4x on ag_news-like)"
    )


if __name__ == "__main__":
    main()
