"""Whole training steps replayed as CUDA graphs (``train.cuda_graphs``).

A study trial's model is small: on an H100 an AG News step spends most of its time launching a
few hundred small kernels, not running them (bench/RESULTS.md, "epoch breakdown"). A CUDA graph
records one step's kernels (forward, loss, backward, gradient clipping, optimiser) once and
launches them all with one call after that. Shapes must stay fixed, so there is one graph per
batch shape: with ``train.pad_to_multiple`` (64 in the study presets) an epoch has a few.

Capturing a shape runs two warm-up steps on a side stream first (lazy allocations, cuBLAS and
cuDNN plans); those steps would train the model, so the weights, the optimiser's state and the
random-number generator are put back as they were before the graph is recorded. A replay then
runs the same kernels on the same inputs as the eager step, and the optimiser is the same
capturable one either way (``make_optimizer``), so ``cuda_graphs`` changes how fast a step runs,
not what it computes (``tests/fusion_ray/train/test_cuda_graphs.py`` checks this on a GPU).

Batches of another size (an epoch's last, shorter one) run eagerly. One worker only, one pass
per step (no ``micro_batch_size``); on a CPU the setting does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fusion_ray.train.spec import TrainSpec

WARMUP_STEPS = 2


class GraphedSteps:
    """One CUDA graph per batch shape of a whole training step, captured on first use."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        spec: TrainSpec,
        device: torch.device,
        forward_backward: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor],
    ) -> None:
        self.model, self.optimizer, self.spec, self.device = model, optimizer, spec, device
        # the loop's pass (``loop.forward_backward``): (input_ids, mask, labels) -> summed loss
        self.forward_backward = forward_backward
        self.graphs: dict[tuple, tuple] = {}

    def handles(self, batch_documents: int) -> bool:
        """Whether a step of this many documents is graphed (full batches only)."""
        return batch_documents == self.spec.batch_size

    def step(
        self, input_ids: torch.Tensor, mask: torch.Tensor | None, labels: torch.Tensor
    ) -> torch.Tensor:
        """One optimiser step on this batch; returns its summed loss (on the device)."""
        key = (tuple(input_ids.shape), mask is not None)
        if key not in self.graphs:
            self.graphs[key] = self._capture(input_ids, mask, labels)
        (static_ids, static_mask, static_labels), graph, loss = self.graphs[key]
        static_ids.copy_(input_ids, non_blocking=True)
        static_labels.copy_(labels, non_blocking=True)
        if static_mask is not None:
            static_mask.copy_(mask, non_blocking=True)
        graph.replay()
        return loss

    def _body(
        self, input_ids: torch.Tensor, mask: torch.Tensor | None, labels: torch.Tensor
    ) -> torch.Tensor:
        """The eager loop's step (its forward and backward pass, clipping, the optimiser), with
        no host synchronisation."""
        batch_loss = self.forward_backward(input_ids, mask, labels)
        if self.spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip)
        self.optimizer.step()
        return batch_loss

    def _capture(
        self, input_ids: torch.Tensor, mask: torch.Tensor | None, labels: torch.Tensor
    ) -> tuple:
        static = (input_ids.clone(), None if mask is None else mask.clone(), labels.clone())
        saved = self._snapshot()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.optimizer.zero_grad(set_to_none=True)
                self._body(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._put_back(saved)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients it writes
        with torch.cuda.graph(graph):
            loss = self._body(*static)
        return static, graph, loss

    def _snapshot(self) -> dict[str, Any]:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return {
            "params": [p.detach().clone() for p in params],
            "state": {
                p: {k: v.clone() for k, v in self.optimizer.state[p].items()}
                for p in params
                if p in self.optimizer.state
            },
            "rng": torch.cuda.get_rng_state(self.device),
        }

    @torch.no_grad()
    def _put_back(self, saved: dict[str, Any]) -> None:
        """In place, so that every tensor keeps the address a graph records: weights and
        optimiser state as before the warm-up steps (state the warm-up created is zeroed: a
        fresh Adam state is all zeros), and the generator's position."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p, value in zip(params, saved["params"], strict=True):
            p.copy_(value)
        for p in params:
            before = saved["state"].get(p, {})
            for k, v in self.optimizer.state.get(p, {}).items():
                if k in before:
                    v.copy_(before[k])
                else:
                    v.zero_()
        torch.cuda.set_rng_state(saved["rng"], self.device)
