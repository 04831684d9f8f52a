"""One driver session for every command that drives trials: ``sweep``, ``hpo`` and the Python API.

A ``DriverSession`` owns what a driver must get right whatever it runs, so each command gets
every protection:

- cloud credentials out of Ray's logs (``credentials.aws_keys_in_a_file``);
- the lease (``lease.SweepLease``): one driver per sweep or HPO file; a second is refused
  (``LeaseHeldError``), and one whose lease was taken over while it was paused stops writing
  (``LeaseLostError``);
- Ray: the cluster joined, or a local instance of its own started (``init_ray``);
- the parent run that records the invocation: KILLED with the signal's name when stopped,
  FAILED with the reason on any error, never left RUNNING;
- signals: the first SIGINT or SIGTERM stops the trials at Tune's next step, never in the
  middle of a write to the tracking store (``stop_on_signals``, ``DriverStopper``);
- the head watch: a Ray head that stops answering ends the driver with one message and exit 7
  (``HEAD_LOST_EXIT``) before Ray's own exit, which cleans nothing;
- what ends a Tune run early: a full storage path (``StorageFullError``), a vanished tracking
  store (``TrackingStoreLostError``) or one with no room left (``TrackingStoreFullError``), the
  lease lost (``after_tune``).

``EXIT_CODES`` gives each of these the exit code every command uses (the CLIs print the message
and return it: ``fusion_ray.cli.run_command``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fusion_ray.driver import head
from fusion_ray.driver.credentials import aws_keys_in_a_file
from fusion_ray.driver.lease import LeaseHeldError, LeaseLostError, SweepLease
from fusion_ray.driver.placement import PlacementError
from fusion_ray.driver.preflight import RefusedError
from fusion_ray.driver.storage import StorageFullError, storage_full, storage_full_message
from fusion_ray.redact import redact
from fusion_ray.store_errors import FAULTS, StoreAccessError

if TYPE_CHECKING:
    from types import TracebackType

    from fusion_ray.driver.tracking import Tracker

log = logging.getLogger(__name__)


def init_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (or $RAY_ADDRESS); with neither, start a Ray of our own.

    Our own means ``address="local"``: a new instance even when another Ray runs on the machine
    (never someone else's cluster), on the loopback address, without a dashboard. Ray's token
    authentication stays as Ray sets it. Raises ``RefusedError`` when nothing answers at the
    address (``ray.init`` would retry for minutes)."""
    address = head.named_address(address)
    why = head.unreachable(address) if address else None
    if why:
        raise RefusedError(why)
    # lazy: ray takes ~0.5 s to import; kept out of --dry-run and --help
    import ray

    if ray.is_initialized():
        return
    if address:
        log.info("connecting to the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        log.info("no cluster given (address / RAY_ADDRESS): starting a local Ray instance")
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )


#: Libraries' start-up lines a user does not act on, hidden at the default verbosity: MLflow
#: creating its tables, Ray's note that token authentication is on (it stays on), matplotlib
#: building its font cache.
_CHATTY_LOGGERS = (
    "mlflow.store.db.utils",
    "alembic.runtime.migration",
    "ray._private.authentication.authentication_token_setup",
    "matplotlib.font_manager",
)


