"""``analysis.rules`` and ``analysis.sequential``, the decision code's old names in the analysis
package, still work for plug-ins written against them, and say where the code lives now."""

from __future__ import annotations

import importlib

import pytest

from fusion_ray.decide import rules, sequential

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "old, new", [("analysis.rules", rules), ("analysis.sequential", sequential)]
)
def test_an_old_name_warns_and_gives_the_same_objects(old, new):
    with pytest.warns(DeprecationWarning, match=new.__name__):
        module = importlib.reload(importlib.import_module(old))
    assert all(getattr(module, name) is getattr(new, name) for name in new.__all__)
