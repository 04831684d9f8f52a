"""From a DataSpec to cached, tokenised splits: load -> check -> split -> fit tokenizer on train ->
tokenise -> cache.

Everything here depends on the dataset settings and ``split_seed`` only, never on a trial seed or
a model choice, so every trial of a sweep (and every operator of a paired seed) sees the same
splits and the same token ids.

Why one module of this size: splitting, fitting the tokenizer, encoding and the cache that
holds all three are one step keyed by one fingerprint; apart, the key could miss a setting.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from fusion_ray.checks import field_problems, is_int
from fusion_ray.data import cache
from fusion_ray.data.sources import (
    SOURCES,
    DataSource,
    LabelWindow,
    RawDataset,
    RawSplit,
    SyntheticSource,
    source_num_classes,
)
from fusion_ray.data.spec import DataSpec
from fusion_ray.data.stats import format_stats, length_stats
from fusion_ray.data.tokenizer import PAD_ID, TOKENIZERS
from fusion_ray.registry import Registry

log = logging.getLogger(__name__)

_CARVE_STREAM = 0xCA5E  # SeedSequence([split_seed, stream]) per use, so uses never share draws
_SUBSAMPLE_STREAM = 0x5AB5
_EVAL_SUBSAMPLE_STREAMS = {"validation": 0x5AB6, "test": 0x5AB7}
_ENCODE_CHUNK = 2048


@dataclass
class TokenizedSplit:
    """One split, tokenised: ids truncated to max_length (no padding), labels, and lengths in tokens
    before truncation."""

    ids: list[np.ndarray]
    labels: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_lengths(self) -> np.ndarray:
        """Tokens actually fed to the model (after truncation): what a batch's padding depends on."""
        return np.fromiter((len(d) for d in self.ids), dtype=np.int64, count=len(self.ids))

    def truncated(self, max_length: int) -> TokenizedSplit:
        """The same documents cut to their first ``max_length`` tokens (views, no copies);
        ``lengths`` keeps each document's length before any truncation."""
        return TokenizedSplit(
            ids=[d[:max_length] for d in self.ids], labels=self.labels, lengths=self.lengths
        )


