"""Cloud credentials out of Ray's logs (``fusion_ray.driver.credentials``): while a driver
session runs, the AWS keys are in a credentials file of the driver's own, not in the environment
Ray Tune copies into every trial, and an S3 client signs its requests with them as before."""

from __future__ import annotations

import os
import socket
import stat
import threading

import pytest

from fusion_ray.driver.credentials import AWS_KEYS, FILE_ENV, aws_keys_in_a_file
from fusion_ray.redact import _SECRET_NAME

pytestmark = pytest.mark.unit


def test_every_secret_variable_ray_tune_copies_into_trials_is_moved():
    """Ray Tune's own list (read from Ray): a new secret in it would leak again."""
    from ray.tune.execution.class_cache import ENV_VARS_TO_PROPAGATE

    copied = {name for name in ENV_VARS_TO_PROPAGATE if _SECRET_NAME.search(name)}
    assert copied and copied <= set(AWS_KEYS), copied - set(AWS_KEYS)


class Recorder:
    """A loopback listener that keeps each request's bytes and answers 403 (no retry)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.requests.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass


def test_the_keys_move_to_a_private_file_that_an_s3_client_signs_with(monkeypatch):
    import pyarrow.fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAINAFILE1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-in-a-file-1")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-in-a-file-1")
    monkeypatch.setenv("AWS_PROFILE", "lab")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv(FILE_ENV, raising=False)
    recorder = Recorder()
    with aws_keys_in_a_file() as path:
        assert path is not None and os.environ[FILE_ENV] == str(path)
        assert not {name for name in AWS_KEYS if name in os.environ}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text().splitlines()[0] == "[lab]"
        s3 = pyarrow.fs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{recorder.port}", scheme="http", region="us-east-1"
        )
        with pytest.raises(OSError):
            s3.get_file_info("bucket/key")
    signed = b"\n".join(recorder.requests).lower()
    assert b"credential=akiainafile1234/" in signed, signed[:400]
    assert b"token-in-a-file-1" in signed  # the session token went with it (x-amz-security-token)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIAINAFILE1234"  # all as it was afterwards
    assert os.environ["AWS_SESSION_TOKEN"] == "token-in-a-file-1" and FILE_ENV not in os.environ


def test_without_keys_nothing_changes(monkeypatch):
    for name in AWS_KEYS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(FILE_ENV, "/home/someone/.aws/credentials")
    before = dict(os.environ)
    with aws_keys_in_a_file() as path:
        assert path is None and dict(os.environ) == before
    assert dict(os.environ) == before
