"""prepare_data: splits independent of any trial seed, tokenizer fitted on train only, the cache,
length statistics, and up-front validation."""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fusion_ray.data import (
    PAD_ID,
    UNK_ID,
    DataSpec,
    cache_settings,
    check_data_spec,
    prepare_data,
)
from fusion_ray.data import cache as cache_mod
from fusion_ray.data.sources import SyntheticSource

pytestmark = pytest.mark.unit


def _synthetic(tmp_path: Path, **overrides) -> DataSpec:
    spec = DataSpec(
        source="synthetic",
        source_kwargs={"regime": "short", "n_train": 120, "n_validation": 30, "n_test": 40},
        tokenizer="word",
        max_length=96,
        cache_dir=str(tmp_path / "cache"),
    )
    return replace(spec, **overrides)


def _local(tmp_path: Path, n: int = 60, **overrides) -> DataSpec:
    """n numbered training documents (no validation file) and a small test file."""
    train = tmp_path / "train.csv"
    if not train.exists():
        pd.DataFrame(
            {
                "text": [f"doc{i} common words here" for i in range(n)],
                "label": [i % 2 for i in range(n)],
            }
        ).to_csv(train, index=False)
        pd.DataFrame({"text": ["common zebra words", "here"], "label": [0, 1]}).to_csv(
            tmp_path / "test.csv", index=False
        )
    spec = DataSpec(
        source="local",
        source_kwargs={"train": str(train), "test": str(tmp_path / "test.csv")},
        tokenizer="word",
        tokenizer_kwargs={"min_frequency": 1},
        max_length=16,
        validation_fraction=0.2,
        cache_dir=str(tmp_path / "cache"),
    )
    return replace(spec, **overrides)


def _texts_of(data, split: str) -> list[tuple[int, ...]]:
    return [tuple(x.tolist()) for x in getattr(data, split).ids]


def test_splits_and_ids_do_not_depend_on_any_global_or_trial_seed(tmp_path):
    results = []
    for trial_seed, cache in ((0, "a"), (12345, "b")):
        random.seed(trial_seed)
        np.random.seed(trial_seed)
        torch.manual_seed(trial_seed)
        results.append(prepare_data(_local(tmp_path, cache_dir=str(tmp_path / cache))))
    a, b = results
    assert not a.cache_hit and not b.cache_hit  # both built from scratch
    assert a.cache_key == b.cache_key  # the key ignores cache_dir
    for split in ("train", "validation", "test"):
        assert _texts_of(a, split) == _texts_of(b, split)
        assert getattr(a, split).labels.tolist() == getattr(b, split).labels.tolist()


def test_validation_is_carved_by_split_seed_only(tmp_path):
    base = prepare_data(_local(tmp_path))
    same = prepare_data(_local(tmp_path, cache_dir=str(tmp_path / "other")))
    moved = prepare_data(_local(tmp_path, split_seed=99))
    assert len(base.validation) == 12 and len(base.train) == 48

    # Validation words "docN" are unknown to a tokenizer fitted on train, so compare the
    # training documents: the complement of the validation split in the file.
    def train_docs(data):
        tok = data.tokenizer()
        return [tok.decode(list(d)) for d in _texts_of(data, "train")]

    assert train_docs(base) == train_docs(same)
    assert base.validation.labels.tolist() == same.validation.labels.tolist()
    assert set(train_docs(base)) != set(train_docs(moved))
    assert len(set(train_docs(base))) == 48  # distinct documents


def test_max_train_samples_is_a_seeded_subset_that_keeps_validation(tmp_path):
    full = prepare_data(_local(tmp_path))
    small = prepare_data(_local(tmp_path, max_train_samples=10))
    again = prepare_data(_local(tmp_path, max_train_samples=10, cache_dir=str(tmp_path / "c2")))
    assert len(small.train) == 10 and not again.cache_hit
    assert _texts_of(small, "train") == _texts_of(again, "train")

    def docs(data, split):
        tok = data.tokenizer()
        return [tok.decode(list(d)) for d in _texts_of(data, split)]

    assert set(docs(small, "train")) < set(docs(full, "train"))
    assert docs(small, "validation") == docs(full, "validation")


