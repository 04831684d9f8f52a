"""Golden values for every fusion operator on tiny inputs that can be checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from fusion_ray.model import FUSIONS

pytestmark = pytest.mark.unit

D = 2
# E [1, 3, 2] and P [3, 2]: small numbers whose mixes are easy to write down.
E = torch.tensor([[[1.0, 2.0], [3.0, -1.0], [0.0, 4.0]]])
P = torch.tensor([[0.0, 1.0], [1.0, 0.0], [-2.0, 2.0]])


def build(name: str, **kwargs: object) -> torch.nn.Module:
    return FUSIONS.build(name, D, **kwargs)


def zero_(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    return module


def test_registry_names() -> None:
    assert FUSIONS.names() == [
        "add",
        "concat",
        "gate_scalar",
        "gate_cnn",
        "gate_mlp",
        "gate_vector",
        "mlp",
    ]


def test_add() -> None:
    expected = torch.tensor([[[1.0, 3.0], [4.0, -1.0], [-2.0, 6.0]]])
    assert torch.equal(build("add")(E, P), expected)


def test_concat_selects_e_or_p() -> None:
    fusion = zero_(build("concat"))
    with torch.no_grad():
        fusion.proj.weight[:, :D] = torch.eye(D)  # W = [I, 0]
    assert torch.equal(fusion(E, P), E)
    with torch.no_grad():
        fusion.proj.weight.zero_()
        fusion.proj.weight[:, D:] = torch.eye(D)  # W = [0, I]
    assert torch.equal(fusion(E, P), P.expand_as(E))


@pytest.mark.parametrize("name", ["gate_scalar", "gate_cnn", "gate_mlp", "gate_vector"])
def test_gates_with_zero_parameters_average(name: str) -> None:
    """sigmoid(0) = 1/2, so every convex-mix gate with zero weights and bias gives (E + P) / 2."""
    assert torch.allclose(zero_(build(name))(E, P), (E + P) / 2)


def test_gate_scalar_by_hand() -> None:
    """w = [1, 0, 0, 0], b = 0: g_i = sigmoid(E_i[0]), one gate shared by both features."""
    fusion = zero_(build("gate_scalar"))
    with torch.no_grad():
        fusion.gate.weight[0, 0] = 1.0
    g = torch.sigmoid(torch.tensor([1.0, 3.0, 0.0]))[None, :, None]  # [1, 3, 1]
    assert torch.allclose(fusion(E, P), g * E + (1 - g) * P)
    # position 1: g = sigmoid(3); H = g [3, -1] + (1 - g) [1, 0]
    s = 1 / (1 + math.exp(-3))
    assert torch.allclose(fusion(E, P)[0, 1], torch.tensor([3 * s + (1 - s), -s]))


def test_gate_cnn_centre_tap_by_hand() -> None:
    """Centre tap 1, others 0: c_i = P_i, g_i = sigmoid(mean(P_i)) = sigmoid([0.5, 0.5, 0])."""
    fusion = zero_(build("gate_cnn", kernel_size=3))
    with torch.no_grad():
        fusion.conv.weight[:, 0, 1] = 1.0
    g = torch.sigmoid(torch.tensor([0.5, 0.5, 0.0]))[None, :, None]
    assert torch.allclose(fusion(E, P), g * E + (1 - g) * P)


def test_gate_cnn_window_zero_pads_sequence_ends() -> None:
    """Left tap 1: c_i = P_{i-1}; position 0 sees the zero padding, so its gate is 1/2."""
    fusion = zero_(build("gate_cnn", kernel_size=3))
    with torch.no_grad():
        fusion.conv.weight[:, 0, 0] = 1.0
    gate = fusion.gate(P)[:, 0]  # [L]
    expected = torch.sigmoid(torch.tensor([0.0, P[0].mean().item(), P[1].mean().item()]))
    assert torch.allclose(gate, expected)


def test_gate_cnn_gate_depends_on_p_only() -> None:
    torch.manual_seed(0)
    fusion = build("gate_cnn", kernel_size=3)
    E2 = torch.randn_like(E) * 10
    # H = g E + (1 - g) P  =>  (H - P) / (E - P) = g, the same for any E.
    g1 = (fusion(E, P) - P) / (E - P)
    g2 = (fusion(E2, P) - P) / (E2 - P)
    assert torch.allclose(g1, g2, atol=1e-5)
    assert torch.allclose(g1[..., 0], fusion.gate(P)[None, :, 0], atol=1e-5)


def test_gate_cnn_kernel_size_is_validated() -> None:
    for bad in (0, 4, -3, 2.0, True, "3"):
        with pytest.raises(ValueError, match="kernel_size"):
            build("gate_cnn", kernel_size=bad)
    assert build("gate_cnn").kernel_size == 7


def test_gate_mlp_by_hand() -> None:
    """Last layer zero with bias ln 3: g = 3/4 on every feature, whatever E and P."""
    fusion = zero_(build("gate_mlp"))
    with torch.no_grad():
        fusion.gate[2].bias.fill_(math.log(3.0))
    assert torch.allclose(fusion(E, P), 0.75 * E + 0.25 * P)


def test_gate_vector_is_feature_wise() -> None:
    """W = [I, 0], b = 0: g = sigmoid(E) feature by feature."""
    fusion = zero_(build("gate_vector"))
    with torch.no_grad():
        fusion.gate.weight[:, :D] = torch.eye(D)
    g = torch.sigmoid(E)
    assert torch.allclose(fusion(E, P), g * E + (1 - g) * P)


def test_mlp_by_hand() -> None:
    """W1 = [I, I], W2 = I, zero biases: H = relu(E + P)."""
    fusion = zero_(build("mlp"))
    with torch.no_grad():
        fusion.net[0].weight.copy_(torch.cat([torch.eye(D), torch.eye(D)], dim=1))
        fusion.net[2].weight.copy_(torch.eye(D))
    assert torch.equal(fusion(E, P), torch.relu(E + P))


def test_gate_mlp_and_mlp_have_the_same_shapes_by_default() -> None:
    """gate_mlp differs from mlp only by the gate: same parameter shapes at default hidden."""
    shapes = [[p.shape for p in build(n, hidden=None).parameters()] for n in ("gate_mlp", "mlp")]
    assert shapes[0] == shapes[1]
    assert [p.shape for p in build("mlp", hidden=5).parameters()][0] == (5, 2 * D)


@pytest.mark.parametrize("name", FUSIONS.names())
def test_p_may_be_shared_or_per_document(name: str) -> None:
    """P [L, d] and P expanded to [B, L, d] give the same H."""
    torch.manual_seed(0)
    fusion = build(name)
    E2 = torch.randn(3, 4, D)
    P2 = torch.randn(4, D)
    assert torch.allclose(fusion(E2, P2), fusion(E2, P2.expand(3, 4, D).clone()), atol=1e-6)