class RetryNotice(logging.Filter):
    """urllib3 warns once per retry of each request to a server that does not answer; MLflow's
    client retries a request for about four minutes (7 times, doubling the wait), so a tracking
    server restarted mid-sweep printed dozens of lines. Instead: one line a minute, naming the
    server and saying that the driver waits."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self.last = -every_s

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Retrying ("):
            return True
        now = time.monotonic()
        if now - self.last < self.every_s:
            return False
        self.last = now
        host = re.search(r"host='([^']*)', port=(\d+)", message)
        where = f"http://{host.group(1)}:{host.group(2)}" if host else "the MLflow server"
        record.msg = (
            f"no answer from {where}: waiting for it (MLflow's client retries each request for "
            "about 4 minutes; finished cells and checkpoints are kept)"
        )
        record.args = ()
        return True


def quiet_console(verbose: int) -> None:
    """The CLIs' console: our own lines, and the libraries' warnings that matter; with
    ``verbose`` > 0 everything the libraries say."""
    if verbose > 0:
        return
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Tune's saves of its own experiment state, which this driver never reads (it resumes from
    # the tracking store): a failed save (a full storage path) is a traceback at ERROR each time,
    # where the driver says the one thing to do
    logging.getLogger("ray.tune.execution.experiment_state").setLevel(logging.CRITICAL)
    pool = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, RetryNotice) for f in pool.filters):
        pool.addFilter(RetryNotice())


@contextlib.contextmanager
def tune_output(verbose: int) -> Iterator[None]:
    """Ray Tune's console output while a Tuner runs: at verbosity 0 none at all (Tune's new
    output engine prints its experiment table and result paths whatever the verbosity; the
    legacy engine at 0 prints nothing; and Tune's traceback of each failed trial, which the
    driver says in one line and keeps in the run's failure_reason tag), else Tune's own."""
    if verbose > 0:
        yield
        return
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_PRINT_ALL_TRIAL_ERRORS": "0"}
    before = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class DriverInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver: it stops its trials and marks its open runs and
    its parent run KILLED; the finished cells stay finished and a re-run resumes the rest."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def stop_on_signals(received: list[str]) -> Iterator[None]:
    """While a driver runs its trials: the first SIGINT or SIGTERM (Ctrl+C, a scheduler's or
    ``ray down``'s stop) is recorded in ``received`` and said on stderr; nothing is raised in the
    middle of what the main thread was doing. The driver acts on it at its next safe point:
    ``DriverStopper`` has Tune stop every trial at its next step (a fraction of a second), then
    ``DriverSession.after_tune`` raises ``DriverInterrupted``. An exception raised at the
    signal itself could land inside a write to the tracking store, and a sqlite connection
    left half-way through its transaction keeps the store locked: the driver's own marking of
    its runs as KILLED then waited out MLflow's 20 s and failed. Ray Tune's own SIGINT handler
    (end the run after one more save of Tune's experiment state, which this driver never reads)
    and Ray's SIGTERM handler (exit with status 1, no cleanup) are off meanwhile. A second
    signal is reported and ignored; a third ends the process at once. Outside the main thread
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        received.append(name)
        if len(received) == 1:
            print(
                f"{name}: stopping the trials (their runs are marked KILLED, finished cells "
                "stay finished); send it twice more to exit at once, without that",
                file=sys.stderr,
                flush=True,
            )
            return
        if len(received) == 2:
            print(
                f"{name}: already stopping (stopping the trials, marking their runs KILLED); "
                "send it once more to exit at once, without that",
                file=sys.stderr,
                flush=True,
            )
            return
        os._exit(128 + signum)

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, handler) for s in signals}
    tune_handler = os.environ.get(_TUNE_SIGINT_ENV)
    os.environ[_TUNE_SIGINT_ENV] = "1"
    try:
        yield
    finally:
        if not received:  # else this handler stays: a second signal must not cut the clean-up
            for s, old in previous.items():
                signal.signal(s, old)
        if tune_handler is None:
            os.environ.pop(_TUNE_SIGINT_ENV, None)
        else:
            os.environ[_TUNE_SIGINT_ENV] = tune_handler


_TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


HEAD_TIMEOUT_ENV = "FUSION_RAY_HEAD_TIMEOUT_S"
"""Seconds the Ray head may stay unreachable before the driver gives up (default 30; Ray's own
driver exits without clean-up after 60)."""
HEAD_LOST_EXIT = 7


