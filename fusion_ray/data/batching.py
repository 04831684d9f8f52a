"""Length-grouped, seed-paired, DDP-aware batches and dynamic padding.

The batch order depends on ``(seed, epoch)`` only: never on the operator, the rank or the world
size (each rank takes ``batch[rank::world_size]`` of the same global batches), so a paired seed
sees the same documents in the same steps for every fusion operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from fusion_ray.data.prepare import TokenizedSplit


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """An RNG for (seed, epoch). SeedSequence hashes the pair, so (s, e + 1) != (s + 1, e)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch)])))


class LengthGroupedSampler:
    """Yields this rank's share of each global batch of document indices.

    ``batch_size`` is the global batch (summed over ranks). With ``group_by_length`` the indices
    are shuffled, cut into mega-batches of ``batch_size * mega_batch_mult``, each sorted by length
    (longest first) and cut into batches, and the batches are shuffled, so padding is small yet the
    order is random. A trailing global batch smaller than ``world_size`` is dropped so every rank
    gets at least one document and all ranks take the same number of steps.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        group_by_length: bool = True,
        mega_batch_mult: int = 50,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        if batch_size < world_size:
            raise ValueError(
                f"global batch_size {batch_size} is smaller than world_size {world_size}; "
                "raise train.batch_size or use fewer workers"
            )
        if mega_batch_mult < 1:
            raise ValueError(f"mega_batch_mult must be >= 1, got {mega_batch_mult}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.shuffle = shuffle
        self.group_by_length = group_by_length
        self.mega_batch_mult = int(mega_batch_mult)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for seed {state['seed']}, this sampler has {self.seed}"
            )
        self.epoch = int(state["epoch"])

    def _sort_desc(self, idx: np.ndarray) -> np.ndarray:
        # Stable sort on -length: ties keep their (already random or sequential) order.
        return idx[np.argsort(-self.lengths[idx], kind="stable")]

    def global_batches(self) -> list[list[int]]:
        """This epoch's global batches; a function of (seed, epoch) and the lengths only."""
        n = len(self.lengths)
        bs = self.batch_size
        rng = epoch_rng(self.seed, self.epoch)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.group_by_length:
            if self.shuffle:
                mega = bs * self.mega_batch_mult
                order = np.concatenate(
                    [self._sort_desc(order[i : i + mega]) for i in range(0, n, mega)] or [order]
                )
            else:
                order = self._sort_desc(order)  # evaluation: least padding, fixed order
        batches = [order[i : i + bs].tolist() for i in range(0, n, bs)]
        if batches and len(batches[-1]) < self.world_size:
            batches.pop()
        if self.shuffle and self.group_by_length:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_batches():
            yield batch[self.rank :: self.world_size]

    def __len__(self) -> int:
        n, bs = len(self.lengths), self.batch_size
        return n // bs + (1 if n % bs >= self.world_size else 0)


def collate(
    split: TokenizedSplit,
    indices: Sequence[int],
    *,
    pad_to: int | None = None,
    pad_id: int = 0,
    multiple: int = 1,
) -> dict[str, torch.Tensor]:
    """Pad the documents ``indices`` of ``split`` into one batch.

    Returns input_ids LongTensor [B, L] (L = the longest document in the batch rounded up to a
    multiple of ``multiple``, or ``pad_to``),
    attention_mask BoolTensor [B, L] (True = real token), labels LongTensor [B], and lengths
    LongTensor [B]: each document's token count before truncation (for length-aware analysis).
    """
    indices = [int(i) for i in indices]
    if not indices:
        raise ValueError("collate needs at least one index")
    docs = [split.ids[i] for i in indices]
    sizes = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    longest = int(sizes.max())
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    width = -(-longest // multiple) * multiple if pad_to is None else int(pad_to)
    if width < longest:
        raise ValueError(
            f"pad_to={pad_to} is shorter than a document in the batch ({longest} tokens); "
            "pad_to must be at least data.max_length"
        )
    ids = np.full((len(docs), width), pad_id, dtype=np.int64)  # [B, L]
    for row, doc in enumerate(docs):
        ids[row, : len(doc)] = doc
    mask = np.arange(width)[None, :] < sizes[:, None]  # [B, L]
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(np.asarray(split.labels[indices], dtype=np.int64)),
        "lengths": torch.from_numpy(np.asarray(split.lengths[indices], dtype=np.int64)),
    }
