"""The study's encoder as a trainable, ``study`` (declared in the entry-point group
``fusion_ray.trainables`` like any plug-in): ``config`` is a trial's config as plain data (the
fields of ``TrialConfig``: dataset, data, model, train), ``seed`` its paired seed; the loop is
``run_trial``'s, its reports and checkpoints go through the ``Report`` it is given, and it
returns the final metrics' numbers (test accuracy first)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusion_ray.redact import redact
from fusion_ray.train.report import CheckpointSource, Reporter, load_checkpoint_dir
from fusion_ray.train.spec import TrialConfig
from fusion_ray.trainables import Report

EXAMPLE: dict[str, Any] = {
    "dataset": "short",
    "data": {
        "source": "synthetic",
        "source_kwargs": {
            "regime": "short",
            "n_train": 96,
            "n_validation": 32,
            "n_test": 32,
            "window": 32,
        },
        "tokenizer": "word",
        "max_length": 48,
    },
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_len": 48},
    "train": {"epochs": 2, "batch_size": 32, "latency_repeats": 1, "latency_batch_size": 4},
}
"""A tiny trial on synthetic documents (seconds on a CPU), for the contract suite."""


@functools.cache
def _adapter() -> Any:
    # lazy: pydantic's adapter for the whole trial is built once per process, on first use
    from pydantic import TypeAdapter

    return TypeAdapter(TrialConfig)


def trial_config(config: dict[str, Any], seed: int) -> TrialConfig:
    """``config`` (a trial's fields as plain data) at ``seed``, validated."""
    return _adapter().validate_python({**config, "seed": seed})


@dataclass
class ReportReporter(Reporter):
    """The training loop's ``Reporter`` over a trainable's ``Report``: metrics and checkpoints
    go through the report; a resume reads the state file of the report's ``resume_from``."""

    through: Report = field(kw_only=True, repr=False)

    def restore(self) -> dict[str, Any] | None:
        folder = self.through.resume_from
        if folder is None:
            return None
        self.restored_from = CheckpointSource(redact(str(folder)), Path(folder))
        return load_checkpoint_dir(folder)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        numbers = {k: v for k, v in self.with_note(metrics).items() if _number(v)}
        self.through(numbers, checkpoint=checkpoint_dir)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def study(config: dict[str, Any], seed: int, report: Report) -> dict[str, float]:
    """Train, validate and test the study's encoder on ``config`` at ``seed``."""
    # lazy: the training loop imports pandas and pyarrow; only a trial's process trains
    from fusion_ray.train.loop import run_trial

    trial = trial_config(config, seed)
    reporter = ReportReporter(rank=report.rank, world_size=report.world_size, through=report)
    final = run_trial(trial, reporter)
    first = {"test_acc": final["test_acc"]}
    return first | {k: float(v) for k, v in final.items() if _number(v) and k not in first}


study.deterministic = True  # type: ignore[attr-defined]
study.example_config = EXAMPLE  # type: ignore[attr-defined]
