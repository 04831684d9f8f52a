"""Against a real ``mlflow server`` on loopback, as a lab shares one: the analysis reads artifacts
through the server (``mlflow-artifacts:``) and finds what a sqlite store gives; with MLflow's
basic-auth app, a sweep with credentials from the environment works and no output holds the
password; without them (or, for the report, with a wrong password), with the store locked, or
(a dry run) with no server answering, the command says so in one line and an exit code.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.process

PASSWORD = "Pl4nted-pass-7Q"  # the admin password a test plants and then looks for everywhere


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(root: Path, *, auth: bool = False) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on loopback with a sqlite backend and served artifacts (runs' artifact
    URIs are ``mlflow-artifacts:/...``); with ``auth``, MLflow's basic-auth app."""
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root / 'server.db'}"]
    cmd += ["--artifacts-destination", str(root / "served"), "--workers", "1"]
    env = {**os.environ}
    if auth:
        cmd += ["--app-name", "basic-auth"]
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = "csrf-key-for-the-test"
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = PASSWORD
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(_auth_config(root))
    log = (root / "server.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(1.0)
                return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"the MLflow server did not start: {(root / 'server.log').read_text()}")


def _auth_config(root: Path) -> Path:
    path = root / "basic_auth.ini"
    path.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        "admin_username = admin\n"
        f"admin_password = {PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return path


def _stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, 9)
    server.wait()


