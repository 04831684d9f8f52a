"""``position_gate``: a scalar gate per position computed from the position signal alone,
g_i = sigmoid(w^T P_i + b), H_i = g_i E_i + (1 - g_i) P_i.

Being a ``GatedFusion``, its runs are tagged ``gated: true`` and the training loop records its
gate by position, so the report's gate section covers it without any list to update.
"""

from __future__ import annotations

import torch
from torch import nn

from fusion_ray.model.fusion import GatedFusion


class PositionGate(GatedFusion):
    """A gate from P only (one weight on E per position, shared by the batch)."""

    gate_from_p_only = True

    def __init__(self, d_model: int, *, init_bias: float = 0.0) -> None:
        super().__init__(d_model)
        self.gate = nn.Linear(d_model, 1)
        nn.init.constant_(self.gate.bias, float(init_bias))

    def gate_weight(self, E: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(P))  # [L, 1] or [B, L, 1]
