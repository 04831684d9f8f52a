"""One driver per sweep: a lease held in the tracking store while a driver runs a sweep.

The lease is a registered model named ``fusion-ray-lease.<sweep>`` in the MLflow store the sweep
writes to. Creating a registered model is atomic (its name is unique), so of two drivers that
start together exactly one gets it; the other is refused with the holder's host, process and
start time. The holder refreshes a heartbeat tag every ``heartbeat_s`` seconds and deletes the
lease when it ends. A lease whose heartbeat is older than ``ttl_s``, or whose holder was a process
on this machine that no longer exists, has no living holder and the next driver takes it over.
Because it lives in the tracking store, it works for drivers on different machines as long as
they share the store (a tracking server on a cluster); it appears in the MLflow UI under Models.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusion_ray.driver.tracking import LeaseStore


log = logging.getLogger(__name__)

LEASE_PREFIX = "fusion-ray-lease."


TTL_ENV = "FUSION_RAY_LEASE_TTL_S"
"""Seconds without a heartbeat after which a lease is taken over (default 120)."""
HEARTBEAT_ENV = "FUSION_RAY_LEASE_HEARTBEAT_S"
"""Seconds between heartbeats (default 10; keep it well below the TTL)."""


class LeaseHeldError(RuntimeError):
    """Another driver holds the sweep's lease; the message names it and says what to do."""


