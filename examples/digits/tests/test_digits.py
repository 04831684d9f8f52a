"""The example trainable's own tests: fusion-ray's contract suite on it, by the name a sweep file
uses (so through its entry point), and what pairing by the seed means for it. Run them with the
package installed:

    pip install -e examples/digits
    python -m pytest examples/digits/tests
"""

from __future__ import annotations

import pytest
import torch
from fusion_ray_digits.trainable import batch_order, model, settings

from fusion_ray.testing import check_trainable


def test_digits_mlp_keeps_the_trainable_contract():
    assert check_trainable("digits_mlp") == "test_acc"


def test_it_keeps_it_with_label_smoothing_and_another_width():
    check_trainable("digits_mlp", {"epochs": 2, "hidden": 16, "label_smoothing": 0.1})


def test_arms_at_one_seed_start_from_the_same_weights_and_other_seeds_do_not():
    plain = model(settings({"label_smoothing": 0.0}), seed=3).state_dict()
    smoothed = model(settings({"label_smoothing": 0.1}), seed=3).state_dict()
    other = model(settings({"label_smoothing": 0.0}), seed=4).state_dict()
    assert all(torch.equal(plain[k], smoothed[k]) for k in plain)
    assert not all(torch.equal(plain[k], other[k]) for k in plain)


def test_arms_at_one_seed_see_the_same_batches_and_each_epoch_its_own_order():
    assert torch.equal(batch_order(3, 0, 100), batch_order(3, 0, 100))
    assert not torch.equal(batch_order(3, 0, 100), batch_order(3, 1, 100))
    assert not torch.equal(batch_order(3, 0, 100), batch_order(4, 0, 100))


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"smoothing": 0.1}, r"unknown settings \['smoothing'\]"),
        ({"activation": "swish"}, "activation must be one of"),
        ({"label_smoothing": 1.0}, r"must be in \[0, 1\)"),
        ({"epochs": 0}, "epochs must be an integer >= 1"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(config, says):
    with pytest.raises(ValueError, match=says):
        settings(config)
