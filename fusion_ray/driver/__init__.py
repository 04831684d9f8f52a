"""The driver: everything that runs trials on Ray for a sweep or a tuning run.

- ``session``: one driver session (Ray start-up, the lease and its fencing, the parent run,
  signals, the lost-head watch, full storage, a vanished store, the exit codes);
- ``runner``: the sweep driver (``run_sweep``): the seed policy's Tune runs inside a session;
- ``lease``, ``preflight``, ``placement``: one driver per sweep; the store checks and the
  placement check before anything is queued;
- ``job`` and ``trial``: the typed job handed across Ray and the trial's entry on the other side
  (the Tune trainable, direct or DDP, its resources and device);
- ``storage``: where a trial's checkpoints and results live, and what a finished trial left;
- ``callbacks`` and ``tracking``: the Ray Tune callbacks, writing through the Tracker, the only
  module of ``fusion_ray`` that imports MLflow.

The package's ``__init__`` imports nothing, so importing one of its modules loads only what
that module needs.
"""
