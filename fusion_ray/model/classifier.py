"""The classifier: embedding -> position signal -> fusion -> dropout -> encoder -> pooling -> head.

Only ``.fusion`` differs between operators. Each submodule is built under its own RNG seed,
derived from (seed, submodule name), so for one seed every parameter outside ``.fusion`` is
byte-identical across operators, and the embedding, encoder blocks and head are byte-identical
across position choices too (the paired-seed protocol of docs/concepts/paired-seeds.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from fusion_ray.checks import field_problems, is_int
from fusion_ray.model.attention import ATTENTION_POSITIONS, Encoder, EncoderBlock
from fusion_ray.model.fusion import FUSIONS, Fusion
from fusion_ray.model.positions import POSITIONS, PositionSignal
from fusion_ray.model.spec import ModelSpec
from fusion_ray.registry import Registry
from fusion_ray.seeds import derive_seed


@contextmanager
def seeded(seed: int, name: str) -> Iterator[None]:
    """Run the body with the CPU RNG seeded from (seed, name); restore the caller's RNG after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, name))
        yield


class FusionClassifier(nn.Module):
    """Encoder-only Transformer classifier with a pluggable fusion operator at ``.fusion``."""

    def __init__(
        self,
        embedding: nn.Embedding,
        position: PositionSignal,
        fusion: Fusion,
        encoder: Encoder,
        head: nn.Linear,
        dropout: float,
        scale_embeddings: bool,
        max_len: int,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.position = position
        self.fusion = fusion
        self.dropout = nn.Dropout(dropout)
        self.encoder = encoder
        self.head = head
        self.embed_scale = math.sqrt(embedding.embedding_dim) if scale_embeddings else 1.0
        self.max_len = max_len

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids [B, L] long, attention_mask [B, L] bool or 0/1 (1 = real token) or None (no
        padding) -> logits [B, C]."""
        # No test of the mask's values here: that would stall the GPU on every call. Callers pass
        # None when nothing is padded (the training loop decides on the host), which is the
        # unmasked, flash-eligible path; an all-True mask gives the same output, more slowly.
        keep = None if attention_mask is None else attention_mask.to(torch.bool)

        E, P = self.fusion_inputs(input_ids, keep)  # [B, L, d], [L, d] or [B, L, d]
        H = self.dropout(self.fusion(E, P))  # [B, L, d]
        H = self.encoder(H, keep)  # [B, L, d]

        if keep is None:
            pooled = H.mean(dim=1)  # [B, d]
        else:
            w = keep[..., None].to(H.dtype)  # [B, L, 1]
            pooled = (H * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)  # [B, d]
        return self.head(pooled)

    def fusion_inputs(
        self, input_ids: torch.Tensor, keep: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``.fusion`` receives: token embeddings E [B, L, d] (times sqrt(d_model) when
        scale_embeddings is set) and the position signal P, [L, d] when ``keep`` (bool [B, L],
        True = real token) is None, else [B, L, d] with zeros on padding."""
        L = input_ids.size(1)
        if L > self.max_len:
            raise ValueError(
                f"sequence length {L} exceeds model.max_len={self.max_len}; "
                f"set model.max_len to at least the data's max_length"
            )
        E = self.embedding(input_ids) * self.embed_scale  # [B, L, d]
        P = self.position(L, input_ids.device)  # [L, d]
        if keep is not None:
            P = P * keep[..., None].to(P.dtype)  # [B, L, d]: no position signal on padding
        return E, P

    @torch.no_grad()
    def input_rms(self, length: int) -> tuple[float, float]:
        """The scales the fusion operator starts from: (RMS of the token embeddings as they enter
        the fusion, over the whole vocabulary; RMS of P over positions 0..length-1).

        Both in float64 over the float32 values the fusion sees; P = 0 (``none``) gives 0.0.
        """
        E = self.embedding.weight * self.embed_scale  # [V, d]
        P = self.position(length, self.embedding.weight.device)  # [length, d]
        return (
            float(E.double().square().mean().sqrt()),
            float(P.double().square().mean().sqrt()),
        )


def build_classifier(
    spec: ModelSpec, vocab_size: int, num_classes: int, seed: int
) -> FusionClassifier:
    """Build the classifier ``spec`` describes; every submodule seeded from (seed, its name)."""
    problems = check_model_spec(spec)
    if problems:
        raise ValueError("invalid model settings:\n  " + "\n  ".join(problems))
    d, head_dim = spec.d_model, spec.d_model // spec.n_heads

    with seeded(seed, "embedding"):
        embedding = nn.Embedding(vocab_size, d, padding_idx=0)
    with seeded(seed, "position"):
        position = POSITIONS.build(spec.position, d, spec.max_len, **spec.position_kwargs)
    with seeded(seed, "fusion"):
        fusion = FUSIONS.build(spec.fusion, d, **spec.fusion_kwargs)
    blocks = []
    for i in range(spec.n_layers):
        with seeded(seed, f"encoder.blocks.{i}"):
            blocks.append(
                EncoderBlock(
                    d, spec.n_heads, spec.d_ff, spec.dropout, spec.activation, spec.norm_first
                )
            )
    with seeded(seed, "encoder.attention_position"):
        attention_position = ATTENTION_POSITIONS.build(
            spec.attention_position,
            spec.n_heads,
            head_dim,
            spec.max_len,
            spec.n_layers,
            **spec.attention_position_kwargs,
        )
    final_norm = nn.LayerNorm(d) if spec.norm_first else None
    encoder = Encoder(blocks, attention_position, final_norm)
    with seeded(seed, "head"):
        head = nn.Linear(d, num_classes)
    return FusionClassifier(
        embedding,
        position,
        fusion,
        encoder,
        head,
        spec.dropout,
        spec.scale_embeddings,
        spec.max_len,
    )


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) at sequence length ``seq_len``.

    6 x non-embedding parameters (fusion, encoder blocks, final norm) plus the attention term
    12 x n_layers x seq_len x d_model (QK^T and AV, 2 FLOPs per multiply-add, backward twice the
    forward). Token embedding and position tables are lookups; the head runs once per document.
    """
    with torch.device("meta"):
        fusion = FUSIONS.build(spec.fusion, spec.d_model, **spec.fusion_kwargs)
        block = EncoderBlock(spec.d_model, spec.n_heads, spec.d_ff, 0.0, spec.activation)
    non_embedding = count_parameters(fusion) + spec.n_layers * count_parameters(block)
    if spec.norm_first:
        non_embedding += 2 * spec.d_model
    return 6.0 * non_embedding + 12.0 * spec.n_layers * seq_len * spec.d_model


def check_model_spec(spec: ModelSpec) -> list[str]:
    """Every problem with ``spec`` as a user-facing message (field, bad value, allowed, fix):
    its fields' own types and ranges, then ``model_rules``."""
    return _field_problems(spec) + model_rules(spec)


