"""Deprecated: the decisions on paired seeds are ``fusion_ray.decide.sequential`` (``run_family``,
``family_evidence``, ``decision_rows``, ...); import them from there.

This name is kept so that code written against it keeps working; importing it warns.
"""

import warnings

from fusion_ray.decide.sequential import *  # noqa: F403
from fusion_ray.decide.sequential import __all__  # noqa: F401

warnings.warn(
    "analysis.sequential is deprecated: import fusion_ray.decide.sequential instead",
    DeprecationWarning,
    stacklevel=2,
)
