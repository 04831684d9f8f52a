"""A trainable's cell resumes from its last checkpoint, as the study's do: in Tune's retry of a
trial that raised (``retries``), and in a second invocation after the first was stopped by a
signal (the MLflow run continued, no step logged twice). The trainable is a plug-in package
installed into a folder of its own (``counter``: it counts epochs, checkpoints each one, and
raises or waits where a file the test controls says so); each sweep is a driver process with
its own local Ray, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.process

COUNTER = """
import json, time
from pathlib import Path

CONTROL = Path({control!r})


def train(config, seed, report):
    start = 0
    if report.resume_from is not None:
        start = json.loads(Path(report.resume_from, "state.json").read_text())["epoch"]
    for epoch in range(start, config["epochs"]):
        if epoch == 2 and (CONTROL / "raise").exists():
            (CONTROL / "raise").unlink()  # once: the retry goes through
            raise RuntimeError("counter: failing once at epoch 2")
        while epoch == 2 and (CONTROL / "hold").exists():
            (CONTROL / "waiting").touch()
            time.sleep(0.1)
        folder = CONTROL / f"ckpt-{{seed}}-{{epoch}}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.json").write_text(json.dumps({{"epoch": epoch + 1}}))
        report({{"value": float(epoch)}}, step=epoch, checkpoint=str(folder))
    return {{"score": float(seed + config["level"]), "started_at": float(start)}}
"""


def _install(site: Path, control: Path) -> str:
    (site / "counter_trainable").mkdir(parents=True)
    (site / "counter_trainable" / "__init__.py").write_text(COUNTER.format(control=str(control)))
    info = site / "counter_trainable-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-trainable\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fusion_ray.trainables]\ncounter = counter_trainable:train\n"
    )
    return str(site)


def _sweep(tmp_path: Path, retries: int) -> Path:
    raw = {
        "name": "counter",
        "trainable": "counter",
        "defaults": {"epochs": 4},
        "grid": {"level": [0, 1]},
        "seeds": [0],
        "resources": {"cpus_per_worker": 1, "max_concurrent_trials": 1},
        "retries": retries,
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "storage_path": str(tmp_path / "ray_results"),
    }
    path = tmp_path / "counter.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _command(path: Path) -> list[str]:
    return [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]


def _env(site: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}


def _runs(path: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(yaml.safe_load(path.read_text())["tracking_uri"])
    experiment = client.get_experiment_by_name("counter")
    runs = client.search_runs([experiment.experiment_id], "tags.role = 'trial'")
    return [(r, client.get_metric_history(r.info.run_id, "value")) for r in runs]


def test_tunes_retry_of_a_trainable_resumes_from_its_last_checkpoint(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    (control / "raise").touch()  # the first cell to reach epoch 2 raises, once
    site = _install(tmp_path / "site", control)
    path = _sweep(tmp_path, retries=1)
    proc = subprocess.run(
        _command(path), cwd=tmp_path, env=_env(site), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "its trial failed (RuntimeError: counter: failing once at epoch 2)" in proc.stdout
    runs = _runs(path)
    assert len(runs) == 2 and {r.info.status for r, _ in runs} == {"FINISHED"}
    started = sorted(r.data.metrics["started_at"] for r, _ in runs)
    assert started == [0.0, 2.0]  # one ran through; the other resumed after its epoch 1
    for _, history in runs:
        assert sorted(m.step for m in history) == [0, 1, 2, 3]  # each step logged once


def test_a_stopped_sweep_resumes_its_trainables_cell_in_the_same_run(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    (control / "hold").touch()  # the first cell waits at epoch 2, after two checkpoints
    site = _install(tmp_path / "site", control)
    path = _sweep(tmp_path, retries=0)
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            _command(path), cwd=tmp_path, env=_env(site), stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 300
        while not (control / "waiting").exists():
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the epoch-1 checkpoint's tag is written before epoch 2 begins
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=300) == 128 + signal.SIGINT, log.read_text()[-3000:]
    (control / "hold").unlink()
    (before,) = [r for r, _ in _runs(path)]
    assert before.info.status == "KILLED"
    second = subprocess.run(
        _command(path), cwd=tmp_path, env=_env(site), capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    runs = {r.info.run_id: (r, h) for r, h in _runs(path)}
    assert len(runs) == 2 and before.info.run_id in runs  # the stopped cell's run continued
    run, history = runs[before.info.run_id]
    assert run.info.status == "FINISHED" and run.data.metrics["started_at"] == 2.0
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
