"""Log a synthetic sweep that follows the MLflow schema, for tests, the benchmark and demos.

Nothing here trains a model: accuracies come from a small generative model with a per-seed
effect shared by every operator (the paired-seed blocking the real sweep provides), a
per-document difficulty shared by every run of a dataset, and operator effects that may grow
with document length. Everything is logged through public MlflowClient calls, one
``log_batch`` per run, so a few thousand runs take minutes rather than hours.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusion_ray.schema import (
    CELLS_ARTIFACT,
    DISPLAY_ORDER_TAG,
    OPERATOR_KWARGS_PREFIX,
    OPERATOR_PARAM,
    PARENT_TAG,
    PREDICTIONS_FILE,
    ROLE_SWEEP,
    ROLE_TAG,
    ROLE_TRIAL,
    TRIAL_TAGS,
)

#: Median document length (tokens) and base accuracy (logit) of the synthetic regimes.
REGIMES: dict[str, tuple[float, float]] = {
    "short": (40.0, 2.3),
    "medium": (230.0, 1.6),
    "long": (3000.0, 0.4),
}


@dataclass
class SyntheticSweep:
    """What to log: the grid, the test-set size and the operators' true effects (logit units)."""

    name: str = "synthetic"
    datasets: Mapping[str, str] = field(
        default_factory=lambda: {"ag_news": "short", "imdb": "medium", "arxiv": "long"}
    )
    """Dataset name -> regime (a key of REGIMES)."""
    positions: Sequence[str] = ("sinusoidal",)
    attention_positions: Sequence[str] = ("none",)
    operators: Sequence[str] = ("add", "concat", "gate_scalar")
    """Operator labels as the sweep writes them in tag ``fusion`` (``name`` or ``name(k=v)``)."""
    seeds: Sequence[int] = (0, 1, 2, 3, 4, 5)
    effects: Mapping[str, float] = field(
        default_factory=lambda: {"concat": 0.05, "gate_scalar": 0.1}
    )
    """Operator -> effect on the logit at the longest documents (scaled by relative length)."""
    test_size: int = 200
    num_classes: int = 4
    epochs: int = 3
    max_length: int = 512
    predictions: bool = True
    """Log ``test_predictions.parquet`` for every run."""
    extra_params: Mapping[str, Any] = field(default_factory=dict)
    """Params added to (or overriding) every run's flattened config."""
    with_parent: bool = True
    cells_artifact: bool = True
    """Log ``sweep_cells.json`` (every cell id of this grid) to the parent run, as the sweep
    driver does at each invocation."""
    cell_salt: str = ""
    """Mixed into every cell id when set: a changed sweep file under the same name (another
    number of epochs, say) gets new cell ids, as the sweep's config-derived ids do."""

    def cell_id(self, dataset: str, position: str, attention: str, op: str, seed: int) -> str:
        """The cell id of one cell of this grid."""
        salt = (self.cell_salt,) if self.cell_salt else ()
        return synthetic_cell_id(dataset, position, attention, op, seed, *salt)


def operator_name(label: str) -> str:
    """The registry name inside an operator label ``name(k=v,...)``."""
    return label.split("(", 1)[0]


def operator_kwargs(label: str) -> dict[str, str]:
    """The options inside an operator label ``name(k=v,...)``, as strings."""
    if "(" not in label:
        return {}
    inner = label.split("(", 1)[1].rstrip(")")
    pairs = [p.split("=", 1) for p in inner.split(",") if p.strip()]
    return {k.strip(): v.strip() for k, v in pairs}