class LeaseLostError(RuntimeError):
    """This driver's lease was taken over while it ran (it was paused or cut off from the
    tracking store for longer than the TTL): it stopped, and finished no cell after that."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: float
    heartbeat: float
    token: str

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Holder:
        return cls(
            host=tags.get("host", "?"),
            pid=int(tags.get("pid", "0") or 0),
            since=float(tags.get("since", "0") or 0),
            heartbeat=float(tags.get("heartbeat", "0") or 0),
            token=tags.get("token", ""),
        )

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, since {started}"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class SweepLease:
    """``with SweepLease(store, sweep): ...`` runs the body as the sweep's only driver
    (``store``: ``tracking.Tracker.lease_store()``, the sweep's tracking store)."""

    def __init__(
        self,
        store: LeaseStore,
        sweep: str,
        *,
        ttl_s: float | None = None,
        heartbeat_s: float | None = None,
        take_over: bool = False,
        what: str = "sweep",
    ) -> None:
        self.store: LeaseStore | None = store
        """None in a copy restored from pickle, which never holds the lease."""
        self.sweep, self.name = sweep, LEASE_PREFIX + sweep
        self.what = what
        """What the lease is for, in messages ("sweep", "HPO")."""
        self.ttl_s = ttl_s if ttl_s is not None else float(os.environ.get(TTL_ENV, 120.0))
        self.heartbeat_s = (
            heartbeat_s if heartbeat_s is not None else float(os.environ.get(HEARTBEAT_ENV, 10.0))
        )
        self.take_over = take_over
        self.token = uuid.uuid4().hex
        self.abandoned = False
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _store(self) -> LeaseStore:
        if self.store is None:
            raise RuntimeError(f"a restored copy of the lease of {self.what} {self.sweep!r}")
        return self.store

    # --- acquiring
    def acquire(self) -> None:
        """Take the lease, or raise ``LeaseHeldError`` naming the driver that holds it."""
        for _ in range(3):
            if self._create():
                self._start_heartbeat()
                return
            holder = self.holder()
            if holder is None:
                continue  # released between our attempt and the read: try again
            if not (self.take_over or self._is_dead(holder)):
                raise LeaseHeldError(self._held_message(holder))
            log.warning(
                "taking over the lease of %s %s from %s", self.what, self.sweep, holder.describe()
            )
            self._delete_if(holder.token)
        raise LeaseHeldError(f"could not take the lease of {self.what} {self.sweep!r}; try again")

    def _create(self) -> bool:
        now = time.time()
        tags = {
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
            "since": repr(now),
            "heartbeat": repr(now),
            "token": self.token,
            "purpose": "fusion-ray: the driver running this sweep (deleted when it ends)",
        }
        return self._store.create(self.name, tags)

    def holder(self) -> Holder | None:
        """The current holder, or None when nobody holds the lease."""
        tags = self._store.tags(self.name)
        return None if tags is None else Holder.from_tags(tags)

    def _is_dead(self, holder: Holder) -> bool:
        if time.time() - holder.heartbeat > self.ttl_s:
            return True
        return holder.host == socket.gethostname() and not _pid_alive(holder.pid)

    def _held_message(self, holder: Holder) -> str:
        age = time.time() - holder.heartbeat
        return (
            f"{self.what} {self.sweep!r} is being run by another driver ({holder.describe()}, last "
            f"heartbeat {age:.0f} s ago). Two drivers would train every cell twice. Wait for it to "
            f"finish (re-running then does only what is left), or, if that driver is gone for good, "
            f"pass --take-over (a lease with no heartbeat for {self.ttl_s:.0f} s is taken over "
            f"without asking)"
        )

    def _delete_if(self, token: str) -> None:
        """Delete the lease if it is still the one with ``token`` (never a newer holder's)."""
        holder = self.holder()
        if holder is not None and holder.token == token:
            self._store.delete(self.name)

    # --- holding
    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.sweep}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                holder = self.holder()
                if holder is None or holder.token != self.token:
                    log.error(
                        "the lease of %s %s was taken by another driver", self.what, self.sweep
                    )
                    self.lost.set()
                    return
                self._store.set_tag(self.name, "heartbeat", repr(time.time()))
            except Exception as exc:  # noqa: BLE001 - a store hiccup: try again next beat
                log.warning(
                    "lease heartbeat of %s %s failed (%s); retrying", self.what, self.sweep, exc
                )

    def holds(self) -> bool:
        """Whether this driver still holds the lease, read from the store now: the fence before
        every write that decides a cell's fate (a run marked FINISHED, a checkpoint registered).
        A store that cannot be read counts as held (the heartbeat decides); a lease found taken
        stays lost."""
        if self.lost.is_set():
            return False
        try:
            holder = self.holder()
        except Exception as exc:  # noqa: BLE001 - a store hiccup is not a lost lease
            log.warning("could not read the lease of %s %s (%s)", self.what, self.sweep, exc)
            return True
        if holder is None or holder.token != self.token:
            log.error("the lease of %s %s was taken by another driver", self.what, self.sweep)
            self.lost.set()
            return False
        return True

    def lost_message(self) -> str:
        """What a driver that lost its lease says as it stops."""
        holder = None
        with contextlib.suppress(Exception):
            holder = self.holder()
        who = f" ({holder.describe()})" if holder is not None else ""
        return (
            f"the lease of {self.what} {self.sweep!r} was taken over by another driver{who} while this "
            f"one ran: this driver was paused or cut off from the tracking store for longer than "
            f"the lease's {self.ttl_s:.0f} s. It stopped its trials and finished no cell after "
            "that; the other driver runs what is left (its runs resume from their checkpoints)"
        )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.abandoned:
            return
        with contextlib.suppress(Exception):
            self._delete_if(self.token)

    def abandon(self) -> None:
        """Stop refreshing the lease and leave it as it is (the store it lives in is gone)."""
        self.abandoned = True
        self._stop.set()

    def __getstate__(self) -> dict:
        """Ray Tune saves its run config (the stopper, the callbacks) with pickle: a copy keeps
        the names and token, not the store, threads or events, and never holds the lease."""
        return {
            k: v for k, v in self.__dict__.items() if k not in ("store", "lost", "_stop", "_thread")
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.store, self._thread = None, None
        self.lost, self._stop = threading.Event(), threading.Event()
        self.lost.set()

    def __enter__(self) -> SweepLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
