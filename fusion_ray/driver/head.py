"""Whether a Ray head answers at an address, asked without Ray: a TCP connection to its GCS
port. ``ray.init`` on an address where nothing listens retries for minutes, printing a warning
every few seconds; the sweep, its dry run, the driver's head watch and a batch script's node
wait ask this first, in two seconds."""

from __future__ import annotations

import os
import socket

HEAD_WAIT_S = 5.0
"""Seconds a sweep waits for the Ray head named by ``--address`` (or the file's ``address:``, or
$RAY_ADDRESS) to accept a connection before it says that nothing answers there."""


def endpoint(address: str) -> tuple[str, int] | None:
    """The host and GCS port of a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``); None for
    an address Ray resolves itself (``auto``, ``local``) or one without a port."""
    bare = address.strip().removeprefix("ray://")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def named_address(address: str | None, spec_address: str | None = None) -> str | None:
    """The cluster a sweep joins: ``--address``, else the sweep file's ``address:``, else
    $RAY_ADDRESS; None: the sweep starts a local Ray of its own."""
    return address or spec_address or os.environ.get("RAY_ADDRESS") or None


def unreachable(address: str, timeout_s: float = HEAD_WAIT_S) -> str | None:
    """Why nothing can join the Ray cluster at ``address`` (one sentence with the fix), or None
    when its head accepts a connection, or when Ray resolves the address itself."""
    where = endpoint(address)
    if where is None or answers(*where, timeout_s=timeout_s):
        return None
    return (
        f"no Ray head answers at {address} within {timeout_s:g} s: start the cluster (ray up "
        "cluster.yaml, or ray start --head on its head node) and give its address as HOST:6379, "
        "or give no address (no --address, no address: in the file, no RAY_ADDRESS) to run on a "
        "local Ray"
    )
