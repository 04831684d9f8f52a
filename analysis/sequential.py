"""Anytime-valid decisions on paired seeds under the analysis package's name:
``fusion_ray.decide.sequential`` (``run_family``, ``family_evidence``, ``decision_rows``, ...).

The decision code lives below both packages (like ``fusion_ray.schema``), so the adaptive seed
policy and the report share it without the engine importing the analysis; see that module.
"""

from fusion_ray.decide.sequential import *  # noqa: F403
from fusion_ray.decide.sequential import __all__  # noqa: F401
