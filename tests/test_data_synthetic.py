"""The synthetic tasks: deterministic, the advertised lengths, and a label that lives in word order
(a counting classifier is at chance, a position rule is near perfect, truncation leaks nothing)."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest

from fusion_ray.data import DataSpec, check_data_spec, prepare_data
from fusion_ray.data.sources import SyntheticSource
from fusion_ray.data.synthetic import (
    REGIMES,
    class_orders,
    generate_split,
    n_topics_for,
    regime_summary,
    vocabulary,
)


def _gen(regime: str, split: str, n: int, **kw):
    kw.setdefault("num_classes", 4)
    kw.setdefault("generator_seed", 0)
    return generate_split(REGIMES[regime], split, n, **kw)


def test_generation_is_deterministic_and_splits_are_independent_of_sizes():
    a_texts, a_labels = _gen("short", "train", 50)
    b_texts, b_labels = _gen("short", "train", 50)
    assert a_texts == b_texts and a_labels.tolist() == b_labels.tolist()
    # Growing a split keeps its first documents; other splits do not move at all.
    c_texts, _ = _gen("short", "train", 80)
    assert c_texts[:50] == a_texts
    test_small, _ = _gen("short", "test", 30)
    assert _gen("short", "test", 30)[0] == test_small
    # Splits and generator seeds give different documents.
    assert _gen("short", "validation", 50)[0] != a_texts
    assert _gen("short", "train", 50, generator_seed=1)[0] != a_texts


def test_regime_lengths_match_their_description():
    summary = regime_summary()
    assert 35 <= summary["short"]["mean"] <= 50  # AG-News-like
    assert 180 <= summary["medium"]["mean"] <= 280  # IMDB-like, long tail
    assert summary["medium"]["p99"] > 2 * summary["medium"]["median"]
    assert summary["long"]["mean"] >= 400 and summary["long"]["p99"] > 1000  # ArXiv-like tail
    texts, labels = _gen("medium", "train", 300)
    words = np.array([len(t.split()) for t in texts])
    assert 150 <= words.mean() <= 300
    assert set(np.unique(labels)) == {0, 1, 2, 3}


@functools.cache
def _topic_sets(num_classes: int) -> list[set[str]]:
    m = n_topics_for(num_classes)
    return [set(ws) for ws in vocabulary(2000, m, 4)[1]]


@functools.cache
def _topic_of_word(num_classes: int) -> dict[str, int]:
    return {w: t for t, words in enumerate(_topic_sets(num_classes)) for w in words}


def _order_rule(text: str, num_classes: int) -> int:
    """Order topics by the mean position of their words: a rule that only reads positions."""
    topic_of = _topic_of_word(num_classes)
    positions: dict[int, list[int]] = {t: [] for t in range(n_topics_for(num_classes))}
    for i, word in enumerate(text.split()):
        if word in topic_of:
            positions[topic_of[word]].append(i)
    order = tuple(sorted(positions, key=lambda t: np.mean(positions[t]) if positions[t] else 1e9))
    orders = class_orders(num_classes)
    return orders.index(order) if order in orders else -1


def _naive_bayes_accuracy(train, test, num_classes: int) -> float:
    """Multinomial naive Bayes on word counts: the strongest simple bag-of-words baseline."""
    (tr_texts, tr_y), (te_texts, te_y) = train, test
    vocab = {w: i for i, w in enumerate(sorted({w for t in tr_texts for w in t.split()}))}
    counts = np.ones((num_classes, len(vocab)))
    for text, y in zip(tr_texts, tr_y, strict=True):
        for w, c in Counter(text.split()).items():
            counts[y, vocab[w]] += c
    log_p = np.log(counts / counts.sum(1, keepdims=True))
    prior = np.log(np.bincount(tr_y, minlength=num_classes) + 1.0)
    correct = 0
    for text, y in zip(te_texts, te_y, strict=True):
        idx = [vocab[w] for w in text.split() if w in vocab]
        correct += int(np.argmax(prior + log_p[:, idx].sum(1)) == y)
    return correct / len(te_texts)


@pytest.mark.parametrize("regime", ["short", "medium"])
def test_label_is_positional_not_lexical(regime):
    n_test = 600 if regime == "short" else 300
    train = _gen(regime, "train", 1200 if regime == "short" else 400)
    test = _gen(regime, "test", n_test)
    # A bag-of-words model is at chance: within 3.5 standard errors of 1/4.
    acc = _naive_bayes_accuracy(train, test, 4)
    assert abs(acc - 0.25) < 3.5 * np.sqrt(0.25 * 0.75 / n_test), acc
    # The same documents, read with positions, give the label almost always.
    rule = np.mean([_order_rule(t, 4) == y for t, y in zip(*test, strict=True)])
    assert rule > 0.95, rule
    # Shuffling each document's words keeps its bag and destroys the label.
    rng = np.random.default_rng(0)
    shuffled = [" ".join(rng.permutation(t.split())) for t in test[0]]
    rule_shuffled = np.mean(
        [_order_rule(t, 4) == y for t, y in zip(shuffled, test[1], strict=True)]
    )
    assert rule_shuffled < 0.4


def test_words_after_the_window_carry_no_label():
    texts, labels = _gen("long", "test", 120, window=128)
    topics = set().union(*_topic_sets(4))
    long_docs = [t.split() for t in texts if len(t.split()) > 128]
    assert long_docs, "the long regime should have documents beyond a 128-word window"
    for words in long_docs:
        assert not topics & set(words[128:])
    # The truncated view (first 128 words) still gives the label.
    rule = np.mean(
        [_order_rule(" ".join(t.split()[:128]), 4) == y for t, y in zip(texts, labels, strict=True)]
    )
    assert rule > 0.95


def test_other_class_counts():
    assert n_topics_for(2) == 2 and n_topics_for(4) == 3 and n_topics_for(11) == 4
    texts, labels = _gen("short", "test", 300, num_classes=2)
    assert set(labels.tolist()) == {0, 1}
    assert np.mean([_order_rule(t, 2) == y for t, y in zip(texts, labels, strict=True)]) > 0.95


def test_max_length_shorter_than_window_is_rejected():
    spec = DataSpec(source_kwargs={"regime": "medium"}, max_length=128)
    problems = check_data_spec(spec)
    assert any("data.max_length" in p and "window" in p for p in problems), problems
    ok = DataSpec(source_kwargs={"regime": "medium", "window": 128}, max_length=128)
    assert check_data_spec(ok) == []
    assert SyntheticSource(regime="short").label_span() == 96


def test_synthetic_options_are_validated():
    spec = DataSpec(
        source_kwargs={"regime": "huge", "n_train": 10},
    )
    assert any("regime" in p and "short, medium, long" in p for p in check_data_spec(spec))
    spec = DataSpec(source_kwargs={"regime": "short", "n_train": 0, "topic_rate": 2.0, "colour": 1})
    problems = check_data_spec(spec)
    assert any("colour" in p for p in problems), problems
    spec = DataSpec(source_kwargs={"regime": "short", "n_train": 0, "topic_rate": 2.0})
    problems = check_data_spec(spec)
    assert any("n_train" in p for p in problems) and any("topic_rate" in p for p in problems)


def test_prepared_synthetic_regimes_are_small_and_fast(tmp_path):
    data = prepare_data(
        DataSpec(
            source_kwargs={"regime": "short", "n_train": 300, "n_validation": 60, "n_test": 60},
            tokenizer="word",
            max_length=96,
            cache_dir=str(tmp_path),
        )
    )
    assert (len(data.train), len(data.validation), len(data.test)) == (300, 60, 60)
    assert data.num_classes == 4
    # Pseudo-words are whole tokens: token counts are word counts.
    assert 35 <= data.stats["train"]["mean"] <= 50
    assert data.stats["train"]["clip_rate"] < 0.02
