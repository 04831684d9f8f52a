"""Scoring a trained model: a split's loss, accuracy and predictions (``evaluate``), the best
model on test with every evaluation length and the gates by position (``score_best_model``),
and the latency against the sweep's baseline operator. Every DDP rank scores its shard; the
counts are summed across ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fusion_ray.data import (
    PreparedData,
    TokenizedSplit,
    collate,
)
from fusion_ray.decide.questions import quarter_metrics
from fusion_ray.model import ModelSpec, build_classifier, check_model_spec
from fusion_ray.model.fusion import GatedFusion
from fusion_ray.schema import (
    EVAL_LENGTH_METRIC_PREFIXES,
    GATE_COLUMNS,
    GATES_FILE,
    LATENCY_RATIO_METRIC,
    LENGTH_PREDICTION_COLUMNS,
    LENGTH_PREDICTIONS_FILE,
    PREDICTIONS_FILE,
)

# ----------------------------------------------------------------------------- small helpers
from fusion_ray.train.checkpoint import unwrap
from fusion_ray.train.report import Reporter
from fusion_ray.train.result import FINAL
from fusion_ray.train.spec import (
    TrainSpec,
    TrialConfig,
)


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


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum scalars over DDP ranks (a no-op with one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


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
    loss_sum, correct_f, count = all_reduce_sum(
        [float(loss_sum), float(correct), len(my_indices)], device
    )
    result: dict[str, Any] = {
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
    models = [unwrap(model)]
    if baseline is not None and baseline != trial.model:
        reference = build_classifier(baseline, data.vocab_size, data.num_classes, trial.seed)
        models.append(reference.to(device))
    ms = measure_latency(models, data.test, trial.train, device, pad_to)
    metrics = {"latency_ms_per_sample": ms[0]}
    if baseline is not None:
        metrics[LATENCY_RATIO_METRIC] = ms[0] / ms[1] if len(ms) > 1 else 1.0
    return metrics


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
    classifier = unwrap(model)
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
    The metrics include correct and total documents of the split's shortest and longest length
    quarter (``fusion_ray.decide.questions.QUARTER_METRICS``) and the inference latency, with its
    ratio to the baseline's when
    ``baseline`` is given (both timed on rank 0 only; other ranks report 0.0 latency and no
    ratio)."""
    spec, device = trial.train, reporter.device
    test = evaluate_split(model, data.test, spec, reporter, pad_to, want_predictions=True)
    by_length, length_predictions = evaluate_lengths(model, data, trial, reporter)
    gates = None
    if isinstance(unwrap(model).fusion, GatedFusion):
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
    right = np.asarray(test["predictions"]) == np.asarray(data.test.labels)
    metrics = {
        FINAL: True,
        "test_acc": test["correct"] / max(test["total"], 1),
        "test_correct": test["correct"],
        "test_total": test["total"],
        "test_loss": test["loss"],
        # the length question inside the dataset: its shortest and longest quarter
        **quarter_metrics(data.test.lengths, right),
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


def evaluate_split(
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
