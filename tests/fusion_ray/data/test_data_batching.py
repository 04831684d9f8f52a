"""The sampler (seed-paired, length-grouped, DDP-aware) and dynamic-padding collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fusion_ray.data import LengthGroupedSampler, TokenizedSplit, collate

pytestmark = pytest.mark.unit


def _lengths(n: int = 1000, seed: int = 0) -> np.ndarray:
    """IMDB-like: log-normal lengths with a long tail."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(200), 0.6, size=n), 5, 2000).astype(int)


def test_same_seed_and_epoch_give_the_same_batches():
    lengths = _lengths()
    a = LengthGroupedSampler(lengths, 32, seed=3)
    b = LengthGroupedSampler(lengths, 32, seed=3)
    for epoch in (0, 1, 7):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert a.global_batches() == b.global_batches()
        assert list(a) == a.global_batches()  # world_size 1: the rank's share is everything


def test_epochs_and_seeds_are_spread():
    lengths = _lengths(300)
    orders = {}
    for seed in range(4):
        for epoch in range(4):
            s = LengthGroupedSampler(lengths, 16, seed=seed)
            s.set_epoch(epoch)
            orders[seed, epoch] = s.global_batches()
    # No two (seed, epoch) pairs share a batch order; in particular (s, e+1) != (s+1, e).
    keys = list(orders)
    for i, k1 in enumerate(keys):
        for k2 in keys[i + 1 :]:
            assert orders[k1] != orders[k2], (k1, k2)


def test_every_epoch_is_a_permutation_of_the_documents():
    lengths = _lengths(203)
    s = LengthGroupedSampler(lengths, 16, seed=0)
    for epoch in range(3):
        s.set_epoch(epoch)
        flat = [i for b in s.global_batches() for i in b]
        assert sorted(flat) == list(range(203))
        assert len(s) == len(s.global_batches()) == 13


def _padded_tokens(lengths: np.ndarray, batches: list[list[int]]) -> int:
    return sum(len(b) * int(lengths[b].max()) for b in batches)


def test_length_grouping_cuts_padding_and_stays_shuffled():
    lengths = _lengths(2000)
    grouped = LengthGroupedSampler(lengths, 32, seed=0, mega_batch_mult=16).global_batches()
    plain = LengthGroupedSampler(lengths, 32, seed=0, group_by_length=False).global_batches()
    real = int(lengths.sum())
    assert _padded_tokens(lengths, grouped) < 1.25 * real  # little padding
    assert _padded_tokens(lengths, plain) > 2.5 * real  # random batches: mostly padding
    # Grouped batches are homogeneous yet their order is random, not sorted by length.
    maxima = [int(lengths[b].max()) for b in grouped]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)
    # Batches come from different mega-batches: the first batch is not simply the longest docs.
    assert set(grouped[0]) != set(np.argsort(-lengths, kind="stable")[:32].tolist())


