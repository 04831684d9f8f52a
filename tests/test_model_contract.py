"""Contract tests that loop over the registries: a new entry is tested without anyone
remembering to (shapes, gradient flow, determinism, paired initialisation, validation)."""

from __future__ import annotations

import itertools
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

VOCAB, CLASSES, MAX_LEN = 50, 3, 16


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**overrides: object) -> ModelSpec:
    settings: dict = dict(d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.1, max_len=MAX_LEN)
    settings.update(overrides)
    return ModelSpec(**settings)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two documents of lengths 10 and 6, right-padded with 0 to 10."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    ids[~mask] = 0
    return ids, mask


def shared_parameters(model: nn.Module, exclude: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if not n.startswith(exclude)}


def assert_byte_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].numpy().tobytes() == b[name].numpy().tobytes(), name


AXES = [("fusion", n) for n in FUSIONS.names()]
AXES += [("position", n) for n in POSITIONS.names()]
AXES += [("attention_position", n) for n in ATTENTION_POSITIONS.names()]


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_shapes_and_gradients_reach_every_parameter(axis: str, name: str) -> None:
    spec = tiny(**{axis: name})
    model = build_classifier(spec, VOCAB, CLASSES, seed=0)
    ids, mask = batch()
    logits = model(ids, mask)
    assert logits.shape == (2, CLASSES)
    assert model.fusion.__class__ is FUSIONS.get(spec.fusion)
    logits.square().sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


@pytest.mark.parametrize("name", FUSIONS.names())
def test_fusion_maps_e_and_p_to_h(name: str) -> None:
    fusion = FUSIONS.build(name, 8)
    E = torch.randn(3, 5, 8)
    for P in (torch.randn(5, 8), torch.randn(3, 5, 8)):
        assert fusion(E, P).shape == (3, 5, 8)


@pytest.mark.parametrize("name", POSITIONS.names())
def test_position_signal_shape(name: str) -> None:
    position = POSITIONS.build(name, 8, MAX_LEN)
    assert position(5, torch.device("cpu")).shape == (5, 8)
    assert position(MAX_LEN, torch.device("cpu")).shape == (MAX_LEN, 8)


@pytest.mark.parametrize(("axis", "name"), AXES)
def test_cpu_determinism(axis: str, name: str) -> None:
    """Same seed twice: identical parameters, outputs (dropout on) and one optimiser step."""
    results = []
    for _ in range(2):
        model = build_classifier(tiny(**{axis: name}), VOCAB, CLASSES, seed=3)
        optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids, mask = batch()
        torch.manual_seed(11)  # dropout
        logits = model(ids, mask)
        logits.logsumexp(-1).sum().backward()
        optimiser.step()
        results.append((logits.detach(), {k: v.clone() for k, v in model.state_dict().items()}))
    assert torch.equal(results[0][0], results[1][0])
    assert_byte_identical(results[0][1], results[1][1])


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


@pytest.mark.parametrize("seed", [0, 1])
def test_paired_init_across_fusion_operators(seed: int) -> None:
    """Everything outside .fusion is byte-identical across every registered operator."""
    for position, attention in [("sinusoidal", "none"), ("learned", "t5_bias")]:
        models = {
            name: build_classifier(
                tiny(fusion=name, position=position, attention_position=attention),
                VOCAB,
                CLASSES,
                seed=seed,
            )
            for name in FUSIONS.names()
        }
        reference = shared_parameters(models["add"], exclude=("fusion.",))
        reference_modules = outside_fusion(models["add"])
        for name, model in models.items():
            assert_byte_identical(reference, shared_parameters(model, exclude=("fusion.",)))
            # nothing of the operator lives outside .fusion: the same submodules everywhere else
            assert outside_fusion(model) == reference_modules, name


def outside_fusion(model: nn.Module) -> list[tuple[str, str]]:
    return [
        (n, type(m).__name__)
        for n, m in model.named_modules()
        if n and n != "fusion" and not n.startswith("fusion.")
    ]


def test_paired_init_across_position_choices() -> None:
    """Embedding, encoder blocks and head are byte-identical across input-level and
    attention-level position choices (and every fusion operator)."""
    exclude = ("fusion.", "position.", "encoder.attention_position.")
    reference = shared_parameters(build_classifier(tiny(), VOCAB, CLASSES, seed=0), exclude)
    for position, attention in itertools.product(POSITIONS.names(), ATTENTION_POSITIONS.names()):
        model = build_classifier(
            tiny(position=position, attention_position=attention), VOCAB, CLASSES, seed=0
        )
        assert_byte_identical(reference, shared_parameters(model, exclude))


def test_every_combination_runs() -> None:
    """The full grid of fusion x position x attention position builds and gives finite logits."""
    ids, mask = batch()
    for fusion, position, attention in itertools.product(
        FUSIONS.names(), POSITIONS.names(), ATTENTION_POSITIONS.names()
    ):
        spec = tiny(fusion=fusion, position=position, attention_position=attention, n_layers=1)
        model = build_classifier(spec, VOCAB, CLASSES, seed=0).eval()
        with torch.no_grad():
            assert torch.isfinite(model(ids, mask)).all(), (fusion, position, attention)


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


def test_learned_and_relative_table_start_identical() -> None:
    """The study's 'Relative' row is an absolute learned table: for one seed it is initialised
    exactly like 'learned' (README says so)."""
    a = build_classifier(tiny(position="learned"), VOCAB, CLASSES, seed=0)
    b = build_classifier(tiny(position="relative_table"), VOCAB, CLASSES, seed=0)
    assert torch.equal(a.position.table.weight, b.position.table)


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
        assert check_model_spec(tiny(**{axis: name})) == [], (axis, name)


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
