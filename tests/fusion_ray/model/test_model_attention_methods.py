"""The attention-level positions beyond the study (untied, disentangled, xpos, kerple_log, fire):
SDPA against scores written out element by element in float64 (padded keys masked), the
relative invariance each one claims, float32 biases under bf16 autocast, and what each
parametrisation promises."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fusion_ray.model import ATTENTION_POSITIONS, ModelSpec, build_classifier, check_model_spec
from fusion_ray.model.attention import (
    AttentionPosition,
    Rotary,
    SelfAttention,
    add_score_terms,
    build_attention_mask,
)
from tests.fusion_ray.model.test_model_attention import NAIVE_NAMES
from tests.fusion_ray.model.test_model_bias_precision import SdpaSpy, one_block_encoder

pytestmark = pytest.mark.unit

D, HEADS, L = 16, 4, 7
DH = D // HEADS
N_LAYERS, LAYER = 2, 1  # build for two layers, test the second layer's parameters
NEW_NAMES = ("untied", "disentangled", "xpos", "kerple_log", "fire")
# At L = 7 these make every branch occur: clipped distances (|i - j| >= 3), queries on both
# sides of FIRE's threshold, and xPos scales far from 1.
OPTIONS: dict[str, dict] = {
    "disentangled": {"max_distance": 3},
    "fire": {"init_threshold": 3.0},
    "xpos": {"scale_base": 4.0},
}
CPU = torch.device("cpu")


def build(name: str, max_len: int = 64) -> AttentionPosition:
    return ATTENTION_POSITIONS.build(name, HEADS, DH, max_len, N_LAYERS, **OPTIONS.get(name, {}))


def test_every_attention_position_has_a_naive_reference() -> None:
    """A new entry fails here until it gets a written-out reference in one of the two files."""
    assert set(ATTENTION_POSITIONS.names()) == set(NAIVE_NAMES) | set(NEW_NAMES)


def head(x: torch.Tensor, h: int) -> torch.Tensor:
    """Head h's channels of the last dimension."""
    return x[..., h * DH : (h + 1) * DH]


