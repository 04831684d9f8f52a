"""A package's names imported on first use (``module_getattr``): importing one submodule (the
settings, for validation) then does not import torch, pandas and the rest. Standard library
only."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def module_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``exports`` (name -> the module it
    lives in) imported from its module when first asked for."""

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
