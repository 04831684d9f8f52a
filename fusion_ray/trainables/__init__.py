"""Bring your own training function: the trainable registry and what a trainable is given.

A trainable is a function ``train(config, seed, report) -> dict[str, float]`` (or a class whose
instances are that call, one instance per trial):

- ``config``: the cell's settings as plain data (a fresh copy per call: the trainable may keep
  or change it);
- ``seed``: the paired seed: every arm of a block gets the same one, so everything the arms do
  not differ in should be drawn from it (the initialisation, the data order, dropout;
  ``fusion_ray.seeds.derive_seed(seed, name)`` gives independent named streams). A trainable that
  draws any of these from elsewhere (the clock, a global RNG left unseeded) breaks the pairing:
  the arms' runs then differ in more than the compared choice;
- ``report(metrics, step=..., checkpoint=...)``: forwards intermediate metrics (names to
  numbers) and, optionally, a checkpoint directory to resume from; ``report.resume_from`` is the
  last checkpoint directory this trial reported (in an earlier attempt), or None to start fresh;
- the returned mapping holds the final metrics (names to numbers).

Trainables are registered by name in ``TRAINABLES`` (``@register_trainable("name")``) or by
other packages in the entry-point group ``fusion_ray.trainables``. ``deterministic=True``
declares that the same config and seed give the same result (``check_trainable`` holds it to
that); ``example`` is a small, fast config the contract suite runs it on.
"""

from fusion_ray.trainables.registry import (
    TRAINABLES,
    TrainableEntry,
    as_trainable,
    register_trainable,
)
from fusion_ray.trainables.report import Report, metric_values, run_trainable

__all__ = [
    "TRAINABLES",
    "Report",
    "TrainableEntry",
    "as_trainable",
    "metric_values",
    "register_trainable",
    "run_trainable",
]
