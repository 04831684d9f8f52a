"""Documents as a source reads them: a split's texts and labels (``RawSplit``) and the three
splits of a dataset (``RawDataset``), before tokenising.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SPLITS = ("train", "validation", "test")


@dataclass
class RawSplit:
    """One split as read: texts, raw labels, and where each row came from (for error messages)."""

    texts: Sequence[str | None]
    """A source may give missing texts (None): they are dropped with the empty ones."""
    labels: list[Any]
    origin: str
    """A file path or a hub id and split, used in error messages."""
    rows: np.ndarray | None = None
    """Row index of each document in ``origin`` (0-based, header excluded); default 0..N-1."""

    def __post_init__(self) -> None:
        if self.rows is None:
            self.rows = np.arange(len(self.texts), dtype=np.int64)
        if not (len(self.texts) == len(self.labels) == len(self.rows)):
            raise AssertionError("texts, labels and rows must have the same length")

    def row(self, i: int) -> int:
        """Document ``i``'s row in ``origin``."""
        assert self.rows is not None  # set by __post_init__
        return int(self.rows[i])


@dataclass
class RawDataset:
    """The splits a source provides (validation may be missing) and its class count."""

    splits: dict[str, RawSplit]
    num_classes: int | None = None
    label_names: list[str] | None = field(default=None)
