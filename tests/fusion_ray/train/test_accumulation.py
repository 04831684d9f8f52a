"""Gradient accumulation (``train.micro_batch_size``): the same documents per optimiser step in
the same order, and the same gradients and weights as one pass over each step, up to float
round-off, with micro-batches of different sizes and padding, with and without a score bias,
in one process and under DDP.

The exactness tests use dropout 0: with dropout each forward pass draws its masks from the
dropout stream in the shapes of its own batch ([m, L_m, d] per micro-batch instead of one
[B, L, d]), so a document gets a different (equally distributed) mask and the runs differ by
more than round-off. With dropout the tests check what must still hold: the run is
deterministic and a resumed run continues its dropout stream bitwise.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.data import LengthGroupedSampler, TokenizedSplit, collate
from fusion_ray.model import ModelSpec, build_classifier
from fusion_ray.train import TrainSpec, run_local
from fusion_ray.train.loop import (
    accumulate_gradients,
    lr_lambda,
    make_optimizer,
    micro_batches,
    train_epoch,
)
from fusion_ray.train.report import Reporter, load_checkpoint_dir
from fusion_ray.train.spec import check_train_spec
from tests.conftest import tiny_sweep
from tests.helpers import sweep_with, tiny_trial

VOCAB, CLASSES, MAX_LEN = 40, 3, 24


def split_of(lengths: list[int], seed: int = 0) -> TokenizedSplit:
    """A hand-made tokenised split: random token ids (no pad id 0) with the given lengths."""
    rng = np.random.default_rng(seed)
    return TokenizedSplit(
        ids=[rng.integers(1, VOCAB, size=n).astype(np.int64) for n in lengths],
        labels=rng.integers(0, CLASSES, size=len(lengths)).astype(np.int64),
        lengths=np.asarray(lengths, dtype=np.int64),
    )


def model_of(attention: str, seed: int = 0) -> nn.Module:
    spec = ModelSpec(
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=32,
        dropout=0.0,
        max_len=MAX_LEN,
        fusion="gate_scalar",
        attention_position=attention,
    )
    return build_classifier(spec, VOCAB, CLASSES, seed=seed)


def gradients(
    model: nn.Module, split: TokenizedSplit, indices: list[int], spec: TrainSpec
) -> dict[str, torch.Tensor]:
    """The gradients ``accumulate_gradients`` leaves for one step over ``indices``."""
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, split, indices, len(indices), 1, spec, None, torch.device("cpu"))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7, msg=name)


def without_key_bias(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights with each layer's key bias zeroed. Adding b to every key adds q . b to all of
    a query's scores, which softmax ignores: the key bias's gradient is zero but for round-off
    (about 1e-9 here), and Adam, which divides by the gradient's own scale, turns that round-off
    into steps of the order of the learning rate, different in every run whose round-off differs.
    """
    out = dict(weights)
    for name, value in weights.items():
        if name.endswith("attn.qkv.bias"):
            d = value.numel() // 3  # [q | k | v]
            out[name] = torch.cat([value[:d], torch.zeros(d), value[2 * d :]])
    return out


@pytest.mark.unit
def test_micro_batches_are_consecutive_cuts_in_the_samplers_order() -> None:
    assert micro_batches([5, 3, 9, 1, 7], 2) == [[5, 3], [9, 1], [7]]
    assert micro_batches([5, 3, 9, 1], 4) == [[5, 3, 9, 1]]
    assert micro_batches([5, 3, 9], None) == [[5, 3, 9]]


# Longest first, as the length-grouped sampler orders a batch: with 2 documents per micro-batch
# the widths are 20 (unpadded: no mask at all), 17 and 9 (padded), 3 (one short document).
LENGTHS = [20, 20, 17, 9, 9, 4, 3]


@pytest.mark.unit
@pytest.mark.parametrize("attention", ["none", "alibi"])
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_accumulated_gradients_equal_one_pass(attention: str, micro: int) -> None:
    split, indices = split_of(LENGTHS), list(range(len(LENGTHS)))
    widths = [collate(split, c)["input_ids"].shape[1] for c in micro_batches(indices, 2)]
    assert widths == [20, 17, 9, 3]  # the micro-batches really differ in size and padding
    model = model_of(attention)
    one_pass = gradients(model, split, indices, TrainSpec(micro_batch_size=None))
    accumulated = gradients(model, split, indices, TrainSpec(micro_batch_size=micro))
    assert_close(accumulated, one_pass)
    for name, grad in one_pass.items():  # the key bias's gradient is round-off: see above
        if name.endswith("attn.qkv.bias"):
            assert grad[16:32].abs().max() < 1e-5 * grad.abs().max()


