"""The encoder: self-attention blocks on F.scaled_dot_product_attention, plus attention-level
positions (the axis orthogonal to the input-level signal P).

An attention-level position acts inside attention only, through up to three hooks of
``AttentionPosition``: ``rotate`` transforms q and k (``rope``, ``xpos``); ``bias`` returns a
content-free [heads, L, L] score bias, built once per forward and shared by all layers
(``alibi``, ``t5_bias``, ``untied``, ``kerple_log``, ``fire``); ``score_terms`` returns
content-dependent [B, heads, L, L] score terms for one layer (``disentangled``, and the decay of
``xpos``'s default, bidirectional form). A mechanism may
also rescale the content term q.k^T (``content_scale``). When there is neither padding nor a
bias, attention runs with ``attn_mask=None``, so on a GPU it can take the flash kernel.

Score biases and score terms stay in float32 under bf16 autocast: they are built with autocast
off, and an attention call with a float bias runs in float32 (see ``biased_attention``). In
bf16, ALiBi's smallest slope at L = 4096 would map the distances 1000..4095 to only 263 distinct
values.

Why one module of this size: the attention block and the attention-level position methods it
calls (rotary, ALiBi, T5 buckets and the rest of the registry) share the score computation and
its precision rules; apart, each method would re-state them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fusion_ray.checks import is_int
from fusion_ray.model.positions import check_base, inverse_frequencies
from fusion_ray.registry import Registry


class AttentionPosition(nn.Module):
    """Base class (and ``none``): no rotation, no score bias, plain 1/sqrt(Dh) scores.

    The framework supplies n_heads, head_dim, max_len and n_layers (the number of encoder layers
    the one module serves, for mechanisms with per-layer parameters); options a sweep may set
    are keyword-only in subclasses.
    """

    RECORDED_OPTIONS: dict[str, Any] = {}
    """Options written into the trial config (so into its cell id and MLflow params) at their
    default when a sweep leaves them out (``ModelSpec`` fills them in): for an option added with
    a default that computes something else than the entry did before it existed."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, n_layers: int = 1) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.max_len = max_len
        self.n_layers = n_layers
        # The factor on q.k^T in the scores; None is SDPA's default 1/sqrt(head_dim).
        self.content_scale: float | None = None

    @classmethod
    def length_problems(
        cls, options: Mapping[str, Any], train_length: int, eval_length: int
    ) -> list[str]:
        """Why evaluating at ``eval_length`` tokens after training at ``train_length`` would
        read parameters that training never updates (checked before Ray starts); none here."""
        return []

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [B, H, L, Dh] -> the same shapes, position-encoded."""
        return q, k

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor | None:
        """An additive score bias [H, L, L] (query i, key j) shared by all layers, or None.
        Already scaled: it is added to content_scale * q.k^T as it is."""
        return None

    def score_terms(self, q: torch.Tensor, k: torch.Tensor, layer: int) -> torch.Tensor | None:
        """Content-dependent additive score terms [B, H, L, L] of encoder layer ``layer`` from
        the (rotated) q, k [B, H, L, Dh], or None. Already scaled, like ``bias``. Called with
        autocast off; an implementation computes in at least float32."""
        return None


ATTENTION_POSITIONS: Registry[type[AttentionPosition]] = Registry(
    "attention_position", group="fusion_ray.attention_positions"
)
ATTENTION_POSITIONS.register("none")(AttentionPosition)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] along the last dimension (the half-split rotary convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@ATTENTION_POSITIONS.register("rope")
class Rotary(AttentionPosition):
    """RoPE (Su et al.): rotate each (q, k) channel pair (c, c + Dh/2) at position p by angle
    p * base^(-2c/Dh), so q_i . k_j depends on i - j only. No parameters."""

    inv_freq: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, n_layers: int = 1, *, base: float = 10000.0
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
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

    slopes: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(self, n_heads: int, head_dim: int, max_len: int, n_layers: int = 1) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
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
        n_layers: int = 1,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
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


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int, if it is an integer >= 1 (an option of a position mechanism)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_number(name: str, value: Any) -> float:
    """``value`` as a float, if it is a finite number > 0 (an option of a position mechanism)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def relative_distance(seq_len: int, device: torch.device) -> torch.Tensor:
    """|i - j| for query i and key j, [L, L] float32."""
    p = torch.arange(seq_len, device=device)
    return (p[None, :] - p[:, None]).abs().float()


