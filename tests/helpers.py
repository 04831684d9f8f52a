"""Helpers several test modules share (fixtures live in conftest.py): a tiny trial, tiny sweep
files with settings changed, a miniature local copy of a hub dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from fusion_ray.data.spec import DataSpec
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train import TrainSpec, TrialConfig
from tests.conftest import tiny_sweep


def tiny_trial(data_cache: str, **train) -> TrialConfig:
    """A tiny gate_scalar trial on short synthetic documents (3 epochs unless ``train`` says)."""
    return TrialConfig(
        dataset="short",
        data=DataSpec(
            source="synthetic",
            source_kwargs={
                "regime": "short",
                "n_train": 160,
                "n_validation": 48,
                "n_test": 48,
                "window": 48,
            },
            tokenizer="word",
            max_length=64,
            cache_dir=data_cache,
        ),
        model=ModelSpec(
            d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=64, fusion="gate_scalar"
        ),
        train=TrainSpec(
            **{
                "epochs": 3,
                "batch_size": 32,
                "lr": 2e-3,
                "latency_repeats": 2,
                "latency_batch_size": 4,
                **train,
            }
        ),
        seed=3,
    )


def sweep_with(tmp_path: Path, **train: object) -> Path:
    """The tests' tiny sweep file with ``train`` settings added to its defaults."""
    path = tiny_sweep(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"].update(train)
    path.write_text(yaml.safe_dump(raw))
    return path


def hub_copy(root: Path, layout: str) -> None:
    """A miniature local copy of a hub dataset repo, in one of the hub's parquet layouts."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]

    def frame(n: int, classes: int) -> pd.DataFrame:
        texts = [" ".join(rng.choice(words, size=5)) for _ in range(n)]
        return pd.DataFrame({"text": texts, "label": rng.integers(0, classes, size=n)})

    if layout == "ag_news":  # data/<split>-00000-of-00001.parquet, train/test only
        (root / "data").mkdir(parents=True)
        frame(40, 4).to_parquet(root / "data" / "train-00000-of-00001.parquet")
        frame(10, 4).to_parquet(root / "data" / "test-00000-of-00001.parquet")
    elif layout == "imdb":  # plain_text/..., with an unsupervised split that must be ignored
        (root / "plain_text").mkdir(parents=True)
        frame(40, 2).to_parquet(root / "plain_text" / "train-00000-of-00001.parquet")
        frame(10, 2).to_parquet(root / "plain_text" / "test-00000-of-00001.parquet")
        unsup = frame(30, 2).assign(label=-1)
        unsup.to_parquet(root / "plain_text" / "unsupervised-00000-of-00001.parquet")
    elif layout == "arxiv":  # two configs; the converter's <config>/<split>/0000.parquet layout
        for config in ("default", "no_ref"):
            for split, n in (("train", 30), ("validation", 8), ("test", 9)):
                (root / config / split).mkdir(parents=True)
                frame(n, 11).to_parquet(root / config / split / "0000.parquet")


def one_long_cell(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """A one-cell sweep (gate_scalar, 3,000 documents, 4 epochs, one trial at a time, 2
    retries), long enough to lose a node mid-trial; its path and its mapping."""
    path = tiny_sweep(tmp_path, name=name, seeds=[0], retries=2)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    raw["datasets"]["short"]["data"]["source_kwargs"]["n_train"] = 3000
    raw["defaults"]["model"].update(d_model=32, n_layers=2, d_ff=64)
    raw["defaults"]["train"]["epochs"] = 4
    raw["resources"]["max_concurrent_trials"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, raw


def assert_metrics_of_an_uninterrupted_run(path: Path, run: Any, tmp_path: Path) -> None:
    """``run`` (the one cell of sweep ``path``) logged what the same trial logs trained locally
    without interruption, on one thread as the trial ran (cpus_per_worker: 1)."""
    import torch

    from fusion_ray.config import load_sweep
    from fusion_ray.grid import expand
    from fusion_ray.train import run_local

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float sums
    try:
        reference = run_local(expand(load_sweep(path))[0].trial, str(tmp_path / "reference"))
    finally:
        torch.set_num_threads(threads)
    for name in ("test_acc", "test_correct", "best_val_acc", "best_epoch", "epochs_run"):
        assert run.data.metrics[name] == reference[name], name
