"""The synthetic tasks: deterministic, the advertised lengths, and a label that lives in word order
(a counting classifier is at chance, a position rule is near perfect, truncation leaks nothing)."""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from fusion_ray.data import DataSpec, cache_settings, check_data_spec, prepare_data
from fusion_ray.data.cache import make_key
from fusion_ray.data.sources import SPLITS, SyntheticSource
from fusion_ray.data.synthetic import (
    MIN_SHARE,
    REGIMES,
    class_orders,
    generate_split,
    n_topics_for,
    regime_summary,
    vocabulary,
)

pytestmark = pytest.mark.unit


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


def test_a_tokenizer_that_cuts_into_the_label_window_is_an_error(tmp_path):
    """check_data_spec compares max_length with words; the fitted tokenizer decides tokens.
    bpe splits a few rare pseudo-words of the validation and test documents (unseen in
    training) into pieces, so at max_length = window = 96 three label windows would lose their
    tail: preparing the data fails and says how many, where, and the fixes."""
    spec = DataSpec(source_kwargs={"regime": "short"}, max_length=96, cache_dir=str(tmp_path))
    assert spec.tokenizer == "bpe" and check_data_spec(spec) == []  # fine in words
    with pytest.raises(ValueError) as error:
        prepare_data(spec)
    message = str(error.value)
    assert "2 of 400 validation, 1 of 800 test documents" in message, message
    assert "the first 96 words of each document" in message
    assert "tokenizer: word" in message and "data.max_length to at least 97" in message
    assert "data.source_kwargs.window" in message
    # nothing was cached: the next call checks again
    with pytest.raises(ValueError, match="label-bearing words"):
        prepare_data(spec)
    # the same documents with the word tokenizer (one token per word), or room for the pieces
    words = prepare_data(replace(spec, tokenizer="word"))
    assert (len(words.validation), len(words.test)) == (400, 800)
    assert prepare_data(replace(spec, max_length=97)).test_max_length == 97


def test_label_words_per_split():
    assert [SyntheticSource(regime="short").label_words(s) for s in SPLITS] == [96, 96, 96]
    assert SyntheticSource(regime="medium", window=128).label_words("test") == 128
    relative = SyntheticSource(regime="short", relative=True, test_length_scale=8)
    # the whole of every training and validation document; test documents are cut on purpose
    assert [relative.label_words(s) for s in SPLITS] == [128, 128, 0]
    assert relative.label_span() == 128


# ----------------------------------------------------------------------------- train short, test long


def _digest(texts: list[str], labels: np.ndarray) -> str:
    return hashlib.sha256(("\n".join(texts) + str(labels.tolist())).encode()).hexdigest()[:16]


def test_the_windowed_tasks_and_their_cache_keys_are_unchanged():
    """Caches and finished runs rely on these documents: options added later must not move them."""
    pinned = {
        ("short", "train"): "e59899fef9d52586",
        ("short", "test"): "b3502a4b1a830b55",
        ("medium", "train"): "769bef426b51f9e2",
        ("medium", "test"): "665d67a5c1614435",
        ("long", "train"): "f4820c4daab781fb",
        ("long", "test"): "6649653717b75245",
    }
    for (regime, split), digest in pinned.items():
        assert _digest(*_gen(regime, split, 40)) == digest, (regime, split)
    # the source passes the same arguments as before (the test split stands for all three)
    test = SyntheticSource(regime="short", n_train=1, n_validation=1, n_test=40).load()
    assert (
        _digest(test.splits["test"].texts, np.array(test.splits["test"].labels))
        == (pinned[("short", "test")])
    )
    base = DataSpec(source_kwargs={"regime": "short"})
    assert cache_settings(base)["source_kwargs"] == {
        "regime": "short",
        "n_train": None,
        "n_validation": None,
        "n_test": None,
        "num_classes": None,
        "window": None,
        "length_scale": 1.0,
        "topic_rate": 0.5,
        "generator_seed": 0,
    }
    spelled = DataSpec(
        source_kwargs={"regime": "short", "relative": False, "test_length_scale": 1.0}
    )
    assert make_key(cache_settings(spelled)) == make_key(cache_settings(base))
    relative = DataSpec(source_kwargs={"regime": "short", "relative": True}, max_length=128)
    assert make_key(cache_settings(relative)) != make_key(cache_settings(base))


