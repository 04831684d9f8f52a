"""Helpers several test modules share (fixtures live in conftest.py): a tiny trial, tiny sweep
files with settings changed, a miniature local copy of a hub dataset."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from fusion_ray.data.spec import DataSpec
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train import TrainSpec, TrialConfig
from tests.conftest import ROOT, tiny_sweep


def tiny_trial(data_cache: str, **train) -> TrialConfig:
    """A tiny gate_scalar trial on short synthetic documents (3 epochs unless ``train`` says)."""
    return TrialConfig(
        dataset="short",
        data=DataSpec(
            source="synthetic",
            source_kwargs={
                "regime": "short",
                "n_train": 160,
                "n_validation": 48,
                "n_test": 48,
                "window": 48,
            },
            tokenizer="word",
            max_length=64,
            cache_dir=data_cache,
        ),
        model=ModelSpec(
            d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=64, fusion="gate_scalar"
        ),
        train=TrainSpec(
            **{
                "epochs": 3,
                "batch_size": 32,
                "lr": 2e-3,
                "latency_repeats": 2,
                "latency_batch_size": 4,
                **train,
            }
        ),
        seed=3,
    )


def sweep_with(tmp_path: Path, **train: object) -> Path:
    """The tests' tiny sweep file with ``train`` settings added to its defaults."""
    path = tiny_sweep(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["train"].update(train)
    path.write_text(yaml.safe_dump(raw))
    return path


def hub_copy(root: Path, layout: str) -> None:
    """A miniature local copy of a hub dataset repo, in one of the hub's parquet layouts."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]

    def frame(n: int, classes: int) -> pd.DataFrame:
        texts = [" ".join(rng.choice(words, size=5)) for _ in range(n)]
        return pd.DataFrame({"text": texts, "label": rng.integers(0, classes, size=n)})

    if layout == "ag_news":  # data/<split>-00000-of-00001.parquet, train/test only
        (root / "data").mkdir(parents=True)
        frame(40, 4).to_parquet(root / "data" / "train-00000-of-00001.parquet")
        frame(10, 4).to_parquet(root / "data" / "test-00000-of-00001.parquet")
    elif layout == "imdb":  # plain_text/..., with an unsupervised split that must be ignored
        (root / "plain_text").mkdir(parents=True)
        frame(40, 2).to_parquet(root / "plain_text" / "train-00000-of-00001.parquet")
        frame(10, 2).to_parquet(root / "plain_text" / "test-00000-of-00001.parquet")
        unsup = frame(30, 2).assign(label=-1)
        unsup.to_parquet(root / "plain_text" / "unsupervised-00000-of-00001.parquet")
    elif layout == "arxiv":  # two configs; the converter's <config>/<split>/0000.parquet layout
        for config in ("default", "no_ref"):
            for split, n in (("train", 30), ("validation", 8), ("test", 9)):
                (root / config / split).mkdir(parents=True)
                frame(n, 11).to_parquet(root / config / split / "0000.parquet")


UNINTERRUPTED_METRICS = ("test_acc", "test_correct", "best_val_acc", "best_epoch", "epochs_run")
"""What a trial that was interrupted and resumed must log as the same trial run without a break."""


def uninterrupted_metrics(path: Path, workdir: Path) -> dict[str, float]:
    """``UNINTERRUPTED_METRICS`` of the one cell of sweep ``path`` trained locally without
    interruption (in ``workdir``), on one thread as its trials run (cpus_per_worker: 1). In a
    process where every operator of the sweep can be built (a plug-in's included)."""
    import torch

    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import expand
    from fusion_ray.train import run_local

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float sums
    try:
        reference = run_local(expand(load_sweep(path))[0].trial, str(workdir))
    finally:
        torch.set_num_threads(threads)
    return {name: reference[name] for name in UNINTERRUPTED_METRICS}


def assert_metrics_of_an_uninterrupted_run(path: Path, run: Any, tmp_path: Path) -> None:
    """``run`` (the one cell of sweep ``path``) logged what the same trial logs trained locally
    without interruption, on one thread as the trial ran (cpus_per_worker: 1)."""
    reference = uninterrupted_metrics(path, tmp_path / "reference")
    for name in UNINTERRUPTED_METRICS:
        assert run.data.metrics[name] == reference[name], name


HELD_ADD = '''"""`add` whose trials take turns as a test says: the first {through} Tune trials that
build it go on; every other trial, after {hold_after} training steps, writes waiting-<trial id>
next to {release!r} and waits until that file exists. Outside a Tune trial it never waits (with
RANKS, each rank of a Ray Train run waits too, as trial <run name>-rank<rank>).
``tag`` changes nothing: a second grid entry that builds the same model."""

import os
import time
from pathlib import Path

from fusion_ray.model.fusion import Add

RELEASE = Path({release!r})
HOLD_AFTER = {hold_after}
THROUGH = {through}
RANKS = {ranks}


def _trial_id():
    import warnings

    trial = None
    try:
        from ray import tune

        with warnings.catch_warnings():  # outside a trial Ray warns, then returns None
            warnings.simplefilter("ignore")
            trial = tune.get_context().get_trial_id()
    except Exception:  # not in a Tune trial
        pass
    if trial is None and RANKS:
        try:
            from ray import train

            context = train.get_context()
            trial = f"{{context.get_experiment_name()}}-rank{{context.get_world_rank()}}"
        except Exception:  # not in a Ray Train run either
            pass
    return trial


class HeldAdd(Add):
    def __init__(self, d_model: int, *, tag: str = "") -> None:
        super().__init__(d_model)
        self.trial, self.steps = _trial_id(), 0
        self.held = self.trial is not None and not self._through()
        if self.held and HOLD_AFTER == 0:
            self._wait()

    def _through(self) -> bool:
        """Whether this trial holds one of the THROUGH places: each is claimed once, atomically
        (a hard link to a file that already names the trial), and kept when the trial's model
        is built again."""
        claim = RELEASE.with_name(f"claim-{{self.trial}}")
        claim.write_text(self.trial)
        for place in range(THROUGH):
            taken = RELEASE.with_name(f"through-{{place}}")
            try:
                os.link(claim, taken)
            except FileExistsError:
                pass
            if taken.read_text() == self.trial:
                return True
        return False

    def _wait(self) -> None:
        RELEASE.with_name(f"waiting-{{self.trial}}").touch()
        while not RELEASE.exists():
            time.sleep(0.1)

    def forward(self, E, P):
        if self.held and self.training and HOLD_AFTER:
            self.steps += 1
            if self.steps == HOLD_AFTER + 1:
                self._wait()
        return super().forward(E, P)
'''


def install_held_add(
    directory: Path, release: Path, hold_after: int = 0, through: int = 1, ranks: bool = False
) -> Path:
    """The plug-in operator ``held_add`` (HELD_ADD) and its dist-info in ``directory``: the first
    ``through`` trials that build it run through (0: none does); every other waits for the file
    ``release`` (the test creates it to let them go), from the start (``hold_after`` 0) or after
    that many training steps (past its first checkpoint, when that is more than one epoch's
    steps). With ``ranks``, the ranks of a multi-worker (Ray Train) trial wait too. Found in every
    process with ``directory`` on its path: a driver's own Ray with ``directory`` on PYTHONPATH,
    or the driver's working directory, which Ray puts on its workers' path. The release path is
    written into the module: workers of a shared Ray do not see the driver's environment."""
    (directory / "fusion_ray_held").mkdir(parents=True)
    (directory / "fusion_ray_held" / "__init__.py").write_text(
        HELD_ADD.format(release=str(release), hold_after=hold_after, through=through, ranks=ranks)
    )
    info = directory / "fusion_ray_held-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fusion-ray-held\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fusion_ray.fusions]\nheld_add = fusion_ray_held:HeldAdd\n"
    )
    return directory


MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""Added to the environment of every ``mlflow server`` a test starts: without MLflow's job runner
(a pool of job-consumer processes, each importing MLflow as the server starts: seconds of CPU
per server on two cores), which no test uses; the tracking and artifact service is the same."""


SCENARIO_HANG_S = 1800
"""How long a multi-node scenario subprocess may run before its test calls it hung: a guard, not
a deadline. On 2 cores kept busy by another job (2026-11-27) the DDP lost-node test took 1,038 s
and the three-node sweep 291 s; idle, they take about a minute each."""


def run_with_hang_guard(
    command: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """Runs a scenario subprocess (its own multi-node Ray) to its end; fails the test with the
    scenario's output when it runs past ``SCENARIO_HANG_S``. The caller checks its return code."""
    try:
        return subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=SCENARIO_HANG_S
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        output = (out or "")[-2000:] + (err or "")[-4000:]
        pytest.fail(f"{' '.join(command[2:])[:300]} still ran after {SCENARIO_HANG_S} s:\n{output}")


def process_ended(process: subprocess.Popen, log: Path | None = None) -> Callable[[], str | None]:
    """For ``wait_until_held``: None while ``process`` runs, else its exit code and the tail of
    ``log``."""

    def check() -> str | None:
        if process.poll() is None:
            return None
        tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
        return f"exit {process.returncode} before a trial was held\n{tail}"

    return check


def wait_until_held(
    release: Path,
    ended: Callable[[], str | None],
    also: Callable[[], bool] = lambda: True,
    timeout: float = 300,
) -> None:
    """Until a ``held_add`` trial waits (a ``waiting-*`` file beside ``release``) and ``also()``
    holds. ``ended()`` says what ended the driver or job (None while it runs): the wait fails
    with that at once, rather than at the timeout."""
    deadline = time.monotonic() + timeout
    while not (list(release.parent.glob("waiting-*")) and also()):
        why = ended()
        assert why is None, why
        assert time.monotonic() < deadline, f"no held trial (waiting-* in {release.parent})"
        time.sleep(0.2)


def wait_until_lapsed(tracking_uri: str, name: str, ttl_s: float, timeout: float = 300) -> None:
    """Until the lease of sweep or HPO ``name`` in the store at ``tracking_uri`` has had no
    heartbeat for more than ``ttl_s`` (``FUSION_RAY_LEASE_TTL_S`` of the next driver): the state
    in which the next driver takes it over. For a paused holder whose heartbeat is slower than
    the pause; sleeps only until the last heartbeat is ``ttl_s`` old, then reads it again."""
    from mlflow.tracking import MlflowClient

    from fusion_ray.driver.lease import LEASE_PREFIX

    client = MlflowClient(tracking_uri)
    deadline = time.monotonic() + timeout
    while True:
        heartbeat = float(client.get_registered_model(LEASE_PREFIX + name).tags["heartbeat"])
        left = heartbeat + ttl_s - time.time()
        if left < 0:
            return
        assert time.monotonic() < deadline, f"the lease of {name} kept its heartbeat"
        time.sleep(min(left + 0.05, 1.0))


def install_example(site: Path, example: str) -> str:
    """The example package ``examples/<example>`` pip-installed into ``site`` (a folder of its
    own, put on PYTHONPATH by the tests that use it), as a user would install it."""
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(site), str(ROOT / "examples" / example)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    return str(site)
