"""Stand-ins for the study's datasets, for benchmarks on machines that cannot reach the hub.

Each stand-in is written in the hub repository's own parquet layout, so the study preset from
``sweeps/_study_datasets.yaml`` runs unchanged with ``data.source_kwargs.data_dir`` pointing at it
(the same code path as a real local copy of the hub data). The text is random words with a
Zipf-like frequency; what matters for speed is faithful: the split sizes of the real datasets and
document lengths drawn to resemble them, so batches, padding and steps per epoch match.

- ag_news: 120,000 train / 7,600 test, 4 classes, lengths log-normal with median 42 words
  (mean about 45, like bench/padding.py);
- imdb: 25,000 train / 25,000 test, 2 classes, log-normal with median 225 and a long right tail
  (mean about 300; about 13 % longer than 512);
- arxiv: 28,388 train / 2,500 validation / 2,500 test, 11 classes, log-normal with median 9,000
  words (about 13 % shorter than 4,096). Documents are generated only up to max_length + 64 words
  (the rest would be truncated anyway), and ``--arxiv-scale`` generates a fraction of each split:
  an ArXiv step costs the same whatever the split size, so timings scale by step counts.

Labels are uniform at random: these stand-ins measure time, never accuracy.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusion_ray.data import DataSpec  # noqa: E402
from fusion_ray.model import ModelSpec  # noqa: E402
from fusion_ray.train import TrainSpec  # noqa: E402

PRESETS_FILE = ROOT / "sweeps" / "_study_datasets.yaml"
VOCAB_WORDS = 60_000


@dataclass(frozen=True)
class Shape:
    splits: dict[str, int]
    num_classes: int
    median_words: float
    sigma: float
    max_words: int


SHAPES = {
    "ag_news": Shape({"train": 120_000, "test": 7_600}, 4, 42.0, 0.35, 200),
    "imdb": Shape({"train": 25_000, "test": 25_000}, 2, 225.0, 0.75, 2_500),
    "arxiv": Shape({"train": 28_388, "validation": 2_500, "test": 2_500}, 11, 9_000.0, 0.7, 4_160),
}


def study_preset(name: str) -> dict[str, Any]:
    """The study's data/model/train settings of one dataset, as the sweep files use them."""
    presets = yaml.safe_load(PRESETS_FILE.read_text())["datasets"]
    return copy.deepcopy(presets[name])


def preset_model(name: str, **settings: Any) -> ModelSpec:
    """The preset's model with ``add`` and sinusoidal P, or what ``settings`` set instead."""
    return ModelSpec(
        **{"fusion": "add", "position": "sinusoidal", **study_preset(name)["model"], **settings}
    )


def write_stand_in(name: str, root: Path, *, scale: float = 1.0, seed: int = 0) -> Path:
    """Write the stand-in of ``name`` under ``root/name`` (once; reused when present)."""
    shape = SHAPES[name]
    out = root / name / "data"
    done = out / "DONE"
    tag = f"scale={scale} seed={seed}"
    if done.exists() and done.read_text() == tag:
        return root / name
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(VOCAB_WORDS)])
    zipf = 1.0 / np.arange(1, VOCAB_WORDS + 1) ** 1.05
    zipf /= zipf.sum()
    for split, n in shape.splits.items():
        n = max(1, round(n * scale))
        lengths = rng.lognormal(np.log(shape.median_words), shape.sigma, size=n)
        lengths = np.clip(np.round(lengths), 3, shape.max_words).astype(np.int64)
        words = rng.choice(VOCAB_WORDS, size=int(lengths.sum()), p=zipf)
        ends = np.cumsum(lengths)
        texts = [" ".join(vocab[words[e - k : e]]) for e, k in zip(ends, lengths, strict=True)]
        labels = rng.integers(0, shape.num_classes, size=n)
        pd.DataFrame({"text": texts, "label": labels}).to_parquet(
            out / f"{split}-00000-of-00001.parquet", index=False
        )
    done.write_text(tag)
    return root / name


def study_specs(
    name: str, root: Path, *, scale: float = 1.0, cache_dir: str | None = None
) -> tuple[DataSpec, ModelSpec, TrainSpec]:
    """The preset of ``name`` reading its stand-in (written if missing), sinusoidal P, ``add``."""
    preset = study_preset(name)
    data = dict(preset["data"])
    data["source_kwargs"] = {
        **data["source_kwargs"],
        "data_dir": str(write_stand_in(name, root, scale=scale)),
    }
    if cache_dir is not None:
        data["cache_dir"] = cache_dir
    return DataSpec(**data), preset_model(name), TrainSpec(**preset["train"])
