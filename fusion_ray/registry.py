"""A tiny registry: one per pluggable family (fusions, positions, sources, ...).

Entries are classes or functions. Arguments the framework supplies (``d_model``, ``max_len``,
...) are ordinary parameters; arguments a user may set from YAML are keyword-only (after ``*``),
so ``check`` can tell a user exactly which keywords an entry accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Callable[..., Any])


class Registry(Generic[T]):
    """Maps names to constructors of one family, with helpful errors for unknown names."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, T] = {}
        self._same_as: dict[str, str] = {}

    def register(self, name: str, *, same_as: str | None = None) -> Callable[[T], T]:
        """Register an entry under ``name``. ``same_as`` names an entry that this one equals
        (same initial values, same forward; a contract test holds it to that): the study's name
        for a model that another entry already is."""

        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            if same_as is not None and same_as not in self._entries:
                raise ValueError(f"{self.family} {name!r}: same_as {same_as!r} is not registered")
            self._entries[name] = entry
            if same_as is not None:
                self._same_as[name] = same_as
            return entry

        return decorator

    def same_as(self, name: str) -> str | None:
        """The entry that ``name`` is another name for, or None."""
        return self._same_as.get(name)

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"unknown {self.family} {name!r}; allowed: {', '.join(self.names())}")
        return self._entries[name]

    def build(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        problems = self.check(name, kwargs)
        if problems:
            raise ValueError("; ".join(problems))
        return self.get(name)(*args, **kwargs)

    def user_kwargs(self, name: str) -> dict[str, inspect.Parameter]:
        """The keyword-only parameters of an entry: the ones a sweep file may set."""
        params = inspect.signature(self.get(name)).parameters
        return {k: p for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def check(self, name: str, kwargs: Mapping[str, Any]) -> list[str]:
        """Every problem with ``name`` and ``kwargs``, as messages; empty when valid."""
        if name not in self._entries:
            return [f"unknown {self.family} {name!r}; allowed: {', '.join(self.names())}"]
        allowed = self.user_kwargs(name)
        problems = []
        for key in kwargs:
            if key not in allowed:
                hint = ", ".join(allowed) if allowed else "none"
                problems.append(
                    f"{self.family} {name!r} has no option {key!r}; allowed options: {hint}"
                )
        missing = [
            k
            for k, p in allowed.items()
            if p.default is inspect.Parameter.empty and k not in kwargs
        ]
        for key in missing:
            problems.append(f"{self.family} {name!r} needs option {key!r}")
        return problems
