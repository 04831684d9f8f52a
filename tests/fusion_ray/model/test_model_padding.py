"""Padding invariance: a document's logits do not change when it is batched with much longer
neighbours (fp32, atol 1e-5), for every position family, attention position and fusion."""

from __future__ import annotations

import pytest
import torch

from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS, ModelSpec, build_classifier

pytestmark = pytest.mark.unit

VOCAB, MAX_LEN = 40, 64

CASES = [(f, "sinusoidal", "none") for f in FUSIONS.names()]
CASES += [("gate_cnn", p, "none") for p in POSITIONS.names()]
CASES += [("add", "none", a) for a in ATTENTION_POSITIONS.names()]
CASES += [("gate_scalar", "learned", a) for a in ATTENTION_POSITIONS.names()]
CASES = list(dict.fromkeys(CASES))


@pytest.mark.parametrize(("fusion", "position", "attention"), CASES)
def test_logits_do_not_depend_on_batch_padding(fusion: str, position: str, attention: str) -> None:
    spec = ModelSpec(
        d_model=16,
        n_heads=4,
        n_layers=2,
        d_ff=32,
        max_len=MAX_LEN,
        fusion=fusion,
        position=position,
        attention_position=attention,
    )
    model = build_classifier(spec, VOCAB, 3, seed=0).eval()
    with torch.no_grad():  # learned attention biases: make them matter
        for p in model.encoder.attention_position.parameters():
            p.normal_(generator=torch.Generator().manual_seed(1))

    g = torch.Generator().manual_seed(0)
    short = torch.randint(1, VOCAB, (5,), generator=g)
    lengths = [5, 60, 5, 33, 64]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = short if n == 5 else torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, :n] = True

    with torch.no_grad():
        alone = model(short[None])  # [1, C], no mask at all
        alone_masked = model(short[None], torch.ones(1, 5, dtype=torch.long))
        batched = model(ids, mask)  # [5, C]
    assert torch.allclose(alone, alone_masked, atol=1e-6)
    assert torch.allclose(batched[0], alone[0], atol=1e-5)
    assert torch.allclose(batched[2], alone[0], atol=1e-5)
    # neighbours are different documents, so their logits differ from the short one's
    assert not torch.allclose(batched[1], alone[0], atol=1e-3)