@ATTENTION_POSITIONS.register("untied")
class Untied(AttentionPosition):
    """TUPE's untied absolute positions (Ke et al. 2021, TUPE-A). Position enters attention as
    its own term beside the content term, each scaled by 1/sqrt(2d) (d = head dimension):

        alpha_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d) + (p_i U^Q)(p_j U^K)^T / sqrt(2d),

    p_i = LayerNorm(P_i), P a learned absolute table [max_len, d_model] that is never added to
    the input, U^Q and U^K [d_model, d_model] split into heads. The positional term is
    content-free, so as in TUPE's code it is built once per forward and shared by all layers.

    Not built: TUPE's untied [CLS] (this classifier mean-pools; there is no [CLS]) and TUPE-R's
    added relative bias. U^K has no bias: it would add a per-query constant, which softmax
    ignores. Initialisation: P ~ N(0, 1); U^Q, U^K as this encoder's q/k projection (Xavier
    uniform, zero bias). It is TUPE only with the input-level position ``none``; with an
    input-level P as well, position also reaches attention through the fusion (the two axes
    combine freely, as ``rope`` over ``sinusoidal`` does).
    """

    def __init__(self, n_heads: int, head_dim: int, max_len: int, n_layers: int = 1) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
        d_model = n_heads * head_dim
        self.content_scale = (2 * head_dim) ** -0.5
        self.table = nn.Embedding(max_len, d_model)  # P, N(0, 1)
        self.norm = nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, d_model)  # U^Q
        self.key = nn.Linear(d_model, d_model, bias=False)  # U^K
        nn.init.xavier_uniform_(self.query.weight)
        nn.init.zeros_(self.query.bias)
        nn.init.xavier_uniform_(self.key.weight)

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        p = self.norm(self.table.weight[:seq_len])  # [L, d_model]
        pq = self.query(p).view(seq_len, self.n_heads, self.head_dim).transpose(0, 1)  # [H, L, Dh]
        pk = self.key(p).view(seq_len, self.n_heads, self.head_dim).transpose(0, 1)  # [H, L, Dh]
        return pq @ pk.transpose(-1, -2) * self.content_scale  # [H, L, L]


@ATTENTION_POSITIONS.register("disentangled")
class Disentangled(AttentionPosition):
    """DeBERTa's disentangled attention (He et al. 2021, eq. 4): content-to-content plus
    content-to-position plus position-to-content, all scaled by 1/sqrt(3d) (d = head dimension):

        A_ij = Q^c_i K^c_j^T + Q^c_i K^r_delta(i,j)^T + K^c_j Q^r_delta(j,i)^T,
        softmax(A / sqrt(3d)),   Q^r = P W_q,r,   K^r = P W_k,r,

    delta(i, j) = 0 if i - j <= -k, 2k - 1 if i - j >= k, i - j + k otherwise (distances
    clipped at k = ``max_distance``, 512 as in DeBERTa). The relative embeddings P [2k, d_model]
    are shared across layers ("shared across all layers" in the paper); W_q,r and W_k,r are per
    layer, as DeBERTa's per-layer position projections, kept here and indexed by layer. W_q,r has
    a bias and W_k,r none, as in DeBERTa (a key-side bias would add a per-query constant).

    Position-to-content is indexed at delta(j, i) as the paper's equation says; DeBERTa's
    released code indexes it at delta(i, j). Not built: dropout on P, the enhanced mask decoder,
    DeBERTa-v2's log buckets and shared position keys. Initialisation: P ~ N(0, 1); W_q,r, W_k,r
    as this encoder's q/k projection (Xavier uniform, zero bias).
    """

    @classmethod
    def length_problems(
        cls, options: Mapping[str, Any], train_length: int, eval_length: int
    ) -> list[str]:
        """Training at L tokens updates only the rows of distances below L; with max_distance k
        > L, an evaluation beyond L reads the rows of distances L .. k-1 at their random initial
        values. With k <= L every longer distance clips to a trained end row."""
        k = options.get("max_distance", inspect.signature(cls).parameters["max_distance"].default)
        if not isinstance(k, int) or k <= train_length or eval_length <= train_length:
            return []
        return [
            f"disentangled's max_distance {k} exceeds the training length (data.max_length "
            f"{train_length}) while data.eval_lengths reach {eval_length}: the relative rows of "
            f"distances {train_length} to {min(k, eval_length) - 1} are never trained (they keep "
            "their random initial values) yet are read at the longer lengths; set "
            f"{{name: disentangled, max_distance: {train_length}}} or less, so that longer "
            "distances clip to trained rows"
        ]

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        n_layers: int = 1,
        *,
        max_distance: int = 512,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
        self.max_distance = positive_int("max_distance", max_distance)
        d_model = n_heads * head_dim
        self.content_scale: float = (3 * head_dim) ** -0.5
        self.table = nn.Embedding(2 * self.max_distance, d_model)  # P, N(0, 1)
        queries = [nn.Linear(d_model, d_model) for _ in range(n_layers)]  # W_q,r
        keys = [nn.Linear(d_model, d_model, bias=False) for _ in range(n_layers)]  # W_k,r
        for query, key in zip(queries, keys, strict=True):
            nn.init.xavier_uniform_(query.weight)
            nn.init.zeros_(query.bias)
            nn.init.xavier_uniform_(key.weight)
        self.query = nn.ModuleList(queries)
        self.key = nn.ModuleList(keys)

    def score_terms(self, q: torch.Tensor, k: torch.Tensor, layer: int) -> torch.Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(dtype), k.to(dtype)  # [B, H, L, Dh]
        B, H, L, Dh = q.shape
        # Only the 2 * span rows that distances below L can reach (all 2k rows when L >= k).
        span = min(L, self.max_distance)
        rows = self.table.weight[self.max_distance - span : self.max_distance + span]  # [2span, d]
        kr = self.key[layer](rows).to(dtype).view(2 * span, H, Dh).transpose(0, 1)  # [H, 2span, Dh]
        qr = self.query[layer](rows).to(dtype).view(2 * span, H, Dh).transpose(0, 1)
        p = torch.arange(L, device=q.device)
        delta = (p[:, None] - p[None, :] + span).clamp(0, 2 * span - 1)  # [L, L]: delta(i, j)
        delta = delta.expand(B, H, L, L)
        c2p = torch.gather(q @ kr.transpose(-1, -2), -1, delta)  # [B, H, L, L]: Q_i . K^r_d(i,j)
        p2c = torch.gather(k @ qr.transpose(-1, -2), -1, delta)  # [B, H, j, i]: K_j . Q^r_d(j,i)
        return (c2p + p2c.transpose(-1, -2)) * self.content_scale  # [B, H, L, L]