@pytest.mark.unit
def test_mean_of_micro_batch_means_would_be_caught() -> None:
    """The tolerance above tells the right normalisation from the usual wrong one: averaging
    each micro-batch's mean loss weights the lone document of the last micro-batch 3.5 times."""
    split, indices = split_of(LENGTHS), list(range(len(LENGTHS)))
    model = model_of("alibi")
    one_pass = gradients(model, split, indices, TrainSpec())
    chunks = micro_batches(indices, 2)
    wrong = {n: torch.zeros_like(g) for n, g in one_pass.items()}
    for chunk in chunks:
        per_chunk = gradients(model, split, chunk, TrainSpec())  # this chunk's mean
        for name in wrong:
            wrong[name] += per_chunk[name] / len(chunks)
    with pytest.raises(AssertionError):
        assert_close(wrong, one_pass)


@dataclasses.dataclass
class BatchRecorder(Reporter):
    """Records the documents of every optimiser step."""

    steps: list[list[int]] = dataclasses.field(default_factory=list)

    def on_train_batch(self, epoch: int, indices: list[int]) -> None:
        self.steps.append([int(i) for i in indices])


def train(
    attention: str, split: TokenizedSplit, epochs: int = 2, **train_settings
) -> tuple[dict[str, torch.Tensor], list[list[int]], float]:
    """Weights, optimiser steps and last epoch's loss after ``epochs`` epochs of ``train_epoch``:
    Adam, warm-up then a linear decay (the rate changes at every step), and a low clip."""
    settings = {
        "optimizer": "adam",
        "lr": 3e-3,
        "batch_size": 8,
        "warmup_steps": 2,
        "schedule": "linear",
        "grad_clip": 0.05,
        "pad_to_multiple": 4,
    }
    spec = TrainSpec(**{**settings, **train_settings})
    torch.manual_seed(0)
    model = model_of(attention, seed=1)
    optimizer = make_optimizer(model, spec)
    sampler = LengthGroupedSampler(split.input_lengths, spec.batch_size, seed=5)
    total = epochs * len(sampler)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec, total))
    reporter = BatchRecorder()
    loss = float("nan")
    for epoch in range(epochs):
        loss, _ = train_epoch(
            model, optimizer, scheduler, split, sampler, epoch, reporter, spec, None
        )
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return weights, reporter.steps, loss


@pytest.mark.unit
@pytest.mark.parametrize("attention", ["none", "alibi"])
def test_training_with_accumulation_ends_where_one_pass_ends(attention: str) -> None:
    # 30 documents of 2..24 tokens in batches of 8: the last step of each epoch has 6 documents,
    # cut into micro-batches of 4 and 2.
    split = split_of([2 + (7 * i) % 23 for i in range(30)], seed=1)
    one_pass, steps, loss = train(attention, split)
    accumulated, accumulated_steps, accumulated_loss = train(attention, split, micro_batch_size=4)
    assert accumulated_steps == steps  # the same documents per step, in the same order
    assert sorted(map(len, steps)) == [6, 6] + [8] * 6
    assert accumulated_loss == pytest.approx(loss, rel=1e-6)
    assert_close(without_key_bias(accumulated), without_key_bias(one_pass))
    # The clip acts here (without it training ends elsewhere), so the agreement above also says
    # that it acts once per optimiser step, on the whole step's gradient.
    unclipped, _, _ = train(attention, split, grad_clip=None, micro_batch_size=4)
    with pytest.raises(AssertionError):
        assert_close(without_key_bias(unclipped), without_key_bias(one_pass))


@pytest.mark.unit
def test_dropout_with_accumulation_is_deterministic_and_resumes_bitwise(
    tmp_path: Path, data_cache: str
) -> None:
    trial = tiny_trial(data_cache, micro_batch_size=8)
    assert trial.model.dropout > 0
    reference = run_local(trial, str(tmp_path / "ref"))
    with pytest.raises(KeyboardInterrupt):
        run_local(trial, str(tmp_path / "resumed"), stop_after_reports=1)  # after epoch 0
    resumed = run_local(trial, str(tmp_path / "resumed"))
    for key in ("test_acc", "best_val_acc", "best_epoch", "test_loss"):
        assert resumed[key] == reference[key], key

    def last_weights(out: Path) -> dict[str, torch.Tensor]:
        return load_checkpoint_dir(sorted((out / "checkpoints").glob("report_*"))[-1])["model"]

    ref_w, res_w = last_weights(tmp_path / "ref"), last_weights(tmp_path / "resumed")
    assert all(torch.equal(ref_w[k], res_w[k]) for k in ref_w)


# ----------------------------------------------------------------------------- DDP


def counting_allreduce(calls: list[int], bucket):
    """DDP's default all-reduce, recording each bucket it reduces in ``calls``. (No annotations:
    DDP checks them against the real classes, and this module's are strings.)"""
    calls.append(bucket.index())
    return allreduce_hook(None, bucket)


