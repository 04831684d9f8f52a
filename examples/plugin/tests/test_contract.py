"""The example plug-in's own tests: each of its entries goes through fusion-ray's registry
contract suite, by the name a sweep file would use (so through the entry points, as a sweep
loads it). Run them with the package installed:

    pip install -e examples/plugin
    python -m pytest examples/plugin/tests
"""

from __future__ import annotations

from fusion_ray.testing import check_decision_rule, check_fusion, check_source


def test_position_gate_keeps_the_fusion_contract():
    check_fusion("position_gate")


def test_position_gate_keeps_it_with_its_option():
    check_fusion("position_gate", {"init_bias": 2.0})


def test_keywords_keeps_the_data_source_contract(tmp_path):
    options = {"num_classes": 3, "n_train": 60, "n_test": 20, "words": 8}
    check_source("keywords", options, {"max_length": 16}, cache_dir=str(tmp_path))


def test_sign_closure_keeps_the_decision_rule_contract():
    check_decision_rule("sign_closure")
