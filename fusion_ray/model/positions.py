"""Input-level position signals P: a [L, d] tensor that a fusion operator mixes with E.

The study's notebooks fed all four of their position families in at this level, including the
two they called "RoPE" and "relative"; those keep their behaviour here under names that say what
they compute (``rotary_features``, ``relative_table``). Real attention-level mechanisms (rotating
q and k, score biases) live in ``attention.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from fusion_ray.registry import Registry


class PositionSignal(nn.Module):
    """Base class: ``forward(seq_len, device) -> P [seq_len, d_model]``."""

    needs_even_d_model: bool = False

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        if self.needs_even_d_model and d_model % 2:
            raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
        self.d_model = d_model
        self.max_len = max_len

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        raise NotImplementedError


POSITIONS: Registry[Callable[..., PositionSignal]] = Registry(
    "position", group="fusion_ray.positions"
)


def check_base(base: float) -> float:
    """``base`` (the wavelength scale of sin/cos frequencies) as a float, if it is valid."""
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


def inverse_frequencies(
    dim: int, base: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """base^(-2i/dim) for i = 0 .. dim/2 - 1: the frequencies of sinusoidal and rotary encodings
    (on ``device``; None: the default device)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)  # [dim / 2]


@functools.lru_cache(maxsize=8)
def _sin_cos_table(max_len: int, d_model: int, base: float, interleaved: bool) -> torch.Tensor:
    """The float32 [max_len, d_model] table of sin(p w_i) and cos(p w_i), computed in float64 on
    the CPU whatever the default device (a check build on the meta device gets the same table):
    sin/cos pairs side by side (``interleaved``) or all sines, then all cosines.

    Cached (at most 8 tables): a pure function of its arguments, and the costliest part of
    building a model (a sweep file's validation builds one per grid point and would otherwise
    spend most of its time here). Callers get a copy (``sin_cos_table``), so the cached tensor
    is never changed.
    """
    w = inverse_frequencies(d_model, base, device="cpu")
    p = torch.arange(max_len, dtype=torch.float64, device="cpu")
    angles = p[:, None] * w[None, :]  # [max_len, d/2]
    if interleaved:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_len, d_model)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # [max_len, d]
    return table.float()


def sin_cos_table(max_len: int, d_model: int, base: float, *, interleaved: bool) -> torch.Tensor:
    """A fresh CPU copy of the cached sin/cos table (``_sin_cos_table``): float32 [max_len,
    d_model]."""
    return _sin_cos_table(max_len, d_model, base, interleaved).clone()


@POSITIONS.register("none")
class NoPosition(PositionSignal):
    """P = 0. With ``add`` this gives H = E: no position information reaches the model unless
    an attention-level position is set."""

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(seq_len, self.d_model, device=device)


@POSITIONS.register("sinusoidal")
class Sinusoidal(PositionSignal):
    """P[p, 2i] = sin(p w_i), P[p, 2i+1] = cos(p w_i), w_i = base^(-2i/d) (Vaswani et al.)."""

    needs_even_d_model = True
    table: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(self, d_model: int, max_len: int, *, base: float = 10000.0) -> None:
        super().__init__(d_model, max_len)
        table = sin_cos_table(max_len, d_model, check_base(base), interleaved=True)
        self.register_buffer("table", table, persistent=False)

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self.table[:seq_len]


@POSITIONS.register("learned")
class Learned(PositionSignal):
    """P[p] = a learned vector per absolute position (nn.Embedding(max_len, d), N(0, 1) init)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__(d_model, max_len)
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self.table.weight[:seq_len]


@POSITIONS.register("rotary_features")
class RotaryFeatures(PositionSignal):
    """P[p] = [sin(p w_0..w_{d/2-1}), cos(p w_0..w_{d/2-1})], w_i = base^(-2i/d).

    The study's "RoPE" row: the rotary frequencies used as an additive input feature (sines in
    the first half, cosines in the second), not a rotation of q and k. Same frequencies as
    ``sinusoidal`` in a different channel order.
    """

    needs_even_d_model = True
    table: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(self, d_model: int, max_len: int, *, base: float = 10000.0) -> None:
        super().__init__(d_model, max_len)
        table = sin_cos_table(max_len, d_model, check_base(base), interleaved=False)
        self.register_buffer("table", table, persistent=False)  # [max_len, d]

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self.table[:seq_len]


@POSITIONS.register("relative_table", same_as="learned")
class RelativeTable(PositionSignal):
    """P[p] = row p of a learned [max_len, d] parameter, N(0, 1) init.

    The study's "Relative" row: despite the name it is indexed by absolute position. It is the
    same model as ``learned``: the same initial values for a seed and the same forward (the
    registry records it, and the report tests it once).
    """

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__(d_model, max_len)
        self.table = nn.Parameter(torch.randn(max_len, d_model))

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self.table[:seq_len]