def test_max_eval_samples_subsamples_validation_and_test_only(tmp_path):
    full = prepare_data(_local(tmp_path))
    small = prepare_data(_local(tmp_path, max_eval_samples=3))
    again = prepare_data(_local(tmp_path, max_eval_samples=3, cache_dir=str(tmp_path / "c2")))
    assert len(full.validation) == 12 and len(small.validation) == 3 and not again.cache_hit
    assert len(small.test) == len(full.test) == 2  # fewer than asked: all kept
    assert len(small.train) == len(full.train)
    for split in ("validation", "test"):
        assert _texts_of(small, split) == _texts_of(again, split)  # seeded: the same subsample
        assert set(_texts_of(small, split)) <= set(_texts_of(full, split))


def test_word_tokenizer_is_fitted_on_train_only(tmp_path):
    data = prepare_data(_local(tmp_path))
    tok = data.tokenizer()
    assert tok.token_to_id("[PAD]") == PAD_ID == data.pad_id and tok.token_to_id("[UNK]") == UNK_ID
    # "zebra" only occurs in the test file: it is not in the vocabulary and encodes as [UNK].
    assert tok.token_to_id("zebra") is None
    assert data.test.ids[0].tolist() == [
        tok.token_to_id("common"),
        UNK_ID,
        tok.token_to_id("words"),
    ]
    # Validation documents' own words ("docN") were held out of the tokenizer's training too.
    val_ids = np.concatenate(data.validation.ids)
    assert (val_ids == UNK_ID).sum() == len(data.validation)


def test_bpe_tokenizer_is_fitted_on_train_only(tmp_path):
    frame = pd.DataFrame({"text": ["abc abd bca cab"] * 30, "label": [0, 1] * 15})
    frame.to_csv(tmp_path / "train.csv", index=False)
    test = pd.DataFrame({"text": ["zebra zebra zebra abc"] * 5, "label": [0] * 5})
    test.to_csv(tmp_path / "test.csv", index=False)
    spec = _local(
        tmp_path, tokenizer="bpe", tokenizer_kwargs={"vocab_size": 100, "min_frequency": 1}
    )
    data = prepare_data(spec)
    tok = data.tokenizer()
    assert tok.token_to_id("zebra") is None and tok.token_to_id("z") is None
    assert UNK_ID in data.test.ids[0].tolist()  # unseen characters are unknown
    assert tok.token_to_id("abc") is not None


def test_word_vocabulary_rules():
    from fusion_ray.data.tokenizer import WordTokenizer

    texts = ["Apple apple banana", "apple Banana cherry", "durian"]
    tok = WordTokenizer().train(texts)  # lowercase, min frequency 2
    assert set(tok.get_vocab()) == {"[PAD]", "[UNK]", "apple", "banana"}
    capped = WordTokenizer(min_frequency=1, max_words=2).train(texts)
    assert set(capped.get_vocab()) == {"[PAD]", "[UNK]", "apple", "banana"}


def test_second_load_is_a_cache_hit(tmp_path, monkeypatch):
    spec = _synthetic(tmp_path)
    first = prepare_data(spec)
    assert not first.cache_hit

    def must_not_load(self):
        raise AssertionError("a cache hit must not read or tokenise the source again")

    monkeypatch.setattr(SyntheticSource, "load", must_not_load)
    second = prepare_data(spec)
    assert second.cache_hit and second.cache_key == first.cache_key
    assert second.vocab_size == first.vocab_size and second.stats == first.stats
    for split in ("train", "validation", "test"):
        assert _texts_of(second, split) == _texts_of(first, split)
        np.testing.assert_array_equal(getattr(second, split).lengths, getattr(first, split).lengths)


