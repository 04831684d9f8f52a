"""One trial's per-worker training loop, written once for every way a trial runs.

Ray Train runs ``train_worker`` on each DDP worker; a one-worker trial runs ``run_trial`` directly
inside its Tune trainable; ``run_local`` runs it with no Ray at all. The loop reads top to bottom:
data -> model (its initial scales) -> optimiser -> (resume) -> epochs of train + validate +
checkpoint -> best model on test (predictions, gate by position, each of data.eval_lengths) ->
latency -> final report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
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
from fusion_ray.job import FINAL
from fusion_ray.model import ModelSpec, build_classifier, check_model_spec, count_parameters
from fusion_ray.model.fusion import GatedFusion
from fusion_ray.schema import (
    EVAL_LENGTH_METRIC_PREFIXES,
    GATE_COLUMNS,
    GATES_FILE,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    LENGTH_PREDICTION_COLUMNS,
    LENGTH_PREDICTIONS_FILE,
    PREDICTIONS_FILE,
)
from fusion_ray.seeds import derive_seed
from fusion_ray.train.graphs import GraphedSteps
from fusion_ray.train.report import CHECKPOINT_FILE, LocalReporter, Reporter, TrainReporter
from fusion_ray.train.spec import (
    TrainSpec,
    TrialConfig,
    cuda_graph_problems,
    micro_batch_problems,
)

# ----------------------------------------------------------------------------- small helpers


def precision_context(device: torch.device, spec: TrainSpec) -> contextlib.AbstractContextManager:
    use_bf16 = spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda")
    if not use_bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def device_batch(
    batch: dict[str, torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A collated batch on ``device``: (input_ids [B, L], attention mask [B, L] or None, labels [B]).

    The mask is None when no document in the batch is padded, decided here on the host, so the
    GPU never stalls to find out and attention can take the flash kernel. On CUDA the copies come
    from pinned memory and are asynchronous, so they overlap the previous step's kernels.
    """
    cuda = device.type == "cuda"

    def move(t: torch.Tensor) -> torch.Tensor:
        return (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)

    mask = batch["attention_mask"]
    return move(batch["input_ids"]), None if bool(mask.all()) else move(mask), move(batch["labels"])


