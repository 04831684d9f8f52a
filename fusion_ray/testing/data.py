"""Contract checks for the data registries: data sources (``SOURCES``) and tokenizers
(``TOKENIZERS``). Each raises ``AssertionError`` naming the entry and what broke.

A data source (``check_source``) with the options a sweep file would give it:
- its options pass the registry's check (names and annotated types) and its own
  ``problems()``; it implements the ``DataSource`` protocol (``problems``, ``fingerprint``,
  ``load``);
- ``fingerprint()`` is a JSON-serialisable mapping, the same for two instances (it enters the
  cache key, so it may not change between processes);
- ``load()`` gives a ``RawDataset`` with a ``train`` and a ``test`` split (``validation``
  optional, no other), texts and labels of equal length, a non-empty train split; loading twice
  gives the same documents and labels (every cell of a sweep must see the same data);
- a declared class count (``DeclaresClasses``) is the loaded one;
- ``check_data_spec`` accepts a ``data:`` block using it, and ``prepare_data`` tokenises it
  into three non-empty splits whose labels lie in ``0 .. num_classes-1``, the same twice.

A tokenizer (``check_tokenizer``):
- its options pass the registry's check and its own ``problems()``;
- ``train(texts)`` returns a ``tokenizers.Tokenizer`` with ``[PAD] = 0`` and ``[UNK] = 1``;
- it is fitted on the texts it is given only (a word it never saw is not in its vocabulary);
- fitting twice on the same texts gives the same vocabulary and the same ids, and the
  tokenizer survives the JSON round trip the cache uses (``to_str`` / ``from_str``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import tokenizers

from fusion_ray.data import DataSpec, check_data_spec, prepare_data
from fusion_ray.data.sources import SOURCES, SPLITS, DataSource, DeclaresClasses, RawDataset
from fusion_ray.data.tokenizer import PAD, PAD_ID, TOKENIZERS, UNK, UNK_ID

TEXTS = tuple(
    f"{a} {b} river stone {c} field"
    for a, b, c in zip(
        ("red", "green", "blue", "amber") * 6,
        ("fox", "owl", "cat", "elk", "bee", "ant") * 4,
        ("north", "south", "east") * 8,
        strict=True,
    )
)
"""Training texts for the tokenizer checks: a few words, each seen several times."""
UNSEEN = "zyzzyvaqx"
"""A word none of ``TEXTS`` contains."""


def _registry_problems(registry, name: str, options: Mapping[str, Any]) -> list[str]:
    assert name in registry, f"{registry.family} {name!r} is not registered (is it installed?)"
    return registry.check(name, dict(options))


def check_source_options(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The options pass the registry's check and the source's own ``problems()``; the built
    source implements the DataSource protocol. Returns the source."""
    options = dict(options or {})
    problems = _registry_problems(SOURCES, name, options)
    assert problems == [], f"data source {name!r}: its options are refused: {problems}"
    source = SOURCES.build(name, **options)
    assert isinstance(source, DataSource), (
        f"data source {name!r}: it does not provide problems(), fingerprint() and load()"
    )
    own = source.problems()
    assert isinstance(own, list) and all(isinstance(p, str) for p in own), (
        f"data source {name!r}: problems() must return a list of messages, got {own!r}"
    )
    assert own == [], f"data source {name!r}: problems() refuses these options: {own}"
    return source


def check_source_fingerprint(name: str, options: Mapping[str, Any] | None = None) -> None:
    """``fingerprint()`` is a JSON-serialisable mapping, the same for two instances."""
    first = check_source_options(name, options).fingerprint()
    second = check_source_options(name, options).fingerprint()
    assert isinstance(first, Mapping), f"data source {name!r}: fingerprint() gave {first!r}"
    try:
        text = json.dumps(first, sort_keys=True)
    except TypeError as exc:
        raise AssertionError(f"data source {name!r}: fingerprint() is not JSON: {exc}") from None
    assert text == json.dumps(second, sort_keys=True), (
        f"data source {name!r}: two instances with the same options give other fingerprints"
    )


def check_source_load(name: str, options: Mapping[str, Any] | None = None) -> None:
    """``load()`` gives train and test (validation optional), texts and labels of one length,
    the same documents twice, and the class count the source declares."""
    source = check_source_options(name, options)
    loaded = [source.load(), check_source_options(name, options).load()]
    for raw in loaded:
        assert isinstance(raw, RawDataset), f"data source {name!r}: load() gave {type(raw)}"
        splits = set(raw.splits)
        assert {"train", "test"} <= splits <= set(SPLITS), (
            f"data source {name!r}: splits {sorted(splits)}; it needs train and test "
            "(validation optional) and no others"
        )
        for split, part in raw.splits.items():
            assert len(part.texts) == len(part.labels), f"data source {name!r}: {split} lengths"
        assert len(raw.splits["train"].texts) > 0, f"data source {name!r}: an empty train split"
    first, second = loaded
    for split in first.splits:
        same = list(first.splits[split].texts) == list(second.splits[split].texts) and list(
            first.splits[split].labels
        ) == list(second.splits[split].labels)
        assert same, f"data source {name!r}: two loads give other {split} documents or labels"
    if isinstance(source, DeclaresClasses) and source.declared_num_classes() is not None:
        declared = source.declared_num_classes()
        assert first.num_classes in (None, declared), (
            f"data source {name!r}: declares {declared} classes but loads {first.num_classes}"
        )


