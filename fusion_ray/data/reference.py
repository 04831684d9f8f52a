"""Reference baselines of a prepared dataset: how well a model that ignores word order does on
exactly the splits and tokens the trials read, so a report can say whether the compared
Transformers are any good.

``bag_of_words``: TF-IDF over the token ids of each document as the trials see it (truncated at
``data.max_length``), fitted on the training split only, then a logistic regression. Its one
hyper-parameter, the inverse regularisation C, is chosen on the validation split from
``C_GRID``; the test split is scored once, with that C. It is position-blind by construction,
so it doubles as the order control: on a task whose label depends on word order (the synthetic
regimes, the ``order`` task) it sits near chance, and a Transformer above it has used order.

The result is computed once per prepared dataset and cached beside it (``FILE`` in the cache
entry), so every trial of a dataset on a node reads the same numbers and a second sweep on the
same data does not fit again.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fusion_ray.data import cache

if TYPE_CHECKING:
    from fusion_ray.data.prepare import PreparedData, TokenizedSplit

BAG_OF_WORDS = "bag_of_words"
MAJORITY = "majority"
FILE = "reference_baselines.json"
VERSION = 2
"""Bump when the baseline's recipe changes (a cached result of another version is refitted)."""
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
"""Inverse regularisation strengths tried on the validation split."""


def _texts(split: TokenizedSplit) -> list[str]:
    """Each document's token ids as one whitespace-separated string (what TF-IDF counts)."""
    return [" ".join(map(str, ids.tolist())) for ids in split.ids]


def fit_bag_of_words(
    train: TokenizedSplit, validation: TokenizedSplit, test: TokenizedSplit
) -> dict[str, Any]:
    """TF-IDF (vocabulary and idf from ``train`` only) + logistic regression, C chosen on
    ``validation``, ``test`` scored once: accuracies as fractions, the C, the vocabulary size."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(token_pattern=r"\S+", lowercase=False, sublinear_tf=True)
    x_train = vectorizer.fit_transform(_texts(train))
    x_val, x_test = vectorizer.transform(_texts(validation)), vectorizer.transform(_texts(test))
    best: tuple[float, float, Any] | None = None
    for c in C_GRID:
        model = LogisticRegression(C=c, max_iter=2000).fit(x_train, train.labels)
        val_acc = float(np.mean(model.predict(x_val) == validation.labels))
        if best is None or val_acc > best[0]:
            best = (val_acc, c, model)
    assert best is not None
    val_acc, c, model = best
    return {
        "test_acc": float(np.mean(model.predict(x_test) == test.labels)),
        "val_acc": val_acc,
        "C": c,
        "vocabulary": len(vectorizer.vocabulary_),
    }


def majority(train: TokenizedSplit, test: TokenizedSplit) -> dict[str, Any]:
    """Always the most frequent training class: the chance level a classifier must beat."""
    counts = np.bincount(np.asarray(train.labels, dtype=np.int64))
    return {"test_acc": float(np.mean(np.asarray(test.labels) == int(np.argmax(counts))))}


def fit_all(data: PreparedData) -> dict[str, dict[str, Any]]:
    """Every reference baseline of ``data``, fitted now."""
    return {
        BAG_OF_WORDS: fit_bag_of_words(data.train, data.validation, data.test),
        MAJORITY: majority(data.train, data.test),
    }


def reference_baselines(data: PreparedData) -> dict[str, dict[str, Any]]:
    """Every reference baseline of ``data`` (name -> its result), from the cache entry when
    there, else fitted and written there (under the entry's lock, atomically)."""
    path = Path(data.cache_path) / FILE if data.cache_path else None
    cached = _read(path)
    if cached is not None:
        return cached
    if path is None:
        return fit_all(data)
    with cache.lock_for(path.parent.parent.parent, data.cache_key):
        cached = _read(path)  # another trial fitted it while we waited
        if cached is not None:
            return cached
        result = fit_all(data)
        _write(path, {"version": VERSION, "baselines": result})
    return result


def _read(path: Path | None) -> dict[str, dict[str, Any]] | None:
    if path is None or not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stored["baselines"] if stored.get("version") == VERSION else None


def _write(path: Path, payload: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(payload, out, indent=2)
    os.replace(tmp, path)


def reference_metrics(baselines: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The trial's final metrics of the baselines: ``reference.<name>.test_acc`` and
    ``reference.<name>.val_acc``."""
    return {
        f"reference.{name}.{key}": float(result[key])
        for name, result in baselines.items()
        for key in ("test_acc", "val_acc")
        if key in result
    }
