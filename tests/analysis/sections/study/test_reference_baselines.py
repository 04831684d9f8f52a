"""Reference baselines: bag-of-words (TF-IDF + logistic regression) fitted on the training split
only, on the tokens the trials read, cached with the prepared data; and the report's warning
when the compared models trail it, its note when it is at chance."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import fusion_ray.data.reference as reference
from analysis.sections.study.reference import REFERENCE, reference_rows
from fusion_ray.data import DataSpec, prepare_data
from fusion_ray.data.prepare import TokenizedSplit

pytestmark = pytest.mark.unit


def _split(docs: list[list[int]], labels: list[int]) -> TokenizedSplit:
    ids = [np.asarray(d, dtype=np.int32) for d in docs]
    return TokenizedSplit(ids, np.asarray(labels), np.asarray([len(d) for d in docs]))


def test_bag_of_words_learns_from_the_training_split_only():
    """Class 0 documents hold token 5, class 1 token 6. Token 99 occurs only in the test split:
    it is not in the vocabulary. The test labels play no part in the choice of C."""
    rng = np.random.default_rng(0)
    labels = rng.integers(2, size=60).tolist()
    docs = [[5 + y, *rng.integers(10, 20, size=6).tolist()] for y in labels]
    train, validation = _split(docs[:40], labels[:40]), _split(docs[40:], labels[40:])
    test_docs = [[5 + y, 99] for y in labels[:20]]
    result = reference.fit_bag_of_words(train, validation, _split(test_docs, labels[:20]))
    assert result["vocabulary"] == len({t for d in docs[:40] for t in d})
    assert result["test_acc"] == 1.0 and result["val_acc"] == 1.0
    flipped = _split(test_docs, [1 - y for y in labels[:20]])
    other = reference.fit_bag_of_words(train, validation, flipped)
    assert (other["C"], other["val_acc"], other["test_acc"]) == (result["C"], 1.0, 0.0)


def test_baselines_are_cached_with_the_prepared_data(tmp_path, monkeypatch):
    spec = DataSpec(
        source="synthetic",
        source_kwargs={
            "regime": "short",
            "n_train": 120,
            "n_validation": 40,
            "n_test": 40,
            "window": 48,
        },
        tokenizer="word",
        max_length=48,
        cache_dir=str(tmp_path),
    )
    data = prepare_data(spec)
    first = reference.reference_baselines(data)
    assert set(first) == {"bag_of_words", "majority"}
    assert (tmp_path / "prepared" / data.cache_key / reference.FILE).is_file()

    def refit(*args, **kwargs):
        raise AssertionError("fitted again although the prepared data has its baselines")

    monkeypatch.setattr(reference, "fit_bag_of_words", refit)
    again = prepare_data(spec)  # a second sweep on the same data
    assert again.cache_hit and reference.reference_baselines(again) == first
    metrics = reference.reference_metrics(first)
    assert set(metrics) == {
        "reference.bag_of_words.test_acc",
        "reference.bag_of_words.val_acc",
        "reference.majority.test_acc",
    }


def _summary(rows: list[tuple[str, str, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"dataset": d, "operator": op, "acc_mean": acc, "bow_acc": bow, "majority_acc": maj}
            | {"n_test": 400, "n": 5}
            for d, op, acc, bow, maj in rows
        ]
    )


def test_weak_models_are_warned_and_a_chance_level_bag_of_words_is_noted():
    summary = _summary(
        [
            ("news", "add", 82.0, 97.5, 25.0),  # every operator far below bag-of-words
            ("news", "gate_scalar", 88.0, 97.5, 25.0),
            ("order", "add", 90.0, 27.0, 25.0),  # bag-of-words at chance: order matters
            ("order", "gate_scalar", 70.0, 27.0, 25.0),
        ]
    )
    table = reference_rows(summary, ["dataset"])
    news, order = table.set_index("dataset").loc["news"], table.set_index("dataset").loc["order"]
    assert news["below"] and news["best_operator"] == "gate_scalar"
    assert news["gap"] == pytest.approx(-9.5) and not news["at_chance"]
    assert not order["below"] and order["at_chance"]
    ctx = SimpleNamespace(summary=summary, main_setting={}, axes=[])
    warnings: list[str] = []
    result = REFERENCE.compute(ctx, warnings)
    (warning,) = warnings
    assert warning.startswith("the compared models are below a bag-of-words baseline on news")
    assert "9.50 points below" in warning
    text = "\n".join(REFERENCE.markdown(result, ctx))
    assert "order: bag-of-words 27.00 %" in text and "the task needs word order" in text
    assert (
        REFERENCE.compute(
            SimpleNamespace(summary=summary.drop(columns="bow_acc"), main_setting={}, axes=[]), []
        )
        is None
    )
