"""A lab's shared MLflow server: ``mlflow server`` on PostgreSQL (Debian's package, a data folder
of the test's own, listening on a free port of 127.0.0.1 only), with an artifact root, and sweep
drivers against it over REST.

Checked: two drivers started at once on the same sweep file (one holds the lease, which lives in
the server's registry; the other is refused; one FINISHED run per cell); the server stopped
mid-sweep and started again once the driver says it waits for it (the driver waits for it or
stops with one message, and nothing is lost: a re-run completes with one FINISHED run per cell);
the server gone for longer than MLflow's client retries (shortened through its settings); MLflow's
basic-auth app (its users in PostgreSQL too) with credentials from the environment (the sweep
works; the password is in no param, tag, artifact, report or log line).

One PostgreSQL and one ``mlflow server`` on it serve the module (each test its own experiment);
the drivers join the session's Ray (``ray_session``). Nothing races the clock: the trials after
the first (``held_add``) wait until the test has done what it does mid-sweep.

Needs Debian's ``postgresql`` (``.ci/run`` installs it) and psycopg2 (the ``dev`` extra).
PostgreSQL refuses to run as root: as root the test runs ``initdb`` and ``pg_ctl`` as the
``postgres`` user (``runuser``) in a folder that user owns. Skipped, saying why, when PostgreSQL
cannot start.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, tiny_sweep
from tests.helpers import MLFLOW_SERVER_ENV, install_held_add, process_ended, wait_until_held

pytestmark = pytest.mark.process

PASSWORD = "Pl4nted-pg-pass-9Z"  # the basic-auth admin password looked for everywhere
DB_PASSWORD = secrets.token_hex(12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    return found[-1]


@dataclass
class Postgres:
    root: Path
    port: int
    run_as: list[str]

    def uri(self, database: str) -> str:
        return f"postgresql+psycopg2://fr:{DB_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def createdb(self, name: str) -> None:
        env = {**os.environ, "PGPASSWORD": DB_PASSWORD}
        command = [_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "fr", name]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if not (_pg_bin("initdb") and _pg_bin("pg_ctl") and _pg_bin("createdb")):
        return "needs PostgreSQL's initdb, pg_ctl, createdb (Debian: apt-get install postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "needs psycopg2 (pip install -e '.[dev]')"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "as root, needs runuser to start PostgreSQL as the postgres user"
    return None


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(f"/tmp/frpg-{secrets.token_hex(3)}")
    root.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses root: its own user, in a folder it owns
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no postgres user to run PostgreSQL as")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    (root / "pw").write_text(DB_PASSWORD + "\n")
    if run_as:
        os.chown(root / "pw", user.pw_uid, user.pw_gid)
    port = _free_port()
    data = root / "data"
    steps = [
        [_pg_bin("initdb"), "-D", str(data), "-U", "fr", f"--pwfile={root / 'pw'}",
         "-A", "scram-sha-256"],
        [_pg_bin("pg_ctl"), "-D", str(data), "-l", str(root / "postgres.log"), "-w", "-t", "60",
         "-o", f"-h 127.0.0.1 -p {port} -k {root}", "start"],
    ]  # fmt: skip
    server = Postgres(root, port, run_as)
    try:
        for step in steps:
            done = subprocess.run(
                run_as + step, cwd=root, capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                log = root / "postgres.log"
                detail = log.read_text()[-800:] if log.exists() else ""
                pytest.skip(f"PostgreSQL did not start: {done.stderr[-800:]} {detail}")
        yield server
    finally:
        subprocess.run(
            run_as + [_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            cwd=root, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


class Server:
    """``mlflow server`` on a PostgreSQL database, served artifacts under ``root``."""

    def __init__(self, pg: Postgres, root: Path, database: str, auth: bool = False) -> None:
        pg.createdb(database)
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
        self.command += ["--port", str(self.port), "--workers", "1"]
        self.command += ["--backend-store-uri", pg.uri(database)]
        self.command += ["--artifacts-destination", str(root / "artifacts")]
        self.env = {**os.environ, **MLFLOW_SERVER_ENV}
        if auth:
            pg.createdb(f"{database}_auth")
            config = root / "basic_auth.ini"
            config.write_text(
                "[mlflow]\ndefault_permission = READ\n"
                f"database_uri = {pg.uri(database + '_auth')}\n"
                "admin_username = admin\n"
                f"admin_password = {PASSWORD}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                "auth_cache_ttl_seconds = 60\n"  # the docs' setting: no password hash per request
            )
            self.command += ["--app-name", "basic-auth"]
            self.env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = secrets.token_hex(8)
            self.env["MLFLOW_AUTH_CONFIG_PATH"] = str(config)
        self.log = root / "server.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=log, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                import urllib.request

                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"the MLflow server did not answer: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def module_server(postgres, tmp_path_factory) -> Iterator[Server]:
    """The module's ``mlflow server`` (each test its own experiment)."""
    started = Server(postgres, tmp_path_factory.mktemp("mlflow_pg"), "mlflow_shared")
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def server(module_server) -> Server:
    """The module's server, running (a test that stopped it and failed before starting it
    again leaves it stopped)."""
    if module_server.process is None or module_server.process.poll() is not None:
        module_server.start()
    return module_server


