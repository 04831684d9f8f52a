"""Checks before any compute starts: the storage path can be written and the tracking store
answers (a sqlite store: a database, on a disk with room to write; a database URI: its driver
installed). What would otherwise fail only after Ray starts is one message, and the command
exits 2.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

from fusion_ray.redact import redact


class RefusedError(RuntimeError):
    """A check a driver makes before it runs anything, once it holds its lease, refused: one
    message, and the command exits 2 as for the checks before it (``driver.exit_code``)."""


def preflight(
    storage_path: str, tracking_uri: str, *, remote: bool = True, timeout_s: float = 5.0
) -> list[str]:
    """What would fail only after Ray starts: storage that cannot be written, a tracking store
    that cannot be reached. Leaves nothing behind; a server gets ``timeout_s``. ``remote=False``
    checks only local paths (a dry run on a machine that cannot reach the cluster's stores)."""
    problems = _setting_problems() + _storage_problems(storage_path, remote)
    return problems + _tracking_problems(tracking_uri, timeout_s, remote)


SQLITE_WAIT_ENV = "FUSION_RAY_SQLITE_WAIT_S"
"""Seconds a read or write of a sqlite tracking store waits for a lock another process holds
before it fails with "database is locked" (unset: MLflow's own waits, 20 s in its sessions and
5 s when it opens the store; ``fusion_ray.driver.tracking`` applies it). Tests shorten it; a lab may
lengthen it for a script that writes to the store at length."""
SQLITE_WAIT_MAX_S = 86400


def _sqlite_wait_s() -> float | None:
    """``FUSION_RAY_SQLITE_WAIT_S`` as seconds; None when unset; NaN when it is no number of
    seconds from 0 to ``SQLITE_WAIT_MAX_S``."""
    value = os.environ.get(SQLITE_WAIT_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return math.nan
    return seconds if 0 <= seconds <= SQLITE_WAIT_MAX_S else math.nan


def sqlite_wait_ms() -> int | None:
    """``FUSION_RAY_SQLITE_WAIT_S`` in milliseconds; None when it is unset or not a number of
    seconds from 0 to 86400 (MLflow's own waits then; ``preflight`` refuses such a value)."""
    seconds = _sqlite_wait_s()
    return None if seconds is None or math.isnan(seconds) else round(seconds * 1000)


def _setting_problems() -> list[str]:
    """Settings read from the environment that hold no usable value."""
    seconds = _sqlite_wait_s()
    if seconds is None or not math.isnan(seconds):
        return []
    value = os.environ[SQLITE_WAIT_ENV]
    return [
        f"{SQLITE_WAIT_ENV} (environment): {value[:40]!r} is not a number of seconds from 0 to "
        f"{SQLITE_WAIT_MAX_S}; set it to one (e.g. 20) or unset it for MLflow's own wait"
    ]


def _writable_dir_problem(path: Path, what: str) -> str | None:
    target = path.resolve()
    if target.exists() and not target.is_dir():
        return f"{what}: {path} is a file, not a folder"
    existing = next(p for p in [target, *target.parents] if p.exists())
    try:  # a real write: permission bits say nothing for root, or on read-only mounts
        os.rmdir(tempfile.mkdtemp(prefix=".fusion-ray-write-test-", dir=existing))
    except OSError as exc:
        return f"{what}: {path} cannot be written ({exc.strerror} in {existing}); choose a folder you can write"
    return None


def _storage_problems(storage_path: str, remote: bool) -> list[str]:
    if "://" not in storage_path:
        problem = _writable_dir_problem(Path(storage_path), "storage_path")
        return [problem] if problem else []
    if not remote:
        return []
    import pyarrow.fs

    try:
        pyarrow.fs.FileSystem.from_uri(storage_path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad URI
        return [
            redact(
                f"storage_path: {storage_path} cannot be opened ({str(exc).splitlines()[0]}); "
                "check the URI, the credentials and the network"
            )
        ]
    return []


SQLITE_HEADER = b"SQLite format 3\x00"
"""How every SQLite database file begins (an empty file is an empty database too)."""
MIN_FREE_BYTES = 1 << 20
"""Less free space than this beside a sqlite store: MLflow's first write would fail."""


def _sqlite_problems(db: Path, remote: bool) -> list[str]:
    """A sqlite store's file: a database when it exists, in a folder that can be written, on a
    disk with room for the runs (``remote``: only for a run; a dry run only reads)."""
    if db.is_dir():
        return [
            f"tracking_uri: {db} is a folder, not a database file; name a file such as {db}/mlflow.db"
        ]
    if db.exists() and not db.is_file():  # a device (/dev/null), a FIFO, a socket
        return [
            f"tracking_uri: {db} is not a regular file (a device, FIFO or socket), so SQLite "
            "cannot keep a store in it; name a database file such as ./mlflow.db"
        ]
    if db.is_file():
        problem = _database_file_problem(db)
        if problem:
            return [problem]
    problem = _writable_dir_problem(db.parent, "tracking_uri")
    if problem is None and remote:
        problem = _disk_full_problem(db.parent)
    return [problem] if problem else []


def _database_file_problem(db: Path) -> str | None:
    """Why the existing file ``db`` is no SQLite database MLflow could open, or None."""
    try:
        with db.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        return f"tracking_uri: {db} cannot be read ({exc.strerror}); check its permissions"
    if not head or head == SQLITE_HEADER:
        return None
    return (
        f"tracking_uri: {db} is not an SQLite database (it begins with {head[:16]!r}); point "
        "tracking_uri at the sweep's MLflow store, or at a new file, and leave this one as it is"
    )


def _disk_full_problem(folder: Path) -> str | None:
    """The disk that holds ``folder`` (or its nearest existing parent) is full, or None."""
    existing = next((p for p in [folder, *folder.resolve().parents] if p.exists()), None)
    try:
        free = shutil.disk_usage(existing).free if existing is not None else MIN_FREE_BYTES
    except OSError:
        return None
    if free >= MIN_FREE_BYTES:
        return None
    return (
        f"tracking_uri: the disk holding {folder} is full ({free // 1024} KiB free), so MLflow "
        "cannot record the runs in its sqlite store (which is left as it is); free space there "
        "or point tracking_uri at a store on a larger disk, then run the same command again"
    )


def _database_driver_problem(tracking_uri: str) -> str | None:
    """A database URI whose SQLAlchemy driver is not installed (MLflow would fail on import)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(tracking_uri).get_dialect().import_dbapi()
    except ImportError as exc:
        return redact(
            f"tracking_uri: {tracking_uri} needs a database driver that is not installed "
            f"({exc}); install it (e.g. pip install psycopg2-binary, then postgresql+psycopg2://"
            "...) or point tracking_uri at an MLflow server in front of the database"
        )
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises several types for a bad URI
        return redact(f"tracking_uri: {tracking_uri} is not a database URI ({exc})")
    return None


def _tracking_problems(tracking_uri: str, timeout_s: float, remote: bool) -> list[str]:
    if tracking_uri.startswith("sqlite:///"):
        return _sqlite_problems(Path(tracking_uri.removeprefix("sqlite:///")), remote)
    if tracking_uri.split(":", 1)[0].split("+")[0].lower() in ("postgresql", "mysql", "mssql"):
        problem = _database_driver_problem(tracking_uri)
        return [problem] if problem else []
    if not remote or not tracking_uri.startswith(("http://", "https://")):
        return []
    import base64
    import http.client
    import urllib.error
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(tracking_uri)
    host = parts.netloc.rsplit("@", 1)[-1]  # user info goes in a header, not in the host name
    url = urlunsplit((parts.scheme, host, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(url)
    if parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return []
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        return [
            redact(
                f"tracking_uri: no MLflow server answers at {tracking_uri} within {timeout_s:g} s "
                f"({reason}); start it (mlflow server ...) or fix the URI"
            )
        ]