@contextlib.contextmanager
def watch_head(on_lost: Callable[[str], None]) -> Iterator[None]:
    """While the body runs, a daemon thread connects to the Ray head's GCS port every 2 s; when
    it has refused or timed out for ``$FUSION_RAY_HEAD_TIMEOUT_S`` seconds, ``on_lost`` gets one
    sentence saying so (it should record it and end the process: Ray's driver would otherwise
    exit on its own a little later, with no clean-up)."""
    # lazy: ray takes ~0.5 s to import; kept out of --dry-run and --help
    import ray

    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    timeout_s = float(os.environ.get(HEAD_TIMEOUT_ENV, "30"))
    done = threading.Event()

    def watch() -> None:
        since = None
        while not done.wait(2.0):
            if head.answers(host, int(port)):
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= timeout_s:
                on_lost(
                    f"the Ray head at {host}:{port} has not answered for {timeout_s:g} s (its GCS "
                    "is gone: the head node stopped, crashed or was shut down)"
                )
                return

    thread = threading.Thread(target=watch, name="fusion-ray-head-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


class DriverSession:
    """The lease, Ray, the parent run, signals, the head watch and the early ends of one driver.

    ::

        with DriverSession("sweep", spec.name, spec.tracking_uri, spec.storage_path) as session:
            session.start_ray(address)                    # when there is anything to run
            session.open_parent(sweep_file, params)
            with session.driving():                       # signals, head watch, FAILED/KILLED
                with session.tune_run(lambda: finished):  # a full disk named as such
                    tuner.fit()
                session.after_tune(failed=..., store_lost=..., finished_now=...)
            session.end({"cells_finished": ...})

    ``what`` names the driver in messages ("sweep", "HPO"); ``resume`` says what running the same
    command again does (printed when the Ray head is lost)."""

    def __init__(
        self,
        what: str,
        name: str,
        tracking_uri: str,
        storage_path: str,
        *,
        take_over: bool = False,
        resume: str = "it resumes without running a finished cell again",
    ) -> None:
        self.what, self.name, self.resume = what, name, resume
        self.tracking_uri, self.storage_path, self.take_over = tracking_uri, storage_path, take_over
        self.parent_id: str | None = None
        self.signals: list[str] = []
        self.finished_now: Callable[[], int] = lambda: 0
        """How many trials this driver finished so far (``tune_run`` sets it)."""

    def __enter__(self) -> DriverSession:
        # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
        from fusion_ray.driver.store_faults import access_errors
        from fusion_ray.driver.tracking import Tracker

        with contextlib.ExitStack() as stack:  # undone in reverse if any step fails
            stack.enter_context(aws_keys_in_a_file())  # before Ray's, MLflow's, pyarrow's clients
            self.tracker: Tracker = Tracker(self.tracking_uri, self.name)
            self.lease: SweepLease = SweepLease(
                self.tracker.lease_store(), self.name, take_over=self.take_over, what=self.what
            )
            with access_errors(self.tracking_uri):  # the lease is the driver's first write
                stack.enter_context(self.lease)
            self._held = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held.__exit__(exc_type, exc, tb)

    def start_ray(self, address: str | None) -> None:
        init_ray(address)

    def open_parent(self, source_file: str | None, params: dict[str, str]) -> str:
        """The parent run of this invocation (its params: what was run and how)."""
        self.parent_id = self.tracker.parent_run(source_file, params=params)
        return self.parent_id

    @property
    def parent(self) -> str:
        """The parent run's id, once ``open_parent`` made it."""
        assert self.parent_id is not None, "open_parent first"
        return self.parent_id

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """While trials run: signals stop them (``DriverInterrupted``, the parent run KILLED),
        a lost Ray head ends the process (exit 7), and any error marks the parent run FAILED with
        the reason (unless the tracking store itself is gone: then nothing can be marked, and the
        lease is left to expire). A signal after the last Tune run, while the driver writes what
        it decided, stops nothing: that is said, and the driver ends as it would have."""
        try:
            with stop_on_signals(self.signals), self._head_watch():
                yield
                if self.signals:
                    print(
                        f"{self.signals[0]} came after the last trial had ended: the {self.what} "
                        "was not stopped; it has finished",
                        file=sys.stderr,
                        flush=True,
                    )
        except KeyboardInterrupt as exc:
            name = self.signals[0] if self.signals else "SIGINT"
            self._mark(f"the {self.what} driver was stopped by {name}", status="KILLED")
            raise DriverInterrupted(name) from exc
        except BaseException as exc:
            # lazy: store_faults imports mlflow (~1.3 s); kept out of --dry-run and --help
            from fusion_ray.driver.store_faults import (
                TrackingStoreLostError,
                store_gone,
                store_lost_error,
            )

            # a store gone (or a server that stopped answering, or a full disk): nothing to
            # mark, no lease to delete; the next driver takes the lease over once its heartbeat
            # is old. A write of the driver's own that met it says so as the callbacks do.
            gone = store_gone(exc, self.tracking_uri) if isinstance(exc, Exception) else None
            if gone is not None:
                self.lease.abandon()
                raise store_lost_error(gone, self.finished_now(), self.storage_path) from None
            if self.tracker.store_problem() is not None or isinstance(exc, TrackingStoreLostError):
                self.lease.abandon()
            else:
                self._mark(f"the {self.what} driver failed: {type(exc).__name__}: {exc}")
            raise

    def _mark(self, reason: str, status: str = "FAILED") -> None:
        """The parent run ended with ``reason``; not by a driver that lost its lease: the parent
        run is the sweep's, and the driver that took over owns it now."""
        if self.parent_id is not None and not self.lease.lost.is_set():
            self.tracker.fail(self.parent_id, reason, status=status)

    @contextlib.contextmanager
    def _head_watch(self) -> Iterator[None]:
        # lazy: ray takes ~0.5 s to import; kept out of --dry-run and --help
        import ray

        if not ray.is_initialized():
            yield
            return

        def lost(why: str) -> None:
            message = (
                f"{why}. The {self.what} cannot go on: its parent run is marked FAILED; finished "
                "runs stay FINISHED and interrupted trials keep their checkpoints under "
                f"{redact(self.storage_path)}. Start the head again (ray up cluster.yaml, or ray "
                f"start --head) and run the same command: {self.resume}."
            )
            print(f"error: {message}", file=sys.stderr, flush=True)
            try:
                self._mark(message)
            finally:
                os._exit(HEAD_LOST_EXIT)

        with watch_head(lost):
            yield

    @contextlib.contextmanager
    def tune_run(self, finished_now: Callable[[], int]) -> Iterator[None]:
        """Around ``Tuner.fit``: Tune itself fails on a full disk; that is said as such.
        ``finished_now``: how many trials this driver finished so far (for the messages)."""
        self.finished_now = finished_now
        try:
            yield
        except Exception as exc:
            full = storage_full(self.storage_path)
            if full is None:
                raise
            raise StorageFullError(storage_full_message(full, finished_now())) from exc

    def stopping(self) -> bool:
        """Whether a signal asked this driver to stop (``DriverStopper`` stops Tune then)."""
        return bool(self.signals)

    def stop_if_signalled(self) -> None:
        """At a point where the driver writes nothing: ``DriverInterrupted`` when a signal asked
        it to stop (``driving`` then marks the parent run KILLED)."""
        if self.signals:
            raise DriverInterrupted(self.signals[0])

    def after_tune(self, *, failed: bool, store_lost: str | None, finished_now: int) -> None:
        """After a Tune run: raises what ended it early (a signal, a full storage path behind its
        failed trials, a vanished tracking store, the lease taken over by another driver)."""
        # lazy: store_faults imports mlflow (~1.3 s); kept out of --dry-run and --help
        from fusion_ray.driver.store_faults import store_lost_error

        self.stop_if_signalled()
        full = storage_full(self.storage_path) if failed else None
        if full is not None:
            raise StorageFullError(storage_full_message(full, finished_now))
        if store_lost:
            raise store_lost_error(store_lost, finished_now, self.storage_path)
        if not self.lease.holds():
            raise LeaseLostError(self.lease.lost_message())

    def end(self, summary: dict[str, float]) -> None:
        """The parent run FINISHED with its summary metrics."""
        self.tracker.end_parent(self.parent, summary)


def exit_code(exc: BaseException) -> int | None:
    """The exit code of a driver stopped by ``exc`` (None: not one of the driver's stops)."""
    # lazy: store_faults imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.store_faults import TrackingStoreFullError, TrackingStoreLostError

    if isinstance(exc, KeyboardInterrupt):
        name = exc.signal_name if isinstance(exc, DriverInterrupted) else "SIGINT"
        return 128 + getattr(signal, name, signal.SIGINT)
    if isinstance(exc, StoreAccessError):
        return exc.exit_code
    codes = {  # a subclass before its base
        RefusedError: 2,
        PlacementError: 2,
        LeaseHeldError: 3,
        LeaseLostError: 4,
        TrackingStoreFullError: FAULTS["full"].exit_code,
        TrackingStoreLostError: 5,
        StorageFullError: 6,
    }
    return next((code for cls, code in codes.items() if isinstance(exc, cls)), None)


EXIT_CODES = {
    2: "the file is invalid, a store cannot be reached, the trials cannot be placed, or (HPO) "
    "the fragment exists (without --overwrite, or written by another driver meanwhile)",
    3: "another driver runs this sweep (it holds the lease)",
    4: "another driver took this sweep over while this one ran (--take-over, or a lapsed lease)",
    5: "the tracking store vanished, or its server stayed away, while the driver ran",
    6: "the storage path is full",
    7: "the Ray head stopped answering",
    8: "the tracking server refused the credentials (401/403)",
    9: "the tracking store stayed locked by another process past MLflow's wait",
    10: "the tracking server did not answer",
    12: "the tracking store has no space left (a sqlite store's disk is full)",
}
"""Every command that drives trials stops with these codes (128 + N: stopped by signal N; 11 is
a SLURM job's, when not every node joined the Ray head)."""