def test_cache_key_follows_every_setting_that_matters(tmp_path):
    base = _synthetic(tmp_path)
    key = cache_mod.make_key(cache_settings(base))
    variants = [
        replace(base, max_length=128),
        replace(base, tokenizer="bpe"),
        replace(base, tokenizer_kwargs={"min_frequency": 3}),
        replace(base, split_seed=7),
        replace(base, num_classes=5),
        replace(base, max_train_samples=50),
        replace(base, max_eval_samples=20),
        replace(base, source_kwargs={**base.source_kwargs, "n_train": 121}),
        replace(base, source_kwargs={**base.source_kwargs, "regime": "medium"}),
    ]
    keys = {cache_mod.make_key(cache_settings(v)) for v in variants}
    assert len(keys) == len(variants) and key not in keys
    # Spelling out a default or moving the cache does not change the key.
    spelled = replace(
        base,
        tokenizer_kwargs={"min_frequency": 2, "max_words": 50_000},
        source_kwargs={**base.source_kwargs, "generator_seed": 0},
        cache_dir=str(tmp_path / "elsewhere"),
    )
    assert cache_mod.make_key(cache_settings(spelled)) == key


def test_editing_a_local_file_invalidates_the_cache(tmp_path):
    spec = _local(tmp_path)
    first = prepare_data(spec)
    pd.DataFrame({"text": ["common words", "here here"], "label": [1, 1]}).to_csv(
        tmp_path / "test.csv", index=False
    )
    second = prepare_data(spec)
    assert second.cache_key != first.cache_key and not second.cache_hit
    assert second.test.labels.tolist() == [1, 1]


def test_concurrent_builds_share_one_entry(tmp_path):
    spec = _synthetic(tmp_path)
    results, errors = [], []

    def work():
        try:
            results.append(prepare_data(spec))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.cache_hit for r in results) == [False, True, True]
    entries = list((tmp_path / "cache" / "prepared").iterdir())
    assert sorted(p.name for p in entries if p.is_dir()) == [results[0].cache_key]


def test_a_failed_write_leaves_no_entry(tmp_path, monkeypatch):
    spec = _synthetic(tmp_path)
    real_save = np.save
    calls = []

    def flaky_save(path, array, **kw):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        real_save(path, array, **kw)

    monkeypatch.setattr(cache_mod.np, "save", flaky_save)
    with pytest.raises(OSError, match="disk full"):
        prepare_data(spec)
    prepared = tmp_path / "cache" / "prepared"
    assert not [p for p in prepared.iterdir() if p.is_dir()]  # no half entry, no temp dir
    monkeypatch.setattr(cache_mod.np, "save", real_save)
    assert not prepare_data(spec).cache_hit


def test_length_statistics_are_pre_truncation(tmp_path):
    words = [3, 5, 8, 10, 12, 20, 25, 40]
    texts = [" ".join(f"w{k % 4}" for k in range(n)) for n in words]
    pd.DataFrame({"text": texts * 5, "label": [0, 1] * 20}).to_csv(
        tmp_path / "train.csv", index=False
    )
    pd.DataFrame({"text": texts, "label": [0, 1] * 4}).to_csv(tmp_path / "test.csv", index=False)
    data = prepare_data(_local(tmp_path, max_length=10))
    stats = data.stats["test"]
    expected = np.array(words)
    assert stats["n_docs"] == 8 and stats["dropped_empty"] == 0
    assert stats["mean"] == pytest.approx(expected.mean())
    assert stats["median"] == pytest.approx(np.median(expected))
    assert stats["p90"] == pytest.approx(np.percentile(expected, 90))
    assert stats["p99"] == pytest.approx(np.percentile(expected, 99))
    assert stats["clip_rate"] == pytest.approx(4 / 8)  # 12, 20, 25, 40 > 10
    assert data.test.lengths.tolist() == words
    assert [len(x) for x in data.test.ids] == [min(n, 10) for n in words]
    assert data.test.input_lengths.tolist() == [min(n, 10) for n in words]
    assert set(data.stats) == {"train", "validation", "test"}


