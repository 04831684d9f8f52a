"""A sweep whose cell resumes from a checkpoint that cannot be loaded (its state file damaged
after an earlier invocation): the trial sets it aside, trains the cell again from scratch to the
same numbers, and the driver says so in one line and tags the run; on a real local Ray, through
the one-worker Tune trial and through a two-worker DDP TorchTrainer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from fusion_ray.config import load_sweep
from fusion_ray.driver.runner import run_sweep
from fusion_ray.schema import CHECKPOINT_SET_ASIDE_TAG, CHECKPOINT_TAG
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.ray


def _run(spec):
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    return client, run


@pytest.mark.parametrize("workers", [1, 2], ids=["tune_trial", "ddp"])
def test_a_damaged_checkpoint_is_set_aside_and_the_cell_trains_again(
    tmp_path, ray_session, data_cache, mlflow_store, caplog, workers
):
    path = tiny_sweep(
        tmp_path,
        name=f"set_aside_{workers}",
        seeds=[0],
        resources={"workers": workers, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        tracking_uri=mlflow_store(),
    )
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["gate_scalar"]
    path.write_text(yaml.safe_dump(raw))
    assert len(run_sweep(load_sweep(path), str(path), verbose=0).finished) == 1
    client, first = _run(load_sweep(path))
    final = Path(first.data.tags[CHECKPOINT_TAG])
    # As if the driver had died after epoch 1: its run KILLED, naming epoch 1's checkpoint
    # (which has no predictions, so the cell is not finished from storage), whose file is
    # damaged (a disk that filled up, a copy cut short).
    *_, epoch_1, last = sorted(p for p in final.parent.glob("checkpoint_*") if p.is_dir())
    assert last == final
    assert (epoch_1 / "state.pt").exists() and not (epoch_1 / "test_predictions.parquet").exists()
    (epoch_1 / "state.pt").write_bytes((epoch_1 / "state.pt").read_bytes()[:200])
    client.set_tag(first.info.run_id, CHECKPOINT_TAG, str(epoch_1))
    client.set_terminated(first.info.run_id, "KILLED")

    with caplog.at_level(logging.WARNING, logger="fusion_ray.driver.callbacks"):
        again = run_sweep(load_sweep(path), str(path), verbose=0)

    assert len(again.finished) == 1 and not again.failed
    said = [r.getMessage() for r in caplog.records if "could not be loaded" in r.getMessage()]
    assert said == [
        f"cell {first.data.tags['cell_id']}: its checkpoint {epoch_1} could not be loaded "
        "(state.pt: RuntimeError: PytorchStreamReader failed reading zip archive: failed "
        f"finding central directory); it was set aside as {epoch_1}.unreadable and the cell "
        "started again"
    ]
    assert (Path(f"{epoch_1}.unreadable") / "state.pt").exists() and not epoch_1.exists()
    _, run = _run(load_sweep(path))
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags[CHECKPOINT_SET_ASIDE_TAG].startswith(f"{epoch_1}: state.pt: ")
    assert run.data.tags[CHECKPOINT_TAG] != str(epoch_1)  # the new attempt's
    # trained again from scratch: epochs 0 and 1 twice, and the same numbers
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_acc"))
    assert steps == [0, 0, 1, 1]
    assert run.data.metrics["test_acc"] == first.data.metrics["test_acc"]