def flat_config(
    dataset: str,
    regime: str,
    position: str,
    attention_position: str,
    operator: str,
    seed: int,
    *,
    max_length: int = 512,
    num_classes: int = 4,
    epochs: int = 3,
) -> dict[str, Any]:
    """A trial's config flattened with dots, shaped like the sweep's TrialConfig."""
    cfg: dict[str, Any] = {
        "dataset": dataset,
        "seed": seed,
        "data.source": "synthetic",
        "data.source_kwargs.regime": regime,
        "data.num_classes": num_classes,
        "data.validation_fraction": 0.1,
        "data.split_seed": 1234,
        "data.max_train_samples": None,
        "data.tokenizer": "bpe",
        "data.tokenizer_kwargs.vocab_size": 8000,
        "data.max_length": max_length,
        "model.d_model": 128,
        "model.n_heads": 8,
        "model.n_layers": 2,
        "model.d_ff": 256,
        "model.dropout": 0.1,
        "model.activation": "relu",
        "model.norm_first": False,
        "model.max_len": max_length,
        OPERATOR_PARAM: operator_name(operator),
        "model.position": position,
        "model.position_kwargs": "{}",
        "model.attention_position": attention_position,
        "model.attention_position_kwargs": "{}",
        "train.optimizer": "adamw",
        "train.lr": 0.0003,
        "train.weight_decay": 0.01,
        "train.schedule": "constant",
        "train.warmup_steps": 0,
        "train.batch_size": 64,
        "train.eval_batch_size": 128,
        "train.epochs": epochs,
        "train.patience": None,
        "train.grad_clip": 1.0,
        "train.padding": "dynamic",
        "train.precision": "auto",
        "train.latency_repeats": 20,
        "train.latency_batch_size": 32,
    }
    kwargs = operator_kwargs(operator)
    for k, v in kwargs.items():
        cfg[OPERATOR_KWARGS_PREFIX + k] = v
    if not kwargs:  # the sweep flattens an empty dict to one param, "{}"
        cfg[OPERATOR_KWARGS_PREFIX.rstrip(".")] = "{}"
    return cfg


def _rng(*key: object) -> np.random.Generator:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _test_set(dataset: str, regime: str, n: int, num_classes: int):
    """Lengths, labels and difficulty of a dataset's fixed test split (no trial seed involved)."""
    median, _ = REGIMES[regime]
    rng = _rng("test-set", dataset)
    length = np.maximum(3, rng.lognormal(np.log(median), 0.6, n)).astype(np.int64)
    label = rng.integers(0, num_classes, n)
    difficulty = rng.normal(0.0, 1.0, n)
    return length, label, difficulty


def simulate_run(
    dataset: str,
    regime: str,
    setting: tuple[str, str],
    operator: str,
    seed: int,
    effects: Mapping[str, float],
    test_size: int,
    num_classes: int,
) -> dict[str, np.ndarray]:
    """Per-document predictions of one synthetic run (common random numbers within a seed)."""
    length, label, difficulty = _test_set(dataset, regime, test_size, num_classes)
    _, base = REGIMES[regime]
    seed_rng = _rng("seed", dataset, setting, seed)
    seed_effect = seed_rng.normal(0.0, 0.15)
    u = seed_rng.random(test_size)  # shared by every operator of this seed: the pairing
    rel = np.log(length) / np.log(max(length.max(), 2))  # 0..1, grows with length
    effect = float(effects.get(operator, effects.get(operator_name(operator), 0.0)))
    own = _rng("operator-noise", dataset, setting, operator, seed).normal(0.0, 0.05)
    logit = base - difficulty + seed_effect + effect * 4.0 * (rel - 0.5) + effect + own
    correct = u < 1.0 / (1.0 + np.exp(-logit))
    wrong = (label + 1 + _rng("wrong", dataset, seed).integers(0, num_classes - 1, test_size)) % (
        num_classes
    )
    pred = np.where(correct, label, wrong)
    return {"length": length, "label": label, "pred": pred}


def _latency(operator: str) -> float:
    base = {"add": 0.10, "concat": 0.12, "gate_scalar": 0.13, "gate_cnn": 0.14}
    return base.get(operator_name(operator), 0.15)