def _sweep(
    tmp_path: Path, name: str, uri: str, concurrent: int = 2, held: bool = False, through: int = 1
) -> tuple[Path, Path]:
    """Four cells (two seeds of ``add`` and ``gate_scalar``, or with ``held`` four seeds of
    ``held_add``, whose trials after the first ``through`` wait for the file returned), one
    epoch each, in a folder ``name`` of its own, which the drivers run in."""
    grid = {"datasets": ["short"], "fusions": ["held_add"]} if held else None
    path = tiny_sweep(
        tmp_path / name, name=name, tracking_uri=uri,
        **({"seeds": [0, 1, 2, 3], "grid": grid} if held else {}),
        resources={"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": concurrent},
    )  # fmt: skip
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    release = path.parent / "turns" / "release"
    if held:
        release.parent.mkdir()
        install_held_add(path.parent, release, through=through)  # the drivers' working directory
    return path, release


def _env(data_cache: str, ray_session, **extra: str) -> dict[str, str]:
    """A driver's environment: no credentials, the session's Ray, this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    return {**env, "PYTHONPATH": str(ROOT), "FUSION_RAY_CACHE": data_cache, **extra}


def _driver(path: Path, env: dict[str, str], out: Path, *extra: str) -> subprocess.Popen:
    with out.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report", *extra],
            cwd=path.parent, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _trials(uri: str, name: str, **creds: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], "tags.role = 'trial'")


def _one_finished_run_per_cell(uri: str, name: str, cells: int) -> list:
    runs = _trials(uri, name)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == len({r.data.tags["cell_id"] for r in finished}) == cells
    assert len(runs) == cells, [(r.data.tags["cell_id"], r.info.status) for r in runs]
    return finished


def _wait_for_line(driver: subprocess.Popen, out: Path, line: str) -> None:
    """Until the driver has written ``line`` to ``out``; fails at once if it ends first."""
    deadline = time.monotonic() + 600
    while line not in out.read_text():
        assert driver.poll() is None, f"ended before {line!r}: {out.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {line!r} in 600 s: {out.read_text()[-3000:]}"
        time.sleep(0.2)


def test_two_drivers_at_once_share_one_lease_over_rest(server, tmp_path, data_cache, ray_session):
    """Both drivers start at once; the trials (``held_add``, none through) wait until one of
    the drivers has ended, so the other holds the lease until then, whichever got it."""
    path, release = _sweep(tmp_path, "pg_two", server.uri, held=True, through=0)
    env = _env(data_cache, ray_session)
    drivers = [_driver(path, env, tmp_path / f"driver{i}.out") for i in (0, 1)]
    try:
        deadline = time.monotonic() + 600
        while all(d.poll() is None for d in drivers):
            assert time.monotonic() < deadline, "neither driver ended while the trials waited"
            time.sleep(0.2)
        release.touch()
        codes = [d.wait(timeout=900) for d in drivers]
    finally:
        release.touch()
        for d in drivers:
            if d.poll() is None:
                d.kill()
    outputs = [(tmp_path / f"driver{i}.out").read_text() for i in (0, 1)]
    assert sorted(codes) == [0, 3], outputs
    refused = outputs[codes.index(3)]
    assert "lease" in refused and "Traceback" not in refused, refused[-3000:]
    _one_finished_run_per_cell(server.uri, "pg_two", 4)
    from mlflow.tracking import MlflowClient

    models = MlflowClient(server.uri).search_registered_models()
    assert not [m.name for m in models if "pg_two" in m.name], "the lease was not released"


def test_the_server_stopped_mid_sweep_loses_nothing(server, tmp_path, data_cache, ray_session):
    """The server killed once a cell has finished (the next trials wait until it is down), and
    started again on the same port once the driver has said that it waits for it: the driver
    either waits it out (exit 0: MLflow's client retries a request for about four minutes),
    saying so in one line, or stops with one message (exit 5, no traceback); then the same
    command again ends with one FINISHED run per cell."""
    path, release = _sweep(tmp_path, "pg_down", server.uri, concurrent=1, held=True)
    env = _env(data_cache, ray_session)
    out = tmp_path / "driver.out"
    driver = _driver(path, env, out)
    try:
        wait_until_held(
            release, process_ended(driver, out), also=lambda: "[1/4]" in out.read_text()
        )
        server.stop()
        release.touch()  # the waiting trials train and report while the server is down
        _wait_for_line(driver, out, ": waiting for it")
        server.start()
        code = driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    text = out.read_text()
    print(f"\ndriver exit status with the server down: {code}")
    assert code in (0, 5), text[-4000:]
    # one line a minute while it waits, not urllib3's line per retried request
    assert f"no answer from {server.uri}: waiting for it" in text, text[-4000:]
    assert "Retrying (" not in text and "Traceback" not in text, text[-4000:]
    if code == 5:
        assert f"no MLflow server answered at {server.uri}" in text, text[-4000:]
        rerun = subprocess.run(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
            cwd=path.parent, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _one_finished_run_per_cell(server.uri, "pg_down", 4)


def test_a_server_gone_longer_than_the_retries_stops_the_driver_with_one_message(
    server, tmp_path, data_cache, ray_session
):
    """MLflow's client made to retry a request for a second only
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=1``, its back-off shortened), the server killed once a
    cell has finished (the next trials wait until it is down) and not started again: the driver
    stops the sweep with one message saying what is kept and what to do (exit 5), without a
    traceback; with the server back, the same command finishes the sweep, every cell once."""
    path, release = _sweep(tmp_path, "pg_gone", server.uri, concurrent=1, held=True)
    retries = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    }
    out = tmp_path / "driver.out"
    driver = _driver(path, _env(data_cache, ray_session, **retries), out)
    try:
        wait_until_held(
            release, process_ended(driver, out), also=lambda: "[1/4]" in out.read_text()
        )
        server.stop()
        release.touch()  # the waiting trials report to a driver whose server is gone
        code = driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    text = out.read_text()
    assert code == 5, text[-4000:]
    assert f"error: no MLflow server answered at {server.uri}" in text, text[-4000:]
    assert "Start the server again" in text and "run the same command" in text
    assert "Traceback" not in text and text.count("error: ") == 1, text[-4000:]
    server.start()
    rerun = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path), "--no-report"],
        cwd=path.parent, env=_env(data_cache, ray_session), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _one_finished_run_per_cell(server.uri, "pg_gone", 4)


def _everything_logged(uri: str, name: str, where: Path) -> str:
    """Every param, tag and artifact of an experiment's runs, as one text."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    parts = []
    for run in client.search_runs([experiment.experiment_id]):
        parts += [f"{k}={v}" for k, v in {**run.data.params, **run.data.tags}.items()]
        target = where / run.info.run_id
        client.download_artifacts(run.info.run_id, "", str(target))
        parts += [p.read_bytes().decode("utf-8", "replace") for p in target.rglob("*")
                  if p.is_file()]  # fmt: skip
    return "\n".join(parts)


