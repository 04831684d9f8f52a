"""One trial's loop without Ray: determinism, bitwise resume, predictions, early stopping, NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from fusion_ray.train import TrainSpec, run_local
from fusion_ray.train.report import load_checkpoint_dir
from tests.helpers import tiny_trial

pytestmark = pytest.mark.unit


def _weights(out_dir: Path) -> dict[str, torch.Tensor]:
    last = sorted((out_dir / "checkpoints").glob("report_*"))[-1]
    return load_checkpoint_dir(last)["model"]


def _without_timing(metrics: dict) -> dict:
    return {
        k: v
        for k, v in metrics.items()
        if k not in ("latency_ms_per_sample", "train_seconds", "loop_seconds")
    }


def test_same_config_and_seed_twice_gives_identical_metrics(tmp_path, data_cache):
    trial = tiny_trial(data_cache)
    first = run_local(trial, str(tmp_path / "a"))
    second = run_local(trial, str(tmp_path / "b"))
    assert _without_timing(first) == _without_timing(second)
    for name, tensor in _weights(tmp_path / "a").items():
        assert torch.equal(tensor, _weights(tmp_path / "b")[name]), name


def test_stopped_after_epoch_k_and_resumed_is_bitwise_identical(tmp_path, data_cache):
    trial = tiny_trial(data_cache)
    reference = run_local(trial, str(tmp_path / "ref"))
    with pytest.raises(KeyboardInterrupt):
        run_local(trial, str(tmp_path / "resumed"), stop_after_reports=1)  # stopped after epoch 0
    assert len(list((tmp_path / "resumed" / "checkpoints").iterdir())) == 1
    resumed = run_local(trial, str(tmp_path / "resumed"))
    assert _without_timing(resumed) == _without_timing(reference)
    ref_w, res_w = _weights(tmp_path / "ref"), _weights(tmp_path / "resumed")
    assert ref_w.keys() == res_w.keys()
    for name in ref_w:
        assert torch.equal(ref_w[name], res_w[name]), f"{name} differs after resume"
    # the resumed run reported only the epochs it ran, continuing the epoch numbering
    lines = [
        json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m.get("epoch") for m in lines] == [0, 1, 2, None]


def test_final_metrics_and_predictions(tmp_path, data_cache):
    final = run_local(tiny_trial(data_cache), str(tmp_path))
    assert final["test_total"] == 48
    assert final["test_acc"] == pytest.approx(final["test_correct"] / 48)
    assert 0 <= final["best_epoch"] < 3
    assert final["latency_ms_per_sample"] > 0 and final["num_params"] > 0
    last = sorted((tmp_path / "checkpoints").glob("report_*"))[-1]
    preds = pd.read_parquet(last / "test_predictions.parquet")
    assert list(preds.columns) == ["length", "label", "pred"] and len(preds) == 48
    assert (preds["label"] == preds["pred"]).sum() == final["test_correct"]
    history = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][:-1]
    assert final["best_val_acc"] == max(m["val_acc"] for m in history)
    assert history[final["best_epoch"]]["val_acc"] == final["best_val_acc"]


def test_early_stopping_patience(tmp_path, data_cache):
    # lr 0: validation accuracy never improves after epoch 0, so patience 1 stops after epoch 1
    final = run_local(tiny_trial(data_cache, lr=0.0, epochs=6, patience=1), str(tmp_path))
    assert final["epochs_run"] == 2 and final["best_epoch"] == 0


def test_non_finite_loss_fails_with_a_fix(tmp_path, data_cache):
    with pytest.raises(FloatingPointError, match="lower train.lr"):
        run_local(tiny_trial(data_cache, lr=1e30, grad_clip=None, epochs=2), str(tmp_path))


def test_epoch_seconds_are_reported_and_add_up_to_train_seconds(tmp_path, data_cache):
    final = run_local(tiny_trial(data_cache), str(tmp_path))
    history = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][:-1]
    assert all(m["epoch_seconds"] > 0 for m in history)
    assert sum(m["epoch_seconds"] for m in history) == pytest.approx(final["train_seconds"])


def test_rounding_batch_lengths_up_does_not_change_evaluation(data_cache):
    """pad_to_multiple only adds masked padding: the same loss and predictions."""
    from fusion_ray.data import prepare_data
    from fusion_ray.model import build_classifier
    from fusion_ray.train.evaluate import evaluate

    trial = tiny_trial(data_cache)
    data = prepare_data(trial.data)
    model = build_classifier(trial.model, data.vocab_size, data.num_classes, seed=0)
    results = [
        evaluate(
            model,
            data.test,
            batch_size=16,
            device=torch.device("cpu"),
            spec=TrainSpec(pad_to_multiple=multiple),
            pad_to=None,
            want_predictions=True,
        )
        for multiple in (1, 16)
    ]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], rel=1e-5)
    assert results[0]["correct"] == results[1]["correct"]
    assert (results[0]["predictions"] == results[1]["predictions"]).all()


class _Payload:
    """Unpickling this runs code: what a tampered checkpoint could carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "code_ran"
    torch.save({"model": {}, "extra": _Payload(marker)}, tmp_path / "state.pt")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        load_checkpoint_dir(tmp_path)
    assert not marker.exists()