@dataclass
class PreparedData:
    """The three tokenised splits of a dataset, with what a model and the analysis need to know."""

    train: TokenizedSplit
    validation: TokenizedSplit
    test: TokenizedSplit
    vocab_size: int
    num_classes: int
    pad_id: int
    stats: dict[str, dict[str, float]]
    """Per split: n_docs, dropped_empty, mean, median, p90, p99, max tokens, clip_rate."""
    cache_key: str
    cache_hit: bool
    cache_path: str = ""
    """The cache entry directory (tokenizer.json and meta.json live there)."""
    label_names: list[str] | None = field(default=None)
    """Class names when the source had string labels (index = class id)."""
    test_max_length: int = 0
    """Tokens the test split was prepared up to: data.max_length, or the longest of
    data.eval_lengths when that is longer."""
    test_long: TokenizedSplit | None = None
    """When test_max_length exceeds data.max_length: the test documents truncated at
    test_max_length (``test`` holds the same documents truncated at data.max_length)."""

    def test_at(self, length: int) -> TokenizedSplit:
        """The test split truncated at ``length`` tokens (at most ``test_max_length``), for the
        per-length evaluation of data.eval_lengths."""
        if not 1 <= length <= self.test_max_length:
            raise ValueError(
                f"the test split was prepared up to {self.test_max_length} tokens, not {length}; "
                f"add {length} to data.eval_lengths"
            )
        return (self.test if self.test_long is None else self.test_long).truncated(length)

    def tokenizer(self) -> tokenizers.Tokenizer:
        """The fitted tokenizer, for decoding and inspection."""
        return tokenizers.Tokenizer.from_file(str(Path(self.cache_path) / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------
# Validation without I/O
# ---------------------------------------------------------------------------------------------


def _build(registry: Registry, name: str, kwargs: dict[str, Any]) -> tuple[Any, list[str]]:
    """The entry built from kwargs and its problems; (None, problems) when it cannot be built."""
    problems = registry.check(name, kwargs)
    if problems:
        return None, problems
    entry = registry.get(name)(**kwargs)
    if registry is SOURCES and not isinstance(entry, DataSource):
        return None, [
            f"data source {name!r} (from {registry.origin(name)}) does not provide problems(), "
            "fingerprint() and load(); see fusion_ray.data.sources.DataSource"
        ]
    return entry, entry.problems()


def check_data_spec(spec: DataSpec) -> list[str]:
    """Every problem a user can fix in a DataSpec, as messages; cheap (no downloads, no tokenising).

    The fields' own types and ranges (they live on the fields; data.eval_lengths has its own,
    more precise, check) and the source and tokenizer options; then, when the fields are
    well-typed, the rest of ``data_rules``."""
    own = eval_length_problems(spec.eval_lengths)
    problems = [
        p for p in field_problems(spec, "data.") if not (own and p.startswith("data.eval_lengths"))
    ]
    if problems or own:
        return problems + own + registry_problems(spec)[1]
    return data_rules(spec)


def registry_problems(spec: DataSpec) -> tuple[Any, list[str]]:
    """The data source built from its options (None when its options have problems), and the
    problems of the source's and the tokenizer's options."""
    source, problems = _build(SOURCES, spec.source, spec.source_kwargs)
    source = None if problems else source
    problems = [f"data.source: {p}" for p in problems]
    tokenizer = _build(TOKENIZERS, spec.tokenizer, spec.tokenizer_kwargs)[1]
    return source, problems + [f"data.tokenizer: {p}" for p in tokenizer]


def data_rules(spec: DataSpec) -> list[str]:
    """The problems of a well-typed DataSpec: its source and tokenizer options, num_classes
    against the source's own count, the eval lengths' order, and the synthetic tasks' label
    window against max_length. The config validator calls this for every grid point before
    Ray starts."""
    source, problems = registry_problems(spec)
    problems += eval_length_problems(spec.eval_lengths)
    declared = source_num_classes(source) if source is not None else None
    if spec.num_classes is not None and declared is not None and spec.num_classes < declared:
        problems.append(
            f"data.num_classes: {spec.num_classes} is fewer than the {declared} classes "
            f"the {spec.source} source has; remove it or set it to {declared}"
        )
    if isinstance(source, LabelWindow) and spec.max_length < source.label_span():
        problems.append(source.label_span_problem(spec.max_length))
    cache_dir = Path(spec.cache_dir).expanduser() if spec.cache_dir else None
    if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
        problems.append(f"data.cache_dir: {spec.cache_dir} exists and is not a directory")
    return problems


def eval_length_problems(eval_lengths: Any) -> list[str]:
    """What is wrong with data.eval_lengths: not a list of positive integers, a repeat, or not in
    increasing order (the message gives the list to write instead)."""
    where = "data.eval_lengths"
    if not isinstance(eval_lengths, list):
        return [
            f"{where}: must be a list of token counts such as [512, 1024], got {eval_lengths!r}"
        ]
    bad = [v for v in eval_lengths if not is_int(v) or v < 1]
    if bad:
        return [f"{where}: every length must be a positive integer, got {bad[0]!r}"]
    fixed = sorted(set(eval_lengths))
    if eval_lengths != fixed:
        what = (
            "repeats a length" if len(fixed) < len(eval_lengths) else "is not in increasing order"
        )
        return [f"{where}: {eval_lengths} {what}; write {fixed}"]
    return []


def longest_input_length(spec: DataSpec) -> int:
    """The most tokens of a document any model of this data is fed: data.max_length, or the
    longest of data.eval_lengths when that is longer (model.max_len must cover it). The test
    split is prepared up to this length."""
    lengths = spec.eval_lengths if isinstance(spec.eval_lengths, list) else []
    return max([int(spec.max_length), *(int(v) for v in lengths if is_int(v))])


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


def _resolved_kwargs(registry: Registry, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs with defaults filled in, so spelling out a default does not change the cache key.

    Options an entry added later (its ``CACHE_KEY_DEFAULTS``) are left out while they hold their
    default, so the data prepared before they existed keeps its key.
    """
    entry = registry.get(name)
    bound = inspect.signature(entry).bind(**kwargs)
    bound.apply_defaults()
    later = getattr(entry, "CACHE_KEY_DEFAULTS", {})
    return {k: v for k, v in bound.arguments.items() if not (k in later and v == later[k])}


def cache_settings(spec: DataSpec) -> dict[str, Any]:
    """What the cached result depends on (and nothing else: not cache_dir, not any trial setting)."""
    source = SOURCES.get(spec.source)(**spec.source_kwargs)
    settings = {
        "source": spec.source,
        "source_kwargs": _resolved_kwargs(SOURCES, spec.source, spec.source_kwargs),
        "source_files": source.fingerprint(),
        "num_classes": spec.num_classes,
        "validation_fraction": float(spec.validation_fraction),
        "split_seed": int(spec.split_seed),
        "max_train_samples": spec.max_train_samples,
        "tokenizer": spec.tokenizer,
        "tokenizer_kwargs": _resolved_kwargs(TOKENIZERS, spec.tokenizer, spec.tokenizer_kwargs),
        "max_length": int(spec.max_length),
        "tokenizers_version": tokenizers.__version__,
    }
    if spec.max_eval_samples is not None:  # only then: other keys stay what they always were
        settings["max_eval_samples"] = spec.max_eval_samples
    test_max_length = longest_input_length(spec)
    if test_max_length > spec.max_length:  # only then: other keys stay what they always were
        settings["test_max_length"] = test_max_length
    return settings


def _label_index(split_name: str, raw: RawSplit, num_classes: int | None) -> np.ndarray:
    """Raw labels as int64, or a ValueError naming the origin, the row and the bad value.

    With ``num_classes`` None only integrality and non-negativity are checked.
    """
    out = np.empty(len(raw.labels), dtype=np.int64)
    upper = num_classes if num_classes is not None else np.iinfo(np.int64).max
    for i, value in enumerate(raw.labels):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not is_int(value) or not 0 <= value < upper:
            if not is_int(value):
                what, fix = "which is not an integer class index", "fill in or remove that row"
            elif value < 0:
                what, fix = "which is negative", "labels must be 0..C-1; fix or remove that row"
            else:
                what = f"outside 0..{upper - 1}"
                fix = (
                    f"fix or remove that row, or set data.num_classes (now {num_classes}) "
                    "if the dataset really has more classes"
                )
            raise ValueError(
                f"{raw.origin}: row {raw.row(i)} of the {split_name} split has label "
                f"{value!r}, {what}; {fix}"
            )
        out[i] = value
    return out


def check_labels_seen_in_train(raw: RawDataset) -> None:
    """A validation or test label that no training document has: the model can never predict it
    and the class count would silently grow. ValueError naming the origin, split, row and value."""

    def plain(value: Any) -> Any:
        return int(value) if isinstance(value, float) and value.is_integer() else value

    train = raw.splits.get("train")
    if train is None:
        return
    seen = {plain(v) for v in train.labels}
    for name in ("validation", "test"):
        split = raw.splits.get(name)
        if split is None:
            continue
        for i, value in enumerate(split.labels):
            if plain(value) in seen:
                continue
            names = raw.label_names
            shown = names[value] if names and is_int(value) and 0 <= value < len(names) else value
            raise ValueError(
                f"{split.origin}: row {split.row(i)} of the {name} split has label "
                f"{shown!r}, which no training document has; fix or remove that row (or, if the "
                "dataset really has a class the training split lacks, set data.num_classes)"
            )


def _seeded_rng(split_seed: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([split_seed, stream])))


@dataclass
class _Docs:
    texts: list[str]
    labels: np.ndarray
    dropped_empty: int

    def take(self, idx: np.ndarray) -> _Docs:
        return _Docs([self.texts[i] for i in idx], self.labels[idx], 0)


def _clean(split_name: str, raw: RawSplit, num_classes: int) -> _Docs:
    labels = _label_index(split_name, raw, num_classes)
    kept = [(i, t) for i, t in enumerate(raw.texts) if isinstance(t, str) and t.strip()]
    keep = [i for i, _ in kept]
    return _Docs([t for _, t in kept], labels[keep], len(raw.texts) - len(keep))


def split_documents(raw: RawDataset, spec: DataSpec, num_classes: int) -> dict[str, _Docs]:
    """Checked, non-empty documents per split; validation carved from train when missing."""
    docs = {name: _clean(name, split, num_classes) for name, split in raw.splits.items()}
    for required in ("train", "test"):
        if required not in docs:
            raise ValueError(f"the {spec.source} source gave no {required!r} split")
    if "validation" not in docs:
        train = docs["train"]
        n = len(train.labels)
        n_val = max(1, int(round(spec.validation_fraction * n)))
        if n - n_val < 1:
            raise ValueError(
                f"cannot carve a validation split from {n} training documents with "
                f"validation_fraction {spec.validation_fraction}; provide more data or a validation file"
            )
        perm = _seeded_rng(spec.split_seed, _CARVE_STREAM).permutation(n)
        val, rest = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        docs["validation"] = train.take(val)
        docs["train"] = train.take(rest)
        docs["train"].dropped_empty = train.dropped_empty
    _subsample(docs, "train", spec.max_train_samples, spec.split_seed, _SUBSAMPLE_STREAM)
    for name, stream in _EVAL_SUBSAMPLE_STREAMS.items():
        _subsample(docs, name, spec.max_eval_samples, spec.split_seed, stream)
    for name in ("train", "validation", "test"):
        if len(docs[name].labels) == 0:
            raise ValueError(
                f"the {name} split has no non-empty documents ({docs[name].dropped_empty} empty "
                "texts were dropped); check data.source_kwargs and the text column"
            )
    return docs


def _subsample(
    docs: dict[str, _Docs], name: str, keep: int | None, split_seed: int, stream: int
) -> None:
    """Keep a seeded subsample of at most ``keep`` documents of split ``name`` (in order)."""
    split = docs[name]
    if keep is None or keep >= len(split.labels):
        return
    chosen = np.sort(
        _seeded_rng(split_seed, stream).choice(len(split.labels), size=keep, replace=False)
    )
    docs[name] = split.take(chosen)
    docs[name].dropped_empty = split.dropped_empty


def _encode(
    tok: tokenizers.Tokenizer, texts: list[str], max_length: int
) -> tuple[list[np.ndarray], np.ndarray]:
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    ids: list[np.ndarray] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), _ENCODE_CHUNK):
        for j, enc in enumerate(
            encode(texts[start : start + _ENCODE_CHUNK], add_special_tokens=False)
        ):
            full = enc.ids
            lengths[start + j] = len(full)
            ids.append(np.asarray(full[:max_length], dtype=np.int32))
    return ids, lengths


def label_window_problem(
    source: LabelWindow, tok: tokenizers.Tokenizer, docs: dict[str, _Docs], spec: DataSpec
) -> str | None:
    """What is wrong when data.max_length tokens cut into the label-bearing words of some
    synthetic documents, counted with the fitted tokenizer (``check_data_spec`` can only
    compare max_length with words; a tokenizer that splits a word into pieces, as ``bpe`` may
    for rare words, makes the words need more tokens). None when every label survives."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    cut, longest = [], 0
    for name in ("train", "validation", "test"):
        words = source.label_words(name)
        if words == 0:
            continue
        prefixes = [" ".join(text.split()[:words]) for text in docs[name].texts]
        tokens = [len(e.ids) for e in encode(prefixes, add_special_tokens=False)]
        over = [n for n in tokens if n > spec.max_length]
        if over:
            cut.append(f"{len(over)} of {len(tokens)} {name}")
            longest = max(longest, *over)
    if not cut:
        return None
    if isinstance(source, SyntheticSource):
        task, relative = f"the synthetic {source.regime!r} task", source.relative
        window_fix = ", or lower data.source_kwargs.window"
    else:  # a plug-in source's LabelWindow: no regime, relative task or window
        task, relative, window_fix = f"the {spec.source} source", False, ""
    if relative:
        where = "every word of a training or validation document of the relative task"
        fix = ""
    else:
        where = f"the first {source.label_words('test')} words of each document"
        fix = window_fix
    return (
        f"data.max_length: {spec.max_length} tokens cut into the label-bearing words of "
        f"{', '.join(cut)} documents of {task} ({where}): the "
        f"{spec.tokenizer!r} tokenizer splits some of their words into several tokens, so "
        "truncation would let word counts reveal the label. Use tokenizer: word (one token "
        f"per word), or raise data.max_length to at least {longest}{fix}"
    )


def _build_entry(spec: DataSpec, cache_dir: Path, key: str, settings: dict[str, Any]) -> Path:
    source = SOURCES.get(spec.source)(**spec.source_kwargs)
    raw = source.load()
    num_classes = spec.num_classes or raw.num_classes
    if num_classes is None or num_classes < 2:
        for name, split in raw.splits.items():  # a bad label explains a bad count best
            _label_index(name, split, None)
        raise ValueError(
            f"cannot tell the number of classes of the {spec.source} source; set data.num_classes"
        )
    if spec.num_classes is None:
        check_labels_seen_in_train(raw)
    docs = split_documents(raw, spec, num_classes)

    tokenizer = TOKENIZERS.get(spec.tokenizer)(**spec.tokenizer_kwargs)
    tok = tokenizer.train(docs["train"].texts)  # the training split only
    if isinstance(source, LabelWindow):
        problem = label_window_problem(source, tok, docs, spec)
        if problem is not None:
            raise ValueError(problem)

    arrays: dict[str, dict[str, np.ndarray]] = {}
    stats: dict[str, dict[str, float]] = {}
    for name in ("train", "validation", "test"):
        d = docs[name]
        # The test split is kept up to the longest evaluation length; PreparedData.test cuts it
        # to max_length again, so the usual test metrics are unchanged.
        limit = longest_input_length(spec) if name == "test" else spec.max_length
        ids, lengths = _encode(tok, d.texts, limit)
        nonempty = lengths > 0  # e.g. only characters the normaliser removes
        dropped = d.dropped_empty + int((~nonempty).sum())
        ids = [x for x, k in zip(ids, nonempty, strict=True) if k]
        lengths, labels = lengths[nonempty], d.labels[nonempty]
        if len(ids) == 0:
            raise ValueError(f"every document of the {name} split tokenised to nothing")
        sizes = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        arrays[name] = {
            "ids": np.concatenate(ids).astype(np.int32, copy=False),
            "offsets": offsets,
            "labels": labels.astype(np.int64),
            "lengths": lengths,
        }
        stats[name] = length_stats(lengths, spec.max_length, dropped)

    meta = {
        "splits": ["train", "validation", "test"],
        "vocab_size": tok.get_vocab_size(),
        "num_classes": int(num_classes),
        "pad_id": PAD_ID,
        "stats": stats,
        "label_names": raw.label_names,
        "validation_carved": "validation" not in raw.splits,
        "settings": settings,
    }
    log.info("data %s: tokenised, %s vocabulary\n%s", key, meta["vocab_size"], format_stats(stats))
    return cache.save_entry(cache_dir, key, meta, tok.to_str(), arrays)


def _from_entry(path: Path, key: str, hit: bool) -> PreparedData:
    meta, arrays = cache.load_entry(path)

    def split(name: str) -> TokenizedSplit:
        a = arrays[name]
        flat, off = a["ids"], a["offsets"]
        ids = [flat[off[i] : off[i + 1]] for i in range(len(off) - 1)]
        return TokenizedSplit(
            ids=ids, labels=np.asarray(a["labels"]), lengths=np.asarray(a["lengths"])
        )

    max_length = int(meta["settings"]["max_length"])
    test_max_length = int(meta["settings"].get("test_max_length", max_length))
    test = split("test")
    test_long = test if test_max_length > max_length else None
    return PreparedData(
        train=split("train"),
        validation=split("validation"),
        test=test if test_long is None else test_long.truncated(max_length),
        vocab_size=int(meta["vocab_size"]),
        num_classes=int(meta["num_classes"]),
        pad_id=int(meta["pad_id"]),
        stats=meta["stats"],
        cache_key=key,
        cache_hit=hit,
        cache_path=str(path),
        label_names=meta.get("label_names"),
        test_max_length=test_max_length,
        test_long=test_long,
    )


def prepare_data(spec: DataSpec) -> PreparedData:
    """Tokenised train/validation/test splits for ``spec``, from the cache when possible.

    Concurrent calls on one node build an entry once (a file lock) and share it; a second call is a
    cache hit. Raises ValueError for invalid settings or bad data, ConnectionError when a hub
    dataset cannot be reached.
    """
    problems = check_data_spec(spec)
    if problems:
        raise ValueError("invalid data settings:\n  - " + "\n  - ".join(problems))
    settings = cache_settings(spec)
    key = cache.make_key(settings)
    cache_dir = Path(spec.cache_dir).expanduser() if spec.cache_dir else cache.default_cache_dir()
    path = cache.entry_dir(cache_dir, key)
    if cache.is_complete(path):
        return _from_entry(path, key, hit=True)
    with cache.lock_for(cache_dir, key):
        if cache.is_complete(path):  # another process built it while we waited
            return _from_entry(path, key, hit=True)
        log.info("data %s: not cached, building under %s", key, path)
        path = _build_entry(spec, cache_dir, key, settings)
    return _from_entry(path, key, hit=False)
