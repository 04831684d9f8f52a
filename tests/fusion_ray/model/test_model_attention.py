"""Attention on SDPA against a naive softmax(QK^T / sqrt(d) + bias)V on the same weights, for
the study's attention-level positions (the others: test_model_attention_methods.py, which also
checks that every registered entry has a reference in one of the two files), plus golden values
of the position mechanisms themselves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fusion_ray.data import TokenizedSplit, collate
from fusion_ray.model import ATTENTION_POSITIONS, ModelSpec, build_classifier
from fusion_ray.model import attention as attention_module
from fusion_ray.model.attention import (
    SelfAttention,
    alibi_slopes,
    build_attention_mask,
    t5_bucket,
)
from fusion_ray.train.evaluate import device_batch

pytestmark = pytest.mark.unit

D, HEADS, L = 16, 4, 7
DH = D // HEADS
NAIVE_NAMES = ("none", "rope", "alibi", "t5_bias")  # the entries naive_attention writes out


def naive_rotate(x: torch.Tensor) -> torch.Tensor:
    """RoPE written out: channel pair (c, c + Dh/2) at position p turns by p * 10000^(-2c/Dh)."""
    out = x.clone()
    half = x.size(-1) // 2
    for p in range(x.size(-2)):
        for c in range(half):
            theta = p * 10000.0 ** (-2 * c / x.size(-1))
            a, b = x[..., p, c], x[..., p, c + half]
            out[..., p, c] = a * math.cos(theta) - b * math.sin(theta)
            out[..., p, c + half] = b * math.cos(theta) + a * math.sin(theta)
    return out


def naive_bias(name: str, position: torch.nn.Module) -> torch.Tensor:
    """[H, L, L] written out element by element."""
    bias = torch.zeros(HEADS, L, L, dtype=torch.float64)
    for h in range(HEADS):
        for i in range(L):
            for j in range(L):
                if name == "alibi":
                    bias[h, i, j] = -(2.0 ** (-8.0 * (h + 1) / HEADS)) * abs(i - j)
                elif name == "t5_bias":
                    bucket = t5_bucket(torch.tensor(j - i), 32, 128)
                    bias[h, i, j] = position.table.weight[bucket, h]
                elif name not in ("none", "rope"):
                    raise ValueError(f"no naive bias for {name!r}")
    return bias


def naive_attention(
    attn: SelfAttention, x: torch.Tensor, keep: torch.Tensor, name: str, position: torch.nn.Module
) -> torch.Tensor:
    B = x.size(0)
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias  # [B, L, 3D]
    q, k, v = (
        qkv[..., i * D : (i + 1) * D].reshape(B, L, HEADS, DH).transpose(1, 2) for i in range(3)
    )
    if name == "rope":
        q, k = naive_rotate(q), naive_rotate(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH) + naive_bias(name, position)  # [B, H, L, L]
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    y = scores.softmax(dim=-1) @ v  # [B, H, L, Dh]
    y = y.transpose(1, 2).reshape(B, L, D)
    return y @ attn.out.weight.T + attn.out.bias


@pytest.mark.parametrize("name", NAIVE_NAMES)
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_matches_naive_attention(name: str, padded: bool) -> None:
    torch.manual_seed(0)
    attn = SelfAttention(D, HEADS, dropout=0.0).double().eval()
    position = ATTENTION_POSITIONS.build(name, HEADS, DH, 64).double()
    with torch.no_grad():
        for p in attn.parameters():  # non-zero biases too
            p.normal_(std=0.3)
        for p in position.parameters():
            p.normal_()
    x = torch.randn(3, L, D, dtype=torch.float64)
    keep = torch.ones(3, L, dtype=torch.bool)
    if padded:
        keep[1, 4:] = False
        keep[2, 1:] = False
    mask = build_attention_mask(keep if padded else None, position.bias(L, x.device))
    got = attn(x, mask, position)
    expected = naive_attention(attn, x, keep, name, position)
    assert torch.allclose(got, expected, atol=1e-10)


def test_rope_scores_depend_on_relative_offset_only() -> None:
    torch.manual_seed(0)
    rope = ATTENTION_POSITIONS.build("rope", 1, 8, 64)
    q0, k0 = torch.randn(8), torch.randn(8)
    q = q0.expand(1, 1, 20, 8)  # the same q and k vector at every position
    k = k0.expand(1, 1, 20, 8)
    rq, rk = rope.rotate(q, k)
    scores = rq[0, 0] @ rk[0, 0].T  # [20, 20]
    for offset in (-3, 0, 5):
        diagonal = torch.diagonal(scores, offset=offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4)
    assert torch.allclose(rq[0, 0, 0], q0)  # position 0 is not rotated
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # a rotation


def test_alibi_slopes_golden() -> None:
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]))
    # 6 heads: the 4-head slopes, then every other slope of the 8-head series
    expected = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected))


def test_alibi_bias_golden() -> None:
    bias = ATTENTION_POSITIONS.build("alibi", 2, 4, 8).bias(3, torch.device("cpu"))
    # 2 heads: slopes 2^(-8h/2) = 2^-4, 2^-8; bias = -slope * |i - j|
    expected_head0 = -(2.0**-4) * torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]])
    assert torch.allclose(bias[0], expected_head0)
    assert torch.allclose(bias[1], expected_head0 / 16)  # head 1: slope 2^-8


def test_t5_buckets_golden() -> None:
    """Values of T5's bidirectional bucketing (32 buckets, max distance 128), worked by hand:
    keys to the left use buckets 0..15, to the right 16..31; distances < 8 are exact, then
    8 + floor(log(dist / 8) / log(16) * 8), capped at 15."""
    relative = torch.tensor([0, -1, 1, -7, 7, -8, 8, -20, 20, -127, 128, -1000, 1000])
    expected = torch.tensor([0, 1, 17, 7, 23, 8, 24, 10, 26, 15, 31, 15, 31])
    assert torch.equal(t5_bucket(relative, 32, 128), expected)


def test_unpadded_unbiased_attention_passes_no_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """attn_mask=None when there is no padding and no bias: the flash kernel stays eligible.
    The training loop drops the mask of an unpadded batch on the host (no GPU sync)."""
    seen: list[object] = []
    real = attention_module.F.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    ids = torch.randint(1, 20, (2, 6))
    docs = [ids[0].numpy(), ids[1].numpy(), ids[0, :3].numpy()]
    split = TokenizedSplit(
        ids=docs, labels=np.zeros(3, dtype=np.int64), lengths=np.array([6, 6, 3])
    )
    published = {"direction": "published"}  # xpos's default, bidirectional form has a score term
    for name, options in (("none", {}), ("rope", {}), ("xpos", published)):
        model = build_classifier(
            ModelSpec(
                d_model=8,
                n_heads=2,
                n_layers=2,
                max_len=8,
                attention_position=name,
                attention_position_kwargs=options,
            ),
            20,
            2,
            seed=0,
        )
        seen.clear()
        unpadded = collate(split, [0, 1])  # both documents 6 tokens long
        batch_ids, batch_mask, _ = device_batch(unpadded, torch.device("cpu"))
        assert batch_mask is None
        model(batch_ids, batch_mask)
        model(ids)
        assert seen == [None] * 4, name
        padded = device_batch(collate(split, [0, 2]), torch.device("cpu"))[1]
        assert padded is not None and padded.tolist() == [[True] * 6, [True] * 3 + [False] * 3]
        seen.clear()
        mask = torch.ones(2, 6, dtype=torch.bool)
        mask[0, 3:] = False
        model(ids, mask)
        assert all(
            m is not None and m.dtype == torch.bool and m.shape == (2, 1, 1, 6) for m in seen
        )
    for name in ("alibi", "t5_bias", "untied", "kerple_log", "fire", "xpos"):
        model = build_classifier(
            ModelSpec(d_model=8, n_heads=2, n_layers=1, max_len=8, attention_position=name),
            20,
            2,
            seed=0,
        )
        seen.clear()
        model(ids)
        shape = (2, 2, 6, 6) if name == "xpos" else (1, 2, 6, 6)  # a score term is per document
        assert seen[0].shape == shape and seen[0].is_floating_point()


@pytest.mark.parametrize("name", ATTENTION_POSITIONS.names())
def test_document_without_real_tokens_gives_no_nan(name: str) -> None:
    model = build_classifier(
        ModelSpec(d_model=8, n_heads=2, n_layers=2, max_len=8, attention_position=name),
        20,
        2,
        seed=0,
    )
    ids = torch.randint(1, 20, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False  # every position of document 1 is padding
    ids[1] = 0
    logits = model(ids, mask)
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["none", "rope", "xpos"])
def test_flash_kernel_is_reachable_on_gpu(name: str) -> None:
    """With only the flash backend allowed, an unpadded bf16 training step still runs (xpos:
    its published form; the default, bidirectional one adds a float32 score term)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    options = {"direction": "published"} if name == "xpos" else {}
    spec = ModelSpec(
        d_model=64,
        n_heads=4,
        n_layers=2,
        max_len=256,
        attention_position=name,
        attention_position_kwargs=options,
    )
    model = build_classifier(spec, 100, 3, seed=0).cuda()
    ids = torch.randint(1, 100, (4, 256), device="cuda")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, None).float().logsumexp(-1).sum()  # unpadded: the loop passes no mask
    loss.backward()
    assert torch.isfinite(loss)
