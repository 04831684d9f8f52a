"""Credentials never leave the process (fusion_ray.redact): URIs keep their shape but lose their
password and secret query values; secret environment values are blanked in any text; the
pre-flight messages that name a storage path or tracking URI say what is wrong without them."""

from __future__ import annotations

import pytest

from fusion_ray.preflight import preflight
from fusion_ray.redact import redact, redact_uri

pytestmark = pytest.mark.unit


def test_user_info_and_secret_query_values_are_masked_and_nothing_else():
    assert redact_uri("http://alice:s3cr3t@host:5000/x") == "http://alice:***@host:5000/x"
    assert redact_uri("http://alice@host:5000") == "http://alice@host:5000"
    masked = redact_uri("s3://bucket/prefix?secret_key=abc123&region=eu-west-1&token=t0k")
    assert "abc123" not in masked and "t0k" not in masked and "region=eu-west-1" in masked
    for plain in ("sqlite:///mlflow.db", "file:///tmp/x", "s3://bucket/p?region=eu", "ray_results"):
        assert redact(plain) == plain


def test_secret_environment_values_are_blanked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("MY_STORAGE_SECRET_KEY", "Zq8-very-secret")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2-hunter2")
    text = "opened s3://b/p?k=Zq8-very-secret; login hunter2-hunter2 failed"
    assert "Zq8-very-secret" not in redact(text) and "hunter2-hunter2" not in redact(text)


def test_a_storage_path_with_an_expanded_secret_is_refused_without_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_S3_SECRET", "AbCdEf-123456")
    storage = "s3://lab-bucket/sweeps?secret_key=AbCdEf-123456&endpoint_override=127.0.0.1:1"
    problems = preflight(storage, f"sqlite:///{tmp_path / 'm.db'}", timeout_s=1.0)
    assert problems and all("AbCdEf-123456" not in p for p in problems)
    assert "secret_key=***" in problems[0]


def test_a_tracking_uri_with_user_info_is_checked_without_dns_and_shown_without_password(tmp_path):
    problems = preflight(str(tmp_path), "http://bob:pa55-word-9@127.0.0.1:9", timeout_s=1.0)
    assert len(problems) == 1 and "pa55-word-9" not in problems[0]
    assert "bob:***@127.0.0.1:9" in problems[0] and "Name or service" not in problems[0]
