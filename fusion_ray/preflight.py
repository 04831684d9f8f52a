"""Checks before any compute starts: the storage path can be written and the tracking store
answers. What would otherwise fail only after Ray starts is one message, and the command exits 2.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fusion_ray.redact import redact


class RefusedError(RuntimeError):
    """A check a driver makes before it runs anything, once it holds its lease, refused: one
    message, and the command exits 2 as for the checks before it (``cli.run_command``)."""


def preflight(
    storage_path: str, tracking_uri: str, *, remote: bool = True, timeout_s: float = 5.0
) -> list[str]:
    """What would fail only after Ray starts: storage that cannot be written, a tracking store
    that cannot be reached. Leaves nothing behind; a server gets ``timeout_s``. ``remote=False``
    checks only local paths (a dry run on a machine that cannot reach the cluster's stores)."""
    problems = _storage_problems(storage_path, remote)
    return problems + _tracking_problems(tracking_uri, timeout_s, remote)


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


def _tracking_problems(tracking_uri: str, timeout_s: float, remote: bool) -> list[str]:
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        problem = _writable_dir_problem(db.parent, "tracking_uri")
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
