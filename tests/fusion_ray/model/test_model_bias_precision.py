"""Attention score biases (ALiBi, T5) keep float32 precision under bf16 autocast (CPU autocast).

bf16 has 8 significant bits: rounded to it, ALiBi's smallest slope (2^-8) at L = 4096 maps the
distances 1000..4095 to 263 values. These tests check that the bias reaching the score addition is
the float32 one, that the attention output then differs from the float32 reference by no more
than the final cast to bf16, and that calls without a bias still run SDPA in bf16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusion_ray.model import ATTENTION_POSITIONS
from fusion_ray.model import attention as attention_module
from fusion_ray.model.attention import (
    AttentionPosition,
    Encoder,
    EncoderBlock,
    SelfAttention,
    build_attention_mask,
    t5_bucket,
)

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
BF16_UNIT_ROUNDOFF = 2.0**-8  # |round_bf16(y) - y| <= 2^-8 |y| (8 significant bits)


class SdpaSpy:
    """Records, per SDPA call, the q dtype, the attn_mask and whether CPU autocast was on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[torch.dtype, torch.Tensor | None, bool]] = []
        self.real = attention_module.F.scaled_dot_product_attention
        monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", self)

    def __call__(self, q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        mask = kwargs.get("attn_mask")
        self.calls.append((q.dtype, mask, torch.is_autocast_enabled("cpu")))
        return self.real(q, *args, **kwargs)


def one_block_encoder(d_model: int, position: AttentionPosition) -> Encoder:
    block = EncoderBlock(d_model, position.n_heads, 2 * d_model, dropout=0.0)
    return Encoder([block], position).eval()


def bf16_bias_attention(attn: SelfAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The former biased path of SelfAttention.forward: the float mask cast to the dtype of q
    (bf16 under autocast) and SDPA run under autocast. Kept here as the baseline to beat."""
    B, L, d = x.shape
    qkv = attn.qkv(x).view(B, L, 3, attn.n_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))
    return attn.out(y.transpose(1, 2).reshape(B, L, d))


def test_alibi_smallest_slope_keeps_every_distance_distinct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    L = 4096
    position = ATTENTION_POSITIONS.build("alibi", 1, 8, L)  # one head: slope 2^-8, the smallest
    assert position.slopes.tolist() == [2.0**-8]
    encoder = one_block_encoder(8, position)
    reference = position.bias(L, CPU)  # [1, L, L], float32, no autocast
    distances = reference[0, 0]  # query 0: -2^-8 * j for keys j = 0..L-1
    assert distances.dtype == torch.float32 and distances.unique().numel() == L
    # What the former path fed SDPA: the bias cast to bf16, the dtype of q under autocast.
    assert distances.to(torch.bfloat16)[1000:].unique().numel() == 263

    spy = SdpaSpy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder(torch.randn(1, L, 8))
    [(q_dtype, mask, autocast_on)] = spy.calls
    assert q_dtype == torch.float32 and not autocast_on
    assert mask is not None and mask.dtype == torch.float32 and mask.shape == (1, 1, L, L)
    assert mask[0, 0, 0].unique().numel() == L  # every distance 0..L-1 has its own value
    assert torch.equal(mask[0], reference)


def test_t5_bias_reaches_the_scores_as_its_fp32_values(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    L, heads = 200, 2  # L > max_distance = 128: the log-spaced buckets all occur
    position = ATTENTION_POSITIONS.build("t5_bias", heads, 4, L)
    encoder = one_block_encoder(8, position)
    keep = torch.ones(2, L, dtype=torch.bool)
    keep[1, 150:] = False  # key padding on document 1
    expected = build_attention_mask(keep, position.bias(L, CPU))  # float32, no autocast
    assert expected is not None and expected.dtype == torch.float32
    # The former path would have rounded the learned table to bf16, changing the biases.
    assert not torch.equal(expected.to(torch.bfloat16).float(), expected)

    spy = SdpaSpy(monkeypatch)
    x = torch.randn(2, L, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = encoder(x, keep)
    [(q_dtype, mask, autocast_on)] = spy.calls
    assert q_dtype == torch.float32 and not autocast_on
    assert mask is not None and mask.dtype == torch.float32
    assert torch.equal(mask, expected)  # padding keys are -inf, the rest the fp32 table values
    assert torch.isinf(mask[1, :, :, 150:]).all() and torch.isfinite(mask[0]).all()
    # Every bucket that occurs brings its fp32 table value to the scores unchanged (31 of the
    # 32 occur: bucket 16, "key to the right at distance 0", cannot).
    p = torch.arange(L)
    buckets = t5_bucket(p[None, :] - p[:, None], 32, 128).unique()
    assert buckets.numel() == 31
    for h in range(heads):
        table = position.table.weight[buckets, h].detach()
        assert torch.equal(mask[0, h].unique(), table.unique())
    y.float().sum().backward()  # the learned table still gets a gradient through the upcast
    grad = position.table.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_alibi_output_under_bf16_is_the_fp32_output_rounded_once() -> None:
    """q = k = 0, so the scores are the ALiBi bias alone; v = x and the output projection is the
    identity, with x exact in bf16, so the qkv and output projections add no rounding. The only
    bf16 step left in the biased path is the cast of the attention output back to bf16, so the
    bf16 result must lie within bf16's unit roundoff 2^-8 of the fp32 one, element by element.
    The former path (bf16 bias, bf16 attention) misses that bound on many elements."""
    L, d_model, heads = 4096, 8, 2  # slopes 2^-4 and 2^-8
    torch.manual_seed(0)
    attn = SelfAttention(d_model, heads, dropout=0.0).eval()
    position = ATTENTION_POSITIONS.build("alibi", heads, d_model // heads, L)
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.bias.zero_()
        attn.qkv.weight[2 * d_model :].copy_(torch.eye(d_model))  # v = x
        attn.out.weight.copy_(torch.eye(d_model))
        attn.out.bias.zero_()
    x = torch.randn(1, L, d_model).to(torch.bfloat16).float()
    mask = build_attention_mask(None, position.bias(L, CPU))
    assert mask is not None

    with torch.no_grad():
        reference = attn(x, mask, position)  # fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fixed = attn(x, mask, position)
            former = bf16_bias_attention(attn, x, mask)
    assert fixed.dtype == torch.bfloat16 and former.dtype == torch.bfloat16
    bound = BF16_UNIT_ROUNDOFF * reference.abs() + 1e-6  # 1e-6: fp32 slack near zero
    fixed_error = (fixed.float() - reference).abs()
    former_error = (former.float() - reference).abs()
    assert (fixed_error <= bound).all()
    assert (former_error > bound).float().mean() > 0.05
    assert former_error.mean() > 1.2 * fixed_error.mean()


@pytest.mark.parametrize("name", ["none", "rope"])
def test_calls_without_a_bias_keep_bf16_sdpa(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No float bias: SDPA gets bf16 q under autocast (flash/efficient kernels stay eligible)."""
    L = 16
    encoder = one_block_encoder(8, ATTENTION_POSITIONS.build(name, 2, 4, L))
    keep = torch.ones(2, L, dtype=torch.bool)
    keep[1, 10:] = False
    spy = SdpaSpy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        encoder(torch.randn(2, L, 8))
        encoder(torch.randn(2, L, 8), keep)
    assert [(q, m is None or m.dtype, on) for q, m, on in spy.calls] == [
        (torch.bfloat16, True, True),
        (torch.bfloat16, torch.bool, True),
    ]


@pytest.mark.parametrize("name", ["alibi", "t5_bias"])
def test_padding_keys_are_ignored_under_bf16_autocast(name: str) -> None:
    """Changing the inputs at padded positions leaves the real tokens' outputs unchanged."""
    torch.manual_seed(0)
    L = 32
    encoder = one_block_encoder(8, ATTENTION_POSITIONS.build(name, 2, 4, L))
    keep = torch.ones(1, L, dtype=torch.bool)
    keep[0, 20:] = False
    x = torch.randn(1, L, 8)
    other = x.clone()
    other[0, 20:] = 100.0 * torch.randn(L - 20, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_other = encoder(x, keep), encoder(other, keep)
    assert torch.equal(y[0, :20], y_other[0, :20])
    assert not torch.equal(y[0, 20:], y_other[0, 20:])