def _all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum scalars over DDP ranks (a no-op with one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


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


def _lr_on_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """After ``load_state_dict`` (which puts the saved learning-rate tensor in place of the
    live one), the learning rate back on the device where a capturable optimiser reads it."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = group["lr"].to(device=device, dtype=torch.float32)


def _eval_batches(
    split: TokenizedSplit, indices: Sequence[int], batch_size: int
) -> Iterator[list[int]]:
    """Evaluation batches sorted by length (less padding); order does not change the results."""
    order = sorted(indices, key=lambda i: (len(split.ids[i]), i))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: TokenizedSplit,
    *,
    batch_size: int,
    device: torch.device,
    spec: TrainSpec,
    pad_to: int | None,
    rank: int = 0,
    world_size: int = 1,
    want_predictions: bool = False,
) -> dict[str, Any]:
    """Loss and accuracy on a split, each rank scoring its share; sums are reduced over ranks."""
    model.eval()
    my_indices = list(range(rank, len(split), world_size))
    loss_sum: torch.Tensor | float = 0.0
    correct: torch.Tensor | int = 0
    preds: dict[int, int] = {}
    for batch_indices in _eval_batches(split, my_indices, batch_size):
        batch = collate(split, batch_indices, pad_to=pad_to, multiple=spec.pad_to_multiple)
        input_ids, mask, labels = device_batch(batch, device)  # [B, L], [B, L] or None, [B]
        with precision_context(device, spec):
            logits = model(input_ids, mask)  # [B, C]
        logits = logits.float()
        # Sums stay on the device until the end: no host sync per batch.
        loss_sum = loss_sum + F.cross_entropy(logits, labels, reduction="sum").double()
        predicted = logits.argmax(dim=-1)
        correct = correct + (predicted == labels).sum()
        if want_predictions:
            preds.update(zip(batch_indices, predicted.cpu().tolist(), strict=True))
    loss_sum, correct_f, count = _all_reduce_sum(
        [float(loss_sum), float(correct), len(my_indices)], device
    )
    result = {
        "loss": loss_sum / max(count, 1),
        "correct": int(round(correct_f)),
        "total": int(count),
    }
    if want_predictions:
        if dist.is_available() and dist.is_initialized():
            gathered: list[dict[int, int]] = [{} for _ in range(world_size)]
            dist.all_gather_object(gathered, preds)
            preds = {k: v for part in gathered for k, v in part.items()}
        result["predictions"] = np.array([preds[i] for i in range(len(split))], dtype=np.int64)
    return result


@torch.no_grad()
def measure_latency(
    models: Sequence[nn.Module],
    split: TokenizedSplit,
    spec: TrainSpec,
    device: torch.device,
    pad_to: int | None,
) -> list[float]:
    """Inference latency of each model in ms per document, all on the same batch: warm-up, then
    ``latency_repeats`` rounds that time every model once (in reverse order on odd rounds, so
    none always runs first); the median of each model's timings. Interleaving makes the models'
    ratio immune to drift in the device's speed (clocks, other processes) during the measurement.
    """
    for model in models:
        model.eval()
    indices = list(range(min(spec.latency_batch_size, len(split))))
    batch = collate(split, indices, pad_to=pad_to, multiple=spec.pad_to_multiple)
    input_ids, mask, _ = device_batch(batch, device)  # [B, L], [B, L] or None

    def once(model: nn.Module) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with precision_context(device, spec):
            model(input_ids, mask)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for _ in range(3):
        for model in models:
            once(model)
    timings: list[list[float]] = [[] for _ in models]
    for repeat in range(max(1, spec.latency_repeats)):
        order = list(range(len(models)))
        for i in order if repeat % 2 == 0 else reversed(order):
            timings[i].append(once(models[i]))
    return [1000.0 * statistics.median(t) / len(indices) for t in timings]


def latency_baseline_spec(
    model: ModelSpec, latency_baseline: Mapping[str, Any] | None
) -> ModelSpec | None:
    """The trial's model settings with the sweep's baseline operator instead of its own, or None
    when no baseline is given. ``latency_baseline`` is ``{"name": <operator>, "kwargs": {...}}``;
    it is checked here, before training, so a bad one fails at once rather than after the epochs.
    """
    if latency_baseline is None:
        return None
    usage = "must be {'name': <an operator in FUSIONS>, 'kwargs': {<its options>}}"
    if not isinstance(latency_baseline, Mapping) or not isinstance(
        latency_baseline.get("name"), str
    ):
        raise ValueError(f"latency_baseline={latency_baseline!r}: {usage}")
    kwargs = latency_baseline.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"latency_baseline kwargs={kwargs!r}: {usage}")
    spec = dataclasses.replace(model, fusion=latency_baseline["name"], fusion_kwargs=dict(kwargs))
    problems = check_model_spec(spec)
    if problems:
        raise ValueError(
            "latency_baseline: the baseline operator cannot be built with this trial's model "
            "settings; fix the sweep's baseline:\n  " + "\n  ".join(problems)
        )
    return spec


def latency_metrics(
    model: nn.Module,
    data: PreparedData,
    trial: TrialConfig,
    device: torch.device,
    pad_to: int | None,
    baseline: ModelSpec | None,
) -> dict[str, float]:
    """``latency_ms_per_sample`` of the trial's model and, given the baseline's settings,
    ``latency_ratio_to_baseline``: the trial's median over that of a freshly built baseline model
    (same settings and seed, another operator; its weights do not change its speed), timed
    interleaved with it. The trial's own operator as the baseline gives 1.0 without timing twice.
    """
    models = [_unwrap(model)]
    if baseline is not None and baseline != trial.model:
        reference = build_classifier(baseline, data.vocab_size, data.num_classes, trial.seed)
        models.append(reference.to(device))
    ms = measure_latency(models, data.test, trial.train, device, pad_to)
    metrics = {"latency_ms_per_sample": ms[0]}
    if baseline is not None:
        metrics[LATENCY_RATIO_METRIC] = ms[0] / ms[1] if len(ms) > 1 else 1.0
    return metrics


def initial_scales(model: nn.Module, max_length: int) -> dict[str, float]:
    """``init_token_rms`` and ``init_position_rms`` (INIT_METRICS) of a model as built: the RMS
    of the token embeddings entering the fusion over the vocabulary, and of P over positions
    0..max_length-1 (0.0 for ``none``)."""
    return dict(zip(INIT_METRICS, _unwrap(model).input_rms(max_length), strict=True))


def gate_bucket_edges(max_length: int) -> list[int]:
    """Position bucket edges of the gate diagnostics: 0, 1, 2, 4, 8, ... (powers of two), the last
    one clipped to ``max_length``; bucket k holds positions edges[k] <= p < edges[k + 1].

    Doubling widths resolve the first positions finely, where every document has tokens, and
    pool the long tail, where only long documents do; they depend on max_length only, so every
    run of a dataset has the same buckets.
    """
    edges = [0]
    while edges[-1] < max_length:
        edges.append(min(max(1, 2 * edges[-1]), max_length))
    return edges


@torch.no_grad()
def gate_by_position(
    model: nn.Module,
    split: TokenizedSplit,
    *,
    spec: TrainSpec,
    device: torch.device,
    pad_to: int | None,
    max_length: int,
    rank: int = 0,
    world_size: int = 1,
) -> pd.DataFrame:
    """The gate g (the weight on E) of a gated fusion operator on ``split``, by position bucket.

    One row per bucket of ``gate_bucket_edges(max_length)``, columns GATE_COLUMNS:
    ``bucket_start``, ``bucket_end`` (0-based token positions, end exclusive), ``tokens`` (the
    split's non-padding tokens in the bucket), ``gate_mean``, ``gate_std`` (mean and standard
    deviation, ddof 0, of g over those tokens and, for a feature-wise gate, their d features;
    NaN where a bucket has no tokens). An explicit pass of the embedding, position and gate only
    (the encoder does not run); each rank scores its share of the documents and the sums are
    reduced over ranks, so every rank returns the whole split's table.
    """
    classifier = _unwrap(model)
    fusion = classifier.fusion
    if not isinstance(fusion, GatedFusion):
        raise TypeError(f"{type(fusion).__name__} has no gate: only gated operators have one")
    classifier.eval()
    # Per position: sum of g, sum of g^2, gate values (tokens x gate width), tokens.
    sums = torch.zeros(4, classifier.max_len, dtype=torch.float64, device=device)
    for batch_indices in _eval_batches(
        split, range(rank, len(split), world_size), spec.eval_batch_size
    ):
        batch = collate(split, batch_indices, pad_to=pad_to, multiple=spec.pad_to_multiple)
        input_ids, mask, _ = device_batch(batch, device)  # [B, L], [B, L] or None
        B, L = input_ids.shape
        with precision_context(device, spec):
            g = fusion.gate_weight(*classifier.fusion_inputs(input_ids, mask))
        g = g.double().expand(B, L, g.size(-1))  # [B, L, w]: w = 1, or d for a feature-wise gate
        keep = (
            torch.ones(B, L, dtype=torch.float64, device=device) if mask is None else mask.double()
        )
        counts = keep.sum(0)  # [L]
        sums[:, :L] += torch.stack(
            [
                (g.sum(-1) * keep).sum(0),
                (g.square().sum(-1) * keep).sum(0),
                counts * g.size(-1),
                counts,
            ]
        )
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)
    g_sum, g2_sum, values, tokens = sums.cpu().numpy()
    assert tokens[max_length:].sum() == 0, "documents are truncated to max_length"
    rows = []
    edges = gate_bucket_edges(max_length)
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        n = values[start:end].sum()
        mean = g_sum[start:end].sum() / n if n else math.nan
        var = max(g2_sum[start:end].sum() / n - mean**2, 0.0) if n else math.nan
        rows.append((start, end, int(tokens[start:end].sum()), mean, math.sqrt(var)))
    return pd.DataFrame(rows, columns=list(GATE_COLUMNS))


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def state_dict_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in _unwrap(model).state_dict().items()}


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class Progress:
    """Everything besides weights and optimiser that a resumed run needs to continue exactly."""

    epochs_done: int = 0
    best_val_acc: float = -1.0
    best_epoch: int = -1
    bad_epochs: int = 0
    stopped_early: bool = False
    train_seconds: float = 0.0
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def record(self, metrics: dict[str, float], patience: int | None) -> bool:
        """Add one epoch's metrics; True when its validation accuracy is the best so far."""
        epoch, val_acc = int(metrics["epoch"]), metrics["val_acc"]
        self.history.append(metrics)
        self.epochs_done = epoch + 1
        self.train_seconds += metrics["epoch_seconds"]
        improved = val_acc > self.best_val_acc
        if improved:
            self.best_val_acc, self.best_epoch, self.bad_epochs = val_acc, epoch, 0
        else:
            self.bad_epochs += 1
        if patience is not None and self.bad_epochs >= patience:
            self.stopped_early = True
        return improved


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
    model = build_classifier(trial.model, data.vocab_size, data.num_classes, trial.seed).to(device)
    num_params, init_scales = count_parameters(model), initial_scales(model, trial.data.max_length)
    if world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    optimizer = make_optimizer(model, spec)
    total_steps = spec.epochs * len(sampler)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec, total_steps))
    torch.manual_seed(derive_seed(trial.seed, f"train/rank{rank}"))  # dropout stream

    # --- resume: weights, optimiser, schedule, RNG and progress from the last checkpoint
    progress, best_state = Progress(), None
    last_state = reporter.restore()
    if last_state is not None:
        progress, best_state = _restore(last_state, model, optimizer, scheduler, rank, device)
    graphed = graphed_steps(model, optimizer, spec, device, world_size)  # after the restore

    # --- epochs: train, validate, keep the best weights, checkpoint
    while progress.epochs_done < spec.epochs and not progress.stopped_early:
        epoch = progress.epochs_done
        train_loss, epoch_seconds = train_epoch(
            model, optimizer, scheduler, data.train, sampler, epoch, reporter, spec, pad_to, graphed
        )
        reporter.on_epoch_end(epoch, _unwrap(model))
        val = _evaluate_split(model, data.validation, spec, reporter, pad_to)
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
        _save_and_report(reporter, metrics, last_state)

    # --- test at the best validation epoch: predictions, gate by position, latency
    assert best_state is not None, "no epoch ran: train.epochs must be >= 1"
    _unwrap(model).load_state_dict(best_state)
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
    _save_and_report(reporter, final, last_state, files)
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


