"""A tiny registry: one per pluggable family (fusions, positions, sources, ...).

Entries are classes or functions. Arguments the framework supplies (``d_model``, ``max_len``,
...) are ordinary parameters; arguments a user may set from YAML are keyword-only (after ``*``),
so ``check`` can tell a user exactly which keywords an entry accepts, and checks each value
against the parameter's annotation (``kernel_size: int``, or ``Annotated[int, Ge(1)]``).

Plug-ins: a registry with an entry-point ``group`` (``fusion_ray.fusions``, ...) also loads the
entries other installed packages declare there, the first time it is asked for a name, in every
process that asks (Ray workers too), so a user's package adds operators, positions, sources
and tokenizers that YAML selects by name like the built-in ones. A name declared twice (by a
plug-in and the built-ins, or by two plug-ins) is an error naming both packages. A plug-in
that cannot be imported, or whose object ``accept`` refuses, is kept as a ``BrokenEntry``
instead: one warning when the group loads, and an error naming its package and the fix only
where it is selected by name, so one broken package does not stop every command.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Generic, TypeVar, cast

from fusion_ray.checks import error_text

T = TypeVar("T")

log = logging.getLogger(__name__)

BUILT_IN = "fusion-ray"
"""The origin of the entries registered by this package itself."""


@dataclass(frozen=True)
class BrokenEntry:
    """A plug-in entry point that could not become an entry: kept, with why, so the commands
    that do not select it still run and the ones that do can say what to fix."""

    family: str
    name: str
    package: str
    """The distribution that declares the entry point (what pip installs and uninstalls)."""
    value: str
    """The entry point's ``module:attr``."""
    error: str
    """The exception's type and the first line of its message."""
    imported: bool
    """False: importing ``value`` failed; True: it imported but ``accept`` refused it."""

    @property
    def reason(self) -> str:
        return f"is not a valid {self.family}" if self.imported else "cannot be imported"

    @property
    def fix(self) -> str:
        """The short fix, for ``fusion-ray list``."""
        return f"{'update' if self.imported else 'reinstall'} or remove {self.package}"

    def message(self) -> str:
        """One line: the entry, its package, the error and how to fix it."""
        again = (
            f"install a version of {self.package} made for this fusion-ray"
            if self.imported
            else f"reinstall {self.package} (pip install --force-reinstall {self.package})"
        )
        return (
            f"{self.family} {self.name!r} from {self.package} (entry point {self.value}) "
            f"{self.reason} ({self.error}): {again}, or uninstall it (pip uninstall {self.package})"
        )


class BrokenEntryError(ValueError):
    """An entry selected by name is a ``BrokenEntry``; the message says which and how to fix it."""


def _error_text(exc: BaseException) -> str:
    """``Type: first line of the message`` (the type alone for an empty message)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def unknown_name(family: str, name: str, names: list[str]) -> str:
    """The message for a name no entry of ``family`` has: the allowed names, and the one it is
    close to, if any (``gate_scaler`` -> ``gate_scalar``)."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {family} {name!r}; allowed: {', '.join(names)}{hint}"