def test_a_basic_auth_server_on_postgres_keeps_the_password_out_of_everything(
    postgres, tmp_path, data_cache, ray_session
):
    server = Server(postgres, tmp_path, f"mlflow_{secrets.token_hex(3)}", auth=True)
    server.start()
    try:
        path, _ = _sweep(tmp_path, "pg_auth", server.uri)
        creds = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
        ran = subprocess.run(
            [sys.executable, "-m", "fusion_ray.sweep", str(path), "--report-dir",
             str(tmp_path / "report")],
            cwd=path.parent, env=_env(data_cache, ray_session, **creds), capture_output=True,
            text=True, timeout=900,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        os.environ.update(creds)
        try:
            _one_finished_run_per_cell(server.uri, "pg_auth", 4)
            logged = _everything_logged(server.uri, "pg_auth", tmp_path / "downloaded")
        finally:
            for key in creds:
                os.environ.pop(key, None)
    finally:
        server.stop()
    outputs = [ran.stdout, ran.stderr, logged, server.log.read_text()]
    for folder in (tmp_path / "report", path.parent / "ray_results"):
        outputs += [p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
                    and p.suffix in (".md", ".json", ".csv", ".log", ".txt", ".yaml", ".tex")]  # fmt: skip
    assert (tmp_path / "report" / "report.md").exists()
    assert len(logged) > 1000, "nothing was read back from the server"
    leaks = [text[max(0, text.find(PASSWORD) - 80) :][:160] for text in outputs if PASSWORD in text]
    assert not leaks, leaks
