"""What a checkpoint folder holds is uploaded only when it is the trial's own: a regular file of
the folder itself, after resolving links. A link planted in a checkpoint under a shared
``storage_path`` would otherwise make the driver upload any file its user can read to the
tracking server, where the planter reads it back; a FIFO would block the driver."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from fusion_ray.driver.tracking import Tracker
from fusion_ray.schema import GATES_FILE, PREDICTIONS_FILE
from fusion_ray.study.workload import log_predictions

pytestmark = pytest.mark.unit

PRIVATE = b"-----BEGIN OPENSSH PRIVATE KEY----- planted-private-bytes"


def _checkpoint(tmp_path, name: str):
    folder = tmp_path / "storage" / name / "checkpoint_000001"
    folder.mkdir(parents=True)
    return folder


def _uploaded(tracker: Tracker, run_id: str, tmp_path) -> dict[str, bytes]:
    out = tmp_path / "downloaded" / run_id
    tracker.client.download_artifacts(run_id, "", str(out))
    return {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.fixture
def tracker(mlflow_store, monkeypatch) -> Tracker:
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return Tracker(mlflow_store(), "planted")


def test_a_link_to_a_private_file_is_not_uploaded_and_the_run_is_not_finished_from_it(
    tracker, tmp_path, caplog
):
    private = tmp_path / "home" / "id_ed25519"
    private.parent.mkdir()
    private.write_bytes(PRIVATE)
    folder = _checkpoint(tmp_path, "linked")
    (folder / PREDICTIONS_FILE).symlink_to(private)
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    assert log_predictions(tracker, run_id, str(folder)) is False  # as if it had none
    assert _uploaded(tracker, run_id, tmp_path) == {}
    assert "a link out of the folder" in caplog.text and PREDICTIONS_FILE in caplog.text


def test_the_trials_own_files_are_uploaded_and_a_planted_extra_is_not(tracker, tmp_path):
    private = tmp_path / "secret.txt"
    private.write_bytes(PRIVATE)
    folder = _checkpoint(tmp_path, "own")
    pd.DataFrame({"length": [3], "label": [1], "pred": [1]}).to_parquet(folder / PREDICTIONS_FILE)
    (folder / GATES_FILE).symlink_to(private)
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    assert log_predictions(tracker, run_id, str(folder)) is True
    uploaded = _uploaded(tracker, run_id, tmp_path)
    assert set(uploaded) == {PREDICTIONS_FILE}
    assert all(PRIVATE not in data for data in uploaded.values())


def test_a_link_inside_the_folder_is_read_and_a_fifo_is_not(tracker, tmp_path):
    folder = _checkpoint(tmp_path, "inside")
    pd.DataFrame({"length": [3], "label": [1], "pred": [0]}).to_parquet(folder / "real.parquet")
    (folder / PREDICTIONS_FILE).symlink_to(folder / "real.parquet")  # the folder's own file
    os.mkfifo(folder / GATES_FILE)  # opening it would block the driver
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    assert log_predictions(tracker, run_id, str(folder)) is True
    assert set(_uploaded(tracker, run_id, tmp_path)) == {PREDICTIONS_FILE}


def test_the_experiment_opens_on_its_runs_in_mlflows_ui(mlflow_store, monkeypatch):
    """MLflow 3's UI shows an experiment without ``mlflow.experimentKind`` as an empty
    LLM-tracing dashboard: every sweep's experiment is tagged as model development, one made
    before the tag existed too."""
    from mlflow import MlflowClient

    from fusion_ray.schema import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    uri = mlflow_store()
    made = Tracker(uri, "tagged")
    client = MlflowClient(uri)
    assert client.get_experiment(made.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    old = client.create_experiment("older")  # as an earlier fusion-ray made it
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    Tracker(uri, "older")
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
