"""One trial's per-worker training loop, written once for every way a trial runs.

Ray Train runs ``train_worker`` on each DDP worker; a one-worker trial runs ``run_trial`` directly
inside its Tune trainable; ``run_local`` runs it with no Ray at all. The loop reads top to bottom:
data -> model (its initial scales) -> optimiser -> (resume) -> epochs of train + validate +
checkpoint -> best model on test (predictions, gate by position, each of data.eval_lengths) ->
latency -> final report.

What the loop calls lives beside it: ``evaluate`` (scoring a split, the best model on test,
each evaluation length, the gates by position, latency) and ``checkpoint`` (what a checkpoint
holds, saving it with the epoch's report, resuming from it).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fusion_ray.data import (
    LengthGroupedSampler,
    PreparedData,
    TokenizedSplit,
    collate,
    prepare_data,
)
from fusion_ray.data.reference import reference_baselines, reference_metrics
from fusion_ray.model import build_classifier, count_parameters
from fusion_ray.schema import (
    INIT_METRICS,
)
from fusion_ray.seeds import derive_seed

# ----------------------------------------------------------------------------- small helpers
from fusion_ray.train.checkpoint import (
    Progress,
    checkpoint_state,
    resume,
    save_and_report,
    state_dict_copy,
    unwrap,
)
from fusion_ray.train.evaluate import (
    all_reduce_sum,
    device_batch,
    evaluate_split,
    latency_baseline_spec,
    precision_context,
    score_best_model,
)
from fusion_ray.train.graphs import GraphedSteps
from fusion_ray.train.report import LocalReporter, Reporter, TrainReporter
from fusion_ray.train.spec import (
    TrainSpec,
    TrialConfig,
    cuda_graph_problems,
    micro_batch_problems,
)


def lr_lambda(spec: TrainSpec, total_steps: int):
    def factor(step: int) -> float:
        if spec.warmup_steps and step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        if spec.schedule == "constant":
            return 1.0
        progress = (step - spec.warmup_steps) / max(1, total_steps - spec.warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if spec.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine

    return factor


def make_optimizer(model: nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    """AdamW or Adam. On CUDA the fused kernels (a few launches per step instead of several per
    parameter group), capturable with the learning rate a device tensor, so that a step can be
    recorded as a CUDA graph (``train.cuda_graphs``) and an eager step runs the same kernels."""
    cls = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.Adam
    device = next(model.parameters()).device
    if device.type != "cuda":
        return cls(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    optimizer = cls(
        model.parameters(),
        lr=torch.tensor(spec.lr, dtype=torch.float32, device=device),
        weight_decay=spec.weight_decay,
        fused=True,
        capturable=True,
    )
    for group in optimizer.param_groups:
        # The schedule's base rate as a number: each step it fills the device tensor in place
        # from a float (a tensor base rate would be read back to the host every step).
        group["initial_lr"] = spec.lr
    return optimizer


def initial_scales(model: nn.Module, max_length: int) -> dict[str, float]:
    """``init_token_rms`` and ``init_position_rms`` (INIT_METRICS) of a model as built: the RMS
    of the token embeddings entering the fusion over the vocabulary, and of P over positions
    0..max_length-1 (0.0 for ``none``)."""
    return dict(zip(INIT_METRICS, unwrap(model).input_rms(max_length), strict=True))


def paired_model(
    trial: TrialConfig, data: PreparedData, device: torch.device, world_size: int
) -> tuple[nn.Module, int, dict[str, float]]:
    """The trial's classifier on ``device`` (in DDP with ``world_size > 1``), its parameter
    count and its initial scales, counted before the DDP wrapper."""
    model: nn.Module = build_classifier(
        trial.model, data.vocab_size, data.num_classes, trial.seed
    ).to(device)
    num_params, init_scales = count_parameters(model), initial_scales(model, trial.data.max_length)
    if world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return model, num_params, init_scales


def run_trial(
    trial: TrialConfig, reporter: Reporter, latency_baseline: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Train, validate and test one trial; returns the final metrics (also reported). With the
    sweep's baseline operator (``latency_baseline``) they include the latency ratio to it."""
    entered = time.perf_counter()
    spec, device = trial.train, reporter.device
    rank, world_size = reporter.rank, reporter.world_size
    baseline = latency_baseline_spec(trial.model, latency_baseline)
    _deterministic(device)

    # --- data: tokenised once per node and cached; independent of seed and operator
    data: PreparedData = prepare_data(trial.data)
    pad_to = trial.data.max_length if spec.padding == "max_length" else None
    sampler = LengthGroupedSampler(
        data.train.lengths.clip(max=trial.data.max_length),
        spec.batch_size,
        seed=trial.seed,
        rank=rank,
        world_size=world_size,
        group_by_length=spec.padding == "dynamic",
    )

    # --- model: every parameter outside `fusion` is identical across operators for this seed
    model, num_params, init_scales = paired_model(trial, data, device, world_size)
    optimizer = make_optimizer(model, spec)
    total_steps = spec.epochs * len(sampler)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec, total_steps))
    torch.manual_seed(derive_seed(trial.seed, f"train/rank{rank}"))  # dropout stream

    # --- resume: weights, optimiser, schedule, RNG and progress from the last checkpoint
    # (one that cannot be loaded or does not fit the model is set aside: start from scratch)
    resumed = resume(reporter, model, optimizer, scheduler, rank, device)
    progress, best_state, last_state = resumed if resumed is not None else (Progress(), None, None)
    graphed = graphed_steps(model, optimizer, spec, device, world_size)  # after the restore

    # --- epochs: train, validate, keep the best weights, checkpoint
    while progress.epochs_done < spec.epochs and not progress.stopped_early:
        epoch = progress.epochs_done
        train_loss, epoch_seconds = train_epoch(
            model, optimizer, scheduler, data.train, sampler, epoch, reporter, spec, pad_to, graphed
        )
        reporter.on_epoch_end(epoch, unwrap(model))
        val = evaluate_split(model, data.validation, spec, reporter, pad_to)
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_loss": val["loss"],
            "val_acc": val["correct"] / max(val["total"], 1),
            "epoch_seconds": epoch_seconds,
        }
        if progress.record(metrics, spec.patience):
            best_state = state_dict_copy(model)
        last_state = checkpoint_state(
            model, optimizer, scheduler, progress, best_state, trial, device
        )
        save_and_report(reporter, metrics, last_state)

    # --- test at the best validation epoch: predictions, gate by position, latency
    # last_state is None only where no epoch ran and none was resumed: best_state is None too
    assert best_state is not None and last_state is not None, (
        "no epoch ran: train.epochs must be >= 1"
    )
    unwrap(model).load_state_dict(best_state)
    final, files = score_best_model(model, data, trial, reporter, pad_to, baseline)
    final.update(
        best_val_acc=progress.best_val_acc,
        best_epoch=progress.best_epoch,
        epochs_run=progress.epochs_done,
        num_params=num_params,
        train_seconds=progress.train_seconds,
        loop_seconds=time.perf_counter() - entered,  # this process's, not summed over resumes
        **init_scales,
        **(reference_metrics(reference_baselines(data)) if rank == 0 else {}),  # bag-of-words
    )
    # the final checkpoint: the last state again (a resumed finished run only re-tests) + files
    save_and_report(reporter, final, last_state, files)
    return final