def model_rules(spec: ModelSpec) -> list[str]:
    """The rules between a ModelSpec's fields: n_heads dividing d_model, and each registry
    entry built with its options and the sizes it is given (the config validator calls this
    for every grid point, after the fields were checked as the spec was built)."""
    problems: list[str] = []
    d_ok = all(is_int(v) and v >= 1 for v in (spec.d_model, spec.max_len))
    heads_ok = d_ok and is_int(spec.n_heads) and spec.n_heads >= 1
    if heads_ok and spec.d_model % spec.n_heads:
        divisors = [h for h in range(1, min(spec.d_model, 64) + 1) if spec.d_model % h == 0]
        problems.append(
            f"model.n_heads={spec.n_heads} does not divide model.d_model={spec.d_model}; "
            f"use n_heads in {divisors} or change d_model"
        )
        heads_ok = False

    head_dim = spec.d_model // spec.n_heads if heads_ok else 0
    # The attention position serves every layer (some keep per-layer parameters); with an
    # invalid n_layers (reported above) its options are still checked, for one layer.
    n_layers = spec.n_layers if is_int(spec.n_layers) and spec.n_layers >= 1 else 1
    families = (
        ("fusion", FUSIONS, spec.fusion, spec.fusion_kwargs, d_ok, (spec.d_model,)),
        (
            "position",
            POSITIONS,
            spec.position,
            spec.position_kwargs,
            d_ok,
            (spec.d_model, spec.max_len),
        ),
        (
            "attention_position",
            ATTENTION_POSITIONS,
            spec.attention_position,
            spec.attention_position_kwargs,
            heads_ok,
            (spec.n_heads, head_dim, spec.max_len, n_layers),
        ),
    )
    for family in families:
        problems += _entry_problems(*family)
    return problems


