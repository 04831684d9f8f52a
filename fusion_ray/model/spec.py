"""The model's typed settings. A plain dataclass, so the model package needs only torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from annotated_types import Interval


@dataclass
class ModelSpec:
    """Encoder-only Transformer classifier; only the fusion step differs between operators."""

    __pydantic_config__ = {"extra": "forbid", "use_attribute_docstrings": True}

    d_model: Annotated[int, Interval(ge=1, le=65_536)] = 128
    """Width of token embeddings, position signals and the encoder."""
    n_heads: Annotated[int, Interval(ge=1, le=4_096)] = 8
    """Attention heads per layer; must divide d_model."""
    n_layers: Annotated[int, Interval(ge=1, le=4_096)] = 2
    """Encoder layers."""
    d_ff: Annotated[int, Interval(ge=1, le=1_048_576)] = 256
    """Hidden width of each feed-forward block."""
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    """Dropout in attention, feed-forward and after fusion."""
    activation: Literal["relu", "gelu"] = "relu"
    """Feed-forward activation: relu (PyTorch's default, as in the study's ArXiv notebooks) or
    gelu (the AG News / IMDB notebook; sweeps/study_faithful.yaml sets it there)."""
    norm_first: bool = False
    """Pre-LayerNorm blocks when true; post-LN (the study's nn.TransformerEncoder default) when false."""
    scale_embeddings: bool = True
    """Multiply token embeddings by sqrt(d_model) before fusion, as both study notebooks did.

    With N(0, 1) embeddings this makes E about sqrt(d_model) times larger than a sinusoidal P,
    which is part of what a fusion operator can learn to undo; false leaves E unscaled."""
    max_len: Annotated[int, Interval(ge=1, le=10**7)] = 512
    """Longest sequence the position tables cover; at least the data's max_length."""
    fusion: str = "add"
    """Fusion operator, a name in fusion_ray.model.FUSIONS."""
    fusion_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the fusion operator (e.g. kernel_size for gate_cnn)."""
    position: str = "sinusoidal"
    """Input-level position signal P, a name in fusion_ray.model.POSITIONS."""
    position_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the input-level position signal."""
    attention_position: str = "none"
    """Attention-level position mechanism, a name in fusion_ray.model.ATTENTION_POSITIONS."""
    attention_position_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the attention-level position mechanism. An entry's recorded options
    (``RECORDED_OPTIONS``, e.g. xpos's ``direction``) are filled in at their defaults when left
    out, so the config says which form ran."""

    def __post_init__(self) -> None:
        # The attention position's recorded options enter the config at their defaults, so a
        # trial's config (hence its cell id and MLflow params) says which form it ran.
        self.attention_position_kwargs = with_recorded_options(
            self.attention_position, self.attention_position_kwargs
        )


def with_recorded_options(name: Any, kwargs: Any) -> Any:
    """``kwargs`` plus the ``RECORDED_OPTIONS`` of attention position ``name`` that it leaves
    out (a new dict); anything else (an unknown name, kwargs not a mapping) as given, for
    ``check_model_spec`` to report."""
    # lazy: the attention registry imports torch (~1.3 s); reading a sweep file's schema does
    # not build a ModelSpec, so its problems are said before torch loads
    from fusion_ray.model.attention import ATTENTION_POSITIONS

    if not isinstance(name, str) or name not in ATTENTION_POSITIONS or not isinstance(kwargs, dict):
        return kwargs
    recorded = getattr(ATTENTION_POSITIONS.get(name), "RECORDED_OPTIONS", {})
    missing = {k: v for k, v in recorded.items() if k not in kwargs}
    return {**kwargs, **missing} if missing else kwargs