def graphed_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: TrainSpec,
    device: torch.device,
    world_size: int,
) -> GraphedSteps | None:
    """The CUDA-graph steps of ``train.cuda_graphs`` on a GPU, else None (eager steps). Made
    after a checkpoint is restored: a graph records the addresses of the tensors it uses."""
    if not (spec.cuda_graphs and device.type == "cuda"):
        return None
    problems = cuda_graph_problems(spec, world_size)
    if problems:
        raise ValueError(f"train.{problems[0]}")
    return GraphedSteps(
        model,
        optimizer,
        spec,
        device,
        lambda ids, mask, labels: forward_backward(
            model, ids, mask, labels, 1, len(labels), spec, device
        ),
    )


def _deterministic(device: torch.device) -> None:
    """Deterministic algorithms, set up so that they cost little on a GPU."""
    if device.type == "cuda":
        # Deterministic cuBLAS needs a fixed workspace; without it every matrix product warns.
        # Read when this process first uses cuBLAS, so it changes nothing after that.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # Deterministic mode would also fill every new tensor with NaN (hundreds of extra kernels
        # per step); the model never reads memory it did not write, so that guard buys nothing.
        # (a property of the module's class in torch, which its stubs do not declare)
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    split: TokenizedSplit,
    sampler: LengthGroupedSampler,
    epoch: int,
    reporter: Reporter,
    spec: TrainSpec,
    pad_to: int | None,
    graphed: GraphedSteps | None = None,
) -> tuple[float, float]:
    """One epoch of optimiser steps over this rank's share of every global batch; returns the mean
    training loss over all ranks' documents and the epoch's seconds. With
    ``spec.micro_batch_size`` each step accumulates the gradients of several micro-batches; with
    ``graphed`` (``train.cuda_graphs`` on a GPU) a full batch's step is a CUDA graph replay."""
    started = time.perf_counter()
    device, world_size = reporter.device, reporter.world_size
    problems = micro_batch_problems(spec, world_size)
    if problems:
        raise ValueError(f"train.{problems[0]}")
    model.train()
    sampler.set_epoch(epoch)
    # The loss sum stays on the device: reading it every step would stall the GPU each time.
    loss_sum, docs = torch.zeros((), dtype=torch.float64, device=device), 0
    for local_indices, global_batch in zip(sampler, sampler.global_batches(), strict=True):
        reporter.on_train_batch(epoch, local_indices)
        if graphed is not None and graphed.handles(len(global_batch)):
            batch = collate(split, local_indices, pad_to=pad_to, multiple=spec.pad_to_multiple)
            loss_sum += graphed.step(*device_batch(batch, device))
        else:
            optimizer.zero_grad(set_to_none=True)
            loss_sum += accumulate_gradients(
                model, split, local_indices, len(global_batch), world_size, spec, pad_to, device
            )
            if spec.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            optimizer.step()
        scheduler.step()
        docs += len(local_indices)
    total, all_docs = all_reduce_sum([float(loss_sum), docs], device)
    if not math.isfinite(total):
        raise FloatingPointError(
            f"training loss is {total} in epoch {epoch}; lower train.lr, enable "
            f"train.grad_clip, or use train.precision: fp32"
        )
    return total / all_docs, time.perf_counter() - started