def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def naive_untied(position: torch.nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """TUPE: (q_i . k_j + (p_i U^Q) . (p_j U^K)) / sqrt(2 Dh), p = LayerNorm(P)."""
    p = layer_norm(position.table.weight[:L], position.norm)  # [L, D]
    pq = p @ position.query.weight.T + position.query.bias
    pk = p @ position.key.weight.T
    scores = torch.zeros(q.size(0), HEADS, L, L, dtype=torch.float64)
    for b in range(q.size(0)):
        for h in range(HEADS):
            for i in range(L):
                for j in range(L):
                    content = q[b, h, i] @ k[b, h, j]
                    positional = head(pq[i], h) @ head(pk[j], h)
                    scores[b, h, i, j] = (content + positional) / math.sqrt(2 * DH)
    return scores


def delta(i: int, j: int, k: int) -> int:
    """DeBERTa's relative distance, case by case as in the paper."""
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


def naive_disentangled(position: torch.nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """DeBERTa: (Q_i . K_j + Q_i . K^r_delta(i,j) + K_j . Q^r_delta(j,i)) / sqrt(3 Dh)."""
    span = position.max_distance
    P = position.table.weight  # [2k, D]: the full table, no slicing
    w_qr, b_qr = position.query[LAYER].weight, position.query[LAYER].bias
    w_kr = position.key[LAYER].weight
    scores = torch.zeros(q.size(0), HEADS, L, L, dtype=torch.float64)
    for b in range(q.size(0)):
        for h in range(HEADS):
            for i in range(L):
                for j in range(L):
                    kr = head(P[delta(i, j, span)] @ w_kr.T, h)
                    qr = head(P[delta(j, i, span)] @ w_qr.T + b_qr, h)
                    total = q[b, h, i] @ k[b, h, j] + q[b, h, i] @ kr + k[b, h, j] @ qr
                    scores[b, h, i, j] = total / math.sqrt(3 * DH)
    return scores


def naive_xpos(x: torch.Tensor, sign: int, scale_base: float) -> torch.Tensor:
    """xPos: rotate pair (c, c + Dh/2) at position p by p * 10000^(-2c/Dh), then multiply it by
    zeta_c^(sign * p / B), zeta_c = (c / (Dh/2) + 0.4) / 1.4."""
    out = x.clone()
    half = DH // 2
    for p in range(L):
        for c in range(half):
            theta = p * 10000.0 ** (-2 * c / DH)
            zeta = (c / half + 0.4) / 1.4
            scale = zeta ** (sign * p / scale_base)
            a, b = x[..., p, c], x[..., p, c + half]
            out[..., p, c] = (a * math.cos(theta) - b * math.sin(theta)) * scale
            out[..., p, c + half] = (b * math.cos(theta) + a * math.sin(theta)) * scale
    return out


def naive_xpos_bidirectional(q: torch.Tensor, k: torch.Tensor, scale_base: float) -> torch.Tensor:
    """Bidirectional xPos: sum over pairs c of zeta_c^(|i - j| / B) times pair c's RoPE score."""
    rq, rk = naive_xpos(q, 0, scale_base), naive_xpos(k, 0, scale_base)  # sign 0: RoPE only
    half = DH // 2
    scores = torch.zeros(*q.shape[:-2], L, L, dtype=torch.float64)
    for i in range(L):
        for j in range(L):
            for c in range(half):
                zeta = (c / half + 0.4) / 1.4
                pair = [c, c + half]
                s = (rq[..., i, pair] * rk[..., j, pair]).sum(-1)
                scores[..., i, j] += zeta ** (abs(i - j) / scale_base) * s
    return scores


def naive_kerple(position: torch.nn.Module) -> torch.Tensor:
    """-r1 log(1 + r2 |i - j|), r = log(1 + exp(raw))."""
    bias = torch.zeros(HEADS, L, L, dtype=torch.float64)
    for h in range(HEADS):
        r1 = math.log1p(math.exp(position.raw_r1[h].item()))
        r2 = math.log1p(math.exp(position.raw_r2[h].item()))
        for i in range(L):
            for j in range(L):
                bias[h, i, j] = -r1 * math.log(1 + r2 * abs(i - j))
    return bias


def naive_fire(position: torch.nn.Module) -> torch.Tensor:
    """f(psi(|i - j|) / psi(max(L, i))), psi(x) = log(|c| x + 1), f = W2 relu(W1 u + b1)."""
    c = abs(position.c.item())
    threshold = abs(position.threshold_scale.item() * position.init_threshold)
    w1, b1 = position.mlp[0].weight[:, 0], position.mlp[0].bias
    w2 = position.mlp[2].weight  # [H, width]
    bias = torch.zeros(HEADS, L, L, dtype=torch.float64)
    for i in range(L):
        normaliser = math.log(c * max(threshold, i) + 1) + 1e-6
        for j in range(L):
            u = math.log(c * abs(i - j) + 1) / normaliser
            bias[:, i, j] = w2 @ torch.relu(w1 * u + b1)
    return bias


def naive_scores(name: str, position: torch.nn.Module, q: torch.Tensor, k: torch.Tensor):
    """Pre-softmax scores [B, H, L, L], written out without the module's code paths."""
    if name == "untied":
        return naive_untied(position, q, k)
    if name == "disentangled":
        return naive_disentangled(position, q, k)
    if name == "xpos" and position.direction == "bidirectional":
        return naive_xpos_bidirectional(q, k, position.scale_base) / math.sqrt(DH)
    if name == "xpos":
        qx, kx = naive_xpos(q, +1, position.scale_base), naive_xpos(k, -1, position.scale_base)
        return qx @ kx.transpose(-1, -2) / math.sqrt(DH)
    content = q @ k.transpose(-1, -2) / math.sqrt(DH)
    if name == "kerple_log":
        return content + naive_kerple(position)
    if name == "fire":
        return content + naive_fire(position)
    raise ValueError(f"no naive scores for {name!r}")


def naive_attention(
    attn: SelfAttention, x: torch.Tensor, keep: torch.Tensor, name: str, position: torch.nn.Module
) -> torch.Tensor:
    B = x.size(0)
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias  # [B, L, 3D]
    q, k, v = (
        qkv[..., i * D : (i + 1) * D].reshape(B, L, HEADS, DH).transpose(1, 2) for i in range(3)
    )
    scores = naive_scores(name, position, q, k)  # [B, H, L, L]
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    y = scores.softmax(dim=-1) @ v  # [B, H, L, Dh]
    y = y.transpose(1, 2).reshape(B, L, D)
    return y @ attn.out.weight.T + attn.out.bias


@pytest.mark.parametrize("name", NEW_NAMES)
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_matches_naive_attention(name: str, padded: bool) -> None:
    check_sdpa_matches_naive(name, padded, build(name))


@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_matches_naive_attention_for_published_xpos(padded: bool) -> None:
    """``xpos`` above is the default, bidirectional form; this is the published one."""
    position = ATTENTION_POSITIONS.build(
        "xpos", HEADS, DH, 64, N_LAYERS, **OPTIONS["xpos"], direction="published"
    )
    check_sdpa_matches_naive("xpos", padded, position)


def check_sdpa_matches_naive(name: str, padded: bool, position: AttentionPosition) -> None:
    torch.manual_seed(0)
    attn = SelfAttention(D, HEADS, dropout=0.0).double().eval()
    position = position.double()
    with torch.no_grad():
        for p in attn.parameters():  # non-zero biases too
            p.normal_(std=0.3)
        for p in position.parameters():
            p.normal_()
        if name == "fire":
            position.threshold_scale.fill_(1.0)  # threshold 3: queries on both sides
    x = torch.randn(3, L, D, dtype=torch.float64)
    keep = torch.ones(3, L, dtype=torch.bool)
    if padded:
        keep[1, 4:] = False
        keep[2, 1:] = False
    mask = build_attention_mask(keep if padded else None, position.bias(L, x.device))
    with torch.no_grad():
        got = attn(x, mask, position, LAYER)
        expected = naive_attention(attn, x, keep, name, position)
    assert torch.allclose(got, expected, atol=1e-10)


def randomised(name: str, *args: object, **kwargs: object) -> AttentionPosition:
    position = ATTENTION_POSITIONS.build(name, *args, **kwargs)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in position.parameters():
            p.normal_(generator=g)
    return position


@pytest.mark.parametrize("name", ["alibi", "t5_bias", "kerple_log"])
def test_relative_biases_are_unchanged_by_shifting_all_positions(name: str) -> None:
    """b(i + s, j + s) = b(i, j): the bias depends on the offset only."""
    bias = randomised(name, 2, 4, 64).bias(40, CPU)  # [H, 40, 40]
    for s in (1, 5, 17):
        assert torch.equal(bias[:, s:, s:], bias[:, :-s, :-s])
    assert not torch.equal(bias[:, 0, 1], bias[:, 0, 2])  # and it does see the offset


def test_fire_is_shift_invariant_only_below_its_threshold() -> None:
    """The normaliser psi(max(L, i)) is the same for every query below L = 16, so there the
    bias depends on |i - j| only; above it, on the query's position too."""
    position = ATTENTION_POSITIONS.build("fire", 2, 4, 64, init_threshold=16.0)
    with torch.no_grad():
        bias = position.bias(40, CPU)  # [H, 40, 40]
    s = 3
    assert torch.equal(bias[:, s:16, s:], bias[:, : 16 - s, : 40 - s])
    assert not torch.allclose(bias[:, 16 + s :, s:], bias[:, 16 : 40 - s, : 40 - s], atol=1e-4)


@pytest.mark.parametrize("name", ["alibi", "t5_bias", "untied", "kerple_log", "fire"])
def test_bias_does_not_depend_on_the_sequence_length(name: str) -> None:
    """The bias for 9 tokens is the top-left block of the bias for 40: padding a document to a
    longer batch does not change its biases."""
    position = randomised(name, 2, 4, 64)
    with torch.no_grad():
        assert torch.allclose(position.bias(40, CPU)[:, :9, :9], position.bias(9, CPU), rtol=1e-5)


def test_xpos_scores_depend_on_offset_only_and_scale_each_pair_by_zeta() -> None:
    """Same q and k at every position: q~_n . k~_m is a function of n - m. With q and k in one
    frequency pair c only, it is rope's score times zeta_c^((n - m)/B), zeta_c from the paper:
    below 1 for keys to the left (n > m), above 1 for keys to the right."""
    B, Dh, n = 16.0, 8, 20
    xpos = ATTENTION_POSITIONS.build("xpos", 1, Dh, 64, scale_base=B, direction="published")
    rope = ATTENTION_POSITIONS.build("rope", 1, Dh, 64)
    torch.manual_seed(0)
    q0, k0 = torch.randn(Dh, dtype=torch.float64), torch.randn(Dh, dtype=torch.float64)
    q, k = q0.expand(1, 1, n, Dh), k0.expand(1, 1, n, Dh)
    xq, xk = xpos.rotate(q, k)
    scores = xq[0, 0] @ xk[0, 0].T  # [n, n]
    for offset in range(-(n - 1), n):
        diagonal = torch.diagonal(scores, offset=offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-5, atol=1e-6)
    offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # n - m
    for c in (0, Dh // 2 - 1):
        pair = torch.zeros(Dh, dtype=torch.float64)
        pair[[c, c + Dh // 2]] = 1.0
        xq, xk = xpos.rotate(q * pair, k * pair)
        rq, rk = rope.rotate(q * pair, k * pair)
        zeta = (c / (Dh / 2) + 0.4) / 1.4
        expected = (rq[0, 0] @ rk[0, 0].T) * zeta ** (offsets / B)
        assert torch.allclose(xq[0, 0] @ xk[0, 0].T, expected, rtol=1e-5, atol=1e-6)
    assert (0.4 / 1.4) ** (-(n - 1) / B) > 2.0  # the growth to the right is not negligible here


def test_disentangled_terms_depend_on_the_clipped_offset_only() -> None:
    """Same content at every position: c2p + p2c depend on j - i only, and beyond the clip
    distance k = 3 every offset on one side shares the edge embeddings."""
    heads, dh, n = 2, 4, 10
    position = randomised("disentangled", heads, dh, 64, max_distance=3)
    torch.manual_seed(0)
    q = torch.randn(heads, dh)[None, :, None, :].expand(1, heads, n, dh)
    k = torch.randn(heads, dh)[None, :, None, :].expand(1, heads, n, dh)
    with torch.no_grad():
        terms = position.score_terms(q, k, 0)[0]  # [H, n, n]
    value = {}
    for offset in range(-(n - 1), n):
        diagonal = torch.diagonal(terms, offset=offset, dim1=-2, dim2=-1)  # [H, n - |offset|]
        assert torch.allclose(diagonal, diagonal[:, :1].expand_as(diagonal), atol=1e-6)
        value[offset] = diagonal[:, 0]
    for offset in range(4, n):
        assert torch.allclose(value[offset], value[3], atol=1e-6)
        assert torch.allclose(value[-offset], value[-3], atol=1e-6)
    assert not torch.allclose(value[2], value[3], atol=1e-3)  # inside the clip: distinct


def test_disentangled_has_per_layer_projections_and_one_shared_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = ModelSpec(
        d_model=8,
        n_heads=2,
        n_layers=3,
        max_len=16,
        attention_position="disentangled",
        attention_position_kwargs={"max_distance": 4},
    )
    model = build_classifier(spec, 20, 2, seed=0).eval()
    position = model.encoder.attention_position
    assert len(position.query) == len(position.key) == 3
    assert position.table.weight.shape == (2 * 4, 8)  # one table for all layers
    layers: list[int] = []
    real = position.score_terms

    def spy(q: torch.Tensor, k: torch.Tensor, layer: int) -> torch.Tensor:
        layers.append(layer)
        return real(q, k, layer)

    monkeypatch.setattr(position, "score_terms", spy)
    with torch.no_grad():
        model(torch.randint(1, 20, (2, 6)))
        assert layers == [0, 1, 2]  # each layer gets its own index
        q, k = torch.randn(2, 1, 2, 6, 4).unbind(0)
        assert not torch.allclose(real(q, k, 0), real(q, k, 1))


def test_kerple_strengths_stay_positive_and_the_bias_falls_with_distance() -> None:
    torch.manual_seed(0)
    fresh = ATTENTION_POSITIONS.build("kerple_log", 64, 4, 64)
    r1, r2 = fresh.strengths()
    assert (
        r1.min() >= 0.01 - 1e-6 and r1.max() <= 2.0 and r2.min() >= 0.01 - 1e-6 and r2.max() <= 1.0
    )
    assert r1.max() > 1.0 and r2.max() > 0.5  # drawn from U(0, 2) and U(0, 1)

    position = ATTENTION_POSITIONS.build("kerple_log", 3, 4, 64)
    with torch.no_grad():
        position.raw_r1.copy_(torch.tensor([-10.0, 0.0, 10.0]))
        position.raw_r2.copy_(torch.tensor([10.0, -10.0, 0.0]))
        r1, r2 = position.strengths()
        bias = position.bias(50, CPU)  # [3, 50, 50]
    assert (r1 > 0).all() and (r2 > 0).all()
    assert (bias <= 0).all() and (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert (torch.diff(bias[:, 0, :], dim=-1) < 0).all()  # strictly falling with |i - j|
    r1_head2 = math.log1p(math.exp(10.0))  # softplus(10); r2 = softplus(0) = log 2
    assert bias[2, 0, 9].item() == pytest.approx(-r1_head2 * math.log1p(math.log(2.0) * 9))


def test_fire_golden_values() -> None:
    """One hidden unit, f(u) = (1, 2) * relu(u): the bias is the normalised distance itself.
    c = 0.1 and L = 512 (the paper's initial values): psi(x) = log(0.1 x + 1)."""
    position = ATTENTION_POSITIONS.build("fire", 2, 4, 1024, mlp_width=1)
    with torch.no_grad():
        position.mlp[0].weight.fill_(1.0)
        position.mlp[0].bias.zero_()
        position.mlp[2].weight.copy_(torch.tensor([[1.0], [2.0]]))
        bias = position.bias(601, CPU)  # [2, 601, 601]
    below = math.log(1.3) / (math.log(52.2) + 1e-6)  # query 0 (below L), key 3
    assert bias[0, 0, 3].item() == pytest.approx(below, rel=1e-6)
    assert bias[1, 0, 3].item() == pytest.approx(2 * below, rel=1e-6)
    above = math.log(61.0) / (math.log(61.0) + 1e-6)  # query 600 (above L), key 0: u ~ 1
    assert bias[0, 600, 0].item() == pytest.approx(above, rel=1e-6)
    right = math.log(61.0) / (math.log(52.2) + 1e-6)  # query 0, key 600 to its right: u > 1
    assert bias[0, 0, 600].item() == pytest.approx(right, rel=1e-6) and right > 1


@pytest.mark.parametrize("name", ["untied", "kerple_log", "fire"])
def test_biases_reach_the_scores_as_their_fp32_values(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    n = 64
    position = randomised(name, 2, 4, n)
    encoder = one_block_encoder(8, position)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, 40:] = False
    with torch.no_grad():
        expected = build_attention_mask(keep, position.bias(n, CPU))  # float32, no autocast
    assert expected is not None and expected.dtype == torch.float32
    assert not torch.equal(expected.to(torch.bfloat16).float(), expected)  # bf16 would round

    spy = SdpaSpy(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = encoder(torch.randn(2, n, 8), keep)
    [(q_dtype, mask, autocast_on)] = spy.calls
    assert q_dtype == torch.float32 and not autocast_on
    assert mask is not None and torch.equal(mask, expected)
    y.float().sum().backward()  # the learned parameters still get gradients through the upcast
    for pname, p in position.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


def test_disentangled_terms_reach_the_scores_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The c2p and p2c terms are computed in float32 from the layer's bf16 q and k, added to
    the padding mask, and attention runs in float32 with autocast off."""
    torch.manual_seed(0)
    n = 48
    position = randomised("disentangled", 2, 4, n, max_distance=16)
    encoder = one_block_encoder(8, position)
    attn = encoder.blocks[0].attn
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, 30:] = False
    x = torch.randn(2, n, 8)

    spy = SdpaSpy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder(x, keep)
        qkv = attn.qkv(x).view(2, n, 3, 2, 4)  # what the layer computes, bf16
    [(q_dtype, mask, autocast_on)] = spy.calls
    assert q_dtype == torch.float32 and not autocast_on
    q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert q.dtype == torch.bfloat16
    with torch.no_grad():
        expected = add_score_terms(build_attention_mask(keep, None), position.score_terms(q, k, 0))
    assert mask is not None and mask.dtype == torch.float32 and mask.shape == (2, 2, n, n)
    assert torch.equal(mask, expected)
    assert torch.isinf(mask[1, :, :, 30:]).all() and torch.isfinite(mask[0]).all()
    assert not torch.equal(expected.to(torch.bfloat16).float(), expected)  # bf16 would round


def test_xpos_keeps_bf16_sdpa_without_a_float_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Published form: no score bias, SDPA gets bf16 q and no float mask, like rope (flash
    stays eligible)."""
    n = 16
    encoder = one_block_encoder(
        8, ATTENTION_POSITIONS.build("xpos", 2, 4, n, direction="published")
    )
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, 10:] = False
    spy = SdpaSpy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder(torch.randn(2, n, 8))
        encoder(torch.randn(2, n, 8), keep)
    assert [(q, m is None or m.dtype, on) for q, m, on in spy.calls] == [
        (torch.bfloat16, True, True),
        (torch.bfloat16, torch.bool, True),
    ]


@pytest.mark.parametrize("name", NEW_NAMES)
def test_padding_keys_are_ignored_under_bf16_autocast(name: str) -> None:
    """Changing the inputs at padded positions leaves the real tokens' outputs unchanged."""
    torch.manual_seed(0)
    n = 32
    encoder = one_block_encoder(8, randomised(name, 2, 4, n))
    keep = torch.ones(1, n, dtype=torch.bool)
    keep[0, 20:] = False
    x = torch.randn(1, n, 8)
    other = x.clone()
    other[0, 20:] = 100.0 * torch.randn(n - 20, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_other = encoder(x, keep), encoder(other, keep)
    assert torch.equal(y[0, :20], y_other[0, :20])
    assert not torch.equal(y[0, 20:], y_other[0, 20:])


# ----------------------------------------------------------------------------- xpos's two forms


def xpos_scores(position: AttentionPosition, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The pre-softmax scores [B, H, L, L] of one layer: SDPA's part plus any score terms."""
    rq, rk = position.rotate(q, k)
    scores = rq @ rk.transpose(-1, -2) / math.sqrt(q.size(-1))
    terms = position.score_terms(rq, rk, 0)
    return scores if terms is None else scores + terms


def test_bidirectional_xpos_decays_with_distance_on_both_sides_and_is_symmetric() -> None:
    """Same q and k at every position: the scores depend on n - m only. With q and k in one
    frequency pair c only, they are rope's times zeta_c^(|n - m| / B): the same factor for a key
    d to the left and d to the right, below 1 and falling with d on both sides. With q = k they
    are a symmetric matrix."""
    B, Dh, n = 16.0, 8, 20
    xpos = ATTENTION_POSITIONS.build("xpos", 1, Dh, 64, scale_base=B)
    assert xpos.direction == "bidirectional"  # the default
    rope = ATTENTION_POSITIONS.build("rope", 1, Dh, 64)
    torch.manual_seed(0)
    q0, k0 = torch.randn(Dh, dtype=torch.float64), torch.randn(Dh, dtype=torch.float64)
    q, k = q0.expand(1, 1, n, Dh), k0.expand(1, 1, n, Dh)
    scores = xpos_scores(xpos, q, k)[0, 0]  # [n, n]
    for offset in range(-(n - 1), n):
        diagonal = torch.diagonal(scores, offset=offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-5, atol=1e-6)
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()  # |n - m|
    for c in range(Dh // 2):
        pair = torch.zeros(Dh, dtype=torch.float64)
        pair[[c, c + Dh // 2]] = 1.0
        got = xpos_scores(xpos, q * pair, k * pair)[0, 0]
        plain = xpos_scores(rope, q * pair, k * pair)[0, 0]
        zeta = (c / (Dh / 2) + 0.4) / 1.4
        factor = zeta ** (distance / B)  # symmetric in n - m, 1 on the diagonal
        assert torch.allclose(got, plain * factor, rtol=1e-9, atol=1e-12)
        assert (factor[0, 1:].diff() < 0).all() and (factor[-1, :-1].diff() > 0).all()
    # q = k: rope's score is |q_c|^2 cos((n - m) theta_c), even in n - m, and so is the decay
    same = xpos_scores(xpos, q, q)[0, 0]
    assert torch.allclose(same, same.T, rtol=1e-9, atol=1e-12)
    published = ATTENTION_POSITIONS.build("xpos", 1, Dh, 64, scale_base=B, direction="published")
    mirrored = xpos_scores(published, q, q)[0, 0]
    assert not torch.allclose(mirrored, mirrored.T, rtol=1e-3)  # the published form is not


class FormerXPos(Rotary):
    """``xpos`` as it was before its ``direction`` option (the published form), kept verbatim
    as the reference that ``direction: published`` must reproduce bit for bit."""

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        n_layers: int = 1,
        *,
        base: float = 10000.0,
        scale_base: float = 512.0,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, n_layers, base=base)
        self.scale_base = float(scale_base)
        c = torch.arange(head_dim // 2, dtype=torch.float64)
        zeta = (c / (head_dim / 2) + 0.4) / 1.4  # [Dh / 2], in (0, 1)
        self.register_buffer("log_zeta", zeta.log(), persistent=False)

    def scales(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        log_zeta = self.log_zeta.to(device)
        p = torch.arange(seq_len, device=device, dtype=log_zeta.dtype)
        power = p[:, None] / self.scale_base * log_zeta[None, :]  # [L, Dh / 2]
        power = torch.cat([power, power], dim=-1)  # [L, Dh]
        return power.exp(), (-power).exp()

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().rotate(q, k)
        up, down = self.scales(q.size(-2), q.device)
        return q * up.to(q.dtype), k * down.to(k.dtype)


@pytest.mark.parametrize("autocast", [False, True])
def test_published_xpos_is_bitwise_the_former_code(autocast: bool) -> None:
    """Same weights, same padded batch: logits and every gradient equal the former ``xpos``'s
    bit for bit, in float32 and under bf16 autocast."""
    spec = ModelSpec(
        d_model=16,
        n_heads=2,
        n_layers=2,
        max_len=64,
        attention_position="xpos",
        attention_position_kwargs={"direction": "published", "scale_base": 8.0},
    )
    ids = torch.randint(1, 30, (3, 40), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(3, 40, dtype=torch.bool)
    keep[1, 25:] = False
    results = []
    for former in (False, True):
        model = build_classifier(spec, 30, 3, seed=0).eval()
        if former:
            model.encoder.attention_position = FormerXPos(2, 8, 64, 2, scale_base=8.0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids, keep)
        logits.float().sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((logits.detach(), grads))
    (logits, grads), (former_logits, former_grads) = results
    assert torch.equal(logits, former_logits)
    assert len(grads) == len(former_grads) and all(
        torch.equal(a, b) for a, b in zip(grads, former_grads, strict=True)
    )


def far_right_share(name: str, L: int, **options: object) -> float:
    """At initialisation (q, k ~ N(0, 1), head dimension 16, two heads): the mean share of
    attention that the queries of the first half put on keys more than L/4 to their right."""
    position = ATTENTION_POSITIONS.build(name, 2, 16, L, **options)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, L, 16, generator=g).unbind(0)  # each [1, H, L, Dh]
    with torch.no_grad():
        attention = xpos_scores(position, q, k)[..., : L // 2, :].softmax(dim=-1)
    p = torch.arange(L)
    far = p[None, :] > p[: L // 2, None] + L // 4  # [L/2, L]
    return (attention * far).sum(-1).mean().item()


def test_only_published_xpos_sends_attention_far_to_the_right_at_initialisation() -> None:
    """The issue's measurement, scale_base 512. Even attention over the keys gives 1/2 (rope);
    published xPos grows the scores of keys to the right: 81 % at L = 1024, 100 % at 4096. The
    bidirectional form stays at or below rope's share."""
    shares = {
        (name, L): far_right_share("xpos" if name != "rope" else "rope", L, **options)
        for name, options in (
            ("rope", {}),
            ("published", {"direction": "published"}),
            ("bidirectional", {"direction": "bidirectional"}),
        )
        for L in (1024, 4096)
    }
    for L in (1024, 4096):
        assert abs(shares["rope", L] - 0.5) < 0.01, shares
        assert shares["bidirectional", L] <= shares["rope", L], shares
        assert shares["bidirectional", L] > 0.4, shares  # decayed, not collapsed onto neighbours
    assert 0.78 < shares["published", 1024] < 0.85, shares
    assert shares["published", 4096] > 0.999, shares


def test_bidirectional_xpos_terms_reach_the_scores_in_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decay is a float32 score term, computed from the layer's bf16 rotated q and k and
    added to the padding mask; attention then runs in float32 with autocast off."""
    torch.manual_seed(0)
    n = 48
    position = ATTENTION_POSITIONS.build("xpos", 2, 4, n, scale_base=8.0)
    encoder = one_block_encoder(8, position)
    attn = encoder.blocks[0].attn
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, 30:] = False
    x = torch.randn(2, n, 8)
    spy = SdpaSpy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder(x, keep)
        qkv = attn.qkv(x).view(2, n, 3, 2, 4)  # what the layer computes, bf16
    [(q_dtype, mask, autocast_on)] = spy.calls
    assert q_dtype == torch.float32 and not autocast_on
    q, k, _ = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    with torch.no_grad():
        rq, rk = position.rotate(q, k)
        assert rq.dtype == torch.bfloat16
        expected = add_score_terms(
            build_attention_mask(keep, None), position.score_terms(rq, rk, 0)
        )
    assert mask is not None and mask.dtype == torch.float32 and mask.shape == (2, 2, n, n)
    assert torch.equal(mask, expected)
    assert torch.isinf(mask[1, :, :, 30:]).all() and torch.isfinite(mask[0]).all()


def test_bidirectional_xpos_terms_have_the_right_gradients() -> None:
    """The term is built in place on matmul outputs: autograd still gets it right."""
    position = ATTENTION_POSITIONS.build("xpos", 2, 4, 16, scale_base=4.0).double()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 2, 9, 4, dtype=torch.float64, generator=g).unbind(0)
    q.requires_grad_(True)
    k.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: position.score_terms(a, b, 0), (q, k))


def test_xpos_options_are_validated() -> None:
    with pytest.raises(ValueError, match="direction: allowed values: bidirectional or published"):
        ATTENTION_POSITIONS.build("xpos", 2, 4, 16, direction="causal")
    with pytest.raises(ValueError, match="direction must be one of bidirectional, published"):
        ATTENTION_POSITIONS.get("xpos")(2, 4, 16, direction="causal")  # the class checks too
    spec = ModelSpec(d_model=8, n_heads=2, attention_position="xpos")
    assert check_model_spec(spec) == []
    bad = ModelSpec(
        d_model=8, n_heads=2, attention_position="xpos", attention_position_kwargs={"direction": 1}
    )
    assert any(
        "option direction: allowed values: bidirectional or published (got 1)" in p
        for p in check_model_spec(bad)
    )


def test_the_xpos_default_enters_the_config_and_the_cell_id() -> None:
    """Runs of ``xpos`` made before its direction option had ``attention_position_kwargs {}``
    and the published form: the default form records its direction in the config, so it never
    shares their cell id; entries without recorded options keep their config (and ids)."""
    from fusion_ray.config.combinations import flatten
    from fusion_ray.config.grid import cell_id
    from fusion_ray.train.spec import TrialConfig

    default = ModelSpec(attention_position="xpos")
    assert default.attention_position_kwargs == {"direction": "bidirectional"}
    published = ModelSpec(
        attention_position="xpos", attention_position_kwargs={"direction": "published"}
    )
    assert published.attention_position_kwargs == {"direction": "published"}
    kept = {"scale_base": 64.0}
    assert ModelSpec(
        attention_position="xpos", attention_position_kwargs=kept
    ).attention_position_kwargs == {
        "scale_base": 64.0,
        "direction": "bidirectional",
    } and kept == {"scale_base": 64.0}  # a new mapping: the caller's is left alone
    for name in ATTENTION_POSITIONS.names():
        if name != "xpos":
            assert ModelSpec(attention_position=name).attention_position_kwargs == {}, name

    before = ModelSpec(attention_position="xpos")
    before.attention_position_kwargs = {}  # a config recorded before the option existed
    ids = {
        label: cell_id(TrialConfig(model=model))
        for label, model in (("before", before), ("default", default), ("published", published))
    }
    assert len(set(ids.values())) == 3, ids
    flat = flatten(dataclasses.asdict(TrialConfig(model=default)))
    assert flat["model.attention_position_kwargs.direction"] == "bidirectional"
    # the form travels with the trial: rebuilt from its config, it is the same model
    model = build_classifier(default, 20, 2, seed=0)
    assert model.encoder.attention_position.direction == "bidirectional"
