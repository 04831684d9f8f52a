"""Deprecated: the decision-rule registry is ``fusion_ray.decide.rules``; import it from there.

This name is kept so that plug-ins written against it keep working; importing it warns. The
decision code lives below both packages (like ``fusion_ray.schema``), so the adaptive seed
policy and the report share it without the engine importing the analysis.
"""

import warnings

from fusion_ray.decide.rules import *  # noqa: F403
from fusion_ray.decide.rules import __all__  # noqa: F401

warnings.warn(
    "analysis.rules is deprecated: import fusion_ray.decide.rules instead",
    DeprecationWarning,
    stacklevel=2,
)
