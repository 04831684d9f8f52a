"""Local files, hub-layout parquet, the offline hub failure, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fusion_ray.data import DataSpec, check_data_spec, prepare_data
from fusion_ray.data.sources import HubSource
from tests.helpers import hub_copy

TRAIN = [
    ("the cat sat on the mat", "pets"),
    ("a dog ran in the park", "pets"),
    ("stocks fell sharply today", "money"),
    ("the market rallied on news", "money"),
    ("rain and wind all week", "weather"),
    ("sunny skies and warm air", "weather"),
] * 4
TEST = [("the cat and the market", "pets"), ("cold rain today", "weather")]


def _frame(rows, text="body", label="topic") -> pd.DataFrame:
    return pd.DataFrame({text: [r[0] for r in rows], label: [r[1] for r in rows], "extra": 1})


def _write(frame: pd.DataFrame, path: Path) -> str:
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def _spec(tmp_path: Path, **source_kwargs) -> DataSpec:
    return DataSpec(
        source="local",
        source_kwargs=source_kwargs,
        tokenizer="word",
        tokenizer_kwargs={"min_frequency": 1},
        max_length=32,
        validation_fraction=0.25,
        cache_dir=str(tmp_path / "cache"),
    )


@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_local_files_with_custom_columns_and_string_labels(tmp_path, suffix):
    train = _write(_frame(TRAIN), tmp_path / f"train{suffix}")
    test = _write(_frame(TEST), tmp_path / f"test{suffix}")
    data = prepare_data(
        _spec(tmp_path, train=train, test=test, text_column="body", label_column="topic")
    )
    assert data.num_classes == 3
    assert data.label_names == ["money", "pets", "weather"]  # sorted -> 0, 1, 2
    assert data.test.labels.tolist() == [1, 2]
    # No validation file: a quarter of train was carved out.
    assert len(data.validation) == 6 and len(data.train) == 18
    assert data.stats["test"]["n_docs"] == 2


@pytest.mark.unit
def test_local_integer_labels_and_explicit_validation(tmp_path):
    rows = [(t, i % 2) for i, (t, _) in enumerate(TRAIN)]
    train = _write(_frame(rows, "text", "label"), tmp_path / "train.csv")
    val = _write(_frame(rows[:4], "text", "label"), tmp_path / "val.jsonl")
    test = _write(_frame(rows[:3], "text", "label"), tmp_path / "test.parquet")
    data = prepare_data(_spec(tmp_path, train=train, validation=val, test=test))
    assert data.num_classes == 2 and data.label_names is None
    assert len(data.train) == len(TRAIN) and len(data.validation) == 4
    assert data.validation.labels.tolist() == [0, 1, 0, 1]


@pytest.mark.unit
def test_missing_files_and_columns_are_named(tmp_path):
    spec = _spec(tmp_path, train=str(tmp_path / "nope.csv"), test=str(tmp_path / "t.xlsx"))
    problems = check_data_spec(spec)
    assert any("nope.csv" in p and "does not exist" in p for p in problems), problems
    assert len(problems) == 2
    (tmp_path / "t.xlsx").write_text("x")
    assert any("unsupported" in p and ".xlsx" in p for p in check_data_spec(spec))

    train = _write(_frame(TRAIN), tmp_path / "train.csv")
    spec = _spec(tmp_path, train=train, test=train)  # default text_column "text" is absent
    with pytest.raises(ValueError, match=r"no column 'text' \(text_column\).*body.*text_column"):
        prepare_data(spec)


@pytest.mark.unit
def test_label_outside_range_names_file_row_and_value(tmp_path):
    rows = [(t, i % 3) for i, (t, _) in enumerate(TRAIN)]
    rows[7] = (rows[7][0], 9)
    train = _write(_frame(rows, "text", "label"), tmp_path / "train.csv")
    test = _write(_frame(rows[:3], "text", "label"), tmp_path / "test.csv")
    spec = _spec(tmp_path, train=train, test=test)
    spec.num_classes = 3
    with pytest.raises(ValueError) as err:
        prepare_data(spec)
    message = str(err.value)
    assert "train.csv" in message and "row 7" in message and "9" in message
    assert "0..2" in message and "num_classes" in message


@pytest.mark.unit
def test_negative_and_missing_labels_fail(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"text": t, "label": -1 if i == 2 else 0}) for i, (t, _) in enumerate(TRAIN)
        )
    )
    with pytest.raises(ValueError, match=r"row 2 .*-1"):
        prepare_data(_spec(tmp_path, train=str(path), test=str(path)))
    path.write_text(
        json.dumps({"text": "a", "label": None}) + "\n" + json.dumps({"text": "b", "label": 1})
    )
    with pytest.raises(ValueError, match=r"row 0 .*(None|nan).*not an integer"):
        prepare_data(_spec(tmp_path, train=str(path), test=str(path)))


@pytest.mark.unit
def test_empty_texts_are_dropped_and_counted(tmp_path):
    rows = list(TRAIN) + [("", "pets"), ("   \t ", "money"), ("\n", "weather")]
    train = _write(_frame(rows), tmp_path / "train.csv")
    test_rows = TEST + [(" ", "pets")]
    test = _write(_frame(test_rows), tmp_path / "test.jsonl")
    data = prepare_data(
        _spec(tmp_path, train=train, test=test, text_column="body", label_column="topic")
    )
    assert data.stats["train"]["dropped_empty"] == 3
    assert data.stats["test"]["dropped_empty"] == 1
    assert len(data.train) + len(data.validation) == len(TRAIN)
    assert len(data.test) == 2
    assert all(len(ids) > 0 for ids in data.test.ids)


@pytest.mark.unit
def test_undecodable_bytes_do_not_crash(tmp_path):
    bad = b"caf\xe9 au lait \xff\xfe ok"  # Latin-1 and stray bytes: invalid UTF-8
    csv = tmp_path / "train.csv"
    csv.write_bytes(
        b"text,label\n" + b"\n".join(t.encode() + b",0" for t, _ in TRAIN) + b"\n" + bad + b",1\n"
    )
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_bytes(b'{"text": "' + bad + b'", "label": 1}\n{"text": "plain", "label": 0}\n')
    data = prepare_data(_spec(tmp_path, train=str(csv), test=str(jsonl)))
    assert len(data.test) == 2 and data.test.labels.tolist() == [1, 0]
    assert len(data.train) + len(data.validation) == len(TRAIN) + 1  # the bad row is kept
    # "caf\ufffd au lait \ufffd\ufffd ok": five whitespace words survive the replacement.
    assert len(data.test.ids[0]) == 5


@pytest.mark.unit
def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": oops}\n')
    with pytest.raises(ValueError, match=r"train.jsonl: line 2 is not valid JSON"):
        prepare_data(_spec(tmp_path, train=str(path), test=str(path)))


# --- hub ------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "dataset,sizes",
    [("ag_news", (36, 4, 10)), ("imdb", (36, 4, 10)), ("arxiv", (30, 8, 9))],
)
def test_hub_layout_parquet_via_data_dir(tmp_path, dataset, sizes):
    root = tmp_path / dataset
    hub_copy(root, dataset)
    spec = DataSpec(
        source="hub",
        source_kwargs={"dataset": dataset, "data_dir": str(root)},
        tokenizer="bpe",
        tokenizer_kwargs={"vocab_size": 100, "min_frequency": 1},
        max_length=16,
        cache_dir=str(tmp_path / "cache"),
    )
    assert check_data_spec(spec) == []
    data = prepare_data(spec)
    assert (len(data.train), len(data.validation), len(data.test)) == sizes
    assert data.num_classes == {"ag_news": 4, "imdb": 2, "arxiv": 11}[dataset]


@pytest.mark.unit
def test_hub_data_dir_problems_are_reported(tmp_path):
    spec = DataSpec(source="hub", source_kwargs={"dataset": "imdb", "data_dir": str(tmp_path)})
    problems = check_data_spec(spec)
    assert any("no parquet files for split 'train'" in p for p in problems), problems
    spec = DataSpec(source="hub", source_kwargs={"dataset": "agnews"})
    assert any("ag_news, imdb, arxiv" in p for p in check_data_spec(spec))
    spec = DataSpec(source="hub", source_kwargs={})
    assert any("needs option 'dataset'" in p for p in check_data_spec(spec))


def _assert_helpful_offline_message(message: str, dataset: str, hub_id: str) -> None:
    assert repr(dataset) in message and hub_id in message
    assert "data_dir" in message and "source: local" in message


@pytest.mark.unit
@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_hub_fails_fast_with_a_fix(tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    spec = DataSpec(source="hub", source_kwargs={"dataset": "ag_news"}, cache_dir=str(tmp_path))
    with pytest.raises(ConnectionError) as err:
        prepare_data(spec)
    _assert_helpful_offline_message(str(err.value), "ag_news", "fancyzhx/ag_news")


@pytest.mark.unit
def test_unreachable_hub_error_is_rewritten(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'stanfordnlp/imdb' on the Hub")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ConnectionError) as err:
        HubSource(dataset="imdb").load()
    _assert_helpful_offline_message(str(err.value), "imdb", "stanfordnlp/imdb")
    assert isinstance(err.value.__cause__, ConnectionError)


@pytest.mark.unit
def test_hub_loads_only_the_splits_it_knows(monkeypatch):
    import datasets

    requested = []

    def fake(path, split=None, revision=None, **kwargs):
        requested.append((path, split, revision))
        return {"text": ["a b", "c d"], "label": [0, 1]}

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    raw = HubSource(dataset="imdb", revision="abc123").load()
    assert sorted(raw.splits) == ["test", "train"]  # never "unsupervised"
    assert requested == [
        ("stanfordnlp/imdb", "train", "abc123"),
        ("stanfordnlp/imdb", "test", "abc123"),
    ]
    assert raw.num_classes == 2


@pytest.mark.unit
def test_tsv_and_json_array_files(tmp_path):
    _frame(TRAIN, "text", "label").to_csv(tmp_path / "train.tsv", sep="\t", index=False)
    (tmp_path / "test.json").write_text(json.dumps([{"text": t, "label": y} for t, y in TEST]))
    data = prepare_data(
        _spec(tmp_path, train=str(tmp_path / "train.tsv"), test=str(tmp_path / "test.json"))
    )
    assert data.label_names == ["money", "pets", "weather"]
    assert data.test.labels.tolist() == [1, 2]


@pytest.mark.process
def test_offline_set_before_import_goes_through_datasets_and_fails_fast(tmp_path):
    """With HF_HUB_OFFLINE set at start-up, `datasets` itself refuses the network at once."""
    import os
    import subprocess
    import sys

    code = (
        "from fusion_ray.data import DataSpec, prepare_data\n"
        "try:\n"
        f"    prepare_data(DataSpec(source='hub', source_kwargs={{'dataset': 'imdb'}}, cache_dir={str(tmp_path)!r}))\n"
        "except ConnectionError as e:\n"
        "    print('MESSAGE', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "MESSAGE" in out.stdout, out.stderr[-2000:]
    _assert_helpful_offline_message(out.stdout, "imdb", "stanfordnlp/imdb")


@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_missing_column_is_found_before_any_loading(tmp_path, suffix):
    train = _write(_frame(TRAIN), tmp_path / f"train{suffix}")
    test = _write(_frame(TEST, text="txt"), tmp_path / f"test{suffix}")
    problems = check_data_spec(
        _spec(tmp_path, train=train, test=test, text_column="body", label_column="topic")
    )
    assert any("test" in p and "no column 'body'" in p and "txt" in p for p in problems), problems


@pytest.mark.unit
@pytest.mark.parametrize("content", ["", "body,topic\n"], ids=["no-bytes", "header-only"])
def test_an_empty_file_is_named_before_any_loading(tmp_path, content):
    train = _write(_frame(TRAIN), tmp_path / "train.csv")
    (tmp_path / "test.csv").write_text(content)
    problems = check_data_spec(
        _spec(
            tmp_path,
            train=train,
            test=str(tmp_path / "test.csv"),
            text_column="body",
            label_column="topic",
        )
    )
    assert any(str(tmp_path / "test.csv") in p for p in problems), problems


@pytest.mark.unit
@pytest.mark.parametrize("unseen", [7, "sports"], ids=["integer", "string"])
def test_a_test_label_that_no_training_document_has_is_refused(tmp_path, unseen):
    if isinstance(unseen, int):
        train_rows = [(t, i % 2) for i, (t, _) in enumerate(TRAIN)]
        test_rows = [("the cat and the market", 0), ("cold rain today", unseen)]
    else:
        train_rows, test_rows = TRAIN, [*TEST, ("a late goal won the cup", unseen)]
    train = _write(_frame(train_rows), tmp_path / "train.csv")
    test = _write(_frame(test_rows), tmp_path / "test.csv")
    spec = _spec(tmp_path, train=train, test=test, text_column="body", label_column="topic")
    with pytest.raises(
        ValueError,
        match=f"test.csv: row {len(test_rows) - 1} of the test split has label {unseen!r}",
    ):
        prepare_data(spec)


@pytest.mark.unit
def test_a_list_valued_text_column_is_refused_not_stringified(tmp_path):
    frame = pd.DataFrame({"body": [["the", "cat"], ["a", "dog"]] * 6, "topic": ["a", "b"] * 6})
    train = _write(frame, tmp_path / "train.parquet")
    test = _write(frame.head(2), tmp_path / "test.parquet")
    spec = _spec(tmp_path, train=train, test=test, text_column="body", label_column="topic")
    with pytest.raises(
        ValueError, match="train.parquet: row 0 of column 'body' is a ndarray, not text"
    ):
        prepare_data(spec)