_SMALL = 65_536
"""Elements a check build may materialise on the CPU for one random draw."""
_RANDOM_INIT = (
    torch.Tensor.normal_,
    torch.Tensor.uniform_,
    torch.nn.init.normal_,
    torch.nn.init.uniform_,
    torch.nn.init.trunc_normal_,
)


class _LightMeta(torch.overrides.TorchFunctionMode):
    """Inside ``torch.device("meta")``: skip the few operations whose meta kernels are Python
    decompositions, which import torch's compiler on first use (1.4 s of a 4 s dry run):
    ranges are made on the CPU (at most max_len long, and the arithmetic on them stays there),
    small random draws too, large ones as empty meta tensors, and random initialisation of a
    meta tensor is skipped (it has no values)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.arange and kwargs.get("device") is None:  # absent or device=None
            return func(*args, **{**kwargs, "device": "cpu"})
        if func in (torch.rand, torch.randn) and kwargs.get("device") is None:
            shape = torch.Size(args[0] if len(args) == 1 and not isinstance(args[0], int) else args)
            if shape.numel() <= _SMALL:
                return func(*args, **{**kwargs, "device": "cpu"})
            return torch.empty(shape, dtype=kwargs.get("dtype"), device="meta")
        target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if func in _RANDOM_INIT and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def check_build(build: Callable[[], object]) -> None:
    """Run a module constructor for its checks only: on the meta device (no memory), never
    touching the caller's RNG. Raises what the constructor raises. The light path is tried
    first; whatever it cannot do, and every error it reports, is decided by the plain meta
    build, so the verdict is always the meta build's."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"), _LightMeta():
                build()
            return
        except Exception:  # noqa: BLE001 (the plain meta build below decides)
            pass
        with torch.device("meta"):
            build()


def _field_problems(spec: ModelSpec) -> list[str]:
    """The fields' own types and ranges (sizes, dropout, activation, the two switches): they
    live on the fields of ModelSpec."""
    return field_problems(spec, "model.")


def _entry_problems(
    field: str,
    registry: Registry,
    name: str,
    kwargs: object,
    sizes_ok: bool,
    framework_args: tuple[int, ...],
) -> list[str]:
    """The problems of one registry entry and its options (``model.<field>``)."""
    if not isinstance(kwargs, Mapping):
        return [f"model.{field}_kwargs={kwargs!r}: must be a mapping of options"]
    found = registry.check(name, kwargs)
    problems = [f"model.{field}: {p}" for p in found]
    if found or not sizes_ok:
        return problems
    # Build without allocating: the constructors validate option values and size constraints
    # (even d_model for sin/cos, even head dim for rope).
    try:
        check_build(lambda: registry.build(name, *framework_args, **kwargs))
    except (ValueError, TypeError) as error:
        options = f" with {field}_kwargs {dict(kwargs)}" if kwargs else ""
        problems.append(f"model.{field}={name!r}{options}: {error}")
    return problems