def _ddp_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: two epochs of ``train_epoch`` under DDP, without and with micro-batches."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        split = split_of([2 + (5 * i) % 23 for i in range(29)], seed=2)
        for micro in (None, 2):
            spec = TrainSpec(optimizer="adam", lr=3e-3, batch_size=8, micro_batch_size=micro)
            model = nn.parallel.DistributedDataParallel(model_of("alibi", seed=3))
            reductions: list[int] = []  # one entry per gradient bucket all-reduced
            model.register_comm_hook(reductions, counting_allreduce)
            optimizer = make_optimizer(model, spec)
            sampler = LengthGroupedSampler(
                split.input_lengths, 8, seed=4, rank=rank, world_size=world_size
            )
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            reporter = Reporter(world_size=world_size, rank=rank)
            for epoch in range(2):
                train_epoch(
                    model, optimizer, scheduler, split, sampler, epoch, reporter, spec, None
                )
            state = {k: v.tolist() for k, v in model.module.state_dict().items()}
            result = {"weights": state, "reductions": len(reductions), "steps": 2 * len(sampler)}
            Path(out_dir, f"rank{rank}_micro{micro}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.process
def test_ddp_with_accumulation_matches_ddp_without(tmp_path: Path) -> None:
    """Two gloo ranks (no Ray): each rank's share of 4 documents is cut into micro-batches of 2;
    the epoch's last global batch has 5 documents, so one rank runs two micro-batches and the
    other one, and only the last of each synchronises."""
    init_file = str(tmp_path / "process_group")  # gloo's rendezvous file; must not exist yet
    ranks = mp.start_processes(
        _ddp_worker, args=(2, init_file, str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 180
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(
                "the ranks did not finish in 180 s: one waits in a collective the other skipped"
            )

    results = {
        (rank, micro): json.loads((tmp_path / f"rank{rank}_micro{micro}.json").read_text())
        for rank in (0, 1)
        for micro in (None, 2)
    }
    weights = {
        key: {k: torch.tensor(v) for k, v in r["weights"].items()} for key, r in results.items()
    }
    reference = weights[0, None]
    assert_close(weights[1, None], reference)  # DDP keeps the ranks identical
    for rank in (0, 1):
        assert_close(without_key_bias(weights[rank, 2]), without_key_bias(reference))
    # one all-reduce per bucket and optimiser step, with micro-batches as without them
    steps = results[0, None]["steps"]
    assert {r["reductions"] for r in results.values()} == {steps}
    initial = model_of("alibi", seed=3).state_dict()
    assert not torch.equal(initial["head.weight"], reference["head.weight"])  # it trained


# ----------------------------------------------------------------------------- settings


@pytest.mark.unit
def test_micro_batch_size_must_divide_each_workers_share() -> None:
    assert check_train_spec(TrainSpec(batch_size=64, micro_batch_size=16)) == []
    assert check_train_spec(TrainSpec(batch_size=64, micro_batch_size=None), workers=3) == []
    assert check_train_spec(TrainSpec(batch_size=64, micro_batch_size=16), workers=2) == []
    (problem,) = check_train_spec(TrainSpec(batch_size=64, micro_batch_size=24))
    assert problem.startswith("micro_batch_size: 24 does not divide") and "64" in problem
    (problem,) = check_train_spec(TrainSpec(batch_size=64, micro_batch_size=32), workers=4)
    assert "= 16 documents" in problem and "multiple of 128" in problem
    (problem,) = check_train_spec(TrainSpec(batch_size=64, micro_batch_size=0))
    assert problem == "micro_batch_size: must be >= 1 or null (got 0)"


@pytest.mark.unit
def test_a_sweep_file_with_a_bad_micro_batch_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.micro_batch_size: 5 does not divide"):
        load_sweep(sweep_with(tmp_path, micro_batch_size=5))


@pytest.mark.unit
def test_train_epoch_refuses_a_micro_batch_that_does_not_divide_the_ranks_share() -> None:
    spec = TrainSpec(batch_size=8, micro_batch_size=4)
    split = split_of([5] * 8)
    model = model_of("none")
    optimizer = make_optimizer(model, spec)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    sampler = LengthGroupedSampler(split.input_lengths, 8, seed=0, rank=0, world_size=4)
    with pytest.raises(ValueError, match="train.micro_batch_size: 4 does not divide"):
        train_epoch(
            model, optimizer, scheduler, split, sampler, 0, Reporter(world_size=4), spec, None
        )


@pytest.mark.unit
def test_cell_ids_stay_at_the_default_and_change_with_a_micro_batch_size(tmp_path: Path) -> None:
    """At its default (null) the setting stays out of the id, so the cells of sweeps written
    before it existed keep their ids (tests/fusion_ray/config/test_config.py pins Table 1's); set, it counts."""
    ids = [c.cell_id for c in expand(load_sweep(tiny_sweep(tmp_path)))]
    default = sweep_with(tmp_path / "default", micro_batch_size=None)
    assert [c.cell_id for c in expand(load_sweep(default))] == ids
    accumulated = expand(load_sweep(sweep_with(tmp_path / "set", micro_batch_size=16)))
    assert {c.trial.train.micro_batch_size for c in accumulated} == {16}
    assert set(ids).isdisjoint(c.cell_id for c in accumulated)
