"""What the sweep and the HPO phase share to run trials on Ray: start-up, storage, resources,
the device a trial trains on, and the Tune trainable that runs one trial.

A trial with one worker trains directly inside its Tune trial; one with several workers runs a
Ray Train ``TorchTrainer`` (DDP) inside it, its metrics forwarded by ``TuneReportCallback``.
Everything here is called on the driver except ``run_cell`` and ``trial_device``, which run in
the trial's process.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fusion_ray.config import Resources
from fusion_ray.job import OperatorRef, TrialJob
from fusion_ray.redact import redact
from fusion_ray.train.spec import TrialConfig

log = logging.getLogger(__name__)

CPU_FALLBACK_ENV = "FUSION_RAY_CPU_FALLBACK"


def init_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (or $RAY_ADDRESS); with neither, start a Ray of our own.

    Our own means ``address="local"``: a new instance even when another Ray runs on the machine
    (never someone else's cluster), on the loopback address, without a dashboard. Ray's token
    authentication stays as Ray sets it."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
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
        import re

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
    pool = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, RetryNotice) for f in pool.filters):
        pool.addFilter(RetryNotice())


@contextlib.contextmanager
def tune_output(verbose: int) -> Iterator[None]:
    """Ray Tune's console output while a Tuner runs: at verbosity 0 none at all (Tune's new
    output engine prints its experiment table and result paths whatever the verbosity; the
    legacy engine at 0 prints nothing), else Tune's own tables."""
    if verbose > 0:
        yield
        return
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


class DriverInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver: it stops its trials and marks its open runs and
    its parent run KILLED; the finished cells stay finished and a re-run resumes the rest."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def stop_on_signals(received: list[str]) -> Iterator[None]:
    """While a driver runs its trials: the first SIGINT or SIGTERM (Ctrl+C, a scheduler's or
    ``ray down``'s stop) raises ``DriverInterrupted`` in the main thread at once. Ray Tune's own
    SIGINT handler (end the run after one more save of Tune's experiment state, which this
    driver never reads) and Ray's SIGTERM handler (exit with status 1, no cleanup) are off
    meanwhile. A second signal while the driver cleans up and exits (it stays handled after an
    interruption) is reported and ignored; a third ends the process at once. Outside the main
    thread nothing changes. ``received`` gets the signals' names (libraries may re-raise the
    interruption as a plain KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        received.append(name)
        if len(received) == 1:
            raise DriverInterrupted(name)
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
    import ray

    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    timeout_s = float(os.environ.get(HEAD_TIMEOUT_ENV, "30"))
    done = threading.Event()

    def reachable() -> bool:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return True
        except OSError:
            return False

    def watch() -> None:
        since = None
        while not done.wait(2.0):
            if reachable():
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


def storage_uri(storage_path: str) -> str:
    """A storage path as Ray wants it: URIs (``s3://...``) as given, local paths absolute."""
    return storage_path if "://" in storage_path else str(Path(storage_path).resolve())


def preflight(
    storage_path: str, tracking_uri: str, *, remote: bool = True, timeout_s: float = 5.0
) -> list[str]:
    """What would fail only after Ray starts: storage that cannot be written, a tracking store
    that cannot be reached. Leaves nothing behind; a server gets ``timeout_s``. ``remote=False``
    checks only local paths (a dry run on a machine that cannot reach the cluster's stores)."""
    problems = _storage_problems(storage_path, remote)
    return problems + _tracking_problems(tracking_uri, timeout_s, remote)


def _writable_dir_problem(path: Path, what: str) -> str | None:
    target = path.resolve()
    if target.exists() and not target.is_dir():
        return f"{what}: {path} is a file, not a folder"
    existing = next(p for p in [target, *target.parents] if p.exists())
    try:  # a real write: permission bits say nothing for root, or on read-only mounts
        os.rmdir(tempfile.mkdtemp(prefix=".fusion-ray-write-test-", dir=existing))
    except OSError as exc:
        return f"{what}: {path} cannot be written ({exc.strerror} in {existing}); choose a folder you can write"
    return None


def _storage_problems(storage_path: str, remote: bool) -> list[str]:
    if "://" not in storage_path:
        problem = _writable_dir_problem(Path(storage_path), "storage_path")
        return [problem] if problem else []
    if not remote:
        return []
    import pyarrow.fs

    try:
        pyarrow.fs.FileSystem.from_uri(storage_path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad URI
        return [
            redact(
                f"storage_path: {storage_path} cannot be opened ({str(exc).splitlines()[0]}); "
                "check the URI, the credentials and the network"
            )
        ]
    return []


def _tracking_problems(tracking_uri: str, timeout_s: float, remote: bool) -> list[str]:
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        problem = _writable_dir_problem(db.parent, "tracking_uri")
        return [problem] if problem else []
    if not remote or not tracking_uri.startswith(("http://", "https://")):
        return []
    import base64
    import http.client
    import urllib.error
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(tracking_uri)
    host = parts.netloc.rsplit("@", 1)[-1]  # user info goes in a header, not in the host name
    url = urlunsplit((parts.scheme, host, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(url)
    if parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return []
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        return [
            redact(
                f"tracking_uri: no MLflow server answers at {tracking_uri} within {timeout_s:g} s "
                f"({reason}); start it (mlflow server ...) or fix the URI"
            )
        ]


def within_storage(path: str, storage_path: str) -> bool:
    """Whether a checkpoint ``path`` (a local path or URI) lies under the sweep's storage: a
    checkpoint path read back from the tracking store is trusted only there. URIs are compared
    parsed, not as strings: the same scheme and bucket, a key under the storage prefix (no
    ``..``), and no query parameters (an endpoint, a scheme, a region) but the storage path's
    own, so a tag cannot point the driver's signed requests at another host."""
    from urllib.parse import parse_qs, urlsplit

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


def trial_resources(res: Resources) -> dict[str, float]:
    """What the Tune trial itself holds: the worker (direct path), or a token bundle plus one unit of
    ``driver_resource`` when set (TorchTrainer path; the workers hold the CPUs and GPUs)."""
    if res.workers == 1 and not res.force_trainer:
        out = {"CPU": res.cpus_per_worker}
        if res.use_gpu:
            out["GPU"] = res.gpus_per_worker
        return out
    # The TorchTrainer's workers request their own resources. Tune needs a non-empty bundle for the
    # trial itself; a token 1 KiB of memory keeps it from holding a CPU the workers need. With
    # `driver_resource`, one unit of that custom resource pins the trial (and the Train controller,
    # which Ray places on the trial's node) to the nodes offering it, e.g. the cluster's head.
    out: dict[str, float] = {"memory": 1024}
    if res.driver_resource:
        out[res.driver_resource] = 1
    return out


def trial_device(res: Resources) -> Any:
    """The device a one-worker trial trains on, in the trial's process: its GPU when the sweep
    asks for one, the CPU otherwise. A GPU trial on a node whose torch has no CUDA fails with the
    fix, unless $FUSION_RAY_CPU_FALLBACK=1 asks to rehearse a GPU sweep on CPU nodes."""
    import torch

    if not res.use_gpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if os.environ.get(CPU_FALLBACK_ENV) == "1":
        return torch.device("cpu")
    raise RuntimeError(
        f"the sweep asks for GPUs (resources.use_gpu: true) but torch {torch.__version__} on this "
        "node has no CUDA: install a CUDA build of torch on the GPU nodes, or set use_gpu: false "
        f"({CPU_FALLBACK_ENV}=1 trains on CPU instead, to rehearse a GPU sweep on CPU nodes)"
    )


def run_direct(
    trial: TrialConfig,
    res: Resources,
    reporter_cls: type,
    *,
    latency_baseline: OperatorRef | None = None,
    **reporter_options: Any,
) -> None:
    """Train ``trial`` in this process (a one-worker Tune trial), reporting through ``reporter_cls``;
    ``latency_baseline`` (the sweep's baseline operator, or None) as in ``run_trial``."""
    import torch

    from fusion_ray.train.loop import run_trial

    torch.set_num_threads(max(1, int(res.cpus_per_worker)))
    reporter = reporter_cls(device=trial_device(res), **reporter_options)
    baseline = latency_baseline.mapping() if latency_baseline is not None else None
    run_trial(trial, reporter, latency_baseline=baseline)


def run_cell(job: TrialJob) -> None:
    """Ray Tune function trainable of a sweep cell: directly (one worker) or as a DDP TorchTrainer.
    ``job`` was built and checked by the driver; it is used as it is."""
    from fusion_ray.train.report import TuneReporter

    res = job.resources
    if res.workers == 1 and not res.force_trainer:
        try:
            run_direct(
                job.trial,
                res,
                TuneReporter,
                latency_baseline=job.latency_baseline,
                resume_from=job.resume_from,
            )
        except REPEATING_ERRORS as exc:
            # The same config, data and seed fail the same way every time: end the trial with
            # the reason (recorded FAILED by the tracking callback) instead of letting Tune retry.
            from ray import tune

            tune.report({TRIAL_ERROR: _error_summary(exc)})
        return
    _run_trainer(job)


REPEATING_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FloatingPointError,
    FileNotFoundError,
    ConnectionError,
)
"""Errors a trial raises because of its config or data (bad values, a non-finite loss at a given
seed, a missing file, a dataset that cannot be downloaded): retrying would repeat them."""
TRIAL_ERROR = "trial_error"
"""The key of the result a trial reports instead of raising one of REPEATING_ERRORS."""


def _error_summary(exc: BaseException) -> str:
    import traceback

    lines = traceback.format_exception(exc)
    return "".join(lines[-6:]).strip() + "\n(not retried: this error repeats on every attempt)"


def _run_trainer(job: TrialJob) -> None:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from fusion_ray.train.loop import train_worker

    res = job.resources
    per_worker = {"CPU": res.cpus_per_worker}
    if res.use_gpu:
        per_worker["GPU"] = res.gpus_per_worker
    baseline = job.latency_baseline
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={
            "trial": job.trial,
            "resume_from": job.resume_from,
            "threads": max(1, int(res.cpus_per_worker)),
            "latency_baseline": baseline.mapping() if baseline is not None else None,
        },
        torch_config=TorchConfig(backend="nccl" if res.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=res.workers, use_gpu=res.use_gpu, resources_per_worker=per_worker
        ),
        # One Train run per cell and sweep invocation: a Tune retry of this trial restarts the
        # trainer under the same name, and Ray Train resumes it from its last checkpoint. Across
        # invocations a cell resumes only from the checkpoint its MLflow run records
        # (`resume_from`). Retries happen at one level, Tune's, so `retries` means what it says.
        run_config=RunConfig(
            name=f"{job.tune_run}-{job.cell_id}",
            storage_path=job.train_storage,
            failure_config=FailureConfig(max_failures=0, max_preemption_failures=0),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()
