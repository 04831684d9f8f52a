"""Fusion operators: how token embeddings E and the position signal P become the encoder input H.

Every operator maps (E [B, L, d], P [L, d] or [B, L, d]) -> H [B, L, d]. The registry names and
equations are those of docs/reference/model.md (paper equations 1-6) plus the two variants the
study's public notebooks actually ran (``gate_vector`` and ``mlp``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fusion_ray.registry import Registry


class Fusion(nn.Module):
    """Base class: ``forward(E, P) -> H`` with E [B, L, d] and P [L, d] or [B, L, d]."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class GatedFusion(Fusion):
    """A convex mix H = g * E + (1 - g) * P; subclasses say how the gate g is computed.

    ``gate_weight`` is the one place each gate's equation lives: ``forward`` mixes with it, and
    diagnostics (the gate by position of a trained model) call it to read g for the same inputs.
    """

    gate_from_p_only: bool = False
    """True when g depends on P alone: a P shared by the batch ([L, d]) then gets one gate per
    sequence length instead of one per document."""

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        """The weight on E, in (0, 1): [B, L, 1] (one gate per position) or [B, L, d]
        (feature-wise); [L, 1] for a gate from P alone when P is [L, d]."""
        raise NotImplementedError

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        if not self.gate_from_p_only:
            P = _expand(P, E)  # [B, L, d]: the gate reads E_i and P_i side by side
        g = self.gate_weight(E, P)  # [B, L, 1], [B, L, d] or [L, 1]
        return g * E + (1 - g) * P


FUSIONS: Registry[Callable[..., Fusion]] = Registry("fusion", group="fusion_ray.fusions")


def is_gated(name: str) -> bool:
    """Whether the registry entry ``name`` is a gated fusion (a ``GatedFusion`` subclass), whose
    gate the training loop reads out by position."""
    entry = FUSIONS.get(name)
    return isinstance(entry, type) and issubclass(entry, GatedFusion)


def _expand(P: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """P [L, d] or [B, L, d] -> [B, L, d] (a broadcast view, no copy)."""
    return P.expand_as(E)


def _check_hidden(hidden: int | None, d_model: int) -> int:
    """The MLP's hidden width: ``hidden``, or d_model when it is None."""
    if hidden is None:
        return d_model
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden must be a positive integer (or null for d_model), got {hidden!r}")
    return hidden


@FUSIONS.register("add")
class Add(Fusion):
    """H = E + P (the Transformer default; paper eq. 1)."""

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return E + P


@FUSIONS.register("concat")
class Concat(Fusion):
    """H = W [E; P] + b, W in R^{d x 2d} (concatenation then projection; paper eq. 2)."""

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.proj = nn.Linear(2 * d_model, d_model)

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([E, _expand(P, E)], dim=-1))  # [B, L, 2d] -> [B, L, d]


@FUSIONS.register("gate_scalar")
class GateScalar(GatedFusion):
    """g_i = sigmoid(w^T [E_i; P_i] + b), H_i = g_i E_i + (1 - g_i) P_i (paper eqs. 3-4)."""

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.gate = nn.Linear(2 * d_model, 1)

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(torch.cat([E, _expand(P, E)], dim=-1)))  # [B, L, 1]


@FUSIONS.register("gate_cnn")
class GateCNN(GatedFusion):
    """Local positional gate computed from P only (paper eqs. 5-6).

    c_i = sum_{k=-K..K} w_k * P_{i+k} + b (depth-wise conv, zero padding at the sequence ends),
    g_i = sigmoid(mean over features of c_i), H_i = g_i E_i + (1 - g_i) P_i.
    The feature mean is our choice of reduction to one scalar per position: it keeps the gate's
    logit at the scale of one feature at initialisation (a sum over d features would start the
    gate saturated) and adds no parameters beyond the convolution.
    """

    gate_from_p_only = True

    def __init__(self, d_model: int, *, kernel_size: int = 7) -> None:
        super().__init__(d_model)
        if (
            isinstance(kernel_size, bool)
            or not isinstance(kernel_size, int)
            or kernel_size < 1
            or kernel_size % 2 == 0
        ):
            raise ValueError(
                f"kernel_size must be a positive odd integer (2K+1), got {kernel_size!r}"
            )
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(
            d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model
        )

    def gate(self, P: torch.Tensor) -> torch.Tensor:
        """P [L, d] or [B, L, d] -> g [L, 1] or [B, L, 1]; depends on P only."""
        x = P.transpose(-1, -2)  # [(B,) d, L]: Conv1d wants channels before length
        c = self.conv(x).transpose(-1, -2)  # [(B,) L, d]
        return torch.sigmoid(c.mean(dim=-1, keepdim=True))

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return self.gate(P)  # computed once per sequence length when P is [L, d]


@FUSIONS.register("gate_mlp")
class GateMLP(GatedFusion):
    """g_i = sigmoid(W2 relu(W1 [E_i; P_i] + b1) + b2) in R^d, H_i = g_i * E_i + (1 - g_i) * P_i.

    The feature-wise MLP gate the paper describes (Table 3's 'Gate-MLP' prose). ``hidden``
    defaults to d_model, so it has exactly the parameter shapes of ``mlp`` and the two differ
    only by the gate.
    """

    def __init__(self, d_model: int, *, hidden: int | None = None) -> None:
        super().__init__(d_model)
        width = _check_hidden(hidden, d_model)
        self.gate = nn.Sequential(
            nn.Linear(2 * d_model, width), nn.ReLU(), nn.Linear(width, d_model)
        )

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(torch.cat([E, _expand(P, E)], dim=-1)))  # [B, L, d]


@FUSIONS.register("gate_vector")
class GateVector(GatedFusion):
    """g_i = sigmoid(W [E_i; P_i] + b) in R^d, W in R^{d x 2d}; H_i = g_i * E_i + (1 - g_i) * P_i.

    What the study's AG News / IMDB notebook ran under the name 'gate'.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.gate = nn.Linear(2 * d_model, d_model)

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(torch.cat([E, _expand(P, E)], dim=-1)))  # [B, L, d]


@FUSIONS.register("mlp")
class MLP(Fusion):
    """H = W2 relu(W1 [E; P] + b1) + b2 (ungated; the notebooks' 'mlp', Table 3's 'MLP-Gate')."""

    def __init__(self, d_model: int, *, hidden: int | None = None) -> None:
        super().__init__(d_model)
        width = _check_hidden(hidden, d_model)
        self.net = nn.Sequential(
            nn.Linear(2 * d_model, width), nn.ReLU(), nn.Linear(width, d_model)
        )

    def forward(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([E, _expand(P, E)], dim=-1))  # [B, L, 2d] -> [B, L, d]
