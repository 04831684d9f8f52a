"""Decisions on paired seeds, below both the engine and the analysis (like ``fusion_ray.schema``).

``rules``: the decision-rule registry (how one comparison's per-seed deltas become e-processes;
built-ins ``magnitude``, the default, and ``sign``; plug-ins from the entry-point group
``fusion_ray.decision_rules``). ``sequential``: a family of comparisons combined into one state
per seed (``run_family``, ``family_evidence``), pure functions of the deltas in seed order.

Pure code (numpy, scipy, ``fusion_ray.registry``): no torch, Ray or MLflow. The adaptive seed
policy (``fusion_ray.policy.seed_policy``) and the report (``analysis``) both import it, so neither
reaches into the other.
"""
