"""Against a real ``mlflow server`` on loopback, as a lab shares one. With MLflow's basic-auth
app: a sweep and an HPO run with the password in their ``tracking_uri`` work, and no console
output, file, pickle, store or artifact holds the password; the report, with the credentials in
the environment, reads the sweep's artifacts through the server (``mlflow-artifacts:``) and
finds what a sqlite store gives. Without credentials (or, for the report, with a wrong
password), with the store locked, or (a dry run) with no server answering, the command says so
in one line and an exit code.

One server, with one sweep and one HPO run on it (``authed``, a module fixture), serves the
tests that read it; the drivers join the session's Ray (``ray_session``).
"""

from __future__ import annotations

import base64
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import ROOT, tiny_sweep
from tests.fusion_ray.hpo.test_hpo_driver import _hpo_file
from tests.helpers import MLFLOW_SERVER_ENV

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
    env = {**os.environ, **MLFLOW_SERVER_ENV}
    if auth:
        cmd += ["--app-name", "basic-auth"]
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = "csrf-key-for-the-test"
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = PASSWORD
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(_auth_config(root))
    log = (root / "server.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        try:  # /health answers once the server serves requests (no auth needed there)
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server, uri
        except OSError:
            time.sleep(0.2)
    _stop(server)
    raise RuntimeError(f"the MLflow server did not start: {(root / 'server.log').read_text()}")


def _auth_config(root: Path) -> Path:
    path = root / "basic_auth.ini"
    path.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        "admin_username = admin\n"
        f"admin_password = {PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"  # the docs' setting: no password hash per request
    )
    return path


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, 9)
    server.wait()