XPOS_DIRECTIONS = ("bidirectional", "published")
"""The forms of ``xpos``: its decay on |i - j| (this encoder's default) or on i - j as published."""


@ATTENTION_POSITIONS.register("xpos")
class XPos(Rotary):
    """xPos (Sun et al. 2023): RoPE with an exponential decay per frequency pair. With R_n the
    rotation of ``rope`` at position n and, for pair c = 0 .. d/2 - 1 (d = head dimension; pair
    c turns at base^(-2c/d)), zeta_c = (c / (d/2) + gamma) / (1 + gamma), gamma = 0.4, the
    score of query n and key m is a function of n - m only:

        ``published``:      q~_n . k~_m = sum_c zeta_c^((n - m) / B)   * (pair c's RoPE score),
        ``bidirectional``:  q~_n . k~_m = sum_c zeta_c^(|n - m| / B) * (pair c's RoPE score),

    B = ``scale_base``. B = 512 and gamma = 0.4 as the reference implementation (torchscale's
    XPOS).

    ``published`` (``direction: published``) is the paper's: q~_n = (R_n q_n) * zeta^(n / B),
    k~_m = (R_m k_m) * zeta^(-m / B). It is defined for causal attention (m <= n), where the
    factor decays with distance. In this bidirectional encoder it decays for keys to the left
    and grows for keys to the right, by up to zeta_0^(-(m - n)/B) = 3.5 at m - n = 512 and
    2.2e4 at 4096 (the highest-frequency pair): at initialisation, queries of the first half of
    a 1024-token document put most of their attention on keys far to their right. It needs no
    score term: it keeps bf16 and the flash kernel as ``rope`` does.

    ``bidirectional`` (the default) applies the same factor to the distance |n - m|, so scores
    shrink on both sides and keys at +d and -d are decayed alike. No product of a query scale
    and a key scale gives |n - m|, so q and k are rotated as ``rope`` does and the decay comes
    as a score term [B, H, L, L] in float32 (keys left of the query from the published scaling,
    keys right of it from the mirrored one, minus RoPE's score, which SDPA adds back): like
    ``disentangled``, no flash kernel and a [B, H, L, L] float32 term per layer (built with at
    most two such tensors alive; on CPU an evaluation pass peaks at about half of
    ``disentangled``'s).

    Positions are not centred (torchscale centres them for range), so a document's scores do
    not depend on its padding. No parameters.
    """

    log_zeta: torch.Tensor  # a buffer (register_buffer in __init__)

    RECORDED_OPTIONS = {"direction": "bidirectional"}
    """Written into the config even when a sweep leaves it out: runs made before the option
    existed used ``published`` with no option, so the default must not share their cell ids."""

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        n_layers: int = 1,
        *,
        base: float = 10000.0,
        scale_base: float = 512.0,
        direction: Literal["bidirectional", "published"] = "bidirectional",
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers, base=base)
        self.scale_base = positive_number("scale_base", scale_base)
        if direction not in XPOS_DIRECTIONS:
            raise ValueError(
                f"direction must be one of {', '.join(XPOS_DIRECTIONS)}, got {direction!r}"
            )
        self.direction = direction
        c = torch.arange(head_dim // 2, dtype=torch.float64)
        zeta = (c / (head_dim / 2) + 0.4) / 1.4  # [Dh / 2], in (0, 1)
        # float64: the exponents p / B * log(zeta) reach ~10 at L = 4096 (a few [L, Dh] flops).
        self.register_buffer("log_zeta", zeta.log(), persistent=False)

    def scales(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """zeta^(p / B) and zeta^(-p / B) for positions p, each [L, Dh], in log_zeta's dtype."""
        log_zeta = self.log_zeta.to(device)
        p = torch.arange(seq_len, device=device, dtype=log_zeta.dtype)
        power = p[:, None] / self.scale_base * log_zeta[None, :]  # [L, Dh / 2]
        power = torch.cat([power, power], dim=-1)  # [L, Dh]: pair (c, c + Dh/2) shares zeta_c
        return power.exp(), (-power).exp()

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().rotate(q, k)
        if self.direction == "bidirectional":
            return q, k  # RoPE only: the decay is a score term
        up, down = self.scales(q.size(-2), q.device)
        return q * up.to(q.dtype), k * down.to(k.dtype)

    def score_terms(self, q: torch.Tensor, k: torch.Tensor, layer: int) -> torch.Tensor | None:
        """``bidirectional``: the decayed score minus RoPE's, scaled by 1/sqrt(Dh), from the
        RoPE-rotated q, k [B, H, L, Dh]; ``published``: None."""
        if self.direction == "published":
            return None
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(dtype), k.to(dtype)  # [B, H, L, Dh]
        up, down = (s.to(dtype) for s in self.scales(q.size(-2), q.device))  # [L, Dh]
        # sum_c zeta_c^((i - j)/B) s_c(i, j) for keys j <= i, zeta_c^((j - i)/B) for j > i.
        # In place on matmul outputs (their backward does not need them): at most two [B, H,
        # L, L] tensors at a time.
        scores = ((q * up) @ (k * down).transpose(-1, -2)).tril_()  # [B, H, L, L]: j <= i
        scores += ((q * down) @ (k * up).transpose(-1, -2)).triu_(1)  # j > i
        scores -= q @ k.transpose(-1, -2)  # SDPA adds RoPE's score back
        return scores.mul_(self.head_dim**-0.5)


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    """The y with softplus(y) = x, for x > 0."""
    return x + torch.log(-torch.expm1(-x))


@ATTENTION_POSITIONS.register("kerple_log")
class KerpleLog(AttentionPosition):
    """KERPLE's logarithmic kernel (Chi et al. 2022) as a score bias, per head h:

        b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|),   r1_h, r2_h > 0 learned.

    The paper's causal distance m - n becomes |i - j| in this bidirectional encoder (symmetric:
    distance, not direction, like ``alibi``). r = softplus(raw) keeps both positive without the
    reference code's in-place clamping; they start as there: r1 ~ U(0, 2), r2 ~ U(0, 1), floored
    at 0.01. One set of parameters shared by all layers, like every bias here and as in KERPLE's
    reference code, which builds one bias module and passes it to every layer
    (chijames/KERPLE, megatron/model/gpt2_model.py).
    """

    def __init__(self, n_heads: int, head_dim: int, max_len: int, n_layers: int = 1) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
        r1 = (2.0 * torch.rand(n_heads)).clamp(min=0.01)
        r2 = torch.rand(n_heads).clamp(min=0.01)
        self.raw_r1 = nn.Parameter(inverse_softplus(r1))  # [H]
        self.raw_r2 = nn.Parameter(inverse_softplus(r2))  # [H]

    def strengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r1, r2), each [H], positive."""
        return F.softplus(self.raw_r1), F.softplus(self.raw_r2)

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        r1, r2 = self.strengths()
        distance = relative_distance(seq_len, device)  # [L, L]
        return -r1[:, None, None] * torch.log1p(r2[:, None, None] * distance)  # [H, L, L]


@ATTENTION_POSITIONS.register("fire")
class FIRE(AttentionPosition):
    """FIRE (Li et al. 2024): a score bias per head from a small MLP of the log-scaled distance,
    normalised by the query's position:

        b(i, j) = f_theta( psi(|i - j|) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

    f_theta: 1 -> mlp_width -> heads with a ReLU; c learned (from ``init_c``), the threshold
    L = |s| * ``init_threshold`` with a learned multiplier s (from 1), as in the paper's
    reference code, which also adds 1e-6 to the normaliser and takes |c|.

    The paper's causal i - j >= 0 becomes |i - j| in this bidirectional encoder, still
    normalised by the query's own position i as published, so keys to the right of a query can
    give inputs above 1. The normaliser depends on i, so the bias is translation-invariant only
    while every query is below L; it does not depend on the sequence length, so padding does
    not change it. The output layer has no bias (a per-head constant, which softmax ignores).
    One MLP shared by all layers, like every bias here. The MLP runs on L x L inputs once per
    forward: at L = 4096 its hidden layer is 4096^2 x mlp_width floats.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        n_layers: int = 1,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 512.0,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers)
        width = positive_int("mlp_width", mlp_width)
        self.init_threshold = positive_number("init_threshold", init_threshold)
        self.mlp = nn.Sequential(
            nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads, bias=False)
        )
        self.c = nn.Parameter(torch.tensor(positive_number("init_c", init_c)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # s: L = |s| * init_threshold

    def normalised_distance(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """psi(|i - j|) / psi(max(L, i)), [L, L] in the parameters' dtype: the MLP's input."""
        c = self.c.abs()
        p = torch.arange(seq_len, device=device, dtype=c.dtype)
        threshold = (self.threshold_scale * self.init_threshold).abs()
        normaliser = torch.log1p(c * torch.maximum(p, threshold)) + 1e-6  # [L]: query i
        distance = relative_distance(seq_len, device).to(c.dtype)  # [L, L]
        return torch.log1p(c * distance) / normaliser[:, None]

    def bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        u = self.normalised_distance(seq_len, device)  # [L, L]
        return self.mlp(u[..., None]).permute(2, 0, 1)  # [L, L, H] -> [H, L, L]


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


def add_score_terms(mask: torch.Tensor | None, terms: torch.Tensor) -> torch.Tensor:
    """One layer's ``attn_mask``: the shared mask (None, bool [B, 1, 1, L] padding, or float
    [B or 1, H, L, L]) plus content-dependent score terms [B, H, L, L]; padded keys stay -inf."""
    if mask is None:
        return terms
    if mask.dtype == torch.bool:
        return terms.masked_fill(~mask, float("-inf"))
    return mask + terms


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    dropout_p: float,
    scale: float | None = None,
) -> torch.Tensor:
    """SDPA with an additive float mask [B or 1, H, L, L], computed in at least float32.

    SDPA needs a float mask in the dtype of q, so under bf16 autocast the bias (and the scores
    it is added to) would be rounded to bf16, whose 8 significant bits cannot tell apart large
    ALiBi distances. Here q, k, v and the mask are upcast to float32 (float64 stays float64) and
    autocast is off for the call; the output returns in the dtype of q. ``scale`` is the factor
    on q.k^T (None: 1/sqrt(Dh)).
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        y = F.scaled_dot_product_attention(
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            attn_mask=mask.to(dtype),
            dropout_p=dropout_p,
            scale=scale,
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
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        position: AttentionPosition,
        layer: int = 0,
    ) -> torch.Tensor:
        """x [B, L, d], the encoder's shared mask, the position module, this layer's index."""
        B, L, d = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, Dh]
        q, k = position.rotate(q, k)
        with torch.autocast(device_type=x.device.type, enabled=False):
            terms = position.score_terms(q, k, layer)  # [B, H, L, L] float32, or None
            if terms is not None:
                mask = add_score_terms(mask, terms)
        dropout_p = self.dropout if self.training else 0.0
        scale = position.content_scale
        if mask is not None and mask.is_floating_point():
            y = biased_attention(q, k, v, mask, dropout_p, scale)  # [B, H, L, Dh]
        else:  # None or a bool padding mask: bf16 stays, flash/efficient kernels stay eligible
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale
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
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        position: AttentionPosition,
        layer: int = 0,
    ) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), mask, position, layer))
            return x + self.drop2(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, mask, position, layer)))
        return self.norm2(x + self.drop2(self.ff(x)))


class Encoder(nn.Module):
    """A stack of blocks sharing one attention-level position module (which keeps any per-layer
    parameters itself, indexed by layer); final LayerNorm if pre-LN."""

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
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, self.attention_position, layer)
        return self.final_norm(x)
