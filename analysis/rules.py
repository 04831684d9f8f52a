"""The decision-rule registry under the analysis package's name: ``fusion_ray.decide.rules``.

The decision code lives below both packages (like ``fusion_ray.schema``), so the adaptive seed
policy and the report share it without the engine importing the analysis; see that module.
"""

from fusion_ray.decide.rules import *  # noqa: F403
from fusion_ray.decide.rules import __all__  # noqa: F401