def _sweep_file(tmp_path: Path, uri: str, name: str) -> Path:
    """Two seeds of ``add`` and ``gate_scalar`` (a gated operator: the gate diagnostics too), one
    epoch each, in a folder ``name`` of its own."""
    path = tiny_sweep(tmp_path / name, name=name, seeds=[0, 1], tracking_uri=uri)
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["fusions"] = ["add", "gate_scalar"]
    raw["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _cli(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600):
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _env(data_cache: str, ray_session=None, **extra: str) -> dict[str, str]:
    """A command's environment: this checkout, the session's data cache, no credentials, and
    the session's Ray when given (else a driver starts a Ray of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    if ray_session is not None:
        env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    return {**env, "PYTHONPATH": str(ROOT), "FUSION_RAY_CACHE": data_cache, **extra}


CREDENTIALS = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
AWS = {
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDKEY7Q2W",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-Zx81",
    "AWS_SESSION_TOKEN": "planted-aws-token-Qp55",
}
"""Cloud credentials in the environment of the module's sweep with the password (``ran``): Ray
Tune copies these three into every trial's runtime environment, which Ray's agent logs."""


@dataclass
class Authed:
    """The module's basic-auth server and what ran on it: the sweep ``authed`` without
    credentials (``refused``), then with the password in its ``tracking_uri`` (``ran``, from
    ``secret``, the same sweep but for that URI; report included), and a tiny HPO run with the
    password in its URI too (``tuned``, from ``hpo``)."""

    root: Path
    uri: str
    path: Path
    secret: Path
    hpo: Path
    refused: subprocess.CompletedProcess
    ran: subprocess.CompletedProcess
    tuned: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def authed(tmp_path_factory, data_cache, ray_session, mlflow_store) -> Iterator[Authed]:
    root = tmp_path_factory.mktemp("authed_server")
    mlflow_store(root / "server.db")  # the server's store, migrated (MLflow takes seconds to)
    server, uri = _server(root, auth=True)
    with_password = uri.replace("http://", f"http://admin:{PASSWORD}@")
    try:
        path = _sweep_file(root, uri, "authed")
        secret = path.with_name("authed_with_password.yaml")
        raw = yaml.safe_load(path.read_text())
        secret.write_text(yaml.safe_dump({**raw, "tracking_uri": with_password}, sort_keys=False))
        hpo = _hpo_file(root / "hpo", "secret_hpo", epochs=1, samples=2)
        raw = yaml.safe_load(hpo.read_text())
        raw["tune"]["fusion"], raw["tracking_uri"] = "add", with_password
        hpo.write_text(yaml.safe_dump(raw, sort_keys=False))
        env = _env(data_cache, ray_session)  # no MLFLOW_TRACKING_* credentials
        refused = _cli(["fusion_ray.sweep", str(path), "--no-report"], path.parent, env)
        ran = _cli(["fusion_ray.sweep", str(secret)], path.parent, {**env, **AWS})
        tuned = _cli(["fusion_ray.hpo", str(hpo)], hpo.parent, env)
        yield Authed(root, uri, path, secret, hpo, refused, ran, tuned)
    finally:
        _stop(server)


def test_the_report_reads_artifacts_through_a_server_as_from_sqlite(
    authed, tmp_path, data_cache, ray_session, monkeypatch, mlflow_store
):
    """The module's sweep, logged to the server (artifacts served as mlflow-artifacts:), and the
    same sweep file logged to a sqlite store: the report's length analysis and gate diagnostics
    agree, none left out."""
    from analysis.report import build_report
    from analysis.sections.context import ReportOptions

    assert authed.ran.returncode == 0, authed.ran.stderr[-3000:]
    local = tmp_path / "authed.yaml"
    raw = yaml.safe_load(authed.path.read_text())
    raw.update(tracking_uri=mlflow_store(tmp_path / "l.db"), storage_path=str(tmp_path / "rr"))
    local.write_text(yaml.safe_dump(raw, sort_keys=False))
    run = _cli(
        ["fusion_ray.sweep", str(local), "--no-report"], tmp_path, _env(data_cache, ray_session)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    reports = {}
    for where, tracking in (("server", authed.uri), ("sqlite", raw["tracking_uri"])):
        out = tmp_path / f"report_{where}"
        build_report("authed", tracking, ReportOptions(out=out, log_to_mlflow=False))
        reports[where] = out
    client = MlflowClient(authed.uri)
    exp = client.get_experiment_by_name("authed")
    (trial, *_) = client.search_runs([exp.experiment_id], "tags.role = 'trial'")
    assert trial.info.artifact_uri.startswith("mlflow-artifacts:")
    text = (reports["server"] / "report.md").read_text()
    assert "left out" not in text and "no test_predictions.parquet" not in text
    for name in ("length_accuracy.csv", "gates_by_position.csv"):
        served = pd.read_csv(reports["server"] / name)
        local_csv = pd.read_csv(reports["sqlite"] / name)
        assert len(served) > 0
        drop = [c for c in served.columns if c.endswith("run_id")]
        pd.testing.assert_frame_equal(served.drop(columns=drop), local_csv.drop(columns=drop))


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


def test_a_basic_auth_server_works_with_credentials_and_no_output_holds_them(
    authed, tmp_path, data_cache
):
    uri, path, refused, ran = authed.uri, authed.path, authed.refused, authed.ran
    # without credentials: one message and exit 8, no traceback
    assert refused.returncode == 8, refused.stderr[-3000:]
    assert "MLFLOW_TRACKING_USERNAME" in refused.stderr and "Traceback" not in refused.stderr
    # with the user info in the URI: the sweep and its report (the driver hands the
    # credentials to MLflow's client through MLFLOW_TRACKING_USERNAME and _PASSWORD)
    assert ran.returncode == 0, ran.stderr[-3000:]
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


SECRETS = (
    PASSWORD.encode(),
    base64.b64encode(f"admin:{PASSWORD}".encode()),
    *(value.encode() for value in AWS.values()),
)
"""The planted password, the basic-auth header value it would travel as, and the planted AWS
keys."""


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


def test_a_password_in_the_tracking_uri_reaches_no_console_file_or_store(authed):
    """The module's sweep and HPO run, each with the password in its ``tracking_uri``: both end
    with every trial FINISHED, and the password (or its basic-auth header value) is nowhere they
    print or write: not in their console output, not in any file under their storage (Ray
    Tune's pickles read as raw bytes), the HPO fragment, the server's store or its artifacts,
    nor in Ray's session folder. Neither are the AWS keys set in the sweep's environment, which
    Ray Tune copies into each trial's runtime environment and Ray's agent logs
    (``fusion_ray.driver.credentials``)."""
    ran, tuned = authed.ran, authed.tuned
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    client = MlflowClient(authed.uri.replace("http://", f"http://admin:{PASSWORD}@"))
    for name, runs in (("authed", 4), ("secret_hpo", 2)):
        exp = client.get_experiment_by_name(name)
        trials = client.search_runs([exp.experiment_id], "tags.role = 'trial'")
        assert sorted(r.info.status for r in trials) == ["FINISHED"] * runs, name
    assert (authed.hpo.parent / "tuned" / "secret_hpo.yaml").is_file()
    for where in (authed.path.parent, authed.hpo.parent):  # the pickles were looked at
        assert list((where / "ray_results").rglob("tuner.pkl")), where
    assert (authed.root / "server.db").is_file()
    assert list((authed.root / "served").rglob("*.parquet"))  # served artifacts

    console = {
        f"{what} {stream}": getattr(run, stream).encode()
        for what, run in (("sweep", ran), ("hpo", tuned))
        for stream in ("stdout", "stderr")
    }
    leaks = [f"{where}: {out[max(0, out.find(s) - 80) :][:160]!r}"
             for where, out in console.items() for s in SECRETS if s in out]  # fmt: skip
    # everything the drivers and the server wrote: storage, Tune's pickles, the fragment, the
    # store and its artifacts; not the files the test wrote with the password in them
    leaks += _leaks(authed.root, {authed.secret, authed.hpo, authed.root / "basic_auth.ini"})
    # and Ray's whole session folder, its logs among them (the sweeps joined the session's Ray)
    leaks += _leaks(_ray_session_folder(), set())
    assert not leaks, "\n".join(leaks)


def _ray_session_folder() -> Path:
    import ray._private.worker

    return Path(ray._private.worker._global_node.get_session_dir_path())


LOCK_WAIT_S = 1
"""The sqlite wait (``FUSION_RAY_SQLITE_WAIT_S``) of the driver that meets a locked store."""


def test_a_store_locked_past_mlflows_wait_is_one_message(tmp_path, data_cache, mlflow_store):
    """Another process holds the sqlite store's write lock for longer than the driver waits for
    it (``FUSION_RAY_SQLITE_WAIT_S``, MLflow's 20 s unless set): the driver ends with exit 9 and
    one message, no traceback; nothing was created.

    Nothing races the clock: the lock is taken before the driver starts and held until the
    driver has ended, so its wait has run out whatever the machine's speed."""
    db = tmp_path / "locked.db"
    path = _sweep_file(tmp_path, f"sqlite:///{db}", "locked")
    first = _cli(["fusion_ray.sweep", str(path), "--dry-run"], path.parent, _env(data_cache))
    assert first.returncode == 0, first.stderr[-2000:]
    mlflow_store(db)  # the store exists, migrated, as a sweep's does
    lock = sqlite3.connect(db, timeout=10, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        env = _env(data_cache, FUSION_RAY_SQLITE_WAIT_S=str(LOCK_WAIT_S))
        began = time.monotonic()
        run = _cli(["fusion_ray.sweep", str(path), "--no-report"], path.parent, env)
        took = time.monotonic() - began
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert run.returncode == 9, run.stderr[-3000:]
    assert "locked" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 3, run.stderr
    assert took >= LOCK_WAIT_S, f"ended after {took:.1f} s, before its wait ran out"
    client = MlflowClient(f"sqlite:///{db}")
    assert client.get_experiment_by_name("locked") is None, "the driver created its experiment"
    assert not client.search_registered_models(), "the driver left a lease"


def test_a_sqlite_wait_that_is_no_number_of_seconds_is_refused_before_anything_starts(
    tmp_path, monkeypatch
):
    """``FUSION_RAY_SQLITE_WAIT_S`` is read where MLflow opens a store: a value that is no
    number of seconds is one of the problems the checks before a run list (exit 2), naming the
    variable, the value and the fix; MLflow's own waits stay in force meanwhile."""
    from fusion_ray.driver.preflight import preflight, sqlite_wait_ms

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for value in ("soon", "-1", "1e9", "nan"):
        monkeypatch.setenv("FUSION_RAY_SQLITE_WAIT_S", value)
        assert sqlite_wait_ms() is None
        assert preflight(str(tmp_path), uri) == [
            f"FUSION_RAY_SQLITE_WAIT_S (environment): {value!r} is not a number of seconds from "
            "0 to 86400; set it to one (e.g. 20) or unset it for MLflow's own wait"
        ]
    monkeypatch.setenv("FUSION_RAY_SQLITE_WAIT_S", "2.5")
    assert sqlite_wait_ms() == 2500 and preflight(str(tmp_path), uri) == []


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
