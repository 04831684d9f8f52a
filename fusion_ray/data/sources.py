"""Where documents come from: the ``SOURCES`` registry (hub, local, synthetic).

A source is a class whose keyword-only ``__init__`` parameters are the options a sweep file may
set under ``data.source_kwargs``. ``problems()`` checks those options cheaply (no downloads, no
reading whole files) for the config validator; ``fingerprint()`` says what on disk the result
depends on (for the cache key); ``load()`` reads the documents. Reading a table of documents
from disk (formats, columns, labels) is ``fusion_ray.data.files``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fusion_ray.checks import is_int
from fusion_ray.data import synthetic
from fusion_ray.data.files import FORMATS, encode_labels, file_format, read_table, table_problems
from fusion_ray.data.raw import SPLITS, RawDataset, RawSplit
from fusion_ray.registry import Registry

MAX_SYNTHETIC_DOCUMENTS = 10_000_000
"""The most documents a synthetic split may have (the study's largest real split has 120,000):
more is certainly a mistake, and would be generated before the first epoch."""


@runtime_checkable
class DataSource(Protocol):
    """What every data source provides (a plug-in source too): a class whose keyword-only
    ``__init__`` parameters are its options, registered in ``SOURCES``."""

    def problems(self) -> list[str]:
        """The options' problems, cheaply (no downloads, no reading whole files)."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """What the documents depend on besides the options (file sizes and times, a version),
        for the cache key."""
        ...

    def load(self) -> RawDataset:
        """The documents of each split."""
        ...


@runtime_checkable
class DeclaresClasses(Protocol):
    """An optional hook: a source that knows its class count without loading, so
    data.num_classes is checked against it before Ray starts."""

    def declared_num_classes(self) -> int | None: ...


@runtime_checkable
class LabelWindow(Protocol):
    """An optional hook: a source whose labels are carried by each document's leading words,
    so truncation at data.max_length must keep them (checked before Ray starts in words, and
    when the data are prepared in the fitted tokenizer's tokens)."""

    def label_span(self) -> int:
        """The most leading words that may carry a label."""
        ...

    def label_words(self, split: str) -> int:
        """How many leading words of a document of ``split`` carry its label (0: none to keep)."""
        ...

    def label_span_problem(self, max_length: int) -> str:
        """The message when data.max_length is below ``label_span()``."""
        ...


SOURCES: Registry = Registry("data source", group="fusion_ray.sources")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """True when the environment asks Hugging Face libraries not to use the network."""
    return _env_flag("HF_HUB_OFFLINE") or _env_flag("HF_DATASETS_OFFLINE")


@dataclass(frozen=True)
class HubDataset:
    hub_id: str
    splits: tuple[str, ...]
    """The splits we use (IMDB's unsupervised split is never used)."""
    num_classes: int
    text_column: str = "text"
    label_column: str = "label"
    config: str | None = None
    """Preferred config sub-folder when a local copy holds several."""


HUB_DATASETS: dict[str, HubDataset] = {
    "ag_news": HubDataset("fancyzhx/ag_news", ("train", "test"), 4, config="data"),
    "imdb": HubDataset("stanfordnlp/imdb", ("train", "test"), 2, config="plain_text"),
    "arxiv": HubDataset(
        "ccdv/arxiv-classification", ("train", "validation", "test"), 11, config="default"
    ),
}


def find_split_files(data_dir: Path, split: str, prefer: str | None) -> list[Path]:
    """Parquet files of ``split`` in a local copy of a hub repo.

    Accepts the hub's layouts: ``<cfg>/<split>-00000-of-00001.parquet`` (also at the top level)
    and the converter's ``<cfg>/<split>/0000.parquet``. When several config folders match (e.g.
    ArXiv's ``default`` and ``no_ref``), ``prefer`` picks one.
    """
    found: dict[str, list[Path]] = {}
    for path in sorted(data_dir.rglob("*.parquet")):
        rel = path.relative_to(data_dir)
        parts = rel.parts
        stem = path.name
        if (
            stem.startswith(f"{split}-")
            or stem.startswith(f"{split}.")
            or stem == f"{split}.parquet"
        ):
            group = "/".join(parts[:-1])
        elif len(parts) >= 2 and parts[-2] == split:
            group = "/".join(parts[:-2])
        else:
            continue
        found.setdefault(group, []).append(path)
    if len(found) <= 1:
        return next(iter(found.values()), [])
    for group in found:
        if prefer is not None and group.split("/")[-1:] == [prefer]:
            return found[group]
    raise ValueError(
        f"{data_dir}: split {split!r} appears in several folders ({', '.join(sorted(found))}); "
        "point data_dir at the one you want"
    )


@SOURCES.register("hub")
class HubSource:
    """A Hugging Face Hub dataset by short name, or a local copy of its parquet files."""

    def __init__(
        self, *, dataset: str, revision: str | None = None, data_dir: str | None = None
    ) -> None:
        self.dataset = dataset
        self.revision = revision
        self.data_dir = data_dir

    @property
    def info(self) -> HubDataset:
        return HUB_DATASETS[self.dataset]

    def declared_num_classes(self) -> int | None:
        return self.info.num_classes if self.dataset in HUB_DATASETS else None

    def problems(self) -> list[str]:
        if self.dataset not in HUB_DATASETS:
            return [
                f"data.source_kwargs.dataset: unknown hub dataset {self.dataset!r}; allowed: "
                f"{', '.join(HUB_DATASETS)} (for other data use source: local)"
            ]
        if self.data_dir is None:
            return []
        root = Path(self.data_dir).expanduser()
        if not root.is_dir():
            return [
                f"data.source_kwargs.data_dir: {root} is not a directory; it should hold a copy "
                f"of {self.info.hub_id}'s parquet files"
            ]
        problems = []
        for split in self.info.splits:
            try:
                files = find_split_files(root, split, self.info.config)
            except ValueError as e:
                problems.append(f"data.source_kwargs.data_dir: {e}")
                continue
            if not files:
                problems.append(
                    f"data.source_kwargs.data_dir: no parquet files for split {split!r} of "
                    f"{self.info.hub_id} under {root} (expected e.g. {split}-00000-of-00001.parquet)"
                )
        return problems

    def fingerprint(self) -> dict[str, Any]:
        if self.data_dir is None:
            return {}
        root = Path(self.data_dir).expanduser()
        return {
            split: [_file_stamp(p) for p in find_split_files(root, split, self.info.config)]
            for split in self.info.splits
        }

    def _offline_error(self, cause: BaseException | None = None) -> ConnectionError:
        info = self.info
        why = (
            f" ({type(cause).__name__}: {cause})" if cause is not None else " (offline mode is set)"
        )
        return ConnectionError(
            f"cannot load hub dataset {self.dataset!r} ({info.hub_id}){why}. On a machine "
            "without network, point the config at local files instead: either download the "
            f"repository's parquet files (hf download {info.hub_id} --repo-type "
            "dataset --local-dir DIR) and set data.source_kwargs.data_dir: DIR, or use "
            "source: local with source_kwargs {train: ..., test: ..., text_column: "
            f"{info.text_column}, label_column: {info.label_column}}}."
        )

    def load(self) -> RawDataset:
        info = self.info
        if self.data_dir is not None:
            root = Path(self.data_dir).expanduser()
            splits = {}
            for split in info.splits:
                texts: list = []
                labels: list = []
                files = find_split_files(root, split, info.config)
                for path in files:
                    t, y = read_table(path, info.text_column, info.label_column)
                    texts += t
                    labels += y
                origin = (
                    str(files[0])
                    if len(files) == 1
                    else (
                        f"{root} ({info.hub_id} {split}: rows counted across "
                        f"{', '.join(str(f.relative_to(root)) for f in files)})"
                    )
                )
                splits[split] = RawSplit(texts, labels, origin=origin)
            return RawDataset(splits, num_classes=info.num_classes)

        import datasets

        if hub_offline() and not datasets.config.HF_HUB_OFFLINE:
            # Offline was asked for after `datasets` was imported, so `datasets` would still try
            # the network: fail fast instead. (Set before import, `datasets` itself serves a
            # copy from its cache or fails at once.)
            raise self._offline_error()
        try:
            splits = {}
            for split in info.splits:
                ds = datasets.load_dataset(info.hub_id, split=split, revision=self.revision)
                splits[split] = RawSplit(
                    list(ds[info.text_column]),
                    list(ds[info.label_column]),
                    origin=f"{info.hub_id} {split}",
                )
        except (ConnectionError, OSError, TimeoutError) as e:
            raise self._offline_error(e) from e
        except Exception as e:  # datasets raises its own types for missing/unreachable repos
            if type(e).__name__ in {
                "DatasetNotFoundError",
                "LocalEntryNotFoundError",
                "HfHubHTTPError",
            }:
                raise self._offline_error(e) from e
            raise
        return RawDataset(splits, num_classes=info.num_classes)


def _file_stamp(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


# ---------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------


@SOURCES.register("local")
class LocalSource:
    """Local csv/tsv/jsonl/parquet files; string labels map to ints in sorted order."""

    def __init__(
        self,
        *,
        train: str,
        test: str,
        validation: str | None = None,
        text_column: str = "text",
        label_column: str = "label",
    ) -> None:
        self.paths = {"train": train, "validation": validation, "test": test}
        self.text_column = text_column
        self.label_column = label_column

    def _given(self) -> dict[str, Path]:
        return {k: Path(v).expanduser() for k, v in self.paths.items() if v is not None}

    def problems(self) -> list[str]:
        problems = []
        for split, path in self._given().items():
            if not path.is_file():
                problems.append(f"data.source_kwargs.{split}: file {path} does not exist")
            elif file_format(path) is None:
                problems.append(
                    f"data.source_kwargs.{split}: {path} has unsupported type {path.suffix!r}; "
                    f"use one of {', '.join(FORMATS)}"
                )
            else:
                found = table_problems(path, self.text_column, self.label_column)
                problems += [f"data.source_kwargs.{split}: {p}" for p in found]
        return problems

    def fingerprint(self) -> dict[str, Any]:
        return {split: _file_stamp(path) for split, path in self._given().items()}

    def load(self) -> RawDataset:
        splits = {}
        for split, path in self._given().items():
            texts, labels = read_table(path, self.text_column, self.label_column)
            splits[split] = RawSplit(texts, labels, origin=str(path))
        num_classes, names = encode_labels(splits)
        return RawDataset(splits, num_classes=num_classes, label_names=names)


# ---------------------------------------------------------------------------------------------
# Synthetic
# ---------------------------------------------------------------------------------------------


@SOURCES.register("synthetic")
class SyntheticSource:
    """Segment-order tasks in three length regimes (see fusion_ray.data.synthetic).

    Sizes default to the regime's (small, for a CPU quickstart); num_classes defaults to 4 in every
    regime, so the regimes differ in length only. ``window`` (words) bounds the label-bearing
    segments and defaults to the regime's (short 96, medium 256, long 512); data.max_length must
    be at least the window, so truncation cannot reveal the label through word counts.

    For train short, test long: ``relative: true`` spreads the segments over each whole document
    (no window: the label is the topics' relative order at any length), and
    ``test_length_scale`` multiplies ``length_scale`` for the test split only (e.g. 8: test
    documents eight times as long as the training and validation ones).
    """

    CACHE_KEY_DEFAULTS = {"relative": False, "test_length_scale": 1.0}
    """Options added after data was cached: out of the cache key at these values."""

    def __init__(
        self,
        *,
        regime: str = "short",
        n_train: int | None = None,
        n_validation: int | None = None,
        n_test: int | None = None,
        num_classes: int | None = None,
        window: int | None = None,
        length_scale: float = 1.0,
        topic_rate: float = 0.5,
        generator_seed: int = 0,
        relative: bool = False,
        test_length_scale: float = 1.0,
    ) -> None:
        self.regime = regime
        self.window = window
        self.sizes = {"train": n_train, "validation": n_validation, "test": n_test}
        self.num_classes = num_classes
        self.length_scale = length_scale
        self.topic_rate = topic_rate
        self.generator_seed = generator_seed
        self.relative = relative
        self.test_length_scale = test_length_scale

    def problems(self) -> list[str]:
        p = "data.source_kwargs"
        if self.regime not in synthetic.REGIMES:
            return [
                f"{p}.regime: unknown regime {self.regime!r}; allowed: {', '.join(synthetic.REGIMES)}"
            ]
        problems = self._size_problems(p) + self._scale_problems(p) + self._relative_problems(p)
        if not isinstance(self.topic_rate, (int, float)) or not 0.0 < self.topic_rate <= 1.0:
            problems.append(f"{p}.topic_rate: must be a number in (0, 1], got {self.topic_rate!r}")
        if not is_int(self.generator_seed) or self.generator_seed < 0:
            problems.append(
                f"{p}.generator_seed: must be a non-negative integer, got {self.generator_seed!r}"
            )
        return problems

    def _size_problems(self, p: str) -> list[str]:
        """The split sizes, num_classes and window."""
        problems = []
        for split, n in self.sizes.items():
            if n is not None and (not is_int(n) or not 1 <= n <= MAX_SYNTHETIC_DOCUMENTS):
                problems.append(
                    f"{p}.n_{split}: must be an integer in 1..{MAX_SYNTHETIC_DOCUMENTS:,}, got {n!r}"
                )
        if self.num_classes is not None and (
            not is_int(self.num_classes) or not 2 <= self.num_classes <= 120
        ):
            problems.append(
                f"{p}.num_classes: must be an integer in 2..120, got {self.num_classes!r}"
            )
        if self.window is not None and (not is_int(self.window) or self.window < 8):
            problems.append(f"{p}.window: must be an integer >= 8 or null, got {self.window!r}")
        return problems

    def _scale_problems(self, p: str) -> list[str]:
        """length_scale and test_length_scale."""
        problems = []
        for name in ("length_scale", "test_length_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                value = None
            if value is None or not 0.05 <= value <= 100:
                problems.append(
                    f"{p}.{name}: must be a number in 0.05..100, got {getattr(self, name)!r}"
                )
        return problems

    def _relative_problems(self, p: str) -> list[str]:
        """relative, and a window given with it."""
        if not isinstance(self.relative, bool):
            return [f"{p}.relative: must be true or false, got {self.relative!r}"]
        if self.relative and self.window is not None:
            return [
                f"{p}.window: a relative task spreads the topics over each whole document and "
                "has no window; remove window or set relative: false"
            ]
        return []

    def fingerprint(self) -> dict[str, Any]:
        return {"synthetic_version": synthetic.SYNTHETIC_VERSION}

    def split_length_scale(self, split: str) -> float:
        """The length scale of one split's documents (the test split's times test_length_scale)."""
        scale = float(self.length_scale)
        return scale * float(self.test_length_scale) if split == "test" else scale

    def label_span(self) -> int:
        """The longest stretch of words (from the start) that can carry the label in the training
        and validation documents, and in the test documents unless the task is relative (whose
        longer test documents are what data.eval_lengths truncates step by step)."""
        regime = synthetic.REGIMES[self.regime]
        splits = ("train", "validation") if self.relative else SPLITS
        longest = max(
            synthetic.document_length_bounds(regime, self.split_length_scale(s))[1] for s in splits
        )
        return longest if self.relative else min(longest, self.window or regime.window)

    def label_words(self, split: str) -> int:
        """How many leading words of a document of ``split`` carry its label, which truncation
        at data.max_length must keep: the window (all of a shorter document); every word of a
        relative task's training and validation documents (its longest document's length);
        none (0) of a relative task's test documents, which data.eval_lengths truncates on
        purpose."""
        regime = synthetic.REGIMES[self.regime]
        if not self.relative:
            return self.window or regime.window
        if split == "test":
            return 0
        return synthetic.document_length_bounds(regime, self.split_length_scale(split))[1]

    def resolved_num_classes(self) -> int:
        return self.num_classes or synthetic.REGIMES[self.regime].num_classes

    def declared_num_classes(self) -> int | None:
        return self.resolved_num_classes() if self.regime in synthetic.REGIMES else None

    def label_span_problem(self, max_length: int) -> str:
        """data.max_length cuts into the words that carry a synthetic document's label."""
        if self.relative:
            return (
                f"data.max_length: {max_length} is shorter than the longest training document of the "
                f"relative synthetic {self.regime!r} task ({self.label_span()} words, all of "
                "them label-bearing), so truncation would let word counts reveal the label; raise "
                "data.max_length or lower data.source_kwargs.length_scale"
            )
        return (
            f"data.max_length: {max_length} is shorter than the synthetic {self.regime!r} "
            f"regime's label window ({self.label_span()} words), so truncation would let word "
            "counts reveal the label; raise data.max_length or set data.source_kwargs.window to "
            f"at most {max_length}"
        )

    def load(self) -> RawDataset:
        regime = synthetic.REGIMES[self.regime]
        defaults = {
            "train": regime.n_train,
            "validation": regime.n_validation,
            "test": regime.n_test,
        }
        num_classes = self.resolved_num_classes()
        splits = {}
        for split in SPLITS:
            n = self.sizes[split] or defaults[split]
            texts, labels = synthetic.generate_split(
                regime,
                split,
                n,
                num_classes=num_classes,
                generator_seed=self.generator_seed,
                window=self.window,
                length_scale=self.split_length_scale(split),
                topic_rate=float(self.topic_rate),
                relative=self.relative,
            )
            splits[split] = RawSplit(
                texts, labels.tolist(), origin=f"synthetic {self.regime} {split}"
            )
        return RawDataset(splits, num_classes=num_classes)


def source_num_classes(source: Any) -> int | None:
    """The class count a source declares without loading (None when it needs the data)."""
    return source.declared_num_classes() if isinstance(source, DeclaresClasses) else None
