"""Where a sweep's trials keep their checkpoints and results, and what a finished trial left
behind: the one module that turns the sweep's ``storage_path`` into paths and URIs, decides
whether a checkpoint path read back from the tracking store may be trusted (it lies under the
sweep's storage), where a cell resumes from, and which ended trials are finished from storage
instead of trained again. The tracking store (``tracking``) only records the paths; the trial
(``trial``) only writes under them.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse, urlsplit

import pyarrow.fs

from fusion_ray.config.workload import AnySweep
from fusion_ray.policy.plan import Plan
from fusion_ray.redact import redact

log = logging.getLogger(__name__)


def storage_uri(storage_path: str) -> str:
    """A storage path as Ray wants it: URIs (``s3://...``) as given, local paths absolute."""
    return storage_path if "://" in storage_path else str(Path(storage_path).resolve())


def within_storage(path: str, storage_path: str) -> bool:
    """Whether a checkpoint ``path`` (a local path or URI) lies under the sweep's storage: a
    checkpoint path read back from the tracking store is trusted only there. URIs are compared
    parsed, not as strings: the same scheme and bucket, a key under the storage prefix (no
    ``..``), and no query parameters (an endpoint, a scheme, a region) but the storage path's
    own, so a tag cannot point the driver's signed requests at another host."""
    if "://" not in storage_path:
        if "://" in path:
            return False
        return Path(path).resolve().is_relative_to(Path(storage_path).resolve())
    root = urlsplit(storage_path)
    where = urlsplit(path if "://" in path else f"{root.scheme}://{path}")
    if (where.scheme, where.netloc) != (root.scheme, root.netloc) or where.fragment:
        return False
    if where.query and parse_qs(where.query) != parse_qs(root.query):
        return False
    parts = [p for p in where.path.split("/") if p]
    prefix = [p for p in root.path.split("/") if p]
    return ".." not in parts and parts[: len(prefix)] == prefix


def checkpoint_uri(path: str, storage_path: str) -> str:
    """A checkpoint path as a URI that ``ray.train.Checkpoint`` can open later (scheme and query,
    e.g. ``?endpoint_override=`` for MinIO, taken from the storage path)."""
    if "://" in path or "://" not in storage_path:
        return path
    parsed = urlparse(storage_path)
    return f"{parsed.scheme}://{path}" + (f"?{parsed.query}" if parsed.query else "")


def stored_checkpoint(tag: str, storage_path: str) -> str:
    """A checkpoint path read back from its run's tag, with the storage path's query put back
    where the tag left it out (it held a secret, ``Tracker`` writes no secret into a tag)."""
    query = urlparse(storage_path).query if "://" in storage_path else ""
    if query and "://" in tag and "?" not in tag:
        return f"{tag}?{query}"
    return tag


def checkpoint_exists(uri: str, storage_path: str) -> bool:
    """Whether a checkpoint directory (local path or URI) read back from the tracking store is
    still there. Only a path under the sweep's ``storage_path`` is looked at
    (``within_storage``): a tag could otherwise point the driver's signed requests
    at any host."""
    return within_storage(uri, storage_uri(storage_path)) and _directory_exists(uri)


def _directory_exists(uri: str) -> bool:
    try:
        if "://" not in uri:
            return Path(uri).is_dir()
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        return fs.get_file_info(path).type == pyarrow.fs.FileType.Directory
    except (OSError, ValueError):
        return False


def finish_ended_trials(
    spec: AnySweep, tracker: Any, todo: Plan, workload: Any, lease_token: str | None = None
) -> None:
    """Cells whose trial ended (final metrics logged, final checkpoint in storage with what the
    ``workload`` keeps of it: the study's predictions) but whose run was never marked FINISHED,
    because the driver died (or was paused and taken over) in between: finish their runs from
    storage instead of training them again, naming the driver that finished them
    (``lease_token``) as the callback does."""
    for cid, run in todo.existing.items():
        path = stored_checkpoint(run.checkpoint_path or "", spec.storage_path)
        if run.status == "FINISHED" or not run.has_final or not path:
            continue
        if not checkpoint_exists(path, spec.storage_path):
            continue
        if workload.keep(tracker, run.run_id, path):
            tracker.finish(run.run_id, lease_token=lease_token)
            run.status = "FINISHED"
            todo.done.add(cid)
            log.info("cell %s: its trial had ended; its run is finished from storage", cid)


def resume_point(spec: AnySweep, cell: Any, existing: dict[str, Any]) -> str | None:
    """The checkpoint a cell resumes from: its MLflow run's, while that checkpoint still exists
    and lies under this sweep's storage (a path read from the tracking store is trusted only
    there: checkpoints are loaded, and a path elsewhere may be anyone's file)."""
    prior = existing.get(cell.cell_id)
    if prior is None:
        return None
    resume_from = prior.checkpoint_path
    if resume_from:
        resume_from = stored_checkpoint(resume_from, spec.storage_path)
    if resume_from and not within_storage(resume_from, storage_uri(spec.storage_path)):
        log.warning(
            "cell %s: its run names checkpoint %s, outside storage_path %s; the cell starts again",
            cell.cell_id,
            redact(resume_from),
            redact(spec.storage_path),
        )
        return None
    if resume_from and not checkpoint_exists(resume_from, spec.storage_path):
        log.warning(
            "cell %s: checkpoint %s is gone; the cell starts again",
            cell.cell_id,
            redact(resume_from),
        )
        resume_from = prior.checkpoint_path = None
    return resume_from


class StorageFullError(RuntimeError):
    """The sweep's local storage_path has no space left: trials cannot write checkpoints."""


def storage_full(storage_path: str) -> str | None:
    """Why the local ``storage_path`` cannot take a checkpoint now (no space left), or None (a
    URI, or space left)."""
    if "://" in storage_path:
        return None
    path = Path(storage_path).resolve()
    try:
        free = shutil.disk_usage(path).free
        with tempfile.TemporaryFile(dir=path) as probe:
            probe.write(b"\0" * 65536)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            return None
        free = 0
    if free >= 1 << 20:
        return None
    return f"the storage at {path} is full ({free // 1024} KiB free)"


def storage_full_message(why: str, finished_now: int) -> str:
    return (
        f"{why}: trials could not write their checkpoints and results. "
        f"The {finished_now} cell(s) finished by this run, and every cell finished before, "
        "stay FINISHED in the tracking store; cells whose trial failed for want of space are "
        "marked FAILED. Free space there (or set storage_path to a larger disk) and run the "
        "same command again: it runs only what is missing."
    )
