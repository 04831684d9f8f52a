"""Contract tests that loop over the registries: a new entry is tested without anyone
remembering to (shapes, gradient flow, determinism, paired initialisation, validation)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from fusion_ray.model import (
    ATTENTION_POSITIONS,
    FUSIONS,
    POSITIONS,
    ModelSpec,
    build_classifier,
    check_model_spec,
    count_parameters,
    flops_per_token,
)
from fusion_ray.testing import model as contract

pytestmark = pytest.mark.unit

VOCAB, CLASSES, MAX_LEN = contract.VOCAB, contract.CLASSES, contract.MAX_LEN


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with contract.one_thread():
        yield


AXES = [("fusion", n) for n in FUSIONS.names()]
AXES += [("position", n) for n in POSITIONS.names()]
AXES += [("attention_position", n) for n in ATTENTION_POSITIONS.names()]


def tiny(**overrides: object) -> ModelSpec:
    return contract.tiny_spec(model=overrides)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.tiny_batch(seed)


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_shapes_and_gradients_reach_every_parameter(axis: str, name: str) -> None:
    contract.check_gradients(axis, name)
    assert build_classifier(tiny(**{axis: name}), VOCAB, CLASSES, 0).fusion.__class__ is (
        FUSIONS.get(name if axis == "fusion" else "add")
    )


@pytest.mark.parametrize("name", FUSIONS.names())
def test_fusion_maps_e_and_p_to_h(name: str) -> None:
    contract.check_fusion_shapes(name)


@pytest.mark.parametrize("name", POSITIONS.names())
def test_position_signal_shape(name: str) -> None:
    contract.check_position_shapes(name)


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_cpu_determinism(axis: str, name: str) -> None:
    """Same seed twice: identical parameters, outputs (dropout on) and one optimiser step."""
    contract.check_determinism(axis, name)


def test_seeds_differ() -> None:
    a = build_classifier(tiny(), VOCAB, CLASSES, seed=0)
    b = build_classifier(tiny(), VOCAB, CLASSES, seed=1)
    assert not torch.equal(a.embedding.weight, b.embedding.weight)
    assert not torch.equal(a.encoder.blocks[0].attn.qkv.weight, b.encoder.blocks[0].attn.qkv.weight)


def test_building_does_not_touch_the_global_rng() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    build_classifier(tiny(position="learned"), VOCAB, CLASSES, seed=0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_paired_init(axis: str, name: str) -> None:
    """For seeds 0 and 1, everything outside the entry's own submodule is byte-identical to the
    default model: across every fusion operator (two position settings), and across input-level
    and attention-level position choices (each with every entry of the other axis)."""
    contract.check_paired_init(axis, name)


@pytest.mark.parametrize("name", FUSIONS.names())
def test_every_combination_runs(name: str) -> None:
    """The full grid of fusion x position x attention position builds and gives finite logits."""
    contract.check_every_combination("fusion", name)


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_an_entry_registered_as_another_is_that_model(axis: str, name: str) -> None:
    contract.check_same_as(axis, name)


def test_the_kit_catches_a_parameter_without_gradient() -> None:
    """An operator with a parameter its forward never uses fails the kit, naming it."""
    from fusion_ray.model.fusion import Fusion

    @FUSIONS.register("unused_parameter_for_test")
    class UnusedParameter(Fusion):
        def __init__(self, d_model: int) -> None:
            super().__init__(d_model)
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
            return E + P

    try:
        contract.check_fusion_shapes("unused_parameter_for_test")
        with pytest.raises(AssertionError, match="fusion.scale gets no gradient"):
            contract.check_gradients("fusion", "unused_parameter_for_test")
    finally:  # out of the registry again, for the tests that list it
        FUSIONS._entries.pop("unused_parameter_for_test")
        FUSIONS._origin.pop("unused_parameter_for_test")


def test_pre_ln_and_gelu() -> None:
    model = build_classifier(tiny(norm_first=True, activation="gelu"), VOCAB, CLASSES, seed=0)
    assert isinstance(model.encoder.final_norm, nn.LayerNorm)
    ids, mask = batch()
    assert model(ids, mask).shape == (2, CLASSES)


def test_embedding_padding_row_is_zero_and_scaled() -> None:
    model = build_classifier(tiny(), VOCAB, CLASSES, seed=0)
    assert model.embedding.padding_idx == 0
    assert torch.equal(model.embedding.weight[0], torch.zeros(8))
    assert model.embed_scale == pytest.approx(8**0.5)
    assert build_classifier(tiny(scale_embeddings=False), VOCAB, CLASSES, 0).embed_scale == 1.0


def test_longer_than_max_len_is_a_clear_error() -> None:
    model = build_classifier(tiny(), VOCAB, CLASSES, seed=0)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(1, MAX_LEN + 1, dtype=torch.long))


def test_count_parameters_and_flops() -> None:
    spec = ModelSpec(d_model=128, n_heads=8, n_layers=2, d_ff=256, max_len=4096)
    model = build_classifier(spec, vocab_size=1000, num_classes=11, seed=0)
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())
    # per block: qkv 3d^2+3d, out d^2+d, ff 2 d d_ff + d_ff + d, two LayerNorms 4d
    d, f = 128, 256
    block = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    assert flops_per_token(spec, 512) == 6 * 2 * block + 12 * 2 * 512 * d
    gate = ModelSpec(**{**spec.__dict__, "fusion": "gate_scalar"})
    assert flops_per_token(gate, 512) - flops_per_token(spec, 512) == 6 * (2 * d + 1)
    assert flops_per_token(spec, 4096) > flops_per_token(spec, 512)


def test_check_model_spec_accepts_defaults_and_every_registered_name() -> None:
    assert check_model_spec(ModelSpec()) == []
    for axis, name in AXES:
        contract.check_spec_accepted(axis, name)


def test_check_model_spec_reports_every_problem() -> None:
    spec = ModelSpec(
        d_model=130,
        n_heads=8,
        n_layers=0,
        dropout=1.5,
        activation="tanh",
        fusion="gate_cnn",
        fusion_kwargs={"kernel_size": 4},
        position="rope",
        attention_position="alibi",
        attention_position_kwargs={"slope": 1},
    )
    problems = check_model_spec(spec)
    text = "\n".join(problems)
    assert "model.n_layers: must be >= 1 (got 0)" in text
    assert "model.dropout: must be < 1 (got 1.5)" in text
    assert "model.activation: allowed values: relu or gelu (got 'tanh')" in text
    assert "n_heads=8 does not divide model.d_model=130" in text
    assert "kernel_size must be a positive odd integer" in text
    assert "unknown position 'rope'" in text and "rotary_features" in text
    assert "attention_position 'alibi' has no option 'slope'" in text
    assert len(problems) == 7


def test_check_model_spec_size_constraints() -> None:
    odd = check_model_spec(ModelSpec(d_model=9, n_heads=1, position="sinusoidal"))
    assert any("d_model must be even" in p for p in odd)
    assert check_model_spec(ModelSpec(d_model=9, n_heads=1, position="learned")) == []
    rope = check_model_spec(
        ModelSpec(d_model=24, n_heads=8, position="none", attention_position="rope")
    )
    assert any("head dimension" in p and "even" in p for p in rope)
    buckets = check_model_spec(
        ModelSpec(attention_position="t5_bias", attention_position_kwargs={"num_buckets": 5})
    )
    assert any("num_buckets" in p for p in buckets)
    with pytest.raises(ValueError, match="does not divide"):
        build_classifier(ModelSpec(d_model=10, n_heads=3), VOCAB, CLASSES, seed=0)


@pytest.mark.parametrize("name", ["sinusoidal", "rotary_features"])
def test_sin_cos_tables_are_the_formula_each_model_its_own_copy(name: str) -> None:
    """The cached sin/cos tables hold the formula's values (float64, then float32) in either
    layout, a check build on the meta device gets the same values on the CPU, and a model that
    changes its table in place changes no other model's."""
    from fusion_ray.model.classifier import check_build

    d, length, base = 8, 50, 500.0
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * w[None, :]
    if name == "sinusoidal":  # sin(p w_i), cos(p w_i) side by side
        expected = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(length, d)
    else:  # every sine, then every cosine
        expected = torch.cat([angles.sin(), angles.cos()], dim=-1)
    one = POSITIONS.build(name, d, length, base=base)
    assert torch.equal(one.table, expected.float())
    built = []
    check_build(lambda: built.append(POSITIONS.build(name, d, length, base=base)))
    assert built[0].table.device.type == "cpu" and torch.equal(built[0].table, one.table)
    one.table.mul_(0)
    assert torch.equal(POSITIONS.build(name, d, length, base=base).table, expected.float())
