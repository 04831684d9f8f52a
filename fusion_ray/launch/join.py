"""The node-wait step of a batch script (``fusion_ray.launch.batch``): ``python -m
fusion_ray.launch.join wait-for-nodes --address HEAD:PORT --nodes N --timeout S --pids PID...``
waits until N Ray nodes are alive at the head, and fails saying why (a start step ended, or the
time ran out) with exit code ``JOIN_FAILED_EXIT``. Scripts run it on the batch host; it is not
meant to be run by hand."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from fusion_ray.driver import head

#: Exit code of the script when the Ray nodes did not all join (or one stopped) in time.
JOIN_FAILED_EXIT = 11


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _head_answers(address: str) -> bool:
    where = head.endpoint(address)
    return where is None or head.answers(*where)


def wait_for_nodes(address: str, nodes: int, timeout_s: float, pids: Sequence[int]) -> str | None:
    """Wait until ``nodes`` Ray nodes are alive at ``address``; None then, else why not (a
    step in ``pids`` ended, or the time ran out)."""
    # Ray is imported here, not at the top: rendering a script (this module's other use) must
    # not pay Ray's import (about a second) or need Ray installed on the laptop.
    import ray

    deadline = time.monotonic() + timeout_s
    joined = 0
    connected = False
    try:
        while time.monotonic() < deadline:
            ended = [pid for pid in pids if not _alive(pid)]
            if ended:
                return (
                    f"a Ray start step (pid {', '.join(map(str, ended))}) ended before every "
                    f"node joined ({joined} of {nodes}): see its lines above in this log"
                )
            if not connected and _head_answers(address):
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
                connected = True
            if connected:
                joined = sum(1 for node in ray.nodes() if node["Alive"])
                if joined >= nodes:
                    return None
            time.sleep(1)
    finally:
        if connected:
            ray.shutdown()
    return (
        f"only {joined} of {nodes} Ray nodes joined the head at {address} within {timeout_s:g} "
        "s: see the Ray start lines above in this log (a node that cannot reach the head's "
        "address: set --node-ip-command; a slow file system: raise --join-timeout)"
    )


def wait_main(argv: Sequence[str], prog: str = "python -m fusion_ray.launch.join") -> int:
    """``PROG wait-for-nodes --address A --nodes N --timeout S --pids PID...``: the script's
    node-wait step; exit 0 once every node joined, else ``JOIN_FAILED_EXIT`` saying why."""
    parser = argparse.ArgumentParser(prog=f"{prog} wait-for-nodes")
    parser.add_argument("--address", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--pids", type=int, nargs="*", default=[])
    args = parser.parse_args(argv)
    problem = wait_for_nodes(args.address, args.nodes, args.timeout, args.pids)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return JOIN_FAILED_EXIT
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["wait-for-nodes"]:
        print("usage: python -m fusion_ray.launch.join wait-for-nodes ...", file=sys.stderr)
        return 2
    return wait_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
