"""``digits_mlp``: a small MLP on scikit-learn's bundled 8x8 digits (1,797 images, 10 classes).

The trainable fusion-ray runs: ``train(config, seed, report)``. What is paired across arms
comes from the seed, each through its own named stream (``fusion_ray.seeds.derive_seed``): the
initial weights (``init``), the order of the training batches (``order``) and dropout
(``dropout``); the split into train, validation and test is fixed (the same documents for every
seed and arm). So two arms at one seed start from the same weights and see the same batches:
they differ only in what the sweep compares (``label_smoothing`` in ``sweep.yaml``).

Settings (``config``), all optional: ``hidden`` (width, 64), ``activation`` (relu, gelu or
tanh), ``dropout`` (0.1), ``label_smoothing`` (0.0), ``lr`` (0.01), ``batch_size`` (64),
``epochs`` (10). Each epoch reports ``train_loss`` and ``val_acc`` with a checkpoint; a call with
``report.resume_from`` set continues from it. Returns ``test_acc`` (its metric), ``test_loss``
and ``best_val_acc``, the test scored at the best validation epoch.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fusion_ray.seeds import derive_seed

DEFAULTS: dict[str, Any] = {
    "hidden": 64,
    "activation": "relu",
    "dropout": 0.1,
    "label_smoothing": 0.0,
    "lr": 0.01,
    "batch_size": 64,
    "epochs": 10,
}
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
SPLIT_SEED = 20  # the split is the same for every seed: only training is paired by the seed


def settings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` over the defaults; a ValueError naming each unknown key or bad value."""
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"digits_mlp: unknown settings {unknown}; allowed: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **config}
    if out["activation"] not in ACTIVATIONS:
        raise ValueError(f"digits_mlp: activation must be one of {sorted(ACTIVATIONS)}")
    if not 0 <= out["label_smoothing"] < 1 or not 0 <= out["dropout"] < 1:
        raise ValueError("digits_mlp: label_smoothing and dropout must be in [0, 1)")
    for key in ("hidden", "batch_size", "epochs"):
        if not isinstance(out[key], int) or out[key] < 1:
            raise ValueError(f"digits_mlp: {key} must be an integer >= 1")
    return out


@functools.cache
def splits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Train / validation / test (60 / 20 / 20 %), standardised by the training split."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    cut = [int(len(y) * 0.6), int(len(y) * 0.8)]
    parts = np.split(order, cut)
    mean, std = x[parts[0]].mean(0), x[parts[0]].std(0) + 1e-6
    return {
        name: (torch.tensor((x[p] - mean) / std, dtype=torch.float32), torch.tensor(y[p]))
        for name, p in zip(("train", "validation", "test"), parts, strict=True)
    }


def model(s: dict[str, Any], seed: int) -> nn.Module:
    """The MLP, initialised from the seed's ``init`` stream (the same for every arm)."""
    torch.manual_seed(derive_seed(seed, "init"))
    return nn.Sequential(
        nn.Linear(64, s["hidden"]),
        ACTIVATIONS[s["activation"]](),
        nn.Dropout(s["dropout"]),
        nn.Linear(s["hidden"], 10),
    )


def batch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the ``n`` training images in ``epoch``, from the seed's ``order`` stream:
    the same for every arm at one seed, and for a run resumed at that epoch."""
    generator = torch.Generator().manual_seed(derive_seed(seed, f"order/{epoch}"))
    return torch.randperm(n, generator=generator)


def evaluate(net: nn.Module, split: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``net`` on ``split``."""
    net.eval()
    with torch.no_grad():
        logits = net(split[0])
        loss = nn.functional.cross_entropy(logits, split[1]).item()
        acc = (logits.argmax(1) == split[1]).float().mean().item()
    net.train()
    return acc, loss


def train(config: dict[str, Any], seed: int, report: Any) -> dict[str, float]:
    s, data = settings(config), splits()
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    net = model(s, seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=s["lr"])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=s["label_smoothing"])
    state = {"epoch": 0, "best_val": -1.0, "best": net.state_dict()}
    if report.resume_from is not None:
        saved = torch.load(Path(report.resume_from, "state.pt"), weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = {"epoch": saved["epoch"], "best_val": saved["best_val"], "best": saved["best"]}
    x, y = data["train"]
    for epoch in range(state["epoch"], s["epochs"]):
        # each epoch's batch order and dropout from the seed and the epoch: a resumed run
        # draws what an uninterrupted one would
        order = batch_order(seed, epoch, len(y))
        torch.manual_seed(derive_seed(seed, f"dropout/{epoch}"))
        total = 0.0
        for batch in order.split(s["batch_size"]):
            optimizer.zero_grad()
            loss = loss_fn(net(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        val_acc, _ = evaluate(net, data["validation"])
        if val_acc > state["best_val"]:
            state["best_val"] = val_acc
            state["best"] = {k: v.clone() for k, v in net.state_dict().items()}
        with tempfile.TemporaryDirectory() as folder:
            torch.save(
                {
                    "model": net.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                    "best_val": state["best_val"],
                    "best": state["best"],
                },
                Path(folder, "state.pt"),
            )
            report(
                {"train_loss": total / len(y), "val_acc": val_acc}, step=epoch, checkpoint=folder
            )
    net.load_state_dict(state["best"])
    test_acc, test_loss = evaluate(net, data["test"])
    return {"test_acc": test_acc, "test_loss": test_loss, "best_val_acc": state["best_val"]}


train.deterministic = True  # type: ignore[attr-defined]
train.example_config = {"epochs": 2, "hidden": 32}  # type: ignore[attr-defined]
