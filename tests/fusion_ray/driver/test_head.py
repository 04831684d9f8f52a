"""Whether a Ray head answers is asked with one TCP connection before Ray is: a sweep given an
address where nothing listens is refused in seconds with the fix (``ray.init`` would retry for
minutes), and its dry run says so beside its plan."""

from __future__ import annotations

import socket

import pytest

from fusion_ray.driver import head
from fusion_ray.driver.preflight import RefusedError
from fusion_ray.driver.session import init_ray

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_address_gives_its_gcs_endpoint_or_none_when_ray_resolves_it():
    assert head.endpoint("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert head.endpoint("ray://head.lab:10001") == ("head.lab", 10001)
    assert head.endpoint("[::1]:6379") == ("::1", 6379)
    assert head.endpoint("auto") is None
    assert head.endpoint("local") is None
    assert head.endpoint("head.lab") is None


def test_a_listening_port_answers_and_a_closed_one_does_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert head.answers("127.0.0.1", server.getsockname()[1])
        assert head.unreachable(f"127.0.0.1:{server.getsockname()[1]}") is None
    port = _closed_port()
    assert not head.answers("127.0.0.1", port)
    why = head.unreachable(f"127.0.0.1:{port}")
    assert why is not None
    assert f"no Ray head answers at 127.0.0.1:{port}" in why
    assert "ray up cluster.yaml" in why and "give no address" in why
    assert head.unreachable("auto") is None  # Ray finds that one itself


def test_the_address_a_sweep_joins_is_the_flag_then_the_file_then_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "env:1")
    assert head.named_address("flag:1", "file:1") == "flag:1"
    assert head.named_address(None, "file:1") == "file:1"
    assert head.named_address(None, None) == "env:1"
    monkeypatch.delenv("RAY_ADDRESS")
    assert head.named_address(None, None) is None


def test_a_driver_given_an_address_where_nothing_answers_is_refused_before_ray_starts():
    """The sweep's and the HPO's driver join Ray through init_ray: nothing listening there is one
    message and exit 2 (RefusedError), not minutes of Ray's retries."""
    with pytest.raises(RefusedError, match="no Ray head answers at 127.0.0.1:"):
        init_ray(f"127.0.0.1:{_closed_port()}")
