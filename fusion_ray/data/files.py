"""Tables of documents on disk, as the local and hub sources read them: the formats (CSV, TSV,
JSON Lines, JSON, Parquet), the problems a file's columns can have (said before any reading of
the whole file), the columns read, and labels encoded as class indices.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fusion_ray.checks import is_int
from fusion_ray.data.raw import RawSplit

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def file_format(path: str | Path) -> str | None:
    return FORMATS.get(Path(path).suffix.lower())


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    """JSON lines (or, for .json, one array of objects); invalid UTF-8 bytes become U+FFFD."""
    with open(path, encoding="utf-8", errors="replace") as f:
        content = f.read()
    if path.suffix.lower() == ".json" and content.lstrip().startswith("["):
        try:
            records = json.loads(content)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        numbered = list(enumerate(records, start=1))
        where = "item"
    else:
        numbered = []
        for lineno, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}: line {lineno} is not valid JSON ({e.msg}); each line of a .jsonl "
                    'file must be one JSON object such as {"text": ..., "label": ...}'
                ) from None
        where = "line"
    for number, obj in numbered:
        if not isinstance(obj, dict):
            raise ValueError(
                f"{path}: {where} {number} is a JSON {type(obj).__name__}, not an object"
            )
    return [obj for _, obj in numbered]


def _missing_column(path: Path, column: str, role: str, columns: list[str]) -> ValueError:
    return ValueError(
        f"{path}: no column {column!r} ({role}); columns are "
        f"{', '.join(map(str, columns)) or 'none'}; set data.source_kwargs.{role}"
    )


def table_problems(path: str | Path, text_column: str, label_column: str) -> list[str]:
    """What would stop ``read_table`` on this file, found by reading only its head: an unreadable
    or empty file, a missing text or label column. Cheap enough to run before Ray starts."""
    import pandas as pd

    path = Path(path)
    fmt = file_format(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            columns, rows = pq.read_schema(path).names, pq.read_metadata(path).num_rows
        elif fmt in ("csv", "tsv"):
            head = pd.read_csv(
                path, sep="," if fmt == "csv" else "\t", nrows=1, encoding_errors="replace"
            )
            columns, rows = list(head.columns), len(head)
        else:  # jsonl / json: the first record says which columns there are
            with open(path, encoding="utf-8", errors="replace") as f:
                first = next((line for line in f if line.strip()), None)
            if first is not None and first.lstrip().startswith("["):
                return []  # a JSON array: checked when read
            record = json.loads(first) if first is not None else {}
            columns, rows = (
                (sorted(record) if isinstance(record, dict) else []),
                int(first is not None),
            )
    except Exception as exc:  # noqa: BLE001 - any reader error becomes one line naming the file
        return [
            f"{path}: cannot be read as {fmt} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ]
    if rows == 0:
        return [f"{path}: has no rows; it needs at least one document"]
    return [
        str(_missing_column(path, column, role, columns))
        for role, column in (("text_column", text_column), ("label_column", label_column))
        if column not in columns
    ]


def read_table(path: str | Path, text_column: str, label_column: str) -> tuple[list, list]:
    """Texts and raw labels from one csv/tsv/jsonl/json/parquet file."""
    path = Path(path)
    fmt = file_format(path)
    if fmt == "jsonl":
        texts, labels = _read_jsonl_columns(path, text_column, label_column)
    elif fmt in ("csv", "tsv", "parquet"):
        texts, labels = _read_frame_columns(path, fmt, text_column, label_column)
    else:
        raise ValueError(
            f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FORMATS)}"
        )
    for row, t in enumerate(texts):
        if isinstance(t, (list, tuple, dict, set, np.ndarray)):
            raise ValueError(
                f"{path}: row {row} of column {text_column!r} is a {type(t).__name__}, not text; "
                "the text column must hold strings (join list columns into one string first)"
            )
    texts = [
        t if isinstance(t, str) else (None if t is None or _is_nan(t) else str(t)) for t in texts
    ]
    return texts, labels


def _check_columns(path: Path, columns: list[str], text_column: str, label_column: str) -> None:
    for role, column in (("text_column", text_column), ("label_column", label_column)):
        if column not in columns:
            raise _missing_column(path, column, role, columns)


def _read_jsonl_columns(path: Path, text_column: str, label_column: str) -> tuple[list, list]:
    records = _read_json_records(path)
    if records:
        _check_columns(path, sorted({k for r in records for k in r}), text_column, label_column)
    return [r.get(text_column) for r in records], [r.get(label_column) for r in records]


def _read_frame_columns(
    path: Path, fmt: str, text_column: str, label_column: str
) -> tuple[list, list]:
    """The two columns of a csv, tsv or parquet file, read as written."""
    import pandas as pd

    sep = "," if fmt == "csv" else "\t"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        columns = pq.read_schema(path).names
    else:
        columns = list(pd.read_csv(path, sep=sep, nrows=0, encoding_errors="replace").columns)
    _check_columns(path, columns, text_column, label_column)
    if fmt == "parquet":
        frame = pd.read_parquet(path, columns=[text_column, label_column])
    else:
        frame = pd.read_csv(
            path,
            sep=sep,
            usecols=[text_column, label_column],
            encoding="utf-8",
            encoding_errors="replace",
            # Texts stay verbatim ("NA" is a word); an empty label cell is missing.
            keep_default_na=False,
            na_values={label_column: [""]},
            dtype={text_column: str},
        )
    return frame[text_column].tolist(), frame[label_column].tolist()


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and x != x


def encode_labels(splits: dict[str, RawSplit]) -> tuple[int | None, list[str] | None]:
    """Integer labels stay as they are; string labels map to ints in sorted order over all splits.

    Returns (num_classes, label_names): for strings, the count and the sorted names; for ints,
    max + 1 (the range check in prepare_data reports negative or missing labels).
    """
    values = [v for s in splits.values() for v in s.labels]
    strings = {v for v in values if isinstance(v, str)}
    if strings:
        non_str = [
            (name, s.row(i), v)
            for name, s in splits.items()
            for i, v in enumerate(s.labels)
            if not isinstance(v, str)
        ]
        if non_str:
            name, row, v = non_str[0]
            raise ValueError(
                f"{splits[name].origin}: row {row} has label {v!r} while other labels are strings; "
                "use one label type per column (all class names or all integers 0..C-1)"
            )
        names = sorted(strings)
        index = {n: i for i, n in enumerate(names)}
        for s in splits.values():
            s.labels = [index[v] for v in s.labels]
        return len(names), names
    # Integer-valued floats (e.g. from a parquet float column) are accepted as ints.
    for s in splits.values():
        s.labels = [int(v) if isinstance(v, float) and v.is_integer() else v for v in s.labels]
    ints = [int(v) for v in values if is_int(v) or (isinstance(v, float) and v.is_integer())]
    return (max(ints) + 1 if ints else None), None
