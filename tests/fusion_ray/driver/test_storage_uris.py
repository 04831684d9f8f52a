"""A checkpoint path read back from the tracking store is trusted only under the sweep's own
storage, compared as a parsed URI: a tag planted on a shared tracking server must not make the
driver send signed storage requests to a host of someone else's choosing."""

from __future__ import annotations

import socket
import threading

import pytest
import yaml

from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.driver.storage import (
    _directory_exists,
    checkpoint_exists,
    finish_ended_trials,
    resume_point,
    within_storage,
)
from fusion_ray.driver.tracking import CellRun
from fusion_ray.policy.plan import Plan
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class Listener:
    """A loopback TCP listener that counts the connections it receives and answers each with
    403 Forbidden."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:  # an S3 error no client retries: the client is told at once
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(FORBIDDEN)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.close()


def test_a_planted_endpoint_in_a_checkpoint_tag_reaches_no_host(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFUSIONRAYTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    path = tiny_sweep(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["storage_path"] = "s3://lab-bucket/fusion"
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    cell = expand(spec)[0]
    listener = Listener()
    try:
        planted = (
            "s3://lab-bucket/fusion/run/checkpoint_000001"
            f"?endpoint_override=127.0.0.1:{listener.port}&scheme=http&region=us-east-1"
        )
        assert not within_storage(planted, spec.storage_path)
        existing = {cell.cell_id: CellRun("run-1", "FAILED", planted, has_final=True)}
        assert resume_point(spec, cell, existing) is None
        todo = Plan([cell], existing)
        finish_ended_trials(spec, None, todo, None)  # tracker, workload: only past the guard
        assert todo.done == set()
        assert listener.connections == 0
        # the check itself holds the guard: it does not connect either
        assert checkpoint_exists(planted, spec.storage_path) is False
        assert listener.connections == 0
        # the listener is reachable: the same URI looked at without the guard does connect to it
        assert _directory_exists(planted) is False
        assert listener.connections > 0
    finally:
        listener.close()


def test_the_storage_paths_own_query_is_kept_and_no_other():
    storage = "s3://bucket/prefix?endpoint_override=minio:9000&scheme=http"
    assert within_storage("bucket/prefix/run/checkpoint", storage)
    assert within_storage(f"s3://bucket/prefix/run?{storage.split('?')[1]}", storage)
    assert not within_storage("s3://bucket/prefix/run?endpoint_override=evil:9000", storage)
    assert not within_storage("s3://bucket/prefix/../other/run", storage)
    assert not within_storage("s3://bucket/prefix/run#x", storage)
    assert not within_storage("s3://user@bucket/prefix/run", storage)
    assert not within_storage("gs://bucket/prefix/run", storage)


def test_a_run_finished_from_storage_names_the_driver_that_finished_it(tmp_path, mlflow_store):
    """A trial that ended (final metrics, final checkpoint) while its driver was paused or dead
    is finished from storage by the next driver, and the FINISHED run carries that driver's
    lease token like every run its callback finishes (one token per FINISHED run)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.schema import LEASE_TOKEN_TAG, PREDICTIONS_FILE
    from fusion_ray.study.workload import StudyWorkload

    spec = load_sweep(tiny_sweep(tmp_path, tracking_uri=mlflow_store()))
    cell = expand(spec)[0]
    tracker = Tracker(spec.tracking_uri, spec.name)
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    checkpoint = tmp_path / "ray_results" / "tiny-train" / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    pd.DataFrame({"label": [0, 1], "prediction": [0, 0]}).to_parquet(checkpoint / PREDICTIONS_FILE)
    todo = Plan([cell], {cell.cell_id: CellRun(run_id, "RUNNING", str(checkpoint), True)})

    workload = StudyWorkload(spec)
    finish_ended_trials(spec, tracker, todo, workload, lease_token="token-of-the-second-driver")

    run = MlflowClient(spec.tracking_uri).get_run(run_id)
    assert todo.done == {cell.cell_id}
    assert run.info.status == "FINISHED"
    assert run.data.tags[LEASE_TOKEN_TAG] == "token-of-the-second-driver"


def test_a_trainables_ended_trial_is_finished_from_storage_without_the_studys_files(
    tmp_path, mlflow_store
):
    """A trainable's checkpoint is its own folder (no study predictions in it): a run that holds
    its returned metrics and a checkpoint in storage is finished from it, not trained again;
    one without its final metrics is left to run."""
    from mlflow.tracking import MlflowClient

    from fusion_ray import api
    from fusion_ray.config.workload import cells_of
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.driver.workload import workload_for

    path = tmp_path / "t.yaml"
    raw = {
        "name": "t", "trainable": "study", "grid": {"model.fusion": ["add", "concat"]},
        "seeds": [0], "tracking_uri": mlflow_store(), "storage_path": str(tmp_path / "ray_results"),
    }  # fmt: skip
    path.write_text(yaml.safe_dump(raw))
    spec = api.load(path)
    ended, running = cells_of(spec)
    tracker = Tracker(spec.tracking_uri, spec.name)
    runs = [tracker.client.create_run(tracker.experiment_id).info.run_id for _ in range(2)]
    checkpoint = tmp_path / "ray_results" / "t" / "checkpoint_000003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text("{}")
    existing = {
        ended.cell_id: CellRun(runs[0], "RUNNING", str(checkpoint), has_final=True),
        running.cell_id: CellRun(runs[1], "RUNNING", str(checkpoint), has_final=False),
    }
    todo = Plan([ended, running], existing)

    finish_ended_trials(spec, tracker, todo, workload_for(spec), lease_token="token")

    assert todo.done == {ended.cell_id}
    client = MlflowClient(spec.tracking_uri)
    assert [client.get_run(r).info.status for r in runs] == ["FINISHED", "RUNNING"]
