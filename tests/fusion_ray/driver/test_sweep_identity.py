"""Nothing lost, nothing mixed: one driver per sweep, a sweep is its cells, a crashed driver
leaves no RUNNING parent run, and looking (``--dry-run``) writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from fusion_ray.config import load_sweep
from fusion_ray.console import summary_table
from fusion_ray.driver.lease import LEASE_PREFIX
from fusion_ray.driver.runner import run_sweep
from fusion_ray.sweep import main as sweep_main
from tests.conftest import ROOT, tiny_sweep
from tests.helpers import install_held_add


def _experiment_runs(spec, role: str):
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    return client, client.search_runs([exp.experiment_id], filter_string=f"tags.role = '{role}'")


def _one_seed(tmp_path, epochs: int, store: str):
    path = tiny_sweep(tmp_path, seeds=[0], tracking_uri=store)
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = epochs
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.ray
def test_a_changed_sweep_file_never_mixes_its_runs(
    tmp_path, ray_session, data_cache, mlflow_store, capsys
):
    store = mlflow_store()
    path = _one_seed(tmp_path, epochs=1, store=store)
    first = run_sweep(load_sweep(path), str(path))
    assert len(first.finished) == 2 and first.other_settings is None

    path = _one_seed(tmp_path, epochs=2, store=store)  # same name, another setting
    spec = load_sweep(path)
    second = run_sweep(spec, str(path))
    assert second.already_finished == 0 and len(second.finished) == 2
    assert "2 FINISHED run(s)" in second.other_settings
    assert "train.epochs 1 in 2 runs vs 2 in the sweep's runs" in second.other_settings

    # the summary counts one seed per operator (this file's cells), not both settings
    table = summary_table(spec)
    assert all(line.split()[4] == "1" for line in table.splitlines()[1:]), table
    # the dry run says the same
    assert sweep_main([str(path), "--dry-run"]) == 0
    assert "belong to other settings" in capsys.readouterr().out
    # the parent run lists the cells the sweep is made of now
    client, parents = _experiment_runs(spec, "sweep")
    local = client.download_artifacts(parents[0].info.run_id, "sweep_cells.json", str(tmp_path))
    cells = json.loads(open(local).read())["cells"]
    _, trials = _experiment_runs(spec, "trial")
    epochs_of = {r.data.tags["cell_id"]: r.data.params["train.epochs"] for r in trials}
    assert sorted(epochs_of[c] for c in cells) == ["2", "2"]


@pytest.mark.ray
def test_a_crash_of_the_driver_marks_the_parent_run_failed_and_frees_the_lease(
    tmp_path, ray_session, data_cache, mlflow_store, monkeypatch
):
    import fusion_ray.driver.runner as sweep_module

    def broken(*args, **kwargs):
        raise RuntimeError("simulated driver bug")

    monkeypatch.setattr(sweep_module, "_tuner", broken)
    path = tiny_sweep(tmp_path, seeds=[0], tracking_uri=mlflow_store())
    spec = load_sweep(path)
    with pytest.raises(RuntimeError, match="simulated driver bug"):
        run_sweep(spec, str(path))
    client, parents = _experiment_runs(spec, "sweep")
    assert [p.info.status for p in parents] == ["FAILED"]
    assert "simulated driver bug" in parents[0].data.tags["failure_reason"]
    names = {m.name for m in client.search_registered_models()}
    assert LEASE_PREFIX + spec.name not in names


@pytest.mark.unit
def test_a_dry_run_creates_no_tracking_store(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    assert sweep_main([str(path), "--dry-run"]) == 0
    assert "4 cells (0 already FINISHED" in capsys.readouterr().out
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.process
def test_two_drivers_on_one_sweep_file_run_every_cell_once(
    tmp_path, ray_session, data_cache, mlflow_store
):
    """Two drivers of one sweep file started at once: one runs every cell once, the other is
    refused (exit 3) naming the driver that holds the lease.

    Nothing races the clock: every trial (``held_add``, ``through=0``) waits until the test lets
    it go, which it does once one of the drivers has ended: the other holds the lease until
    then, whichever of them got it and however slow the machine."""
    path = tiny_sweep(
        tmp_path,
        seeds=[0, 1],
        grid={"datasets": ["short"], "fusions": ["held_add"]},
        tracking_uri=mlflow_store(tmp_path / "mlflow.db"),  # new, migrated: no experiment yet
    )
    release = tmp_path / "turns" / "release"
    release.parent.mkdir()
    install_held_add(tmp_path, release, through=0)  # the drivers' working directory
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FUSION_RAY_CACHE": data_cache,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
    }
    cmd = [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"]
    drivers = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 300
        while all(p.poll() is None for p in drivers):  # one ends while the other's trials wait
            assert time.monotonic() < deadline, "neither driver ended while the trials waited"
            time.sleep(0.1)
        release.touch()
        outputs = [p.communicate(timeout=600) for p in drivers]
    finally:
        release.touch()
        for p in drivers:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in drivers]
    assert sorted(codes) == [0, 3], outputs
    refused = outputs[codes.index(3)][1]
    assert "is being run by another driver" in refused and "pid" in refused
    tracking_uri = yaml.safe_load(path.read_text())["tracking_uri"]
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("tiny")
    trials = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    assert sorted(r.info.status for r in trials) == ["FINISHED", "FINISHED"]
    assert len({r.data.tags["cell_id"] for r in trials}) == 2


@pytest.mark.unit
@pytest.mark.parametrize(
    "path, storage, inside",
    [
        ("{tmp}/results/run/checkpoint_000001", "{tmp}/results", True),
        ("{tmp}/results/../elsewhere/checkpoint", "{tmp}/results", False),
        ("/etc/evil", "{tmp}/results", False),
        ("s3://bucket/prefix/run/checkpoint", "s3://bucket/prefix", True),
        (
            "bucket/prefix/run/checkpoint",
            "s3://bucket/prefix?endpoint_override=http://minio:9000",
            True,
        ),
        ("s3://bucket/prefix2/run", "s3://bucket/prefix", False),
        ("s3://other/prefix/run", "s3://bucket/prefix", False),
        ("{tmp}/results/run", "s3://bucket/prefix", False),
    ],
)
def test_a_checkpoint_path_from_the_tracking_store_is_trusted_only_under_storage(
    tmp_path, path, storage, inside
):
    from fusion_ray.driver.storage import within_storage

    assert within_storage(path.format(tmp=tmp_path), storage.format(tmp=tmp_path)) is inside


@pytest.mark.unit
def test_a_run_naming_a_checkpoint_outside_storage_starts_again(tmp_path, caplog):
    from fusion_ray.config.grid import expand
    from fusion_ray.driver.storage import resume_point
    from fusion_ray.driver.tracking import CellRun

    spec = load_sweep(tiny_sweep(tmp_path))
    cell = expand(spec)[0]
    outside = tmp_path / "planted"
    (outside / "checkpoint").mkdir(parents=True)
    existing = {cell.cell_id: CellRun("run", "KILLED", str(outside / "checkpoint"))}
    assert resume_point(spec, cell, existing) is None
    assert "outside storage_path" in caplog.text
    inside = tmp_path / "ray_results" / "run" / "checkpoint"
    inside.mkdir(parents=True)
    existing = {cell.cell_id: CellRun("run", "KILLED", str(inside))}
    assert resume_point(spec, cell, existing) == str(inside)


@pytest.mark.unit
def test_the_parent_run_records_the_order_the_report_lists_the_sweep_in(tmp_path):
    """Operators in the fusion registry's order whatever order the file lists them in;
    datasets in the sweep file's order."""
    from fusion_ray.config.grid import expand
    from fusion_ray.model.fusion import FUSIONS
    from fusion_ray.study.workload import display_order

    path = tiny_sweep(tmp_path, grid={"datasets": ["long", "short"], "fusions": ["mlp", "add"]})
    spec = yaml.safe_load(path.read_text())
    spec["datasets"]["long"] = spec["datasets"]["short"]
    spec["grid"]["fusions"] = ["mlp", "gate_cnn", "add"]
    path.write_text(yaml.safe_dump(spec))
    order = display_order(expand(load_sweep(path)))
    registered = [n for n in FUSIONS.names() if n in {"mlp", "gate_cnn", "add"}]
    assert order == {"operator": registered, "dataset": ["long", "short"]}
    assert registered.index("add") < registered.index("gate_cnn") < registered.index("mlp")
