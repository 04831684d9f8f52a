"""Train short, test long: data.eval_lengths is checked before compute, keeps cell ids of sweeps
that do not use it, and after training scores the best weights on the test split truncated at
each length (final metrics, the per-length predictions artifact, and its MLflow logging)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from fusion_ray.config import SweepFileError, load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.data import DataSpec, check_data_spec, collate, prepare_data
from fusion_ray.model import ModelSpec, build_classifier
from fusion_ray.schema import (
    EVAL_LENGTH_METRIC_PREFIXES,
    LENGTH_PREDICTION_COLUMNS,
    LENGTH_PREDICTIONS_FILE,
    PREDICTIONS_FILE,
)
from fusion_ray.study.workload import final_metric_names, log_predictions
from fusion_ray.train import TrainSpec, TrialConfig, run_local
from fusion_ray.train.evaluate import evaluate_lengths
from fusion_ray.train.report import Reporter, load_checkpoint_dir
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit

MAX_LENGTH = 64
EVAL_LENGTHS = [32, 64, 128, 256]


def order_trial(data_cache: str, eval_lengths: list[int] = EVAL_LENGTHS) -> TrialConfig:
    """The relative synthetic task at test size: training documents of 8-64 words, test
    documents four times as long (32-256 words), trained at 64 tokens."""
    return TrialConfig(
        dataset="order",
        data=DataSpec(
            source="synthetic",
            source_kwargs={
                "regime": "short",
                "relative": True,
                "length_scale": 0.5,
                "test_length_scale": 4,
                "n_train": 160,
                "n_validation": 48,
                "n_test": 48,
            },
            tokenizer="word",
            max_length=MAX_LENGTH,
            eval_lengths=list(eval_lengths),
            cache_dir=data_cache,
        ),
        model=ModelSpec(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=256),
        train=TrainSpec(
            epochs=2,
            batch_size=32,
            lr=2e-3,
            eval_batch_size=8,
            latency_repeats=2,
            latency_batch_size=4,
        ),
        seed=1,
    )


def _final_checkpoint(out: Path) -> Path:
    return sorted((out / "checkpoints").glob("report_*"))[-1]


@pytest.fixture(scope="module")
def order_run(tmp_path_factory, data_cache):
    """(trial, final metrics, final checkpoint directory) of one tiny trial with eval lengths."""
    out = tmp_path_factory.mktemp("order_run")
    trial = order_trial(data_cache)
    final = run_local(trial, str(out))
    return trial, final, _final_checkpoint(out)


# ----------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    "eval_lengths, message",
    [
        ([0, 64], "every length must be a positive integer, got 0"),
        ([128, 64], "[128, 64] is not in increasing order; write [64, 128]"),
        ([64, 128, 64], "[64, 128, 64] repeats a length; write [64, 128]"),
        ([64, 2.5], "every length must be a positive integer, got 2.5"),
        (128, "must be a list of token counts"),
    ],
)
def test_bad_eval_lengths_are_problems_that_say_the_fix(eval_lengths, message):
    problems = check_data_spec(DataSpec(eval_lengths=eval_lengths))
    assert [p for p in problems if p.startswith("data.eval_lengths: ")] == [
        next(p for p in problems if message in p)
    ], problems
    assert check_data_spec(DataSpec(eval_lengths=[256, 512, 1024])) == []


def _sweep_with(tmp_path: Path, eval_lengths: list[int] | None, max_len: int = 64) -> Path:
    path = tiny_sweep(tmp_path)
    raw = yaml.safe_load(path.read_text())
    if eval_lengths is not None:
        raw["datasets"]["short"]["data"]["eval_lengths"] = eval_lengths
    raw["defaults"]["model"]["max_len"] = max_len
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_position_tables_must_cover_the_longest_eval_length(tmp_path):
    with pytest.raises(SweepFileError) as info:
        load_sweep(_sweep_with(tmp_path, [64, 128]))
    message = str(info.value)
    assert (
        "model.max_len: 64 is shorter than the longest of data.eval_lengths (128), which the "
        "position tables must cover; set model.max_len >= 128"
    ) in message
    assert load_sweep(_sweep_with(tmp_path, [64, 128], max_len=128)).name == "tiny"
    with pytest.raises(SweepFileError, match=r"write \[32, 64\]"):
        load_sweep(_sweep_with(tmp_path, [64, 32]))


def test_an_empty_eval_lengths_keeps_the_cell_ids(tmp_path):
    ids = {c.cell_id for c in expand(load_sweep(_sweep_with(tmp_path, None)))}
    assert {c.cell_id for c in expand(load_sweep(_sweep_with(tmp_path, [])))} == ids
    used = {c.cell_id for c in expand(load_sweep(_sweep_with(tmp_path, [64])))}
    assert used.isdisjoint(ids) and len(used) == len(ids)


# ----------------------------------------------------------------------------- the trial


def test_each_length_has_its_final_metrics(order_run):
    trial, final, _ = order_run
    acc, correct, total = EVAL_LENGTH_METRIC_PREFIXES
    for length in EVAL_LENGTHS:
        assert final[f"{total}{length}"] == 48
        assert final[f"{acc}{length}"] == final[f"{correct}{length}"] / 48
    # At the training length the per-length evaluation is the usual test evaluation.
    assert final[f"{correct}{MAX_LENGTH}"] == final["test_correct"]
    assert final["test_total"] == 48


def test_the_length_predictions_are_in_the_final_checkpoint(order_run):
    trial, final, checkpoint = order_run
    frame = pd.read_parquet(checkpoint / LENGTH_PREDICTIONS_FILE)
    usual = pd.read_parquet(checkpoint / PREDICTIONS_FILE)
    assert list(frame.columns) == list(LENGTH_PREDICTION_COLUMNS)
    assert all(str(t) == "int64" for t in frame.dtypes)
    assert frame["eval_length"].unique().tolist() == EVAL_LENGTHS
    for length, rows in frame.groupby("eval_length"):
        assert rows["doc"].tolist() == list(range(48))
        assert rows["length"].tolist() == usual["length"].tolist()
        assert rows["label"].tolist() == usual["label"].tolist()
        correct = int((rows["pred"] == rows["label"]).sum())
        assert correct == final[f"{EVAL_LENGTH_METRIC_PREFIXES[1]}{length}"]
    at_max = frame[frame["eval_length"] == MAX_LENGTH]
    assert at_max["pred"].tolist() == usual["pred"].tolist()
    # the test documents really are longer than training's: truncation at 64 cuts most of them
    assert (usual["length"] > MAX_LENGTH).mean() > 0.5 and usual["length"].max() <= 256
    # only the final checkpoint carries the file
    assert [p.parent for p in checkpoint.parent.glob(f"*/{LENGTH_PREDICTIONS_FILE}")] == [
        checkpoint
    ]


def test_whole_documents_are_scored_at_the_longest_length(order_run, data_cache):
    """The artifact's predictions at 256 (every document whole) again, one document at a time
    without padding, from the best weights: batching, padding and truncation change nothing."""
    trial, _, checkpoint = order_run
    data = prepare_data(trial.data)
    model = build_classifier(trial.model, data.vocab_size, data.num_classes, trial.seed)
    model.load_state_dict(load_checkpoint_dir(checkpoint)["best_model"])
    model.eval()
    whole = data.test_at(256)
    assert [len(d) for d in whole.ids] == whole.lengths.tolist()
    with torch.no_grad():
        preds = [int(model(collate(whole, [i])["input_ids"]).argmax(-1)) for i in range(len(whole))]
    frame = pd.read_parquet(checkpoint / LENGTH_PREDICTIONS_FILE)
    assert frame[frame["eval_length"] == 256]["pred"].tolist() == preds


class _Recording(torch.nn.Module):
    """A classifier that records the shape of every batch it scores."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.shapes = inner, []

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        self.shapes.append(tuple(input_ids.shape))
        return self.inner(input_ids, mask)