def _sweep_file(tmp_path: Path, uri: str, name: str) -> Path:
    path = tiny_sweep(tmp_path / name, name=name, seeds=[0, 1], tracking_uri=uri)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["add", "gate_scalar"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _cli(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600):
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _env(data_cache: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    return {**env, "PYTHONPATH": str(ROOT), "FUSION_RAY_CACHE": data_cache, **extra}


def test_the_report_reads_artifacts_through_a_server_as_from_sqlite(tmp_path, data_cache):
    """The same tiny sweep logged to a server (artifacts served as mlflow-artifacts:) and to a
    sqlite store: the report's length analysis and gate diagnostics agree, none left out."""
    from analysis.context import ReportOptions
    from analysis.report import build_report

    server, uri = _server(tmp_path)
    try:
        reports = {}
        for where, tracking in (("server", uri), ("sqlite", f"sqlite:///{tmp_path / 'l.db'}")):
            path = _sweep_file(tmp_path, tracking, f"same_{where}")
            run = _cli(
                ["fusion_ray.sweep", str(path), "--no-report"], path.parent, _env(data_cache)
            )
            assert run.returncode == 0, run.stderr[-3000:]
            out = tmp_path / f"report_{where}"
            build_report(path.stem, tracking, ReportOptions(out=out, log_to_mlflow=False))
            reports[where] = out
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("same_server")
        (trial, *_) = client.search_runs([exp.experiment_id], "tags.role = 'trial'")
        assert trial.info.artifact_uri.startswith("mlflow-artifacts:")
    finally:
        _stop(server)
    text = (reports["server"] / "report.md").read_text()
    assert "left out" not in text and "no test_predictions.parquet" not in text
    for name in ("length_accuracy.csv", "gates_by_position.csv"):
        served = pd.read_csv(reports["server"] / name)
        local = pd.read_csv(reports["sqlite"] / name)
        assert len(served) > 0
        drop = [c for c in served.columns if c.endswith("run_id")]
        pd.testing.assert_frame_equal(served.drop(columns=drop), local.drop(columns=drop))


def _everything_logged(client: MlflowClient, name: str, tmp_path: Path) -> str:
    """Every param, tag and artifact of an experiment's runs, as one text."""
    exp = client.get_experiment_by_name(name)
    parts = []
    for run in client.search_runs([exp.experiment_id]):
        parts += [f"{k}={v}" for k, v in {**run.data.params, **run.data.tags}.items()]
        where = tmp_path / "artifacts" / run.info.run_id
        client.download_artifacts(run.info.run_id, "", str(where))
        for path in where.rglob("*"):
            if path.is_file():
                parts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def test_a_basic_auth_server_works_with_credentials_and_no_output_holds_them(tmp_path, data_cache):
    server, uri = _server(tmp_path, auth=True)
    try:
        path = _sweep_file(tmp_path, uri, "authed")
        # without credentials: one message and exit 8, no traceback
        refused = _cli(
            ["fusion_ray.sweep", str(path), "--no-report"], path.parent, _env(data_cache)
        )
        assert refused.returncode == 8, refused.stderr[-3000:]
        assert "MLFLOW_TRACKING_USERNAME" in refused.stderr and "Traceback" not in refused.stderr
        creds = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
        env = _env(data_cache, **creds)
        ran = _cli(["fusion_ray.sweep", str(path)], path.parent, env)
        assert ran.returncode == 0, ran.stderr[-3000:]
        # a URI with the user info works too (MLflow's client sends it as basic auth)
        with_info = uri.replace("http://", f"http://admin:{PASSWORD}@")
        dry = _cli(
            ["fusion_ray.sweep", str(path), "--dry-run", f"tracking_uri={with_info}"],
            path.parent,
            _env(data_cache),
        )
        assert dry.returncode == 0, dry.stderr[-2000:]
        report = _cli(
            ["analysis.report", "--experiment", "authed", "--tracking-uri", with_info, "--out",
             str(tmp_path / "authed_report")],
            path.parent,
            _env(data_cache),
        )  # fmt: skip
        assert report.returncode == 0, report.stderr[-2000:]
        # a wrong password in the report's URI: one message, exit 8
        wrong = uri.replace("http://", "http://admin:not-the-password@")
        denied = _cli(
            ["analysis.report", "--experiment", "authed", "--tracking-uri", wrong, "--out",
             str(tmp_path / "denied_report")],
            path.parent,
            _env(data_cache),
        )  # fmt: skip
        assert denied.returncode == 8, denied.stderr[-2000:]
        assert denied.stderr.startswith(
            f"error: the MLflow server at {uri.replace('http://', 'http://admin:***@')} refused "
            "the report's credentials (401 unauthenticated): fix the user and password in "
            "--tracking-uri"
        ), denied.stderr[-2000:]
        assert len(denied.stderr.splitlines()) == 1 and "not-the-password" not in denied.stderr
        assert not (tmp_path / "denied_report").exists()
        logged = _everything_logged(MlflowClient(with_info), "authed", tmp_path)
    finally:
        _stop(server)
    outputs = [refused.stdout, refused.stderr, ran.stdout, ran.stderr, dry.stdout, dry.stderr]
    outputs += [report.stdout, report.stderr, logged]
    outputs += [p.read_text(errors="replace") for p in (tmp_path / "authed_report").rglob("*")
                if p.is_file() and p.suffix in (".md", ".json", ".csv", ".tex")]  # fmt: skip
    for d in (path.parent / "reports", path.parent / "ray_results"):
        outputs += [p.read_text(errors="replace") for p in d.rglob("*") if p.is_file()
                    and p.suffix in (".md", ".json", ".csv", ".log", ".txt", ".yaml")]  # fmt: skip
    assert "admin:***@" in (tmp_path / "authed_report" / "report.md").read_text()
    leaks = [text[max(0, text.find(PASSWORD) - 80) :][:160] for text in outputs if PASSWORD in text]
    assert not leaks, leaks


def test_a_store_locked_past_mlflows_wait_is_one_message(tmp_path, data_cache):
    """Another process holds the sqlite store's write lock longer than MLflow's busy timeout
    (20 s): the driver ends with exit 9 and one message, no traceback; nothing was created."""
    path = _sweep_file(tmp_path, f"sqlite:///{tmp_path / 'locked.db'}", "locked")
    first = _cli(["fusion_ray.sweep", str(path), "--dry-run"], path.parent, _env(data_cache))
    assert first.returncode == 0, first.stderr[-2000:]
    MlflowClient(f"sqlite:///{tmp_path / 'locked.db'}").search_experiments()  # tables exist
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        db = sqlite3.connect(tmp_path / "locked.db", timeout=1, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.set()
        release.wait(90)
        db.execute("ROLLBACK")
        db.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(10)
        run = _cli(["fusion_ray.sweep", str(path), "--no-report"], path.parent, _env(data_cache))
    finally:
        release.set()
        holder.join()
    assert run.returncode == 9, run.stderr[-3000:]
    assert "locked" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 3, run.stderr


def test_a_dry_run_against_a_server_that_does_not_answer_gives_up_as_it_says(tmp_path, data_cache):
    """A port nothing listens on, and one that takes the connection but never answers: the dry
    run sends each request once and waits ``api.DRY_RUN_WAIT_S`` for it (MLflow's client would
    retry for about 4 minutes, or wait 120 s for each of 8 tries), then exit 10, one line."""
    from fusion_ray.api import DRY_RUN_WAIT_S

    refused = f"http://127.0.0.1:{_free_port()}"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections wait in the backlog, never accepted nor answered
    quiet = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        for i, uri in enumerate((refused, quiet)):
            path = _sweep_file(tmp_path, uri, f"dry{i}")
            env = _env(data_cache)
            env.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
            env.pop("MLFLOW_HTTP_REQUEST_TIMEOUT", None)
            dry = _cli(["fusion_ray.sweep", str(path), "--dry-run"], path.parent, env, timeout=180)
            assert dry.returncode == 10, dry.stderr[-3000:]
            assert dry.stderr.startswith(
                f"error: no MLflow server answered at {uri} within {DRY_RUN_WAIT_S} s"
            ), dry.stderr[-3000:]
            assert len(dry.stderr.splitlines()) == 1 and not dry.stdout, dry.stderr[-3000:]
    finally:
        silent.close()
