"""Small value checks shared by the validators of the data, model and sweep settings."""

from __future__ import annotations

import numbers


def is_int(value: object) -> bool:
    """An integer (Python or NumPy) but not a bool: what a count or a size in YAML must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
