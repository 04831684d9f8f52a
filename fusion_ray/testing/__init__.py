"""The registry contract suites, for a plug-in author's own pytest.

Each registry a sweep file selects from by name has one function that runs every contract
check on one entry, by its registered name (so the check goes through the same registry, and
the same entry-point loading, as a sweep), and raises ``AssertionError`` naming the entry and
the check that failed:

- ``check_fusion(name, options)``: a fusion operator (group ``fusion_ray.fusions``);
- ``check_position(name, options)``: an input-level position (``fusion_ray.positions``);
- ``check_attention_position(name, options)``: an attention-level position
  (``fusion_ray.attention_positions``);
- ``check_source(name, options, data)``: a data source (``fusion_ray.sources``);
- ``check_tokenizer(name, options)``: a tokenizer (``fusion_ray.tokenizers``);
- ``check_statistic(name)``: a report statistic (``fusion_ray.statistics``);
- ``check_decision_rule(name)``: a decision rule (``fusion_ray.decision_rules``);
- ``check_launcher(name)``: a launch target (``fusion_ray.launchers``; ``fusion-ray cluster
  NAME``), which needs ``bash`` on PATH;
- ``check_trainable(name, config)``: a training function (``fusion_ray.trainables``): its
  metric, determinism where declared, seeds that differ, reports, resume from its checkpoint.

``options`` are the entry's keyword options as a sweep file writes them (``fusion_kwargs``,
``source_kwargs``, ...). A plug-in's test file needs a few lines::

    from fusion_ray.testing import check_fusion, check_source

    def test_my_operator_keeps_the_contract():
        check_fusion("my_operator", {"width": 4})

    def test_my_source_keeps_the_contract(tmp_path):
        check_source("my_source", {"n": 50}, cache_dir=str(tmp_path))

The single checks each suite runs are public too (``fusion_ray.testing.model``, ``.data``,
``.stats``, ``.rules``); fusion-ray's own contract tests call them over every registered entry,
plug-ins included, so there is one copy of each check.
"""

from fusion_ray.testing.data import check_source, check_tokenizer
from fusion_ray.testing.launch import check_launcher
from fusion_ray.testing.model import check_attention_position, check_fusion, check_position
from fusion_ray.testing.rules import (
    check_anytime_crossing,
    check_decision_rule,
    check_determinism_and_persistence,
    check_equivalence_validity,
    check_interval,
    check_no_look_ahead,
    check_null_validity,
)
from fusion_ray.testing.stats import check_statistic
from fusion_ray.testing.trainables import check_trainable

__all__ = [
    "check_anytime_crossing",
    "check_attention_position",
    "check_decision_rule",
    "check_determinism_and_persistence",
    "check_equivalence_validity",
    "check_fusion",
    "check_interval",
    "check_launcher",
    "check_no_look_ahead",
    "check_null_validity",
    "check_position",
    "check_source",
    "check_statistic",
    "check_tokenizer",
    "check_trainable",
]
