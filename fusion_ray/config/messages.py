"""Where a sweep file's problem is and what it may have meant: the line of the key a problem
names (``key_lines``, ``line_suffix``) and the known key a misspelled one is close to
(``keys_at``, ``unknown_key_text``). YAML and the standard library only.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import os
import stat
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel


def key_lines(path: str | Path, max_bytes: int, max_values: int) -> dict[str, int]:
    """Each dotted key of the YAML file at ``path`` (``datasets.short.data.max_length``) with the
    1-based line it is written on; {} when the file cannot be read as YAML (its problem then
    says why). A list's items have their own line (``grid.fusions[1]``), and their keys are
    stepped over (``include``'s keys are ``include.KEY``)."""
    root = _compose(path, max_bytes)
    found: dict[str, int] = {}
    todo: collections.deque[tuple[str, Any]] = collections.deque([("", root)])  # document order
    seen: set[int] = set()  # an alias is its anchor's node again: each node is walked once
    while todo and len(found) < max_values:
        prefix, node = todo.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                found.setdefault(key, key_node.start_mark.line + 1)
                todo.append((key, value_node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found.setdefault(f"{prefix}[{i}]", item.start_mark.line + 1)
            todo.extend((prefix, item) for item in node.value)
    return found


def _compose(path: str | Path, max_bytes: int) -> Any:
    """The YAML node tree of the regular file at ``path``; None when it cannot be read as YAML
    or is larger than ``max_bytes``."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
            return None
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
        if len(data) > max_bytes:
            return None
        return yaml.compose(data.decode("utf-8"), Loader=yaml.SafeLoader)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None


def line_suffix(problem: str, lines_of: dict[str, int]) -> str:
    """``:LINE`` for the key a problem begins with (its longest prefix the file writes), else ''."""
    where = problem.partition(": ")[0]
    parts = where.split(".")
    for end in range(len(parts), 0, -1):
        line = lines_of.get(".".join(parts[:end]))
        if line is not None:
            return f":{line}"
    return ""


def _members(tp: Any) -> list[Any]:
    """The types a field's annotation may hold a value of (``Annotated`` and unions opened)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _fields(tp: Any) -> dict[str, Any]:
    """The keys of a pydantic model or dataclass with their annotations ({} for other types)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: f.annotation for name, f in tp.model_fields.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(tp)}
    return {}


def keys_at(root: Any, loc: Sequence[Any]) -> list[str]:
    """The keys the type ``root`` allows at ``loc`` (a pydantic error's location, the unknown
    key last): a mapping's or list's own keys are stepped over. [] when it cannot tell."""
    current = [root]
    for step in loc[:-1]:
        nxt = []
        for tp in (m for c in current for m in _members(c)):
            origin, args = typing.get_origin(tp), typing.get_args(tp)
            if origin in (dict, collections.abc.Mapping) and len(args) == 2:
                nxt.append(args[1])  # a mapping's key (a dataset's name) is any text
            elif origin in (list, tuple, collections.abc.Sequence) and args:
                nxt.append(args[0])
            elif isinstance(step, str) and step in _fields(tp):
                nxt.append(_fields(tp)[step])
        current = nxt
    return sorted({k for c in current for m in _members(c) for k in _fields(m)})


def unknown_key_text(key: str, known: Sequence[str]) -> str:
    """What to say of an unknown key: the known key it is likely a misspelling of, if any."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return f"unknown key; did you mean {close[0]!r}? (or remove it)"
    return "unknown key; remove it or check its spelling"
