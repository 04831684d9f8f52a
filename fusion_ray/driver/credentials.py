"""Cloud credentials reach the trials by a path no Ray log records.

Ray Tune copies ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` and
``AWS_SECURITY_TOKEN`` from the driver's environment into every trial actor's runtime
environment, and Ray's runtime-environment agent logs each runtime environment at INFO, in
plain text, under Ray's temporary folder (``logs/runtime_env_agent.log``), which any user of the
machine may read. So while a driver session runs (``aws_keys_in_a_file``), the keys are not in
the driver's environment: they are in a credentials file of the driver's own (mode 0600, in a
folder of mode 0700), which ``AWS_SHARED_CREDENTIALS_FILE`` names, under the profile that
``AWS_PROFILE`` selects (``default`` without it). Every AWS client reads that file as it read the
variables (pyarrow's S3 file system in the driver and in the trials, boto3 for MLflow's
artifacts): the environment variables came first in their lookup, and now nothing else does.

A Ray the driver starts itself (no ``address``) starts from this environment, so its workers
find the file too; the nodes of a cluster the driver joins use their own credentials (an
instance profile, or the variables set where ``ray start`` ran), as they did for everything but
Tune's copy. The tracking server's password is never copied: only the driver talks to MLflow.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

AWS_KEYS = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
    "AWS_SECURITY_TOKEN": "aws_security_token",
}
"""The environment variables Ray Tune copies into trials that hold a secret, and their keys in
an AWS credentials file."""
FILE_ENV = "AWS_SHARED_CREDENTIALS_FILE"

_folder: Path | None = None
"""The driver's own folder for the credentials file: one per process, removed at exit, so a Ray
started by an earlier session of this process still finds it."""


def _credentials_file() -> Path:
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="fusion-ray-aws-"))  # mode 0700
        atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    return _folder / "credentials"


def _file_text(keys: dict[str, str], profile: str) -> str:
    lines = [f"[{profile}]"]
    lines += [f"{AWS_KEYS[name]} = {value}" for name, value in keys.items()]
    if "AWS_SECURITY_TOKEN" in keys and "AWS_SESSION_TOKEN" not in keys:
        lines.append(f"aws_session_token = {keys['AWS_SECURITY_TOKEN']}")  # its older name
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def aws_keys_in_a_file() -> Iterator[Path | None]:
    """While the body runs, the AWS keys of this process's environment are in a credentials file
    (its path yielded; None when no key is set) and not in the environment; afterwards the
    environment is as it was. A key holding a line break is left where it is (no file could
    hold it)."""
    keys = {name: os.environ[name] for name in AWS_KEYS if os.environ.get(name)}
    if not keys or any("\n" in value or "\r" in value for value in keys.values()):
        yield None
        return
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    path = _credentials_file()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(_file_text(keys, profile))
    before = os.environ.get(FILE_ENV)
    for name in keys:
        del os.environ[name]
    os.environ[FILE_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.update(keys)
        if before is None:
            os.environ.pop(FILE_ENV, None)
        else:
            os.environ[FILE_ENV] = before
