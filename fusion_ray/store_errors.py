"""What an error from a tracking store says about the store: the one classification that the
driver (``fusion_ray.driver.tracking``) and the report (``analysis.load.store``) both word as
one message with the fix, and the exit codes both give each kind.

Standard library only, so ``analysis`` imports it (as it imports ``fusion_ray.schema``): it reads
an exception, whatever raised it (MLflow's client, SQLAlchemy, sqlite3), through its chain of
causes, and never imports MLflow.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

from fusion_ray.redact import split_credentials

EXIT_CODES = {"auth": 8, "locked": 9, "unreachable": 10, "full": 12}
"""The exit code of each kind of store fault, for every command (a sweep, HPO, the report); a
URI that names no store (kind "store") is an invalid input: exit 2."""

HTTP_RETRIES_ENV, HTTP_TIMEOUT_ENV = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
)
"""How often MLflow's client retries a request to a server (7 by default, about 4 minutes with
its backoff), and how many seconds it waits for each answer (120)."""


@contextlib.contextmanager
def each_request_once(wait_s: int) -> Iterator[None]:
    """While the body runs, MLflow's client sends each request to a server once and waits at
    most ``wait_s`` seconds for its answer, instead of retrying for minutes: for a first look at
    a store that should fail fast. MLflow reads both settings from the environment at every
    request, so they hold for the whole process while the body runs, and are as they were
    after."""
    saved = {name: os.environ.get(name) for name in (HTTP_RETRIES_ENV, HTTP_TIMEOUT_ENV)}
    os.environ[HTTP_RETRIES_ENV], os.environ[HTTP_TIMEOUT_ENV] = "0", str(wait_s)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_UNREACHABLE = re.compile(r"Max retries exceeded|Connection refused|timed out|Failed to establish")
_AUTH = re.compile(r"error code (40[13])\b|\b(UNAUTHENTICATED|PERMISSION_DENIED)\b")
_FULL = re.compile(r"database or disk is full|No space left on device")
_LOCKED = re.compile(r"database is locked")
_NO_STORE = re.compile(r"not a database|unsupported URI|file store|filesystem tracking backend")


@dataclass(frozen=True)
class StoreFault:
    """A store fault: ``kind`` ("auth", "locked", "unreachable", "full" or "store") and the
    words a message quotes: "401 unauthenticated" or "403 forbidden" (auth), SQLite's or the
    operating system's own words (full), the error's first line (store); else empty."""

    kind: str
    detail: str = ""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: its causes, and the driver's error inside a SQLAlchemy one."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(out) < 20:
        item = todo.pop(0)
        if item is None or any(item is seen for seen in out):
            continue
        out.append(item)
        orig = getattr(item, "orig", None)
        todo += [orig if isinstance(orig, BaseException) else None]
        todo += [item.__cause__, item.__context__]
    return out


def _words(exc: BaseException) -> str:
    """An error's text without the statement and parameters SQLAlchemy appends (a parameter may
    quote an earlier error, e.g. a run's failure reason)."""
    return re.split(r"\n\[SQL: ", str(exc), maxsplit=1)[0]


def _sqlite_fault(chain: list[BaseException]) -> StoreFault | None:
    """What SQLite's own error code says, when the chain holds a sqlite3 error."""
    for item in chain:
        name = getattr(item, "sqlite_errorname", None) if isinstance(item, sqlite3.Error) else None
        if name == "SQLITE_FULL":
            return StoreFault("full", str(item))
        if name in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            return StoreFault("locked", str(item))
    return None


def classify(exc: BaseException) -> StoreFault | None:
    """What ``exc`` (from MLflow's client, SQLAlchemy or sqlite3, or any error that wraps one)
    says about the tracking store: its server refused the credentials ("auth"), did not answer
    ("unreachable"), its database stayed locked ("locked"), its disk is full ("full"), or the
    URI names no store ("store"); None when it is about something else."""
    chain = _chain(exc)
    fault = _sqlite_fault(chain)
    if fault is not None:
        return fault
    for item in chain:
        if isinstance(item, OSError) and item.errno == errno.ENOSPC:
            where = f": {item.filename}" if item.filename else ""
            return StoreFault("full", f"{item.strerror or 'No space left on device'}{where}")
    text = "\n".join(_words(item) for item in chain)
    status = _AUTH.search(text)
    if status:
        forbidden = "403" in status.group(0) or "PERMISSION" in status.group(0)
        return StoreFault("auth", "403 forbidden" if forbidden else "401 unauthenticated")
    if _UNREACHABLE.search(text):
        return StoreFault("unreachable")
    full = _FULL.search(text)
    if full:
        return StoreFault("full", full.group(0))
    if _LOCKED.search(text):
        return StoreFault("locked", "database is locked")
    if _NO_STORE.search(text):
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return StoreFault("store", first.strip().split(". ")[0][:200])
    return None


def credentials_fix(tracking_uri: str, option: str) -> str:
    """What to do about refused credentials: fix the user and password in the URI when it
    carries them (they are used over the environment), else set the environment variables
    MLflow's client sends; ``option`` names where the URI was given (``tracking_uri``,
    ``--tracking-uri``)."""
    if split_credentials(tracking_uri)[2] is not None:
        return (
            f"fix the user and password in {option} (they are used over "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD), or remove them and set "
            "those variables (or MLFLOW_TRACKING_TOKEN),"
        )
    return "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
