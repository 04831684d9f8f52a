"""Which cells of a sweep run, and when: seed policies and what they are made of.

- ``seed_policy``: the ``SeedPolicy`` interface, the fixed and the adaptive policy, and
  ``policy_for`` (the one place a sweep's policy is chosen);
- ``schedule``: the adaptive policy's state (``SeedSchedule``: which seed each comparison needs
  next, from the finished runs, decided by a rule of ``fusion_ray.decide``);
- ``searcher``: the Ray Tune searcher that suggests the schedule's cells as results arrive;
- ``plan``: the sweep's cells against what the experiment already holds (done, pending, other
  settings).

The policies decide from finished runs; they write through the small protocols in
``seed_policy`` and import nothing of ``fusion_ray.driver``.
"""
