"""Typed settings of one trial's training, and the full config of one trial."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from fusion_ray.checks import field_problems
from fusion_ray.data.spec import DataSpec
from fusion_ray.model.spec import ModelSpec


@dataclass
class TrainSpec:
    """Optimisation, evaluation and batching; identical across the operators of a sweep. Upper
    bounds are where a value is certainly a mistake (a learning rate above 10, a batch of more
    than ten million documents), not advice."""

    __pydantic_config__ = {"extra": "forbid", "use_attribute_docstrings": True}

    optimizer: Literal["adamw", "adam"] = "adamw"
    """AdamW (AG News / IMDB in the study) or Adam (ArXiv)."""
    lr: Annotated[float, Field(ge=1e-8, le=10, allow_inf_nan=False)] = 3e-4
    """Peak learning rate (below 1e-8 nothing is learnt: certainly a mistake)."""
    weight_decay: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.01
    """Decoupled weight decay (AdamW) or L2 penalty (Adam)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate decay after warm-up."""
    warmup_steps: Annotated[int, Field(ge=0, le=10**9)] = 0
    """Linear warm-up steps from 0 to lr."""
    batch_size: Annotated[int, Field(gt=0, le=10**7)] = 64
    """Documents per optimiser step, summed over all workers."""
    micro_batch_size: Annotated[int, Field(ge=1, le=10**7)] | None = None
    """Documents per forward and backward pass on each worker: each worker's share of a step's
    ``batch_size`` documents is cut into micro-batches of this size whose gradients add up before
    the one optimiser step (gradient accumulation), so a step that does not fit in memory at once
    still trains on the same documents in the same order; the result equals one pass up to float
    round-off. Must divide batch_size / workers. None: one pass per step."""
    eval_batch_size: Annotated[int, Field(gt=0, le=10**7)] = 128
    """Documents per evaluation batch on each worker."""
    epochs: Annotated[int, Field(gt=0, le=100_000)] = 20
    """Maximum training epochs."""
    patience: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Stop after this many epochs without a better validation accuracy; None never stops early."""
    grad_clip: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = 1.0
    """Clip the global gradient norm to this value; None disables clipping."""
    padding: Literal["dynamic", "max_length"] = "dynamic"
    """dynamic: length-grouped batches padded to their longest document; max_length: the study's
    fixed padding of every batch to data.max_length."""
    pad_to_multiple: Annotated[int, Field(ge=1, le=65_536)] = 1
    """With dynamic padding, round each batch's length up to a multiple of this: a few distinct
    shapes instead of one per length, so GPU kernels are planned a few times rather than at every
    new length (the study presets use 64); 1 pads to the longest document exactly."""
    cuda_graphs: bool = False
    """On a GPU, record each batch shape's whole training step (forward, backward, clipping,
    optimiser) as a CUDA graph once and replay it: the same kernels on the same inputs, launched
    in one call (an AG News step 8x faster on an H100; bench/RESULTS.md). Needs one worker, no
    micro_batch_size, and few shapes (pad_to_multiple > 1 or padding: max_length); an epoch's
    shorter last batch runs eagerly. Does nothing on a CPU."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on GPU, fp32 on CPU."""
    latency_repeats: Annotated[int, Field(ge=1, le=100_000)] = 20
    """Timed repeats of the inference-latency measurement (median reported, after warm-up)."""
    latency_batch_size: Annotated[int, Field(ge=1, le=10**7)] = 32
    """Documents per batch in the inference-latency measurement."""


@dataclass
class TrialConfig:
    """Everything one trial needs: a dataset, a model, a training recipe and the paired seed."""

    __pydantic_config__ = {"extra": "forbid", "use_attribute_docstrings": True}

    dataset: str = "short"
    """The dataset's name in the sweep (an MLflow tag and a table row)."""
    data: DataSpec = field(default_factory=DataSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    seed: int = 0
    """The blocking factor: same seed => same shared init and batch order for every operator."""


def check_train_spec(spec: TrainSpec, workers: int = 1) -> list[str]:
    """Every value of ``spec`` that would fail or mislead only after training started, as
    ``field: problem`` messages: its fields' own ranges (they live on the fields), then, when
    those hold, ``train_rules``."""
    return field_problems(spec) or train_rules(spec, workers)


def train_rules(spec: TrainSpec, workers: int = 1) -> list[str]:
    """The rules between a built TrainSpec's fields and the trial's ``workers`` (its DDP ranks,
    which share each step's documents)."""
    problems = []
    if spec.batch_size < workers:
        problems.append(
            f"batch_size: {spec.batch_size} is smaller than resources.workers {workers}; each "
            "worker needs at least one document per step"
        )
    return problems + micro_batch_problems(spec, workers) + cuda_graph_problems(spec, workers)


def cuda_graph_problems(spec: TrainSpec, workers: int = 1) -> list[str]:
    """Why ``cuda_graphs`` cannot be used with the rest of ``spec``, if it cannot."""
    if not spec.cuda_graphs:
        return []
    problems = []
    if workers > 1:
        problems.append(
            f"cuda_graphs: needs a one-worker trial (got {workers} DDP workers); set "
            "cuda_graphs: false or resources.workers: 1"
        )
    if spec.micro_batch_size is not None:
        problems.append(
            "cuda_graphs: records one pass per step, so it cannot be combined with "
            f"micro_batch_size ({spec.micro_batch_size}); set one of them to false / null"
        )
    if spec.padding == "dynamic" and spec.pad_to_multiple == 1:
        problems.append(
            "cuda_graphs: one graph is recorded per batch shape, and padding each batch to its "
            "longest document gives one shape per length; set pad_to_multiple (64 in the study "
            "presets) or padding: max_length"
        )
    return problems


def micro_batch_problems(spec: TrainSpec, workers: int = 1) -> list[str]:
    """Why ``micro_batch_size`` cannot cut each worker's share of a step evenly, if it cannot:
    the share is batch_size / workers, so micro_batch_size must divide it exactly."""
    size = spec.micro_batch_size
    if size is None:
        return []
    if size < 1:
        return [f"micro_batch_size: must be >= 1 or null (got {size})"]
    if spec.batch_size % (workers * size):
        share = spec.batch_size / workers
        return [
            f"micro_batch_size: {size} does not divide each worker's share of batch_size "
            f"({spec.batch_size} over {workers} worker(s) = {share:g} documents); use a divisor "
            f"of the share, make batch_size a multiple of {workers * size}, or null for one pass "
            "per step"
        ]
    return []
