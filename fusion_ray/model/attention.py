"""The encoder: self-attention blocks on F.scaled_dot_product_attention, plus attention-level
positions (the axis orthogonal to the input-level signal P).

An attention-level position acts inside attention only: ``rope`` rotates q and k; ``alibi`` and
``t5_bias`` add a [heads, L, L] bias to the attention scores. When there is neither padding nor a
bias, attention runs with ``attn_mask=None``, so on a GPU it can take the flash kernel.

Score biases stay in float32 under bf16 autocast: they are built with autocast off, and an
attention call with a float bias runs in float32 (see ``biased_attention``). In bf16, ALiBi's
smallest slope at L = 4096 would map the distances 1000..4095 to only 263 distinct values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fusion_ray.model.positions import check_base, inverse_frequencies
from fusion_ray.registry import Registry


class AttentionPosition(nn.Module):
    """Base class (and ``none``): no rotation and no score bias."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.max_len = max_len

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [B, H, L, Dh] -> the same shapes, position-encoded."""
        return q, k

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor | None:
        """An additive score bias [H, L, L] (query i, key j), or None."""
        return None


ATTENTION_POSITIONS: Registry[Callable[..., AttentionPosition]] = Registry("attention_position")
ATTENTION_POSITIONS.register("none")(AttentionPosition)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] along the last dimension (the half-split rotary convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@ATTENTION_POSITIONS.register("rope")
class Rotary(AttentionPosition):
    """RoPE (Su et al.): rotate each (q, k) channel pair (c, c + Dh/2) at position p by angle
    p * base^(-2c/Dh), so q_i . k_j depends on i - j only. No parameters."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, *, base: float = 10000.0) -> None:
        super().__init__(n_heads, head_dim, max_len)
        if head_dim % 2:
            raise ValueError(f"head dimension d_model / n_heads must be even, got {head_dim}")
        w = inverse_frequencies(head_dim, check_base(base))
        self.register_buffer("inv_freq", w.float(), persistent=False)  # [Dh / 2]

    def cos_sin(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the rotation angles, each [L, Dh], float32."""
        p = torch.arange(seq_len, device=device, dtype=torch.float32)
        angles = p[:, None] * self.inv_freq.to(device)[None, :]  # [L, Dh / 2]
        angles = torch.cat([angles, angles], dim=-1)  # [L, Dh]
        return angles.cos(), angles.sin()

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(q.size(-2), q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi head slopes (Press et al.): 2^(-8h/n) for h = 1..n when n is a power of two;
    otherwise those of the nearest lower power of two plus every other slope of the next."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    low = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(low)
    if low < n_heads:
        slopes += power_of_two(2 * low)[0::2][: n_heads - low]
    return torch.tensor(slopes)


@ATTENTION_POSITIONS.register("alibi")
class ALiBi(AttentionPosition):
    """Score bias -m_h |i - j| with fixed per-head slopes m_h (symmetric, for a bidirectional
    encoder). No parameters. Being symmetric, it tells distance but not direction."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int) -> None:
        super().__init__(n_heads, head_dim, max_len)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # [H]

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        p = torch.arange(seq_len, device=device)
        distance = (p[None, :] - p[:, None]).abs().float()  # [L, L]
        return -self.slopes.to(device)[:, None, None] * distance  # [H, L, L]


def t5_bucket(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional T5 buckets of relative positions (key - query): half the buckets for keys
    to the left, half for keys to the right; within each half, distances below a quarter of
    num_buckets get their own bucket, larger ones share log-spaced buckets up to max_distance."""
    half = num_buckets // 2
    bucket = (relative > 0).long() * half
    distance = relative.abs()
    max_exact = half // 2
    is_small = distance < max_exact
    # distance 0 takes the is_small branch; the clamp only keeps log() finite there.
    large = (
        max_exact
        + (
            torch.log(distance.clamp(min=1).float() / max_exact)
            / math.log(max_distance / max_exact)
            * (half - max_exact)
        ).long()
    )
    large = large.clamp(max=half - 1)
    return bucket + torch.where(is_small, distance, large)


@ATTENTION_POSITIONS.register("t5_bias")
class T5Bias(AttentionPosition):
    """Score bias b[h, bucket(j - i)] learned per head (Raffel et al.), bidirectional buckets,
    one table shared by all layers as in T5; initialised N(0, 1/d_model) as Hugging Face's T5."""

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len)
        for name, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if num_buckets < 4 or num_buckets % 2:
            raise ValueError(f"num_buckets must be an even integer >= 4, got {num_buckets}")
        if max_distance <= num_buckets // 4:
            raise ValueError(
                f"max_distance must exceed num_buckets / 4 = {num_buckets // 4}, got {max_distance}"
            )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.table.weight, std=(n_heads * head_dim) ** -0.5)

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        p = torch.arange(seq_len, device=device)
        relative = p[None, :] - p[:, None]  # [L, L]: key j - query i
        buckets = t5_bucket(relative, self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)  # [L, L, H] -> [H, L, L]