def test_unshuffled_orders():
    lengths = np.array([3, 9, 1, 7, 5])
    seq = LengthGroupedSampler(lengths, 2, seed=0, shuffle=False, group_by_length=False)
    assert seq.global_batches() == [[0, 1], [2, 3], [4]]
    by_len = LengthGroupedSampler(lengths, 2, seed=0, shuffle=False)
    assert by_len.global_batches() == [[1, 3], [4, 0], [2]]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ddp_shards_are_disjoint_cover_the_batch_and_take_equal_steps(world_size):
    lengths = _lengths(250)
    reference = LengthGroupedSampler(lengths, 24, seed=5)
    reference.set_epoch(2)
    samplers = [
        LengthGroupedSampler(lengths, 24, seed=5, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for s in samplers:
        s.set_epoch(2)
    shards = [list(s) for s in samplers]
    steps = {len(x) for x in shards} | {len(s) for s in samplers}
    assert len(steps) == 1  # every rank takes the same number of steps
    global_batches = samplers[0].global_batches()
    # The global order does not depend on rank or world size (only the trailing batch may drop).
    assert global_batches == reference.global_batches()[: len(global_batches)]
    for step, batch in enumerate(global_batches):
        parts = [shard[step] for shard in shards]
        assert all(parts), "every rank gets at least one document"
        assert sorted(i for p in parts for i in p) == sorted(batch)  # disjoint and covering
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_trailing_batch_smaller_than_world_size_is_dropped():
    lengths = np.arange(1, 11)  # 10 documents, batches of 4: 4, 4, 2
    assert len(LengthGroupedSampler(lengths, 4, seed=0, world_size=2)) == 3
    three = [LengthGroupedSampler(lengths, 4, seed=0, rank=r, world_size=3) for r in range(3)]
    assert all(len(s) == 2 == len(list(s)) for s in three)
    assert all(len(b) == 4 for b in three[0].global_batches())


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match="smaller than world_size"):
        LengthGroupedSampler([1, 2, 3], 2, seed=0, world_size=4, rank=0)
    with pytest.raises(ValueError, match="rank"):
        LengthGroupedSampler([1, 2, 3], 2, seed=0, world_size=2, rank=2)


def test_state_dict_round_trip():
    s = LengthGroupedSampler(_lengths(100), 8, seed=1)
    s.set_epoch(4)
    t = LengthGroupedSampler(_lengths(100), 8, seed=1)
    t.load_state_dict(s.state_dict())
    assert t.epoch == 4 and t.global_batches() == s.global_batches()
    with pytest.raises(ValueError, match="seed"):
        LengthGroupedSampler(_lengths(100), 8, seed=2).load_state_dict(s.state_dict())


def _split() -> TokenizedSplit:
    ids = [
        np.array([5, 6, 7], np.int32),
        np.array([8], np.int32),
        np.array([9, 10, 11, 12, 13], np.int32),
    ]
    return TokenizedSplit(ids=ids, labels=np.array([2, 0, 1]), lengths=np.array([3, 1, 40]))


def test_collate_pads_to_the_longest_document():
    batch = collate(_split(), [1, 0])
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (2, 3)
    assert batch["input_ids"].tolist() == [[8, 0, 0], [5, 6, 7]]
    assert batch["attention_mask"].dtype == torch.bool
    assert batch["attention_mask"].tolist() == [[True, False, False], [True, True, True]]
    assert batch["labels"].tolist() == [0, 2] and batch["labels"].dtype == torch.long
    assert batch["lengths"].tolist() == [1, 3]


def test_collate_fixed_padding_and_pre_truncation_lengths():
    batch = collate(_split(), [2, 1], pad_to=8, pad_id=0)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 8)
    assert batch["attention_mask"].sum(1).tolist() == [5, 1]
    assert batch["lengths"].tolist() == [40, 1]  # before truncation, for length-aware analysis
    assert (batch["input_ids"][~batch["attention_mask"]] == 0).all()
    with pytest.raises(ValueError, match="pad_to"):
        collate(_split(), [2], pad_to=4)


def test_collate_rounds_the_width_up_to_a_multiple():
    split = _split()
    assert collate(split, [1, 0], multiple=4)["input_ids"].shape == (2, 4)  # longest 3 -> 4
    assert collate(split, [1], multiple=4)["input_ids"].shape == (1, 4)  # 1 -> 4
    batch = collate(split, [2, 1], multiple=4)  # longest 5 (truncated) -> 8
    assert batch["input_ids"].shape == (2, 8)
    assert batch["attention_mask"].sum(1).tolist() == [5, 1]
    assert (batch["input_ids"][~batch["attention_mask"]] == 0).all()
    assert collate(split, [2, 1], multiple=5)["input_ids"].shape == (2, 5)  # already a multiple
    assert collate(split, [2], pad_to=8, multiple=3)["input_ids"].shape == (1, 8)  # pad_to wins
    with pytest.raises(ValueError, match="multiple"):
        collate(split, [0], multiple=0)


def test_collate_mask_does_not_trust_token_values():
    # A real token equal to pad_id (0) is still masked in: the mask comes from document lengths.
    split = TokenizedSplit(ids=[np.array([0, 4])], labels=np.array([1]), lengths=np.array([2]))
    assert collate(split, [0])["attention_mask"].tolist() == [[True, True]]
