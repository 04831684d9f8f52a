"""A tracking URI with a password in it (``http://admin:PASSWORD@host``) against a real basic-auth
``mlflow server``: a tiny sweep and a tiny HPO run work end to end, and the password is nowhere
they print or write: not in their console output, not in any file under storage_path (Ray's
pickles included, read as raw bytes), not in the server's store or its artifact root.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import ROOT, tiny_sweep
from tests.fusion_ray.driver.test_tracking_server import PASSWORD, _server, _stop
from tests.fusion_ray.hpo.test_hpo_driver import _hpo_file

pytestmark = pytest.mark.process

SECRETS = (PASSWORD.encode(), base64.b64encode(f"admin:{PASSWORD}".encode()))
"""The planted password, and the basic-auth header value it would travel as."""


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=cwd, env=env, capture_output=True, timeout=900
    )


def _leaks(root: Path, skip: set[Path]) -> list[str]:
    """Every file under ``root`` (but ``skip``) whose bytes hold a secret, with what is around it."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p not in skip):
        data = path.read_bytes()
        for secret in SECRETS:
            at = data.find(secret)
            if at >= 0:
                found.append(f"{path.relative_to(root)}: {data[max(0, at - 60) : at + 40]!r}")
    return found


def test_a_password_in_the_tracking_uri_reaches_no_console_file_or_store(
    tmp_path, ray_session, data_cache, mlflow_store
):
    mlflow_store(tmp_path / "server" / "server.db")  # the server's store, migrated
    server, plain = _server(tmp_path / "server", auth=True)
    uri = plain.replace("http://", f"http://admin:{PASSWORD}@")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env.update(
        PYTHONPATH=str(ROOT),
        FUSION_RAY_CACHE=data_cache,
        RAY_ADDRESS=ray_session.get_runtime_context().gcs_address,
    )
    sweep = tiny_sweep(tmp_path / "sweep", name="secret_sweep", seeds=[0], tracking_uri=uri)
    raw = yaml.safe_load(sweep.read_text())
    raw["defaults"]["train"]["epochs"] = 1
    sweep.write_text(yaml.safe_dump(raw, sort_keys=False))  # 2 cells (add, gate_scalar), 1 epoch
    hpo = _hpo_file(tmp_path / "hpo", "secret_hpo", epochs=1, samples=2)
    raw = yaml.safe_load(hpo.read_text())
    raw["tune"]["fusion"], raw["tracking_uri"] = "add", uri
    hpo.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        swept = _run(["fusion_ray.sweep", str(sweep), "--no-report"], sweep.parent, env)
        assert swept.returncode == 0, swept.stderr.decode(errors="replace")[-3000:]
        tuned = _run(["fusion_ray.hpo", str(hpo)], hpo.parent, env)
        assert tuned.returncode == 0, tuned.stderr.decode(errors="replace")[-3000:]
        client = MlflowClient(uri)
        for name, runs in (("secret_sweep", 2), ("secret_hpo", 2)):
            exp = client.get_experiment_by_name(name)
            trials = client.search_runs([exp.experiment_id], "tags.role = 'trial'")
            assert sorted(r.info.status for r in trials) == ["FINISHED"] * runs, name
    finally:
        _stop(server)
    assert (hpo.parent / "tuned" / "secret_hpo.yaml").is_file()
    assert list((sweep.parent / "ray_results").rglob("tuner.pkl"))  # the pickles were looked at
    assert (tmp_path / "server" / "server.db").is_file()
    assert list((tmp_path / "server" / "served").rglob("*.parquet"))  # served artifacts

    console = {
        f"{what} {stream}": getattr(run, stream)
        for what, run in (("sweep", swept), ("hpo", tuned))
        for stream in ("stdout", "stderr")
    }
    leaks = [f"{where}: {out[max(0, out.find(s) - 80) :][:160]!r}"
             for where, out in console.items() for s in SECRETS if s in out]  # fmt: skip
    # everything the drivers and the server wrote: storage, Tune's pickles, the fragment, the
    # store and its artifacts; not the files the test wrote with the password in them
    leaks += _leaks(tmp_path, {sweep, hpo, tmp_path / "server" / "basic_auth.ini"})
    assert not leaks, "\n".join(leaks)
