"""``keywords``: generated documents whose label is which of ``num_classes`` keywords they
contain, among filler words; a data source in a few lines, offline and deterministic."""

from __future__ import annotations

from typing import Any

import numpy as np

from fusion_ray.data.sources import RawDataset, RawSplit

SPLITS = {"train": 0, "validation": 1, "test": 2}


class KeywordSource:
    """Implements fusion_ray.data.sources.DataSource, and DeclaresClasses (its class count is
    known before loading, so data.num_classes is checked against it)."""

    def __init__(
        self, *, num_classes: int = 3, n_train: int = 200, n_test: int = 60, words: int = 20
    ) -> None:
        self.num_classes, self.n_train, self.n_test, self.words = (
            num_classes,
            n_train,
            n_test,
            words,
        )

    def problems(self) -> list[str]:
        problems = []
        if not 2 <= self.num_classes <= 26:
            problems.append(f"data.source_kwargs.num_classes: 2 to 26 (got {self.num_classes})")
        for name in ("n_train", "n_test", "words"):
            if getattr(self, name) < 1:
                problems.append(
                    f"data.source_kwargs.{name}: at least 1 (got {getattr(self, name)})"
                )
        return problems

    def fingerprint(self) -> dict[str, Any]:
        return {"keywords_version": 1}

    def declared_num_classes(self) -> int | None:
        return self.num_classes

    def load(self) -> RawDataset:
        sizes = {"train": self.n_train, "validation": max(1, self.n_test // 2), "test": self.n_test}
        splits = {name: self._split(name, n) for name, n in sizes.items()}
        return RawDataset(splits, num_classes=self.num_classes)

    def _split(self, name: str, n: int) -> RawSplit:
        rng = np.random.default_rng([SPLITS[name], self.num_classes, self.words])
        labels = rng.integers(self.num_classes, size=n)
        texts = []
        for label in labels:
            words = [f"filler{w}" for w in rng.integers(50, size=self.words)]
            words[int(rng.integers(self.words))] = f"keyword{chr(97 + int(label))}"
            texts.append(" ".join(words))
        return RawSplit(texts, labels.tolist(), origin=f"keywords {name}")
