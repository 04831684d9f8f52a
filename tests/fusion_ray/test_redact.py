"""Credentials never leave the process (fusion_ray.redact): URIs keep their shape but lose their
password and secret query values; secret environment values are blanked in any text; the
pre-flight messages that name a storage path or tracking URI say what is wrong without them; an
HTTP tracking URI's password reaches MLflow's client through the environment only, and a pickled
tracking callback (Tune's tuner.pkl) carries no tracker."""

from __future__ import annotations

import os
import pickle

import pytest

from fusion_ray.driver.preflight import preflight
from fusion_ray.redact import redact, redact_uri, split_credentials

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


def test_an_http_uris_password_is_split_off_and_other_uris_are_left_whole():
    bare, user, password = split_credentials("https://alice:p%40ss%3Aw0rd@mlflow.lab:443/x?a=1")
    assert (bare, user, password) == ("https://mlflow.lab:443/x?a=1", "alice", "p@ss:w0rd")
    assert split_credentials("http://a:b@c@host:5000") == ("http://host:5000", "a", "b@c")
    for whole in (
        "http://alice@host:5000",  # no password: nothing to move
        "postgresql://mlflow:db-pass@127.0.0.1/mlflow",  # the database needs it in the URI
        "sqlite:///mlflow.db",
        "http://host:5000",
    ):
        assert split_credentials(whole) == (whole, None, None)


def test_the_mlflow_client_gets_the_uri_without_its_password_and_the_password_from_the_environment(
    monkeypatch,
):
    from fusion_ray.driver.tracking import client_uri

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "")  # setenv: put back as it was afterwards
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "")
    os.environ.pop("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")
    assert client_uri("http://bob:Zz-9%2Fsecret@127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "bob"  # the URI's user, over the old one
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "Zz-9/secret"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"  # no run links
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")
    assert client_uri("sqlite:///m.db") == "sqlite:///m.db"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "false"  # the user's choice


def test_refused_credentials_in_the_uri_are_named_as_the_thing_to_fix():
    from fusion_ray.store_errors import access_error

    refused = Exception("API request failed with error code 401 != 200")
    in_uri = access_error(refused, "http://bob:Zz-9-secret@127.0.0.1:5000", "driver")
    assert in_uri is not None and in_uri.kind == "auth" and "Zz-9-secret" not in str(in_uri)
    assert "bob:***@127.0.0.1:5000" in str(in_uri) and "in tracking_uri" in str(in_uri)
    from_env = access_error(refused, "http://127.0.0.1:5000", "driver")
    assert from_env is not None and "set MLFLOW_TRACKING_USERNAME" in str(from_env)


def test_a_pickled_tracking_callback_holds_no_tracker_and_its_copy_writes_nothing(
    tmp_path, mlflow_store, monkeypatch
):
    from fusion_ray.driver.callbacks import MLflowSweepCallback
    from fusion_ray.driver.tracking import Tracker

    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # as the tracker sets it
    store = tmp_path / "store-only-the-live-callback-knows.db"
    tracker = Tracker(mlflow_store(store), "pickled")
    callback = MLflowSweepCallback(tracker, {}, {}, "parent", str(tmp_path / "ray_results"))
    data = pickle.dumps(callback)
    assert store.name.encode() not in data
    copy = pickle.loads(data)
    assert copy.tracker is None and copy.store_lost and callback.tracker is tracker
    copy.on_trial_start(0, [], object())  # would open a run: returns before touching a tracker
    assert copy.run_ids == {}


RESERVED = ["Sec#ret-9", "Sec?ret-9", "Sec/ret-9", "p@ss#w?rd/9", "a b", "Ab 1"]
"""Passwords with the characters a URI parser ends the user info at, or white space."""


@pytest.mark.parametrize("password", RESERVED)
def test_a_password_with_reserved_characters_is_masked_whole_everywhere(password):
    uri = f"http://admin:{password}@127.0.0.1:5000/api"
    assert redact_uri(uri) == "http://admin:***@127.0.0.1:5000/api"
    assert redact(uri) == "http://admin:***@127.0.0.1:5000/api"
    text = f"error: the server at {uri}: refused ('{uri}', 'postgresql://u:{password}@db/x')"
    if " " not in password:  # in running text a URI ends at white space
        assert password not in redact(text) and "admin:***@127.0.0.1:5000" in redact(text)
    from fusion_ray.store_errors import access_error

    refused = access_error(
        Exception("API request failed with error code 401 != 200"), uri, "driver"
    )
    assert refused is not None and password not in str(refused)
    assert "admin:***@127.0.0.1:5000" in str(refused)


@pytest.mark.parametrize("password", RESERVED)
def test_a_password_read_in_a_uri_is_masked_where_it_shows_again_however_short(password):
    from fusion_ray.redact import credentials_problem

    uri = f"https://admin:{password}@mlflow.lab"
    credentials_problem(uri, "tracking_uri")  # read (and refused or not): remembered
    text = f"override tracking_uri=https://admin:{password}@mlflow.lab: (got 'x:{password}@y')"
    assert password not in redact(text), redact(text)


@pytest.mark.parametrize(
    ("password", "says"),
    [("Sec#ret", "'#'"), ("Sec?ret", "'?'"), ("Sec/ret", "'/'"), ("a b", "white space"),
     ("100%", "%25"), ("Sec%2", "%25")],
)  # fmt: skip
def test_a_uri_whose_user_info_cannot_be_read_as_written_is_refused_with_the_encoding(
    password, says, tmp_path
):
    from fusion_ray.config.fields import tracking_uri_problem
    from fusion_ray.redact import credentials_problem

    uri = f"http://admin:{password}@127.0.0.1:5000"
    problem = credentials_problem(uri, "tracking_uri")
    assert problem is not None and says in problem and password not in problem
    assert "http://admin:***@127.0.0.1:5000" in problem
    assert tracking_uri_problem(uri) is not None
    assert tracking_uri_problem(f"postgresql://mlflow:{password}@127.0.0.1/mlflow") is not None


def test_a_percent_encoded_or_at_sign_password_is_accepted_and_split_as_sent():
    from fusion_ray.config.fields import tracking_uri_problem
    from fusion_ray.redact import credentials_problem

    for uri, password in (
        ("http://admin:Sec%23ret%3F%2F%20@127.0.0.1:5000", "Sec#ret?/ "),
        ("http://admin:p@ss@127.0.0.1:5000", "p@ss"),
        ("http://admin:plain-pass-1@127.0.0.1:5000/prefix", "plain-pass-1"),
    ):
        assert credentials_problem(uri, "tracking_uri") is None
        assert tracking_uri_problem(uri) is None
        assert split_credentials(uri)[2] == password
    for plain in ("http://127.0.0.1:5000", "sqlite:////tmp/a@b/m.db", "http://alice@h:5000"):
        assert credentials_problem(plain, "tracking_uri") is None


def test_a_sweep_file_with_a_reserved_character_in_its_password_is_refused_without_it(tmp_path):
    from fusion_ray.config import load_sweep
    from tests.conftest import tiny_sweep

    path = tiny_sweep(tmp_path, tracking_uri="http://admin:Sec#ret-77@127.0.0.1:5000")
    with pytest.raises(ValueError) as refused:
        load_sweep(path)
    assert "Sec#ret-77" not in str(refused.value) and "ret-77" not in str(refused.value)
    assert "tracking_uri" in str(refused.value) and "%23" in str(refused.value)
