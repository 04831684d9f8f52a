"""A decision rule brought by a plug-in: the sign e-process decided by closed testing.

fusion-ray's ``sign`` rule combines its comparisons with Holm on running maxima; closed testing
with the mean of current e-values (what the built-in ``magnitude`` rule uses) decides unanimous
comparisons earlier. Same evidence, same null, another family procedure: a subclass is enough.
Select it with ``seeds: {adaptive: true, rule: sign_closure}``; ``fusion_ray.testing``'s
``check_decision_rule("sign_closure")`` is its contract test.
"""

from __future__ import annotations

from fusion_ray.decide.rules import SignRule


class SignClosure(SignRule):
    """The KT sign e-process (counts wins only), combined by closed testing."""

    name = "sign_closure"
    family = "closure"
