"""A signal to the driver is recorded, said, and acted on at the driver's next safe point: never
raised in the middle of what the main thread does (a write to the sqlite tracking store cut
half-way left its connection holding the store locked, and the driver's own KILLED marks then
failed after MLflow's 20 s wait). The real driver under SIGINT and SIGTERM is tested in
test_driver_resume.py."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from fusion_ray.driver.callbacks import DriverStopper, TrackingCallback
from fusion_ray.driver.session import DriverInterrupted, DriverSession, stop_on_signals

pytestmark = pytest.mark.unit


@pytest.fixture
def own_handlers():
    """The process's SIGINT and SIGTERM handlers put back after the test: after a signal the
    driver's handler stays installed on purpose (a second signal must not cut the clean-up)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs in this (the main) thread at its next bytecode


def test_a_signal_during_a_store_write_lets_the_write_finish(tmp_path, own_handlers, capsys):
    store = tmp_path / "store.db"
    with sqlite3.connect(store, isolation_level=None) as setup:
        setup.execute("CREATE TABLE runs (id INTEGER, status TEXT)")
    received: list[str] = []
    writer = sqlite3.connect(store, isolation_level=None, timeout=0.5)
    with stop_on_signals(received):
        writer.execute("BEGIN IMMEDIATE")  # the store is locked for this write
        writer.execute("INSERT INTO runs VALUES (1, 'RUNNING')")
        _deliver(signal.SIGTERM)
        writer.execute("COMMIT")  # reached: the signal did not cut the transaction
    writer.close()
    assert received == ["SIGTERM"]
    assert "SIGTERM: stopping the trials" in capsys.readouterr().err
    with sqlite3.connect(store, isolation_level=None, timeout=0.5) as other:
        other.execute("UPDATE runs SET status = 'KILLED'")  # not "database is locked"
        assert other.execute("SELECT status FROM runs").fetchall() == [("KILLED",)]


def test_the_second_signal_is_said_and_ignored_and_the_handler_stays(own_handlers, capsys):
    received: list[str] = []
    with stop_on_signals(received):
        _deliver(signal.SIGINT)
    # after the body, while the driver marks its runs KILLED: still this driver's handler
    _deliver(signal.SIGINT)
    assert received == ["SIGINT", "SIGINT"]
    assert "SIGINT: already stopping" in capsys.readouterr().err


def test_no_signal_puts_the_previous_handlers_back(own_handlers):
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals([]):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


class _Callback(TrackingCallback):
    def key(self, trial):
        return trial


def test_tune_is_stopped_and_the_session_raises_at_its_safe_point(tmp_path):
    session = DriverSession("sweep", "s", f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path))
    stopper = DriverStopper(_Callback(tracker=None), session.stopping)
    assert not stopper.stop_all() and not stopper("trial", {})
    session.stop_if_signalled()  # nothing received: goes on

    session.signals.append("SIGTERM")  # what the handler records
    assert stopper.stop_all() and stopper("trial", {})
    with pytest.raises(DriverInterrupted) as raised:
        session.stop_if_signalled()
    assert raised.value.signal_name == "SIGTERM"


def test_a_signal_after_the_last_tune_run_is_said_not_acted_on(tmp_path, own_handlers, capsys):
    session = DriverSession("sweep", "s", f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path))
    with session.driving():  # the decisions are written here, after the last Tune run
        _deliver(signal.SIGINT)
    assert session.signals == ["SIGINT"]
    err = capsys.readouterr().err
    assert "SIGINT came after the last trial had ended: the sweep was not stopped" in err


def test_without_a_signal_the_driver_says_nothing_of_one(tmp_path, own_handlers, capsys):
    session = DriverSession("sweep", "s", f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path))
    with session.driving():
        pass
    assert "came after the last trial" not in capsys.readouterr().err
