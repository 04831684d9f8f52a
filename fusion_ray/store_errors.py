"""A tracking store's faults, in one place: what an error says about the store (``classify``),
each kind's cause and its fix for each audience (``FAULTS``: the driver, a dry run, the report),
the one exception that carries a fault to the command (``StoreAccessError``) and its exit code.
The driver (``fusion_ray.driver.store_faults``) and the report (``analysis.load.store``) word
every fault through ``access_error``.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fusion_ray.redact import redact, split_credentials

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


AUDIENCES = ("driver", "dry run", "report")
"""Who a fault is worded for: a driver about to run trials, a dry run's quick look at the store
(each request sent once, waited for ``wait_s``), the report reading the runs."""

OPTION = {"driver": "tracking_uri", "dry run": "tracking_uri", "report": "--tracking-uri"}
"""Where each audience's tracking URI was given, as its fixes name it."""

AGAIN = {
    "driver": "then run the same command again",
    "dry run": "then run the same command again",
    "report": "then run the report again",
}


@dataclass(frozen=True)
class FaultKind:
    """One kind of store fault: its exit code, and per audience its cause and its fix, as
    templates of ``{where}`` (the redacted URI), ``{store}`` (a sqlite file by its path, a
    server's store by its server), ``{detail}`` (the words ``classify`` quotes), ``{wait_s}``,
    ``{credentials}`` (``credentials_fix``) and ``{again}``. A kind without a cause for an
    audience is left to that audience's own check (the driver's pre-flight check names a URI
    that is no store)."""

    kind: str
    exit_code: int
    cause: Mapping[str, str]
    fix: Mapping[str, str]


_SERVER_FIX = "start it (mlflow server ...) or fix tracking_uri, {again}"
FAULTS: dict[str, FaultKind] = {
    "unreachable": FaultKind(
        "unreachable",
        EXIT_CODES["unreachable"],
        cause={
            "driver": "no MLflow server answers at {where}",
            "dry run": "no MLflow server answered at {where} within {wait_s} s (each request is "
            "sent once and waited for no longer)",
            "report": "no MLflow server answers at {where} (the report's first request waits "
            "{wait_s} s)",
        },
        fix={
            "driver": _SERVER_FIX,
            "dry run": _SERVER_FIX,
            "report": "start it or fix --tracking-uri, {again}",
        },
    ),
    "auth": FaultKind(
        "auth",
        EXIT_CODES["auth"],
        cause={
            "driver": "the MLflow server at {where} refused this driver's credentials ({detail})",
            "dry run": "the MLflow server at {where} refused this driver's credentials ({detail})",
            "report": "the MLflow server at {where} refused the report's credentials ({detail})",
        },
        fix={
            "driver": "{credentials} for a user that may write to the experiment, {again}",
            "dry run": "{credentials} for a user that may write to the experiment, {again}",
            "report": "{credentials} for a user that may read the experiment, {again}",
        },
    ),
    "full": FaultKind(
        "full",
        EXIT_CODES["full"],
        cause={
            "driver": "no space is left for the tracking store {store} ({detail}), so MLflow "
            "cannot record the runs",
            "dry run": "no space is left for the tracking store {store} ({detail}), so MLflow "
            "cannot record the runs",
            "report": "no space is left for the tracking store {store} ({detail})",
        },
        fix={
            "driver": "free space on its disk (or point tracking_uri at a store on a larger "
            "disk), {again}",
            "dry run": "free space on its disk (or point tracking_uri at a store on a larger "
            "disk), {again}",
            "report": "free space on its disk, {again}",
        },
    ),
    "locked": FaultKind(
        "locked",
        EXIT_CODES["locked"],
        cause={
            "driver": "the tracking store {where} stayed locked by another process beyond "
            "MLflow's wait (another driver or a script writing to the same sqlite file)",
            "dry run": "the tracking store {where} stayed locked by another process beyond "
            "MLflow's wait (another driver or a script writing to the same sqlite file)",
            "report": "the tracking store {where} stayed locked by another process beyond "
            "MLflow's wait",
        },
        fix={
            "driver": "wait for it to finish and run the same command again; for stores several "
            "processes write, use an MLflow server (mlflow server --backend-store-uri ...)",
            "dry run": "wait for it to finish and run the same command again; for stores "
            "several processes write, use an MLflow server (mlflow server --backend-store-uri "
            "...)",
            "report": "run the report again once that process has finished writing",
        },
    ),
    "store": FaultKind(
        "store",
        2,
        cause={
            "report": "the tracking URI {where} names no MLflow store the report can read "
            "({detail})"
        },
        fix={
            "report": "pass the store the sweep logged to with --tracking-uri: sqlite:///PATH "
            "or http(s)://HOST:PORT"
        },
    ),
}
"""Every kind ``classify`` gives, with its cause and fix for each audience."""


class StoreAccessError(RuntimeError):
    """The tracking store refused, did not answer, stayed locked, has no room, or is no store;
    ``kind`` (a key of ``FAULTS``) picks the exit code. Raised by every command, worded for it
    (``access_error``)."""

    def __init__(self, kind: str, message: str, fault: StoreFault | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.fault = fault
        """What ``classify`` read, when the error came from it: to word it for another
        audience (``reworded``)."""

    def reworded(self, tracking_uri: str, audience: str, wait_s: int = 0) -> StoreAccessError:
        """The same fault worded for ``audience`` (itself when it holds no classified fault, or
        the kind has no words for that audience)."""
        if self.fault is None or audience not in FAULTS[self.kind].cause:
            return self
        message = fault_message(self.fault, tracking_uri, audience, wait_s)
        return StoreAccessError(self.kind, message, self.fault)

    @property
    def exit_code(self) -> int:
        return FAULTS[self.kind].exit_code


def sqlite_file(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///`` store (None for any other store)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri.removeprefix("sqlite:///")).resolve()


def store_name(tracking_uri: str) -> str:
    """The store as a message names it: a sqlite file by its path, a server's store by its
    server."""
    db = sqlite_file(tracking_uri)
    return str(db) if db is not None else f"behind the MLflow server at {redact(tracking_uri)}"


def fault_message(fault: StoreFault, tracking_uri: str, audience: str, wait_s: int = 0) -> str:
    """One message for ``fault``: its cause and its fix, as ``audience`` needs them (one of
    ``AUDIENCES``). KeyError when the kind has no words for the audience."""
    kind = FAULTS[fault.kind]
    words = {
        "where": redact(tracking_uri),
        "store": store_name(tracking_uri),
        "detail": redact(fault.detail),
        "wait_s": wait_s,
        "credentials": credentials_fix(tracking_uri, OPTION[audience]),
        "again": AGAIN[audience],
    }
    return f"{kind.cause[audience].format(**words)}: {kind.fix[audience].format(**words)}"


def access_error(
    exc: BaseException, tracking_uri: str, audience: str, wait_s: int = 0
) -> StoreAccessError | None:
    """What ``exc`` says about reaching the store, as one ``StoreAccessError`` worded for
    ``audience``; None when it is about something else, or is a kind the audience checks
    itself."""
    fault = classify(exc)
    if fault is None or audience not in FAULTS[fault.kind].cause:
        return None
    message = fault_message(fault, tracking_uri, audience, wait_s)
    return StoreAccessError(fault.kind, message, fault)