def log_trial(
    client: Any,
    experiment_id: str,
    *,
    tags: Mapping[str, Any],
    params: Mapping[str, Any],
    final_metrics: Mapping[str, float],
    epoch_metrics: Sequence[Mapping[str, float]] = (),
    predictions: Mapping[str, np.ndarray] | None = None,
    parent_run_id: str | None = None,
    status: str = "FINISHED",
    tmp_dir: str | Path | None = None,
) -> str:
    """Log one trial run exactly as the schema says, with a single log_batch; returns its id."""
    from mlflow.entities import Metric, Param

    all_tags = {str(k): str(v) for k, v in tags.items()}
    all_tags.setdefault(ROLE_TAG, ROLE_TRIAL)
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = client.create_run(experiment_id, tags=all_tags, run_name=all_tags.get("cell_id"))
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in final_metrics.items()]
    for epoch, row in enumerate(epoch_metrics):
        metrics += [Metric(k, float(v), now, epoch) for k, v in row.items()]
    plist = [Param(k, str(v)) for k, v in params.items()]
    # log_batch accepts at most 100 params and 1000 metrics per call
    for b in range(max(-(-len(plist) // 100), -(-len(metrics) // 1000), 1)):
        client.log_batch(
            run_id,
            metrics=metrics[b * 1000 : (b + 1) * 1000],
            params=plist[b * 100 : (b + 1) * 100],
        )
    if predictions is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(dir=tmp_dir) as d:
            path = Path(d) / PREDICTIONS_FILE
            table = pa.table({k: np.asarray(v) for k, v in predictions.items()})
            pq.write_table(table, path)
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status)
    return run_id


def synthetic_cell_id(*parts: object) -> str:
    """The cell id a synthetic sweep gives (dataset, position, attention, operator, seed)."""
    return hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()[:12]


def iter_cells(spec: SyntheticSweep) -> Iterable[tuple[str, str, str, str, str, int]]:
    """Seed-major grid order, as the sweep schedules it."""
    for seed in spec.seeds:
        for dataset, regime in spec.datasets.items():
            for position in spec.positions:
                for attention in spec.attention_positions:
                    for op in spec.operators:
                        yield dataset, regime, position, attention, op, seed


@dataclass
class SyntheticTrial:
    """What one synthetic trial run logs."""

    tags: dict[str, Any]
    params: dict[str, Any]
    final_metrics: dict[str, float]
    epoch_metrics: list[dict[str, float]]
    predictions: dict[str, np.ndarray]


def simulate_trial(
    spec: SyntheticSweep,
    dataset: str,
    regime: str,
    position: str,
    attention: str,
    op: str,
    seed: int,
) -> SyntheticTrial:
    """The tags, params, metrics and predictions of one cell of a synthetic sweep."""
    sim = simulate_run(
        dataset,
        regime,
        (position, attention),
        op,
        seed,
        spec.effects,
        spec.test_size,
        spec.num_classes,
    )
    correct = int((sim["pred"] == sim["label"]).sum())
    total = spec.test_size
    rng = _rng("metrics", dataset, position, attention, op, seed)
    val = [min(0.99, correct / total - 0.05 * (spec.epochs - e)) for e in range(spec.epochs)]
    params = flat_config(
        dataset,
        regime,
        position,
        attention,
        op,
        seed,
        max_length=spec.max_length,
        num_classes=spec.num_classes,
        epochs=spec.epochs,
    )
    params.update(spec.extra_params)
    values = (spec.cell_id(dataset, position, attention, op, seed), dataset, position)
    values += (attention, op, seed, spec.name, "0" * 40)
    tags: dict[str, Any] = dict(zip(TRIAL_TAGS, values, strict=True))
    tags[ROLE_TAG] = ROLE_TRIAL
    final = {
        "test_acc": correct / total,
        "best_val_acc": max(val),
        "best_epoch": int(np.argmax(val)),
        "test_correct": correct,
        "test_total": total,
        "latency_ms_per_sample": _latency(op) * (1 + 0.05 * rng.standard_normal()),
        "num_params": 100_000 + 128 * len(op),
        "train_seconds": 10.0 + rng.random(),
    }
    epochs = [
        {"train_loss": 1.0 / (e + 1), "val_loss": 1.1 / (e + 1), "val_acc": v}
        for e, v in enumerate(val)
    ]
    return SyntheticTrial(tags, params, final, epochs, sim)


def log_synthetic_sweep(
    spec: SyntheticSweep,
    tracking_uri: str,
    *,
    artifact_location: str | None = None,
    skip: Iterable[tuple[str, str, int]] = (),
    progress: bool = False,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Log a whole synthetic sweep (parent run + one child per cell); returns ids.

    ``skip`` holds (dataset, operator, seed) cells to leave out, to make a partial sweep.
    ``parent_run_id`` logs into that existing parent run instead of a new one, as the sweep
    driver reuses its parent run when the sweep runs again (its ``sweep_cells.json`` is
    replaced by this grid's).
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    exp_id = (
        exp.experiment_id
        if exp is not None
        else client.create_experiment(spec.name, artifact_location=artifact_location)
    )
    parent_id = parent_run_id or (_start_parent(client, exp_id, spec) if spec.with_parent else None)
    if parent_id and spec.cells_artifact:
        cells = [spec.cell_id(d, p, a, o, s) for d, _, p, a, o, s in iter_cells(spec)]
        log_sweep_cells(client, parent_id, spec.name, cells)
    skipped = set(skip)
    run_ids = []
    t0 = time.perf_counter()
    for i, (dataset, regime, position, attention, op, seed) in enumerate(iter_cells(spec)):
        if (dataset, op, seed) in skipped:
            continue
        trial = simulate_trial(spec, dataset, regime, position, attention, op, seed)
        run_id = log_trial(
            client,
            exp_id,
            tags=trial.tags,
            params=trial.params,
            final_metrics=trial.final_metrics,
            epoch_metrics=trial.epoch_metrics,
            predictions=trial.predictions if spec.predictions else None,
            parent_run_id=parent_id,
        )
        run_ids.append(run_id)
        if progress and (i + 1) % 500 == 0:
            print(f"  logged {i + 1} runs in {time.perf_counter() - t0:.0f} s", flush=True)
    if parent_id:
        client.set_terminated(parent_id, "FINISHED")
    return {"experiment_id": exp_id, "parent_run_id": parent_id, "run_ids": run_ids}


def log_sweep_cells(client: Any, parent_run_id: str, sweep: str, cell_ids: Sequence[str]) -> None:
    """Log ``sweep_cells.json`` to the parent run, shaped as the sweep driver writes it."""
    payload = {
        "sweep": sweep,
        "cells": list(cell_ids),
        "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / CELLS_ARTIFACT
        path.write_text(json.dumps(payload), encoding="utf-8")
        client.log_artifact(parent_run_id, str(path))


def _start_parent(client: Any, exp_id: str, spec: SyntheticSweep) -> str:
    """Create the sweep's parent run, tagged with the grid's size as the sweep tags it."""
    tags = {
        ROLE_TAG: ROLE_SWEEP,
        "sweep": spec.name,
        "cells": str(sum(1 for _ in iter_cells(spec))),
        "seeds": str(list(spec.seeds)),
        # as the driver records it: the operators as the fusion registry lists them (the
        # built-ins' order; the grid's here), the datasets in the sweep file's order
        DISPLAY_ORDER_TAG: json.dumps(
            {"operator": list(spec.operators), "dataset": list(spec.datasets)}
        ),
    }
    parent = client.create_run(exp_id, tags=tags, run_name=f"{spec.name}-sweep")
    return parent.info.run_id


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tests.synthetic``: log a demo sweep to try the report without training."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.synthetic", description=main.__doc__)
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--name", default="synthetic_demo", help="experiment (sweep) name")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--artifact-location", default=None)
    args = p.parse_args(argv)
    spec = SyntheticSweep(
        name=args.name,
        operators=("add", "concat", "gate_scalar", "gate_cnn(kernel_size=3)"),
        effects={"concat": 0.04, "gate_scalar": 0.12, "gate_cnn(kernel_size=3)": 0.06},
        seeds=tuple(range(args.seeds)),
        test_size=args.test_size,
    )
    ids = log_synthetic_sweep(spec, args.tracking_uri, artifact_location=args.artifact_location)
    print(
        f"logged {len(ids['run_ids'])} synthetic runs to experiment {args.name!r} at "
        f"{args.tracking_uri}; now: python -m analysis.report --experiment {args.name} "
        f"--tracking-uri {args.tracking_uri}"
    )


if __name__ == "__main__":
    main()