def check_source_prepares(
    name: str,
    options: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
) -> None:
    """A ``data:`` block with the source (``data``: more of its settings, e.g. ``max_length``)
    passes ``check_data_spec``, and ``prepare_data`` gives three non-empty splits with labels in
    ``0 .. num_classes-1``, the same ids when prepared again in another cache."""
    settings = {"tokenizer": "word", "tokenizer_kwargs": {"min_frequency": 1}, **(data or {})}
    spec = DataSpec(source=name, source_kwargs=dict(options or {}), **settings)
    problems = check_data_spec(spec)
    assert problems == [], f"data source {name!r}: check_data_spec refuses it: {problems}"
    prepared = []
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        for run in ("a", "b"):
            prepared.append(prepare_data(replace(spec, cache_dir=f"{scratch}/{run}")))
    for part in ("train", "validation", "test"):
        splits = [getattr(p, part) for p in prepared]
        assert len(splits[0]) > 0, f"data source {name!r}: an empty {part} split once prepared"
        labels = splits[0].labels
        assert 0 <= labels.min() and labels.max() < prepared[0].num_classes, (
            f"data source {name!r}: {part} labels outside 0..{prepared[0].num_classes - 1}"
        )
        same = [a.tolist() for a in splits[0].ids] == [b.tolist() for b in splits[1].ids]
        assert same and labels.tolist() == splits[1].labels.tolist(), (
            f"data source {name!r}: preparing it twice gives other {part} ids or labels"
        )


def check_source(
    name: str,
    options: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
) -> None:
    """Every contract check of a data source registered as ``name`` (``options``: its keyword
    options, as under ``data.source_kwargs``; ``data``: other ``data:`` settings;
    ``cache_dir``: where the scratch caches go, default the system's temporary folder)."""
    check_source_options(name, options)
    check_source_fingerprint(name, options)
    check_source_load(name, options)
    check_source_prepares(name, options, data, cache_dir)


def _train(name: str, options: Mapping[str, Any], texts: Sequence[str]):
    return TOKENIZERS.build(name, **options).train(list(texts))


def check_tokenizer_options(name: str, options: Mapping[str, Any] | None = None) -> None:
    """The options pass the registry's check and the tokenizer's own ``problems()``."""
    options = dict(options or {})
    problems = _registry_problems(TOKENIZERS, name, options)
    assert problems == [], f"tokenizer {name!r}: its options are refused: {problems}"
    own = TOKENIZERS.build(name, **options).problems()
    assert own == [], f"tokenizer {name!r}: problems() refuses these options: {own}"


def check_tokenizer_training(
    name: str, options: Mapping[str, Any] | None = None, texts: Sequence[str] = TEXTS
) -> None:
    """``train`` gives a ``tokenizers.Tokenizer`` with ``[PAD] = 0`` and ``[UNK] = 1`` that
    knows only what it was fitted on, and training twice gives the same tokenizer."""
    options = dict(options or {})
    tok = _train(name, options, texts)
    assert isinstance(tok, tokenizers.Tokenizer), f"tokenizer {name!r}: train() gave {type(tok)}"
    assert tok.token_to_id(PAD) == PAD_ID and tok.token_to_id(UNK) == UNK_ID, (
        f"tokenizer {name!r}: [PAD] must be id {PAD_ID} and [UNK] id {UNK_ID}"
    )
    assert tok.token_to_id(UNSEEN) is None, (
        f"tokenizer {name!r}: {UNSEEN!r} is in its vocabulary though no training text has it"
    )
    again = _train(name, options, texts)
    assert tok.get_vocab() == again.get_vocab(), f"tokenizer {name!r}: another vocabulary twice"
    ids = [tok.encode(t).ids for t in texts]
    assert ids == [again.encode(t).ids for t in texts], f"tokenizer {name!r}: other ids twice"
    assert any(i not in (PAD_ID, UNK_ID) for row in ids for i in row), (
        f"tokenizer {name!r}: every training word encodes as [PAD] or [UNK]"
    )
    restored = tokenizers.Tokenizer.from_str(tok.to_str())
    assert [restored.encode(t).ids for t in texts] == ids, (
        f"tokenizer {name!r}: it encodes otherwise after the JSON round trip of the cache"
    )


def check_tokenizer(
    name: str, options: Mapping[str, Any] | None = None, texts: Sequence[str] = TEXTS
) -> None:
    """Every contract check of a tokenizer registered as ``name`` (``options``: its keyword
    options, as under ``data.tokenizer_kwargs``; ``texts``: training texts for the check)."""
    check_tokenizer_options(name, options)
    check_tokenizer_training(name, options, texts)
