"""One classification of a tracking store's faults (``fusion_ray.store_errors``), on the errors
the real components raise: MLflow writing to a sqlite store that has no page left (SQLite's
SQLITE_FULL, as on a full disk), a write while another connection holds the database, a server
port nothing listens on; and what the driver and the report make of each: one message, the same
exit code."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from analysis.load.store import access_problem as report_problem
from fusion_ray import api
from fusion_ray.config import load_sweep
from fusion_ray.driver import session as driver_session
from fusion_ray.driver import store_faults, tracking
from fusion_ray.driver.preflight import RefusedError
from fusion_ray.hpo.fragment import FragmentExistsError, exists_message
from fusion_ray.store_errors import (
    AUDIENCES,
    EXIT_CODES,
    FAULTS,
    HTTP_RETRIES_ENV,
    HTTP_TIMEOUT_ENV,
    StoreAccessError,
    StoreFault,
    access_error,
    classify,
    fault_message,
)
from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.unit


@pytest.fixture
def capped_pages():
    """``cap["pages"] = N``: every connection SQLAlchemy opens from then on may grow its
    database to N pages at most (SQLite's ``max_page_count``), so the next write that needs a
    page fails as on a full disk (SQLITE_FULL, "database or disk is full")."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    cap: dict[str, int | None] = {"pages": None}

    def limit(connection: sa.Connection) -> None:
        if cap["pages"] is not None:
            connection.exec_driver_sql(f"PRAGMA max_page_count = {cap['pages']}")

    event.listen(Engine, "engine_connect", limit)
    yield cap
    event.remove(Engine, "engine_connect", limit)


def _pages(db: Path) -> int:
    with sqlite3.connect(db) as connection:
        return connection.execute("PRAGMA page_count").fetchone()[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_full_sqlite_store_is_one_kind_for_the_driver_and_the_report(
    tmp_path, capped_pages, caplog, mlflow_store
):
    db = tmp_path / "mlflow.db"
    uri = mlflow_store(db)
    tracker = tracking.Tracker(uri, "full_sweep")
    client = tracker.client
    run_id = client.create_run(tracker.experiment_id).info.run_id
    client.set_terminated(run_id)
    capped_pages["pages"] = _pages(db)
    caplog.set_level(logging.ERROR, logger="mlflow.store.db.utils")
    with pytest.raises(MlflowException) as caught:
        for i in range(200):  # a page's worth of tags at most
            client.set_tag(run_id, f"tag{i}", "v" * 4000)
    assert classify(caught.value) == StoreFault("full", "database or disk is full")
    # MLflow logs the error with its traceback first; the driver says it once instead
    said = [r for r in caplog.records if r.name == "mlflow.store.db.utils"]
    assert not [r for r in said if r.levelno >= logging.ERROR]

    problem = access_error(caught.value, uri, "driver")
    assert problem is not None and problem.kind == "full"
    assert str(problem) == (
        f"no space is left for the tracking store {db} (database or disk is full), so MLflow "
        "cannot record the runs: free space on its disk (or point tracking_uri at a store on a "
        "larger disk), then run the same command again"
    )
    assert driver_session.exit_code(problem) == 12
    refused = report_problem(caught.value, uri)
    assert refused is not None and refused.kind == "full" and str(db) in str(refused)
    assert refused.exit_code == 12
    # the driver's parent run of an invocation, written into that store: the same one message
    with pytest.raises(StoreAccessError) as parent:
        tracker.parent_run(params={f"setting{i}": "v" * 4000 for i in range(20)})
    assert parent.value.kind == "full" and str(parent.value) == str(problem)
    # what was there reads back
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def test_a_driver_write_that_meets_a_full_store_ends_the_session_as_the_callbacks_do(
    tmp_path, capped_pages, mlflow_store
):
    """A write of the driver's own (not a Tune callback's) inside ``DriverSession.driving``:
    the session stops with the full store's one message and exit 12, and leaves its lease as it
    is (it cannot be deleted from a full store; the next driver on this machine takes it over)
    instead of marking the parent run FAILED in a store that takes no writes."""
    from fusion_ray.driver.session import DriverSession

    db = tmp_path / "mlflow.db"
    with DriverSession("sweep", "full_session", mlflow_store(db), str(tmp_path)) as session:
        parent_id = session.open_parent(None, {"cells": "1"})
        capped_pages["pages"] = _pages(db)
        with pytest.raises(store_faults.TrackingStoreFullError) as caught, session.driving():
            for i in range(200):
                session.tracker.client.set_tag(parent_id, f"note{i}", "v" * 4000)
    assert str(caught.value).startswith(
        f"no space is left for the tracking store {db} (database or disk is full) while the "
        "sweep ran, so the driver stopped: 0 trial(s) had finished in this run"
    )
    assert driver_session.exit_code(caught.value) == 12 and session.lease.abandoned
    store = tracking.Tracker(f"sqlite:///{db}", "full_session").lease_store()
    assert store.tags(session.lease.name) is not None  # left for the next driver
    assert MlflowClient(f"sqlite:///{db}").get_run(parent_id).info.status == "RUNNING"


def test_a_store_held_by_another_connection_is_locked_at_every_layer(tmp_path):
    db = tmp_path / "held.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError) as raw:
            sqlite3.connect(db, timeout=0).execute("INSERT INTO t VALUES (1)")
        engine = sa.create_engine(f"sqlite:///{db}", connect_args={"timeout": 0})
        with pytest.raises(sa.exc.OperationalError) as wrapped, engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO t VALUES (1)")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for caught in (raw.value, wrapped.value):
        assert classify(caught) == StoreFault("locked", "database is locked")
    problem = access_error(wrapped.value, f"sqlite:///{db}", "driver")
    assert problem is not None and driver_session.exit_code(problem) == 9


def test_an_error_is_classified_by_its_own_words_not_by_the_values_it_quotes(tmp_path):
    """SQLAlchemy appends the statement and its parameters to an error; a parameter (a run's
    failure reason, say) may quote an earlier store error, which says nothing about this one."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    earlier = "no MLflow server answers: Connection refused; database or disk is full (401)"
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO missing VALUES (:reason)"), {"reason": earlier})
    assert earlier in str(caught.value) and "no such table" in str(caught.value)
    assert classify(caught.value) is None


def test_a_port_nothing_listens_on_is_unreachable(monkeypatch):
    monkeypatch.setenv(HTTP_RETRIES_ENV, "0")
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(MlflowException) as caught:
        MlflowClient(uri).get_experiment_by_name("x")
    assert classify(caught.value) == StoreFault("unreachable")
    problem = access_error(caught.value, uri, "driver")
    assert problem is not None and driver_session.exit_code(problem) == 10
    reported = report_problem(caught.value, uri)
    assert reported is not None and reported.exit_code == 10


def test_a_dry_run_waits_for_a_server_as_long_as_it_says_and_leaves_mlflows_settings(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(HTTP_RETRIES_ENV, raising=False)
    monkeypatch.setenv(HTTP_TIMEOUT_ENV, "77")
    uri = f"http://127.0.0.1:{_closed_port()}"
    spec = load_sweep(tiny_sweep(tmp_path, tracking_uri=uri))
    with pytest.raises(StoreAccessError) as caught:
        api.dry_run(spec)
    assert caught.value.kind == "unreachable"
    assert f"no MLflow server answered at {uri} within {api.DRY_RUN_WAIT_S} s" in str(caught.value)
    assert driver_session.exit_code(caught.value) == 10
    assert HTTP_RETRIES_ENV not in os.environ
    assert os.environ[HTTP_TIMEOUT_ENV] == "77"


def test_every_stop_of_a_driver_has_its_documented_exit_code(tmp_path):
    assert driver_session.exit_code(RefusedError("a check under the lease refused")) == 2
    assert (
        driver_session.exit_code(FragmentExistsError(exists_message(tmp_path / "tuned.yaml"))) == 2
    )
    full = store_faults.store_lost_error(f"{store_faults.STORE_FULL} x.db (d)", 1, "/s")
    gone = store_faults.store_lost_error("the tracking store x.db disappeared", 1, "/s")
    assert (
        type(full) is store_faults.TrackingStoreFullError and driver_session.exit_code(full) == 12
    )
    assert type(gone) is store_faults.TrackingStoreLostError and driver_session.exit_code(gone) == 5
    assert "Free space on its disk" in str(full) and "Restore the store" in str(gone)
    assert {kind: FAULTS[kind].exit_code for kind in EXIT_CODES} == EXIT_CODES
    table = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for code in [*driver_session.EXIT_CODES, *EXIT_CODES.values()]:
        assert f"\n| {code} |" in table, f"exit code {code} is not in docs/reference/cli.md"


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_every_fault_kind_has_one_exit_code_and_whole_words_for_each_audience(kind):
    """One table: each kind's cause and fix, for each audience that meets it, fill every slot
    (no brace left, the URI's password masked) and end with what to do; the driver leaves a
    URI that names no store to its pre-flight check."""
    uri = "http://bob:Zz-9-secret@127.0.0.1:5000"
    fault = StoreFault(kind, "some detail")
    worded = {a: fault_message(fault, uri, a, wait_s=7) for a in FAULTS[kind].cause}
    assert set(worded) == (set(AUDIENCES) if kind != "store" else {"report"})
    for text in worded.values():
        assert "{" not in text and "}" not in text and "Zz-9-secret" not in text, text
        assert text.count(": ") >= 1 and ("again" in text or "--tracking-uri" in text), text
    if kind == "unreachable":
        assert "within 7 s" in worded["dry run"] and "waits 7 s" in worded["report"]
    error = StoreAccessError(kind, "x")
    assert error.exit_code == FAULTS[kind].exit_code == EXIT_CODES.get(kind, 2)