def build_attention_mask(
    keep: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """The ``attn_mask`` for SDPA from a key mask keep [B, L] (True = real token) and a bias.

    None when there is neither (the flash-eligible case); a bool [B, 1, 1, L] for padding only;
    a float [B or 1, H, L, L] when there is a bias. A document without any real token attends
    to all its positions, so no row is fully masked and nothing becomes NaN.
    """
    if keep is not None:
        keep = keep | ~keep.any(dim=1, keepdim=True)  # [B, L]
    if bias is None:
        return None if keep is None else keep[:, None, None, :]  # [B, 1, 1, L]
    if keep is None:
        return bias[None]  # [1, H, L, L]
    return bias[None].masked_fill(~keep[:, None, None, :], float("-inf"))  # [B, H, L, L]


def biased_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """SDPA with an additive float mask [B or 1, H, L, L], computed in at least float32.

    SDPA needs a float mask in the dtype of q, so under bf16 autocast the bias (and the scores
    it is added to) would be rounded to bf16, whose 8 significant bits cannot tell apart large
    ALiBi distances. Here q, k, v and the mask are upcast to float32 (float64 stays float64) and
    autocast is off for the call; the output returns in the dtype of q.
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        y = F.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask.to(dtype), dropout_p=dropout_p
        )
    return y.to(q.dtype)


class SelfAttention(nn.Module):
    """Multi-head self-attention: fused qkv projection, SDPA, output projection."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        # nn.MultiheadAttention's initialisation, which the study's encoder used.
        nn.init.xavier_uniform_(self.qkv.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.out.bias)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, position: AttentionPosition
    ) -> torch.Tensor:
        B, L, d = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, Dh]
        q, k = position.rotate(q, k)
        dropout_p = self.dropout if self.training else 0.0
        if mask is not None and mask.is_floating_point():
            y = biased_attention(q, k, v, mask, dropout_p)  # [B, H, L, Dh]
        else:  # None or a bool padding mask: bf16 stays, flash/efficient kernels stay eligible
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p
            )  # [B, H, L, Dh]
        y = y.transpose(1, 2).reshape(B, L, d)  # [B, L, H * Dh]
        return self.out(y)


class EncoderBlock(nn.Module):
    """One Transformer encoder layer: post-LN (nn.TransformerEncoderLayer's default) or pre-LN."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        activation: str = "relu",
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.norm_first = norm_first
        self.attn = SelfAttention(d_model, n_heads, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_ff),
            nn.ReLU() if activation == "relu" else nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(d_ff, d_model),
        )
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, position: AttentionPosition
    ) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask, position))
            return x + self.drop2(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, mask, position)))
        return self.norm2(x + self.drop2(self.ff(x)))


class Encoder(nn.Module):
    """A stack of blocks sharing one attention-level position module; final LayerNorm if pre-LN."""

    def __init__(
        self,
        blocks: Sequence[EncoderBlock],
        attention_position: AttentionPosition,
        final_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.attention_position = attention_position
        self.final_norm = final_norm if final_norm is not None else nn.Identity()

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, d], keep [B, L] bool (True = real token) or None (no padding) -> [B, L, d]."""
        # Autocast off: the bias and the mask are built in the position module's dtype (float32).
        with torch.autocast(device_type=x.device.type, enabled=False):
            bias = self.attention_position.bias(x.size(1), x.device)  # [H, L, L] or None
            mask = build_attention_mask(keep, bias)  # computed once, shared by all layers
        for block in self.blocks:
            x = block(x, mask, self.attention_position)
        return self.final_norm(x)