class Registry(Generic[T]):
    """Maps names to constructors of one family, with helpful errors for unknown names."""

    def __init__(
        self,
        family: str,
        group: str | None = None,
        *,
        accept: Callable[[Any, str], T] | None = None,
        named: Callable[[T], str] | None = None,
    ) -> None:
        """``group``: the entry-point group plug-ins declare entries in. ``accept(loaded,
        origin)`` turns what an entry point loads into an entry, or raises saying why it cannot
        be one (default: as loaded); ``named(entry)`` is an entry's name when the entry carries
        its own (default: the entry point's name)."""
        self.family, self.group = family, group
        self.accept, self.named = accept, named
        self._entries: dict[str, T] = {}
        self._same_as: dict[str, str] = {}
        self._origin: dict[str, str] = {}
        self._broken: dict[str, BrokenEntry] = {}
        self._plugins_loaded = group is None

    def register(
        self, name: str, *, same_as: str | None = None, origin: str = BUILT_IN
    ) -> Callable[[T], T]:
        """Register an entry under ``name``. ``same_as`` names an entry that this one equals
        (same initial values, same forward; a contract test holds it to that): the study's name
        for a model that another entry already is. ``origin``: the package it comes from."""

        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(
                    f"{self.family} {name!r} is registered twice: by {self._origin[name]} and by "
                    f"{origin}; rename one of them"
                )
            if same_as is not None and same_as not in self._entries:
                raise ValueError(f"{self.family} {name!r}: same_as {same_as!r} is not registered")
            self._entries[name] = entry
            self._origin[name] = origin
            if same_as is not None:
                self._same_as[name] = same_as
            return entry

        return decorator

    def load_plugins(self) -> None:
        """Register the entries of the installed packages' entry-point group (once). An entry
        point that fails to import, or that ``accept`` refuses, is recorded as broken (with one
        warning) instead of raising: only selecting it by name is an error."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if self.group is None:  # a registry without a group has no plug-ins
            return
        for point in sorted(metadata.entry_points(group=self.group), key=lambda p: p.name):
            origin = point.dist.name if point.dist is not None else point.value
            loaded = self._load(point, origin)
            if loaded is None:
                continue
            name, entry = loaded
            if name in self._entries:
                raise ValueError(
                    f"{self.family} {name!r} is registered twice: by {self._origin[name]} and "
                    f"by {origin} (entry point {point.value} in group {self.group}); rename one "
                    "of them"
                )
            self.register(name, origin=origin)(entry)

    def _load(self, point: metadata.EntryPoint, origin: str) -> tuple[str, T] | None:
        """The name and entry of one entry point, or None when it is broken (then recorded in
        ``broken()`` and warned about once)."""
        imported = False
        try:
            entry = point.load()
            imported = True
            if self.accept is not None:
                entry = self.accept(entry, origin)
            name = self.named(entry) if self.named is not None else point.name
        except Exception as exc:  # any error in the plug-in's code: only its entry is broken
            broken = BrokenEntry(
                self.family, point.name, origin, point.value, _error_text(exc), imported
            )
            self._broken.setdefault(point.name, broken)
            log.warning("%s (group %s)", broken.message(), self.group)
            return None
        return name, entry

    def broken(self) -> list[BrokenEntry]:
        """The plug-in entry points of this registry's group that could not be loaded."""
        self.load_plugins()
        return list(self._broken.values())

    def unregister(self, name: str) -> T:
        """Remove the entry ``name`` and return it."""
        self.load_plugins()
        if name not in self._entries:
            raise KeyError(
                f"no {self.family} named {name!r} is registered; registered: "
                + ", ".join(self._entries)
            )
        self._origin.pop(name)
        self._same_as.pop(name, None)
        return self._entries.pop(name)

    def origin(self, name: str) -> str:
        """The package an entry comes from (``fusion-ray`` for the built-ins)."""
        self.get(name)
        return self._origin[name]

    def same_as(self, name: str) -> str | None:
        """The entry that ``name`` is another name for, or None."""
        self.load_plugins()
        return self._same_as.get(name)

    def names(self) -> list[str]:
        self.load_plugins()
        return list(self._entries)

    @property
    def plugins_loaded(self) -> bool:
        """Whether the entry-point group's plug-ins are registered yet."""
        return self._plugins_loaded

    def names_so_far(self) -> list[str]:
        """The names registered so far, without loading the plug-ins (nothing is imported)."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry ``name``; a ``BrokenEntryError`` for a broken plug-in, else a ValueError
        listing the allowed names."""
        if name not in self:
            raise self._not_found(name)
        return self._entries[name]

    def _not_found(self, name: str) -> ValueError:
        """Why ``name`` is not an entry: a broken plug-in (its package and fix) or unknown."""
        broken = self._broken.get(name)
        if broken is not None:
            return BrokenEntryError(broken.message())
        return ValueError(unknown_name(self.family, name, self.names()))

    def build(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """The entry ``name`` called with ``args`` and ``kwargs``, once ``check`` passes."""
        if name not in self:
            raise self._not_found(name)
        problems = self.check(name, kwargs)
        if problems:
            raise ValueError("; ".join(problems))
        # build is only called on registries of classes and factories
        factory = cast("Callable[..., Any]", self.get(name))
        return factory(*args, **kwargs)

    def user_kwargs(self, name: str) -> dict[str, inspect.Parameter]:
        """The keyword-only parameters of an entry: the ones a sweep file may set."""
        return dict(_keyword_only(self.get(name)))

    def check(self, name: str, kwargs: Mapping[str, Any]) -> list[str]:
        """Every problem with ``name`` and ``kwargs``, as messages; empty when valid: unknown
        options, missing ones, and values that do not match their parameter's annotation."""
        if name not in self:
            return [str(self._not_found(name))]
        allowed = self.user_kwargs(name)
        hint = ", ".join(allowed) if allowed else "none"
        problems = [
            f"{self.family} {name!r} has no option {key!r}; allowed options: {hint}"
            for key in kwargs
            if key not in allowed
        ]
        problems += [
            f"{self.family} {name!r} needs option {key!r}"
            for key, p in allowed.items()
            if p.default is inspect.Parameter.empty and key not in kwargs
        ]
        hints = _option_types(self.get(name))
        for key, value in kwargs.items():
            problem = _value_problem(hints.get(key), value) if key in allowed else None
            if problem:
                problems.append(f"{self.family} {name!r} option {key}: {problem}")
        return problems


@functools.cache
def _keyword_only(entry: Callable[..., Any]) -> tuple[tuple[str, inspect.Parameter], ...]:
    """An entry's keyword-only parameters (its signature read once: the decision rules are built
    at every look)."""
    params = inspect.signature(entry).parameters
    return tuple((k, p) for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)


@functools.cache
def _option_types(entry: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of an entry's parameters (of ``__init__`` for a class); {} when
    they cannot be resolved."""
    target = entry.__init__ if inspect.isclass(entry) else entry
    try:
        return typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError):
        return {}


@functools.cache
def _adapter(annotation: Any) -> Any:
    # lazy: analysis shares this module; it loads pydantic only to check an entry's options
    from pydantic import TypeAdapter

    return TypeAdapter(annotation, config={"strict": True})


def _value_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` does not match ``annotation`` (None when it does, or nothing is annotated)."""
    if annotation is None or annotation is Any:
        return None
    # lazy: analysis shares this module; it loads pydantic only to check an entry's options
    from pydantic import ValidationError

    try:
        adapter = _adapter(annotation)
    except TypeError:  # an unhashable annotation: not cached
        adapter = None
    except Exception:  # an annotation pydantic cannot check: the constructor checks the value
        return None
    if adapter is None:
        try:
            adapter = _adapter.__wrapped__(annotation)
        except Exception:
            return None
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return error_text(exc.errors()[0])
    return None
