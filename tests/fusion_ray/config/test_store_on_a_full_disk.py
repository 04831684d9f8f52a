"""A sqlite tracking store on a full disk: the sweep and HPO commands say so in one message and
exit 2 before anything starts (MLflow's first write would fail with a traceback per retry),
and the store is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.process

FILL = """
import sys
try:
    with open(sys.argv[1], "wb") as out:
        while True:
            out.write(b"\\0" * (1 << 16))
            out.flush()
except OSError:
    pass
"""
"""Writes the file until the disk is full."""


def _private_tmpfs(mount_point: Path) -> list[str] | None:
    """``unshare`` arguments that give a command a mount namespace of its own, where a tmpfs can
    be mounted at ``mount_point`` (as root, or through a user namespace); None when neither is
    allowed here."""
    if not shutil.which("unshare"):
        return None
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        if unshare == ["unshare", "-m"] and os.geteuid() != 0:
            continue
        probe = subprocess.run(
            [*unshare, "sh", "-c", f"mount -t tmpfs -o size=4m tmpfs {mount_point}"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return unshare
    return None


def test_a_sqlite_store_on_a_full_disk_is_one_message_and_left_as_it_was(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    unshare = _private_tmpfs(disk)
    if unshare is None:
        pytest.skip("cannot mount a private tmpfs here (needs root or user namespaces)")
    seed = tmp_path / "seed.db"  # a store with runs of another sweep, made by MLflow
    client = MlflowClient(f"sqlite:///{seed}")
    run = client.create_run(client.create_experiment("earlier"))
    client.log_metric(run.info.run_id, "val_acc", 0.5)
    client.set_terminated(run.info.run_id)
    db = disk / "mlflow.db"
    sweep = tiny_sweep(tmp_path, name="full_store", tracking_uri=f"sqlite:///{db}")
    hpo = tmp_path / "full_hpo.yaml"
    hpo.write_text(yaml.safe_dump(_hpo(tmp_path, sweep, db)))
    python = sys.executable
    script = " && ".join(
        [
            f"mount -t tmpfs -o size=4m tmpfs {disk}",
            f"cp {seed} {db}",
            f"sha256sum {db} > {tmp_path / 'before'}",
            f"{python} -c '{FILL}' {disk / 'filler'}",
            f"{{ {python} -m fusion_ray.sweep {sweep} --no-report > {tmp_path / 'sweep.out'} "
            f"2>&1; echo $? > {tmp_path / 'sweep.rc'}; }}",
            f"{{ {python} -m fusion_ray.hpo {hpo} > {tmp_path / 'hpo.out'} 2>&1; "
            f"echo $? > {tmp_path / 'hpo.rc'}; }}",
            f"sha256sum {db} > {tmp_path / 'after'}",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [*unshare, "sh", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    said = f"tracking_uri: the disk holding {disk} is full ("
    for command in ("sweep", "hpo"):
        out = (tmp_path / f"{command}.out").read_text()
        assert (tmp_path / f"{command}.rc").read_text().strip() == "2", out[-3000:]
        assert said in out and "Traceback" not in out, out[-3000:]
    before, after = (tmp_path / "before").read_text(), (tmp_path / "after").read_text()
    assert before == after and before.split()[0] == hashlib.sha256(seed.read_bytes()).hexdigest()


def _hpo(tmp_path: Path, sweep: Path, db: Path) -> dict:
    """quick.yaml's tuning, for the tiny sweep, into the store on the full disk."""
    raw = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    raw.update(
        name="full_hpo",
        sweeps=[str(sweep)],
        output="tuned.yaml",
        storage_path=str(tmp_path / "ray_results"),
        tracking_uri=f"sqlite:///{db}",
    )
    return raw