@functools.cache
def _relative_splits() -> dict:
    """300 training and 300 test documents of the relative task, test eight times as long."""
    source = SyntheticSource(
        regime="short", relative=True, test_length_scale=8, n_train=300, n_test=300
    )
    return source.load().splits


def _relative_split(split: str) -> tuple[list[list[str]], np.ndarray]:
    raw = _relative_splits()[split]
    return [t.split() for t in raw.texts], np.asarray(raw.labels)


def test_relative_documents_are_short_in_training_and_long_in_test():
    train, _ = _relative_split("train")
    test, labels = _relative_split("test")
    train_words = np.array([len(w) for w in train])
    test_words = np.array([len(w) for w in test])
    assert train_words.min() >= 16 and train_words.max() <= 128
    assert test_words.min() >= 128 and test_words.max() <= 1024
    assert 6 <= np.median(test_words) / np.median(train_words) <= 10
    # topic words reach the end of the documents: segments span each whole document
    topics = set().union(*_topic_sets(4))
    last_topic = [max(i for i, w in enumerate(words) if w in topics) / len(words) for words in test]
    assert np.median(last_topic) > 0.95
    assert set(labels.tolist()) == {0, 1, 2, 3}


def test_the_relative_task_is_solvable_at_every_length_by_a_rule():
    """The mean-position rule recovers every test document's label whenever the whole document
    is visible, at every length; truncated inside the first segment it sees one topic, which
    leaves two orders of the four classes: no better than a coin between them."""
    test, labels = _relative_split("test")
    n = len(test)

    def rule_accuracy(views: list[list[str]]) -> np.ndarray:
        return np.array(
            [_order_rule(" ".join(v), 4) == y for v, y in zip(views, labels, strict=True)]
        )

    assert rule_accuracy(test).all()  # every document, 128 to 1024 words
    ladder = []
    for length in (128, 256, 512, 1024):
        correct = rule_accuracy([words[:length] for words in test])
        whole = np.array([len(words) <= length for words in test])
        assert correct[whole].all(), length  # whole documents: always right
        ladder.append(correct.mean())
    assert ladder == sorted(ladder) and ladder[0] < 0.9 and ladder[-1] == 1.0
    first = rule_accuracy([words[: int(MIN_SHARE * len(words))] for words in test]).mean()
    assert first <= 0.5 + 3.5 * np.sqrt(0.25 / n), first
    # and word counts still say nothing: the label lives in the order only
    train = _relative_split("train")
    bag = _naive_bayes_accuracy(
        ([" ".join(w) for w in train[0]], train[1]), ([" ".join(w) for w in test], labels), 4
    )
    assert abs(bag - 0.25) < 3.5 * np.sqrt(0.25 * 0.75 / n), bag


def test_relative_options_are_validated():
    def problems(**kwargs) -> list[str]:
        return SyntheticSource(regime="short", **kwargs).problems()

    assert problems(relative=True, test_length_scale=8) == []
    assert any("has no window" in p for p in problems(relative=True, window=64))
    assert any("relative: must be true or false" in p for p in problems(relative="yes"))
    assert any("test_length_scale" in p for p in problems(test_length_scale=0))
    assert any("test_length_scale" in p for p in problems(test_length_scale=True))
    # max_length must hold every training document of a relative task (not the longer tests)
    spec = DataSpec(
        source_kwargs={"regime": "short", "relative": True, "test_length_scale": 8},
        max_length=96,
    )
    found = check_data_spec(spec)
    assert any("longest training document" in p and "128 words" in p for p in found), found
    assert check_data_spec(replace(spec, max_length=128)) == []
    # a windowed task with longer test documents: the window still bounds the label
    windowed = SyntheticSource(regime="short", window=48, test_length_scale=8)
    assert windowed.label_span() == 48
    assert SyntheticSource(regime="short", test_length_scale=0.5).label_span() == 96
