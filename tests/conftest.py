"""Shared fixtures: one local Ray instance for the whole session, small sweeps on synthetic data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance shared by every test that needs Ray (start-up costs seconds)."""
    import ray

    if not ray.is_initialized():
        # Workers import test helpers (e.g. tests.test_distributed) from the checkout.
        ray.init(
            address="local",  # always a new instance, never a cluster another process started
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    """A tokenisation cache shared by the session's tests (each dataset is tokenised once)."""
    path = tmp_path_factory.mktemp("fusion_ray_cache")
    os.environ["FUSION_RAY_CACHE"] = str(path)
    return str(path)


def tiny_sweep(tmp_path: Path, name: str = "tiny", **overrides) -> Path:
    """Write a small, fast sweep file under ``tmp_path`` and return its path."""
    spec = {
        "name": name,
        "seeds": [0, 1],
        "grid": {"datasets": ["short"], "fusions": ["add", "gate_scalar"]},
        "datasets": {
            "short": {
                "data": {
                    "source": "synthetic",
                    "source_kwargs": {
                        "regime": "short",
                        "n_train": 160,
                        "n_validation": 64,
                        "n_test": 64,
                        "window": 48,
                    },
                    "tokenizer": "word",
                    "max_length": 64,
                }
            }
        },
        "defaults": {
            "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_len": 64},
            "train": {
                "epochs": 2,
                "batch_size": 32,
                "lr": 1e-3,
                "latency_repeats": 2,
                "latency_batch_size": 4,
            },
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 2},
        "storage_path": str(tmp_path / "ray_results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "retries": 0,
    }
    for key, value in overrides.items():
        spec[key] = value
    path = tmp_path / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