def micro_batches(indices: Sequence[int], size: int | None) -> list[list[int]]:
    """One step's documents on this rank cut into consecutive micro-batches of ``size`` (the
    last one shorter when an epoch's final batch is); None keeps them whole. Consecutive cuts
    keep the sampler's length order, so each micro-batch is padded little."""
    indices = list(indices)
    if size is None:
        return [indices]
    return [indices[start : start + size] for start in range(0, len(indices), size)]


def accumulate_gradients(
    model: nn.Module,
    split: TokenizedSplit,
    indices: Sequence[int],
    global_size: int,
    world_size: int,
    spec: TrainSpec,
    pad_to: int | None,
    device: torch.device,
) -> torch.Tensor:
    """Add to the parameters' gradients those of this rank's documents ``indices`` of a global
    batch of ``global_size``, one micro-batch at a time; returns their summed loss on the device.

    Each micro-batch's loss is its documents' summed cross-entropy times world_size /
    global_size (DDP averages over ranks), never a mean over the micro-batch, so the gradients
    add up to the mean over the whole global batch however the micro-batches differ in size or
    padding. Under DDP only the last micro-batch's backward pass averages gradients over ranks
    (``no_sync`` for the others): one all-reduce per step, as without micro-batches.
    """
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    chunks = micro_batches(indices, spec.micro_batch_size)
    for i, chunk in enumerate(chunks):
        batch = collate(split, chunk, pad_to=pad_to, multiple=spec.pad_to_multiple)
        input_ids, mask, labels = device_batch(batch, device)  # [m, L], [m, L] or None, [m]
        with _gradient_sync(model, i == len(chunks) - 1):
            loss_sum += forward_backward(
                model, input_ids, mask, labels, world_size, global_size, spec, device
            )
    return loss_sum


def forward_backward(
    model: nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor | None,
    labels: torch.Tensor,
    world_size: int,
    global_size: int,
    spec: TrainSpec,
    device: torch.device,
) -> torch.Tensor:
    """One forward and backward pass of a batch already on ``device``: the documents' summed
    cross-entropy, backpropagated times world_size / global_size; returns the summed loss
    (detached, on the device). No host synchronisation, so a CUDA graph can record it."""
    with precision_context(device, spec):
        logits = model(input_ids, mask)  # [m, C]
    batch_loss = F.cross_entropy(logits.float(), labels, reduction="sum")
    (batch_loss * world_size / global_size).backward()
    return batch_loss.detach()


def _gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP's ``no_sync`` unless ``sync``: gradients then stay local and accumulate in ``.grad``."""
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: one DDP rank of a multi-worker trial."""
    if config.get("threads"):
        torch.set_num_threads(int(config["threads"]))
    reporter = TrainReporter.from_context(resume_from=config.get("resume_from"))
    run_trial(config["trial"], reporter, latency_baseline=config.get("latency_baseline"))


def run_local(
    trial: TrialConfig,
    out_dir: str,
    latency_baseline: Mapping[str, Any] | None = None,
    **reporter_options: Any,
) -> dict[str, Any]:
    """Run one trial in this process without Ray (debugging, tests); resumes from ``out_dir``.
    ``latency_baseline`` as in ``run_trial`` (none by default: no latency ratio)."""
    return run_trial(
        trial, LocalReporter(out_dir=out_dir, **reporter_options), latency_baseline=latency_baseline
    )
