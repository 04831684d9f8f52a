"""On-disk cache of tokenised splits: one directory per key, written atomically under a file lock.

Layout of ``<cache_dir>/prepared/<key>/``: ``meta.json`` (vocab size, classes, stats, the settings
that made the key), ``tokenizer.json``, and per split ``<split>.ids.npy`` (all documents' ids
concatenated, int32; truncated at max_length, the test split's at the longest of
data.eval_lengths when that is longer), ``<split>.offsets.npy``, ``<split>.labels.npy``,
``<split>.lengths.npy``.
A directory only appears under its final name through ``os.replace`` of a finished temporary
directory, so a reader never sees a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

FORMAT_VERSION = 1
"""Bump when the cached layout or the tokenisation pipeline changes."""


def default_cache_dir() -> Path:
    env = os.environ.get("FUSION_RAY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fusion_ray"


def make_key(settings: dict[str, Any]) -> str:
    """A short stable hash of JSON-able settings."""
    blob = json.dumps({"format": FORMAT_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def entry_dir(cache_dir: Path, key: str) -> Path:
    return cache_dir / "prepared" / key


def lock_for(cache_dir: Path, key: str) -> FileLock:
    (cache_dir / "prepared").mkdir(parents=True, exist_ok=True)
    return FileLock(str(cache_dir / "prepared" / f"{key}.lock"))


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def save_entry(
    cache_dir: Path,
    key: str,
    meta: dict[str, Any],
    tokenizer_json: str,
    splits: dict[str, dict[str, np.ndarray]],
) -> Path:
    """Write an entry into a temporary directory, then rename it into place."""
    final = entry_dir(cache_dir, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=final.parent))
    try:
        for split, arrays in splits.items():
            for name, array in arrays.items():
                np.save(tmp / f"{split}.{name}.npy", array, allow_pickle=False)
        (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        if final.exists():  # a stale, incomplete entry (cannot be complete: we hold the lock)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_entry(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Meta and arrays of a complete entry; ids are memory-mapped (shared by trials on a node)."""
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    splits: dict[str, dict[str, np.ndarray]] = {}
    for split in meta["splits"]:
        splits[split] = {
            "ids": np.load(path / f"{split}.ids.npy", mmap_mode="r", allow_pickle=False),
            "offsets": np.load(path / f"{split}.offsets.npy", allow_pickle=False),
            "labels": np.load(path / f"{split}.labels.npy", allow_pickle=False),
            "lengths": np.load(path / f"{split}.lengths.npy", allow_pickle=False),
        }
    return meta, splits
