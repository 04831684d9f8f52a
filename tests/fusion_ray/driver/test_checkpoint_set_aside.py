"""The driver's side of a checkpoint a trial could not load: one warning per trial naming the
checkpoint, why, and where it went, a tag on the cell's run, and the epochs trained again from
epoch 0 logged (the resumed run had logged the ones of the attempt set aside)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.driver.callbacks import MLflowSweepCallback
from fusion_ray.driver.tracking import CellRun, Tracker
from fusion_ray.hpo.tracking import MLflowTuningCallback
from fusion_ray.schema import CHECKPOINT_SET_ASIDE_TAG, CHECKPOINT_TAG, EPOCH_METRICS
from fusion_ray.study.workload import StudyWorkload
from fusion_ray.train.result import CHECKPOINT_SET_ASIDE, set_aside_note
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit

EPOCH = {"train_loss": 0.7, "val_loss": 0.69, "val_acc": 0.5, "epoch_seconds": 0.1}


@pytest.fixture
def tracker(mlflow_store, monkeypatch) -> Tracker:
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return Tracker(mlflow_store(), "set_aside")


def _resumed_cell(tracker: Tracker, tmp_path, checkpoint: str):
    """A sweep callback with one cell whose earlier run logged epochs 0-1 and names
    ``checkpoint``, and the Tune trial that resumes it (started)."""
    spec = load_sweep(tiny_sweep(tmp_path))
    cell = expand(spec)[0]
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    earlier = tracker.open_cell_run(cell, parent, None, resume=False)
    for epoch in (0, 1):
        tracker.log_epoch(earlier, {"epoch": epoch, **EPOCH}, EPOCH_METRICS)
    tracker.set_checkpoint(earlier, checkpoint)
    tracker.client.set_terminated(earlier, "KILLED")
    existing = {cell.cell_id: CellRun(earlier, "KILLED", checkpoint)}
    storage = str(tmp_path / "storage")
    callback = MLflowSweepCallback(
        tracker, {cell.cell_id: cell}, existing, parent, storage, workload=StudyWorkload(spec)
    )
    trial = SimpleNamespace(config={"cell_id": cell.cell_id}, trial_id="t1")
    callback.on_trial_start(0, [], trial)
    assert callback.run_ids[cell.cell_id] == earlier and callback.logged_until[cell.cell_id] == 1
    return callback, trial, cell.cell_id, earlier


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_set_aside_checkpoint_is_said_once_tagged_and_its_cell_logged_from_epoch_0(
    tracker, tmp_path, caplog
):
    folder = str(tmp_path / "storage" / "t" / "checkpoint_000001")
    callback, trial, cid, run_id = _resumed_cell(tracker, tmp_path, folder)
    reason = "state.pt: RuntimeError: PytorchStreamReader failed reading zip archive"
    note = set_aside_note(folder, reason, f"{folder}.unreadable")

    with caplog.at_level(logging.WARNING, logger="fusion_ray.driver.callbacks"):
        callback.on_trial_result(0, [], trial, {"epoch": 0, **EPOCH, CHECKPOINT_SET_ASIDE: note})
        callback.on_trial_result(0, [], trial, {"epoch": 1, **EPOCH})
        again = set_aside_note(folder, "state.pt: EOFError", None)  # a retry sets it aside too
        callback.on_trial_result(0, [], trial, {"epoch": 0, **EPOCH, CHECKPOINT_SET_ASIDE: again})

    assert _warnings(caplog) == [
        f"cell {cid}: its checkpoint {folder} could not be loaded ({reason}); it was set aside "
        f"as {folder}.unreadable and the cell started again"
    ]
    run = tracker.client.get_run(run_id)
    assert run.data.tags[CHECKPOINT_SET_ASIDE_TAG] == note
    assert run.data.tags[CHECKPOINT_TAG] == folder  # the next checkpoint replaces it
    # epochs 0 and 1 of the earlier attempt, then 0 and 1 of the new one, then 0 of the retry
    steps = [m.step for m in tracker.client.get_metric_history(run_id, "val_acc")]
    assert sorted(steps) == [0, 0, 0, 1, 1]
    assert cid not in callback.failed


def test_a_uri_is_said_to_be_left_in_place_without_its_secret(
    tracker, tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("LAB_S3_SECRET", "Zq8-very-secret")
    uri = "s3://lab/sweeps/t/checkpoint_000001?secret_key=Zq8-very-secret"
    callback, trial, cid, run_id = _resumed_cell(tracker, tmp_path, "lab/sweeps/t/ckpt")
    note = set_aside_note(uri, "state.pt: EOFError: the file is empty or cut short", None)
    with caplog.at_level(logging.WARNING, logger="fusion_ray.driver.callbacks"):
        callback.on_trial_result(0, [], trial, {"epoch": 0, **EPOCH, CHECKPOINT_SET_ASIDE: note})
    (line,) = _warnings(caplog)
    assert line.startswith(f"cell {cid}: its checkpoint s3://lab/sweeps/t/checkpoint_000001?")
    assert line.endswith("(state.pt: EOFError: the file is empty or cut short); it was left in "
                         "place and the cell started again")  # fmt: skip
    tag = tracker.client.get_run(run_id).data.tags[CHECKPOINT_SET_ASIDE_TAG]
    assert "Zq8-very-secret" not in line and "Zq8-very-secret" not in tag
    assert tag.endswith("; left in place")


def test_a_tuning_trial_says_it_too(tracker, tmp_path, caplog):
    spec = load_sweep(tiny_sweep(tmp_path))
    cell = expand(spec)[0]
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    callback = MLflowTuningCallback(tracker, lambda config: cell, parent, 2, "best_val_acc")
    trial = SimpleNamespace(config={}, trial_id="tune_1")
    callback.on_trial_start(0, [], trial)
    note = set_aside_note("/s/checkpoint_000001", "state.pt: EOFError", "/s/x.unreadable")
    with caplog.at_level(logging.WARNING, logger="fusion_ray.driver.callbacks"):
        callback.on_trial_result(0, [], trial, {"epoch": 0, **EPOCH, CHECKPOINT_SET_ASIDE: note})
    assert _warnings(caplog) == [
        "trial tune_1: its checkpoint /s/checkpoint_000001 could not be loaded (state.pt: "
        "EOFError); it was set aside as /s/x.unreadable and the trial started again"
    ]
    tags = tracker.client.get_run(callback.run_ids["tune_1"]).data.tags
    assert tags[CHECKPOINT_SET_ASIDE_TAG] == note
