"""The tracking store's faults as the driver meets them, beside the tracker
(``fusion_ray.driver.tracking``) that meets them: on first contact (``access_errors``, a dry
run's ``answer_within``), worded by the one table of ``fusion_ray.store_errors``; while the
sweep runs (``store_gone``: a server that stayed away, a full disk; ``store_lost_error``); and
how long a sqlite store waits for a lock (``FUSION_RAY_SQLITE_WAIT_S``).

With ``fusion_ray.driver.tracking``, the only module of fusion_ray that imports MLflow (an
architecture test holds that): it tells MLflow's and SQLAlchemy's errors from any other.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import mlflow

from fusion_ray.driver.preflight import sqlite_wait_ms
from fusion_ray.redact import redact
from fusion_ray.store_errors import (
    FAULTS,
    StoreAccessError,
    access_error,
    classify,
    each_request_once,
    fault_message,
    store_name,
)


@contextlib.contextmanager
def access_errors(tracking_uri: str, audience: str = "driver", wait_s: int = 0) -> Iterator[None]:
    """MLflow's errors on first contact with the store, as ``StoreAccessError`` (worded for
    ``audience``) where they mean that the store refused, did not answer, stayed locked or has
    no room; anything else as it was."""
    from sqlalchemy.exc import OperationalError

    try:
        yield
    except (mlflow.exceptions.MlflowException, OperationalError) as exc:
        problem = access_error(exc, tracking_uri, audience, wait_s)
        if problem is None:
            raise
        raise problem from None


@contextlib.contextmanager
def answer_within(tracking_uri: str, wait_s: int) -> Iterator[None]:
    """While the body runs, MLflow's client sends each request once and waits at most ``wait_s``
    seconds for its answer, instead of retrying for minutes (for a look at the store that can
    fail fast, as a dry run's); a fault is a ``StoreAccessError`` worded for a dry run. MLflow
    reads both from the environment, so they hold for the whole process while the body runs,
    and are as they were after."""
    try:
        with each_request_once(wait_s), access_errors(tracking_uri, "dry run", wait_s):
            yield
    except StoreAccessError as exc:  # met inside by a tracker, worded for a driver
        raise exc.reworded(tracking_uri, "dry run", wait_s) from None


def _sqlite_wait_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """A new sqlite connection waits ``FUSION_RAY_SQLITE_WAIT_S`` for a lock (MLflow opens the
    store on connections whose wait is the sqlite3 driver's 5 s)."""
    wait_ms = sqlite_wait_ms()
    if wait_ms is not None and isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute(f"PRAGMA busy_timeout = {wait_ms}")


def _sqlite_wait_in_sessions(
    _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any
) -> tuple[str, Any]:
    """MLflow starts every session on a sqlite store with ``PRAGMA busy_timeout = 20000``: with
    ``FUSION_RAY_SQLITE_WAIT_S`` set, that statement sets its value instead."""
    if statement.lstrip().upper().startswith("PRAGMA BUSY_TIMEOUT"):
        wait_ms = sqlite_wait_ms()
        if wait_ms is not None:
            return f"PRAGMA busy_timeout = {wait_ms};", parameters
    return statement, parameters


def _listen_for_sqlite_waits() -> None:
    """Every SQLAlchemy engine of this process (MLflow's sqlite stores among them) takes
    ``FUSION_RAY_SQLITE_WAIT_S``; the listeners change nothing while it is unset."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _sqlite_wait_on_connect):
        event.listen(Engine, "connect", _sqlite_wait_on_connect)
        event.listen(Engine, "before_cursor_execute", _sqlite_wait_in_sessions, retval=True)


_listen_for_sqlite_waits()


class TrackingStoreLostError(RuntimeError):
    """The sweep's tracking store vanished while it ran; the message says what is safe and how
    to recover."""


class TrackingStoreFullError(TrackingStoreLostError):
    """The sweep's tracking store had no room for another write while the sweep ran (its disk
    filled); the message says what is safe and how to recover."""


SERVER_GONE = "no MLflow server answered at"
"""How ``store_gone`` starts for a tracking server that stopped answering mid-sweep."""
STORE_FULL = "no space is left for the tracking store"
"""How ``store_gone`` starts for a store whose disk filled mid-sweep."""


def store_gone(exc: BaseException, tracking_uri: str) -> str | None:
    """When ``exc``, an error of the store's client, says the store cannot take the sweep's
    writes any more: its server did not answer after MLflow's client retried the request for
    minutes (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``), or its disk is full; that, as the first half
    of ``store_lost_message``; else None."""
    from sqlalchemy.exc import SQLAlchemyError

    if not isinstance(exc, (mlflow.exceptions.MlflowException, SQLAlchemyError, sqlite3.Error)):
        return None
    fault = classify(exc)
    if fault is not None and fault.kind == "full":
        return f"{STORE_FULL} {store_name(tracking_uri)} ({fault.detail})"
    if fault is None or fault.kind != "unreachable":
        return None
    return (
        f"{SERVER_GONE} {redact(tracking_uri)} for as long as MLflow's client retries a request "
        "(about 4 minutes)"
    )


def store_lost_message(problem: str, finished: int, storage_path: str) -> str:
    if problem.startswith(SERVER_GONE):
        fix = "Start the server again (or point tracking_uri at the right one)"
    elif problem.startswith(STORE_FULL):
        fix = "Free space on its disk (or point tracking_uri at a store on a larger disk)"
    else:
        fix = "Restore the store from a backup (or point tracking_uri at the right one)"
    return (
        f"{problem} while the sweep ran, so the driver stopped: {finished} trial(s) had "
        f"finished in this run; their checkpoints and predictions remain under storage_path "
        f"{storage_path}, which the driver left as it was. {fix} and run the same command "
        "again: cells whose FINISHED runs are in the store are not run again; the others "
        "resume from their checkpoints or start again"
    )


def store_lost_error(problem: str, finished: int, storage_path: str) -> TrackingStoreLostError:
    """The error a driver stops with when its store went away as ``problem`` says
    (``Tracker.store_problem``, ``store_gone``): ``TrackingStoreFullError`` for a full store."""
    full = problem.startswith(STORE_FULL)
    error = TrackingStoreFullError if full else TrackingStoreLostError
    return error(store_lost_message(problem, finished, storage_path))


class Watched(Protocol):
    """A tracker whose store may go away (``Tracker.store_problem``)."""

    def store_problem(self) -> str | None: ...


class _StoreErrorFilter(logging.Filter):
    """Drops MLflow's SQLAlchemy error records (each with a traceback) that the driver says in
    one message instead: every record once a watched tracker's sqlite file is gone, and a full
    store's at any time (the driver stops on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.trackers: weakref.WeakSet[Watched] = weakref.WeakSet()
        logging.getLogger("mlflow.store.db.utils").addFilter(self)

    def watch(self, tracker: Watched) -> None:
        self.trackers.add(tracker)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        fault = classify(error) if error is not None else None
        if fault is not None and fault.kind == "full":
            return False
        return all(t.store_problem() is None for t in list(self.trackers))


STORE_ERRORS = _StoreErrorFilter()
"""The filter every tracker of a sqlite store is watched by (``STORE_ERRORS.watch``)."""


def inode(path: Path | None) -> int | None:
    """The inode of ``path`` (None: no path, or nothing there)."""
    try:
        return path.stat().st_ino if path is not None else None
    except OSError:
        return None


__all__ = [
    "FAULTS",
    "SERVER_GONE",
    "STORE_ERRORS",
    "STORE_FULL",
    "StoreAccessError",
    "TrackingStoreFullError",
    "TrackingStoreLostError",
    "access_errors",
    "answer_within",
    "fault_message",
    "inode",
    "store_gone",
    "store_lost_error",
    "store_lost_message",
]
