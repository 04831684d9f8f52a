"""The trainable registry: names to training functions (the built-in study encoder is one,
declared like any plug-in in the entry-point group ``fusion_ray.trainables``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from fusion_ray.registry import BUILT_IN, Registry


@dataclass(frozen=True)
class TrainableEntry:
    """A registered trainable: the function (or class) and what it declares of itself."""

    function: Callable[..., Any]
    """``train(config, seed, report)``, or a class whose instances are that call."""
    deterministic: bool = False
    """The same config and seed give the same result (on the same machine)."""
    example: Mapping[str, Any] | None = None
    """A small, fast config the contract suite (``check_trainable``) runs it on."""

    @property
    def qualname(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"

    def call(self, config: dict[str, Any], seed: int, report: Any) -> Any:
        """One trial: a class is instantiated (no arguments) for it, a function called."""
        run = self.function() if inspect.isclass(self.function) else self.function
        return cast("Callable[..., Any]", run)(config, seed, report)


def _positional_arity_problem(function: Callable[..., Any]) -> str | None:
    """Why ``function`` cannot be called as ``(config, seed, report)``, if it cannot."""
    target = function.__call__ if inspect.isclass(function) else function
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: trusted
    params = list(signature.parameters.values())
    if inspect.isclass(function) and params and params[0].name == "self":
        params = params[1:]
    try:
        inspect.Signature(params).bind(None, None, None)
    except TypeError:
        shown = ", ".join(p.name for p in params) or "nothing"
        return f"takes ({shown}); a trainable takes (config, seed, report)"
    return None


def as_trainable(loaded: Any, origin: str = BUILT_IN) -> TrainableEntry:
    """What an entry point (or ``register_trainable``) loads, as an entry; raises TypeError
    saying why it cannot be one. ``deterministic`` and ``example_config`` attributes of the
    function or class are its declarations."""
    if isinstance(loaded, TrainableEntry):
        return loaded
    if not callable(loaded):
        raise TypeError(
            f"{type(loaded).__name__} from {origin} is not callable; a trainable is a function "
            "train(config, seed, report) -> dict[str, float], or a class with that __call__"
        )
    problem = _positional_arity_problem(loaded)
    if problem is not None:
        raise TypeError(f"{getattr(loaded, '__qualname__', loaded)} {problem}")
    example = getattr(loaded, "example_config", None)
    if example is not None and not isinstance(example, Mapping):
        raise TypeError(f"example_config of {loaded.__qualname__} must be a mapping")
    return TrainableEntry(loaded, bool(getattr(loaded, "deterministic", False)), example)


TRAINABLES: Registry[TrainableEntry] = Registry(
    "trainable", "fusion_ray.trainables", accept=as_trainable
)
"""Trainables by name: a sweep file's ``trainable: NAME``."""


def register_trainable(
    name: str, *, deterministic: bool = False, example: Mapping[str, Any] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``train(config, seed, report)`` (or a class with that call) as ``name``; the
    function is returned unchanged, with ``deterministic`` and ``example_config`` set on it so
    that an entry point naming it declares the same."""

    def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
        function.deterministic = deterministic  # type: ignore[attr-defined]
        function.example_config = dict(example) if example is not None else None  # type: ignore[attr-defined]
        TRAINABLES.register(name)(as_trainable(function))
        return function

    return decorator
