"""Small value checks shared by the validators of the data, model, training and sweep settings.

Single-field ranges and choices live on the settings' fields (``Annotated`` constraints and
``Literal`` types) and are checked by pydantic when a setting is built; this module turns
pydantic's errors into the project's messages (``field: must be > 0 (got 0)``) so that every
validator speaks alike, and checks an already-built settings object against its own field
constraints (``field_problems``), for the code paths that build one directly.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import re
from collections.abc import Mapping
from typing import Any


def is_int(value: object) -> bool:
    """An integer (Python or NumPy) but not a bool: what a count or a size in YAML must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to about ``limit`` characters for a message, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}...{text[-8:]} ({len(text):,} characters)"


def shorten_runs(text: str, limit: int = 120) -> str:
    """``text`` with every run of more than ``limit`` non-space characters (a long value echoed
    in a message) shortened by ``shorten``."""
    import re

    return re.sub(rf"\S{{{limit + 1},}}", lambda m: shorten(m.group(0)), text)


_NUMBER_TEXT = re.compile(r"[-+]?[0-9][0-9a-fA-FxXoObB_:]*")


def _too_long_number(value: object) -> bool:
    """An integer too long to be read as one (the sweep file loader keeps it as its text)."""
    return isinstance(value, str) and len(value) > 100 and bool(_NUMBER_TEXT.fullmatch(value))


def error_text(err: Mapping[str, Any], nullable: bool = False) -> str:
    """One pydantic error's problem, without its location: what the value must be and what it
    was. ``nullable``: the field also accepts null (said in the message)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind.startswith(("int_", "float_")) and _too_long_number(err.get("input")):
        digits = len(err["input"])
        return f"must be a number a setting can use (got one written with {digits:,} characters)"
    got = f" (got {shorten(repr(err.get('input')))})"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        bound = ctx[key]
        bound = f"{bound:g}" if isinstance(bound, float) else bound
        return f"must be {sign} {bound}{' or null' if nullable else ''}{got}"
    if kind == "finite_number":
        return f"must be a finite number{got}"
    if kind == "literal_error":
        return f"allowed values: {str(ctx.get('expected', '')).replace(chr(39), '')}{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false{got}"
    if kind in ("int_type", "int_from_float") and isinstance(err.get("input"), bool):
        return f"must be a whole number, not true or false{got}"
    if kind == "float_type" and isinstance(err.get("input"), bool):
        return f"must be a number, not true or false{got}"
    if kind == "value_error":
        return f"{err['msg'].removeprefix('Value error, ')}{got}"
    return f"{err['msg']}{got}"


def not_bool(value: Any) -> Any:
    """For a number field: true or false is no number (pydantic would read them as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


def _number_type(hint: Any) -> type | None:
    """int or float when ``hint`` (``Annotated``, possibly ``| None``) is that number type."""
    import types
    import typing

    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _number_type(args[0]) if len(args) == 1 else None
    return hint if hint in (int, float) else None


@functools.cache
def _number_fields(cls: type) -> dict[str, type]:
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    found = {name: _number_type(hint) for name, hint in hints.items()}
    return {name: kind for name, kind in found.items() if kind is not None}


def bool_number_problems(cls: type, raw: Any, prefix: str = "") -> list[str]:
    """The number fields of the settings dataclass ``cls`` given true or false in ``raw``, as
    ``<prefix><field>: problem`` messages: pydantic reads true as 1, so ``epochs: true`` would
    train one epoch."""
    if not isinstance(raw, dict) or not dataclasses.is_dataclass(cls):
        return []
    fields = _number_fields(cls)
    return [
        f"{prefix}{name}: must be a {'whole number' if fields[name] is int else 'number'}, "
        f"not true or false (got {value!r})"
        for name, value in raw.items()
        if name in fields and isinstance(value, bool)
    ]


@functools.cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def _nullable(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if "None" in str(f.type))


def field_problems(settings: Any, prefix: str = "") -> list[str]:
    """``settings`` (a settings dataclass, possibly built directly in code) checked against its
    fields' types and constraints, as ``<prefix><field>: problem`` messages."""
    from pydantic import ValidationError

    cls: type = type(settings)
    try:
        _adapter(cls).validate_python(dataclasses.asdict(settings))
    except ValidationError as exc:
        nullable = _nullable(cls)
        return [
            f"{prefix}{'.'.join(map(str, e['loc']))}: {error_text(e, e['loc'][0] in nullable)}"
            for e in exc.errors()
        ]
    return []


_HOSTNAME = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def address_problem(address: str) -> str | None:
    """Why ``address`` names no Ray cluster to join, or None: ``auto`` (the cluster started on
    this machine with ``ray start``), ``local`` (a new Ray of the driver's own), or
    ``HOST:PORT`` (the head's GCS; HOST a name, an IPv4 or a bracketed IPv6 address)."""
    if address in ("auto", "local"):
        return None
    host, sep, port = address.rpartition(":")
    ipv6 = host.startswith("[") and host.endswith("]") and len(host) > 2
    if ipv6:
        ipv6 = all(c in "0123456789abcdefABCDEF:." for c in host[1:-1])
    if not sep or not (ipv6 or _HOSTNAME.fullmatch(host)):
        return (
            f"{shorten(repr(address))} is no Ray cluster address: write auto (the cluster started "
            "here with ray start), local (a Ray of the driver's own) or HOST:PORT of the head "
            "(e.g. 10.0.0.5:6379)"
        )
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{shorten(repr(address))}: the port must be a number from 1 to 65535"
    return None