def score_best_model(
    model: nn.Module,
    data: PreparedData,
    trial: TrialConfig,
    reporter: Reporter,
    pad_to: int | None,
    baseline: ModelSpec | None = None,
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """Test metrics of the loaded (best) weights and the files of the final checkpoint, by name:
    the per-document predictions (PREDICTIONS_FILE: ``length`` before truncation, ``label``,
    ``pred``), the gate by position on the test split (GATES_FILE, gated operators only), and
    with data.eval_lengths the metrics and predictions at each length (``evaluate_lengths``).
    The metrics include the inference latency, with its ratio to the baseline's when
    ``baseline`` is given (both timed on rank 0 only; other ranks report 0.0 latency and no
    ratio)."""
    spec, device = trial.train, reporter.device
    test = _evaluate_split(model, data.test, spec, reporter, pad_to, want_predictions=True)
    by_length, length_predictions = evaluate_lengths(model, data, trial, reporter)
    gates = None
    if isinstance(_unwrap(model).fusion, GatedFusion):
        gates = gate_by_position(
            model,
            data.test,
            spec=spec,
            device=device,
            pad_to=pad_to,
            max_length=trial.data.max_length,
            rank=reporter.rank,
            world_size=reporter.world_size,
        )
    if reporter.rank == 0:
        latency = latency_metrics(model, data, trial, device, pad_to, baseline)
    else:
        latency = {"latency_ms_per_sample": 0.0}
    metrics = {
        FINAL: True,
        "test_acc": test["correct"] / max(test["total"], 1),
        "test_correct": test["correct"],
        "test_total": test["total"],
        "test_loss": test["loss"],
        **by_length,
        **latency,
    }
    files = {
        PREDICTIONS_FILE: pd.DataFrame(
            {"length": data.test.lengths, "label": data.test.labels, "pred": test["predictions"]}
        )
    }
    if gates is not None:
        files[GATES_FILE] = gates
    if length_predictions is not None:
        files[LENGTH_PREDICTIONS_FILE] = length_predictions
    return metrics, files


def evaluate_lengths(
    model: nn.Module, data: PreparedData, trial: TrialConfig, reporter: Reporter
) -> tuple[dict[str, float], pd.DataFrame | None]:
    """Train short, test long: the loaded (best) weights on the test split truncated at each of
    data.eval_lengths. Returns the final metrics ``test_acc_at_<L>``, ``test_correct_at_<L>``
    and ``test_total_at_<L>`` per length L, and the predictions, one row per document and
    length (LENGTH_PREDICTION_COLUMNS); ({}, None) without eval lengths.

    A length beyond data.max_length runs in proportionally fewer documents per batch (never more
    than train.eval_batch_size), so a batch holds about as many tokens as at max_length; with
    ``padding: max_length`` each batch is padded to L.
    """
    spec, max_length = trial.train, trial.data.max_length
    acc_prefix, correct_prefix, total_prefix = EVAL_LENGTH_METRIC_PREFIXES
    metrics: dict[str, float] = {}
    frames = []
    for length in trial.data.eval_lengths:
        split = data.test_at(length)
        result = evaluate(
            model,
            split,
            batch_size=max(1, spec.eval_batch_size * max_length // max(length, max_length)),
            device=reporter.device,
            spec=spec,
            pad_to=length if spec.padding == "max_length" else None,
            rank=reporter.rank,
            world_size=reporter.world_size,
            want_predictions=True,
        )
        metrics[f"{acc_prefix}{length}"] = result["correct"] / max(result["total"], 1)
        metrics[f"{correct_prefix}{length}"] = result["correct"]
        metrics[f"{total_prefix}{length}"] = result["total"]
        frames.append(
            pd.DataFrame(
                {
                    "doc": np.arange(len(split), dtype=np.int64),
                    "length": split.lengths,
                    "label": split.labels,
                    "eval_length": np.full(len(split), length, dtype=np.int64),
                    "pred": result["predictions"],
                }
            )
        )
    if not frames:
        return metrics, None
    return metrics, pd.concat(frames, ignore_index=True)[list(LENGTH_PREDICTION_COLUMNS)]


def _evaluate_split(
    model: nn.Module,
    split: TokenizedSplit,
    spec: TrainSpec,
    reporter: Reporter,
    pad_to: int | None,
    want_predictions: bool = False,
) -> dict[str, Any]:
    """``evaluate`` on this process's device and share of the ranks."""
    return evaluate(
        model,
        split,
        batch_size=spec.eval_batch_size,
        device=reporter.device,
        spec=spec,
        pad_to=pad_to,
        rank=reporter.rank,
        world_size=reporter.world_size,
        want_predictions=want_predictions,
    )


def _deterministic(device: torch.device) -> None:
    """Deterministic algorithms, set up so that they cost little on a GPU."""
    if device.type == "cuda":
        # Deterministic cuBLAS needs a fixed workspace; without it every matrix product warns.
        # Read when this process first uses cuBLAS, so it changes nothing after that.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # Deterministic mode would also fill every new tensor with NaN (hundreds of extra kernels
        # per step); the model never reads memory it did not write, so that guard buys nothing.
        torch.utils.deterministic.fill_uninitialized_memory = False
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
    total, docs = _all_reduce_sum([float(loss_sum), docs], device)
    if not math.isfinite(total):
        raise FloatingPointError(
            f"training loss is {total} in epoch {epoch}; lower train.lr, enable "
            f"train.grad_clip, or use train.precision: fp32"
        )
    return total / docs, time.perf_counter() - started


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


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    progress: Progress,
    best_state: dict[str, torch.Tensor] | None,
    trial: TrialConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Everything a resumed run needs to continue exactly: weights, optimiser, schedule, every
    rank's RNG state, progress, the best weights so far, and the trial's config."""
    rng = [_rng_state(device)]
    if dist.is_available() and dist.is_initialized():  # every rank's dropout stream
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, _rng_state(device))
    return {
        "model": state_dict_copy(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng,
        "progress": dataclasses.asdict(progress),
        "best_model": best_state,
        "trial": dataclasses.asdict(trial),
    }


def _restore(
    saved: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    device: torch.device,
) -> tuple[Progress, dict[str, torch.Tensor] | None]:
    """Load a checkpoint state into the model, optimiser and schedule; (progress, best weights)."""
    _unwrap(model).load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    _lr_on_device(optimizer, device)
    scheduler.load_state_dict(saved["scheduler"])
    _set_rng_state(saved["rng"][min(rank, len(saved["rng"]) - 1)], device)
    return Progress(**saved["progress"]), saved["best_model"]


def _save_and_report(
    reporter: Reporter,
    metrics: dict[str, Any],
    state: dict[str, Any],
    files: Mapping[str, pd.DataFrame] | None = None,
) -> None:
    """Report ``metrics`` with a checkpoint of ``state`` and, beside it, ``files`` (parquet by
    file name: the test predictions, the gate by position, the predictions by length)."""
    with tempfile.TemporaryDirectory() as ckpt_dir:
        if reporter.rank == 0:
            torch.save(state, Path(ckpt_dir, CHECKPOINT_FILE))
            for name, frame in (files or {}).items():
                frame.to_parquet(Path(ckpt_dir, name), index=False)
        reporter.report(metrics, checkpoint_dir=ckpt_dir)


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
