"""Every registered data source and tokenizer (built-ins and installed plug-ins) keeps the
contract of ``fusion_ray.testing``: valid options, a stable fingerprint, the same documents on
every load, a data block that checks and prepares; tokenizers with [PAD] = 0 and [UNK] = 1,
fitted on their texts only, deterministic."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fusion_ray.data import SOURCES, TOKENIZERS
from fusion_ray.testing import check_source, check_tokenizer
from fusion_ray.testing import data as contract
from tests.helpers import hub_copy

pytestmark = pytest.mark.unit


def _local_files(folder: Path) -> dict[str, str]:
    texts = [f"{w} market rain cat" for w in ("alpha", "beta", "gamma", "delta")] * 6
    train = pd.DataFrame({"text": texts, "label": ["a", "b", "c"] * 8})
    train.to_csv(folder / "train.csv", index=False)
    train.head(6).to_csv(folder / "test.csv", index=False)
    return {"train": str(folder / "train.csv"), "test": str(folder / "test.csv")}


def _source_settings(name: str, folder: Path) -> tuple[dict, dict]:
    """(source options, other data settings) that make each built-in source work offline in a
    second; a plug-in source is checked with its defaults."""
    if name == "synthetic":
        return {"regime": "short", "n_train": 40, "n_validation": 12, "n_test": 12}, {}
    if name == "local":
        return _local_files(folder), {"validation_fraction": 0.25}
    if name == "hub":
        hub_copy(folder / "imdb", "imdb")
        return {"dataset": "imdb", "data_dir": str(folder / "imdb")}, {}
    return {}, {}


@pytest.mark.parametrize("name", SOURCES.names())
def test_every_registered_source_keeps_the_contract(name, tmp_path):
    options, data = _source_settings(name, tmp_path)
    check_source(name, options, data, cache_dir=str(tmp_path))


@pytest.mark.parametrize("name", TOKENIZERS.names())
def test_every_registered_tokenizer_keeps_the_contract(name):
    check_tokenizer(name)
    if name == "bpe":
        check_tokenizer(name, {"vocab_size": 100, "min_frequency": 1, "lowercase": False})


class _Shuffled:
    """A source whose documents change order from one load to the next: not allowed."""

    calls = 0

    def problems(self):
        return []

    def fingerprint(self):
        return {"version": 1}

    def load(self):
        from fusion_ray.data.sources import RawDataset, RawSplit

        _Shuffled.calls += 1
        texts = [f"word{i}" for i in range(6)]
        texts = texts[_Shuffled.calls % 6 :] + texts[: _Shuffled.calls % 6]
        split = RawSplit(texts, [0, 1] * 3, origin="shuffled")
        return RawDataset({"train": split, "test": split}, num_classes=2)


def test_the_kit_catches_a_source_whose_documents_change_between_loads():
    SOURCES.register("shuffled_for_test")(_Shuffled)
    try:
        with pytest.raises(AssertionError, match="two loads give other train documents"):
            contract.check_source_load("shuffled_for_test")
    finally:  # out of the registry again, for the tests that list it
        SOURCES._entries.pop("shuffled_for_test")
        SOURCES._origin.pop("shuffled_for_test")