def test_check_data_spec_collects_every_problem_at_once():
    spec = DataSpec(
        source="synthetic",
        source_kwargs={"regime": "short"},
        tokenizer="sentencepiece",
        validation_fraction=1.5,
        split_seed=-1,
        max_train_samples=0,
        max_length=0,
        num_classes=1,
    )
    problems = check_data_spec(spec)
    for needle in (
        "unknown tokenizer 'sentencepiece'; allowed: bpe, word",
        "validation_fraction",
        "split_seed",
        "max_train_samples",
        "max_length",
        "num_classes",
    ):
        assert any(needle in p for p in problems), (needle, problems)
    with pytest.raises(ValueError, match="invalid data settings"):
        prepare_data(spec)
    bad_tok = DataSpec(tokenizer="bpe", tokenizer_kwargs={"vocab_size": 10, "merges": 3})
    assert any("'merges'" in p for p in check_data_spec(bad_tok))
    bad_tok = DataSpec(tokenizer="bpe", tokenizer_kwargs={"vocab_size": 10})
    assert any("vocab_size" in p for p in check_data_spec(bad_tok))
    assert check_data_spec(DataSpec()) == []
    assert any("unknown data source" in p for p in check_data_spec(DataSpec(source="s3")))
    assert any("fewer than the 4 classes" in p for p in check_data_spec(DataSpec(num_classes=3)))


def _relative(tmp_path: Path, **overrides) -> DataSpec:
    """The relative synthetic task: training documents of 8-64 words, test documents four times
    as long (32-256 words)."""
    kwargs = {"regime": "short", "relative": True, "length_scale": 0.5, "test_length_scale": 4}
    spec = _synthetic(tmp_path, max_length=64)
    return replace(spec, source_kwargs={**spec.source_kwargs, **kwargs}, **overrides)


def test_eval_lengths_keep_the_test_split_longer_and_everything_else_as_before(tmp_path):
    base = prepare_data(_relative(tmp_path))
    long = prepare_data(_relative(tmp_path, eval_lengths=[32, 64, 256]))
    assert long.cache_key != base.cache_key and not long.cache_hit
    assert (base.test_long, base.test_max_length, long.test_max_length) == (None, 64, 256)
    # training, validation and the usual test split (at max_length) are what they were
    for split in ("train", "validation", "test"):
        assert _texts_of(long, split) == _texts_of(base, split)
        np.testing.assert_array_equal(getattr(long, split).lengths, getattr(base, split).lengths)
    assert long.stats == base.stats and long.vocab_size == base.vocab_size
    # the test split up to 256 tokens: every document whole, and truncating it gives the rest
    assert (long.test.lengths > 64).any() and long.test.lengths.max() <= 256
    assert [len(d) for d in long.test_long.ids] == long.test.lengths.tolist()
    for length in (32, 64, 100, 256):
        cut = long.test_at(length)
        assert [tuple(d.tolist()) for d in cut.ids] == [
            tuple(d[:length].tolist()) for d in long.test_long.ids
        ]
        np.testing.assert_array_equal(cut.lengths, long.test.lengths)
    assert _texts_of(long, "test") == [tuple(d.tolist()) for d in long.test_at(64).ids]
    with pytest.raises(ValueError, match="add 512 to data.eval_lengths"):
        long.test_at(512)
    with pytest.raises(ValueError, match="add 128 to data.eval_lengths"):
        base.test_at(128)
    # read back from the cache: the same splits
    again = prepare_data(_relative(tmp_path, eval_lengths=[32, 64, 256]))
    assert again.cache_hit and again.test_max_length == 256
    assert [tuple(d.tolist()) for d in again.test_long.ids] == [
        tuple(d.tolist()) for d in long.test_long.ids
    ]


def test_eval_lengths_within_max_length_keep_the_cache_key(tmp_path):
    base = _relative(tmp_path)
    key = cache_mod.make_key(cache_settings(base))
    for lengths in ([], [16, 32], [64]):
        assert cache_mod.make_key(cache_settings(replace(base, eval_lengths=lengths))) == key
    assert cache_mod.make_key(cache_settings(replace(base, eval_lengths=[65]))) != key