def test_long_lengths_run_in_fewer_documents_per_batch(order_run):
    trial, final, _ = order_run
    data = prepare_data(trial.data)
    model = _Recording(build_classifier(trial.model, data.vocab_size, data.num_classes, 0))
    for length in EVAL_LENGTHS:
        model.shapes.clear()
        one = dataclasses.replace(trial.data, eval_lengths=[length])
        metrics, frame = evaluate_lengths(
            model, data, dataclasses.replace(trial, data=one), Reporter()
        )
        per_batch = max(1, 8 * MAX_LENGTH // max(length, MAX_LENGTH))  # eval_batch_size 8
        assert max(b for b, _ in model.shapes) == per_batch
        assert max(w for _, w in model.shapes) == min(length, int(data.test.lengths.max()))
        assert sum(b for b, _ in model.shapes) == 48 and len(frame) == 48
    no_lengths = dataclasses.replace(trial, data=dataclasses.replace(trial.data, eval_lengths=[]))
    assert evaluate_lengths(model, data, no_lengths, Reporter()) == ({}, None)


def test_a_trial_without_eval_lengths_has_neither_metrics_nor_file(tmp_path, data_cache):
    final = run_local(order_trial(data_cache, eval_lengths=[]), str(tmp_path))
    assert not [k for k in final if k.startswith(EVAL_LENGTH_METRIC_PREFIXES)]
    checkpoint = _final_checkpoint(tmp_path)
    assert (checkpoint / PREDICTIONS_FILE).exists()
    assert not (checkpoint / LENGTH_PREDICTIONS_FILE).exists()


# ----------------------------------------------------------------------------- MLflow


def test_the_tracker_logs_the_length_metrics_and_the_artifact(order_run, tmp_path, mlflow_store):
    from fusion_ray.driver.tracking import Tracker

    _, final, checkpoint = order_run
    tracker = Tracker(mlflow_store(), "lengths")
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    tracker.log_final(run_id, final, final_metric_names(final))
    assert log_predictions(tracker, run_id, str(checkpoint))
    metrics = tracker.client.get_run(run_id).data.metrics
    for length in EVAL_LENGTHS:
        for prefix in EVAL_LENGTH_METRIC_PREFIXES:
            assert metrics[f"{prefix}{length}"] == pytest.approx(final[f"{prefix}{length}"])
    assert metrics["test_acc"] == pytest.approx(final["test_acc"])
    artifacts = {a.path for a in tracker.client.list_artifacts(run_id)}
    assert {PREDICTIONS_FILE, LENGTH_PREDICTIONS_FILE} <= artifacts
    logged = pd.read_parquet(
        tracker.client.download_artifacts(run_id, LENGTH_PREDICTIONS_FILE, str(tmp_path))
    )
    pd.testing.assert_frame_equal(logged, pd.read_parquet(checkpoint / LENGTH_PREDICTIONS_FILE))
    assert np.isfinite(list(metrics.values())).all()


def test_disentangled_with_untrained_distance_rows_is_refused_before_ray_starts(tmp_path):
    """Trained at 64 tokens and evaluated at 256, disentangled with max_distance 128 would read
    the rows of distances 64-127 untouched by training: refused, naming the grid point and the
    fix, in the dry run too (load_sweep is its validation); max_distance 64, or no evaluation
    beyond the training length, is accepted."""
    path = tiny_sweep(tmp_path, name="dis")
    raw = yaml.safe_load(path.read_text())
    raw["datasets"]["short"]["data"]["eval_lengths"] = [64, 256]
    raw["defaults"]["model"]["max_len"] = 256
    raw["grid"]["attention_positions"] = [{"name": "disentangled", "max_distance": 128}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SweepFileError) as info:
        load_sweep(path)
    (problem,) = info.value.problems
    assert problem.startswith("grid point short/sinusoidal/disentangled(max_distance=128)/add")
    assert "distances 64 to 127 are never trained" in problem
    assert "max_distance: 64} or less" in problem
    assert (
        len(
            expand(
                load_sweep(
                    path, ["grid.attention_positions=[{name: disentangled, max_distance: 64}]"]
                )
            )
        )
        == 4
    )
    assert expand(load_sweep(path, ["data.eval_lengths=[]"]))
    # the default (512) is checked too
    with pytest.raises(SweepFileError, match="max_distance 512 exceeds"):
        load_sweep(path, ["grid.attention_positions=[disentangled]"])
