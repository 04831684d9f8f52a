"""Shared fixtures (one local Ray instance for the whole session, small sweeps on synthetic
data) and the test tiers: every test under tests/ carries exactly one of the markers in TIERS,
checked when pytest collects (``pytest -m unit -n 2`` is the quick check)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# Ray Train's controller polls its ranks every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default)
# and a rank's report waits for the next poll once the last one is not yet taken (its result
# queue holds one): the tests' epochs take milliseconds, so their Ray Train runs poll every
# 0.25 s. Set before any Ray starts; the drivers the tests start inherit it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")

TIERS = {
    "unit": "no Ray, no subprocess, no training beyond a few steps",
    "ray": "starts a local Ray (the ray_session fixture) or runs a sweep on it in this process",
    "process": "real processes: drivers, signals, faults, servers (mlflow server, sshd, SLURM, "
    "PostgreSQL), or a fresh interpreter",
    "cluster": "real clusters: `ray start`, `ray up`, a batch scheduler",
}
"""The tiers, registered as markers in pyproject.toml (``python -m pytest -m unit``: the first)."""

TIER_TIMEOUT_S = {"unit": 300, "ray": 1200, "process": 1200, "cluster": 900}
"""Each tier's limit for one test, setup and teardown included (pytest-timeout; a test's own
``@pytest.mark.timeout`` overrides it): a test that hangs fails with its stack printed, instead
of holding its worker, and the run, until CI gives up. The slowest tests take about 2 minutes
on 2 cores (``--durations``: a lost node's fixture, a SIGKILLed driver's cleanup) and up to 5
times that with both cores kept busy by another job (bench/RESULTS.md, "test tiers"): 1,200 s
is above both; a cluster test (the SLURM jobs, ``ray start``, ``ray up``) about 200 s at most,
so 900 s, and its module's four SLURM tests hung end within CI's 90 minutes. The multi-node
scenarios keep their own, longer guard (``SCENARIO_HANG_S``)."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a test without a tier fails every run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the collection, naming every test under tests/ that has no tier or more than one,
    and every unit test that starts Ray through the ray_session fixture (on one process or on
    pytest-xdist workers); give every other test its tier's time limit (``TIER_TIMEOUT_S``)."""
    problems = []
    for item in items:
        path = Path(str(item.path)).resolve()
        if TESTS not in path.parents:
            continue  # another project's tests run with ours (examples/plugin/tests)
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) == 1 and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT_S[tiers[0]]))
        if len(tiers) != 1:
            problems.append((item.nodeid, f"has {', '.join(tiers) or 'none'}"))
        elif tiers == ["unit"] and "ray_session" in getattr(item, "fixturenames", ()):
            problems.append((item.nodeid, "is unit but starts Ray (ray_session): at least ray"))
    if problems and hasattr(config, "workerinput"):  # a pytest-xdist worker (-n 2)
        # A UsageError would end the worker without its message: report a failed collection
        # instead (the controller prints it once and the run fails), and run nothing.
        report = pytest.CollectReport("tests/conftest.py", "failed", tier_message(problems), [])
        config.hook.pytest_collectreport(report=report)
        items.clear()
    elif problems:
        raise pytest.UsageError(tier_message(problems))


def tier_message(problems: list[tuple[str, str]]) -> str:
    """What is wrong with each test and exactly what to add."""
    lines = [f"{len(problems)} test(s) must be in exactly one tier ({', '.join(TIERS)}):"]
    lines += [f"  {nodeid}: {what}" for nodeid, what in problems]
    lines += [
        "Add one marker to each: for a whole file, one line after its imports,",
        "    pytestmark = pytest.mark.unit   # or ray, process, cluster",
        "or, where a file's tests differ, a decorator on every test of the file (a file with",
        "pytestmark takes no decorator of another tier):",
        "    @pytest.mark.process",
        "The tiers:",
        *(f"    {name}: {what}" for name, what in TIERS.items()),
        "and put the file where its package is: tests/fusion_ray/<package>/, tests/analysis/, ...",
    ]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance shared by every test that needs Ray (start-up costs seconds); with
    ``-n 2``, one per worker."""
    import ray

    if not ray.is_initialized():
        # Workers import test helpers (e.g. tests.fusion_ray.train.test_distributed) from the
        # checkout.
        ray.init(
            address="local",  # always a new instance, never a cluster another process started
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    """A tokenisation cache shared by the session's tests (each dataset is tokenised once)."""
    path = tmp_path_factory.mktemp("fusion_ray_cache")
    os.environ["FUSION_RAY_CACHE"] = str(path)
    return str(path)


RAM_DISK = Path("/dev/shm")
"""Where tests keep the MLflow stores they need not name, when it is there: sqlite syncs every
commit to disk, and logging a run there takes a fifth of the time it takes under /tmp."""


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory) -> Iterator[Callable[..., str]]:
    """``mlflow_store(path=None)``: a new, empty MLflow sqlite store and its tracking URI, at
    ``path`` (the folder is made), or, without one, in a folder of its own on the RAM disk
    (RAM_DISK; the session's temporary folder without one), removed when the session ends.

    MLflow migrates a new sqlite file in seconds; here it migrates one per session and each
    store is a copy of it, in milliseconds. The copy has no experiment: MLflow makes the
    Default one, with its artifact folder, as it opens the store."""
    template = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{template}").search_experiments()  # MLflow creates and migrates it
    with closing(sqlite3.connect(template)) as db, db:  # closed, after one commit
        db.execute("DELETE FROM experiments")  # the Default one, its artifacts under this cwd
    on_ram = RAM_DISK.is_dir() and os.access(RAM_DISK, os.W_OK)
    stores = Path(tempfile.mkdtemp(prefix="fusion-ray-stores-", dir=RAM_DISK if on_ram else None))

    def make(path: Path | None = None) -> str:
        if path is None:
            path = Path(tempfile.mkdtemp(dir=stores)) / "mlflow.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"

    yield make
    shutil.rmtree(stores, ignore_errors=True)


def tiny_sweep(tmp_path: Path, name: str = "tiny", **overrides) -> Path:
    """Write a small, fast sweep file under ``tmp_path`` and return its path."""
    spec = {
        "name": name,
        "seeds": [0, 1],
        "grid": {"datasets": ["short"], "fusions": ["add", "gate_scalar"]},
        "datasets": {
            "short": {
                "data": {
                    "source": "synthetic",
                    "source_kwargs": {
                        "regime": "short",
                        "n_train": 160,
                        "n_validation": 64,
                        "n_test": 64,
                        "window": 48,
                    },
                    "tokenizer": "word",
                    "max_length": 64,
                }
            }
        },
        "defaults": {
            "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_len": 64},
            "train": {
                "epochs": 2,
                "batch_size": 32,
                "lr": 1e-3,
                "latency_repeats": 2,
                "latency_batch_size": 4,
            },
        },
        "resources": {"workers": 1, "cpus_per_worker": 1, "max_concurrent_trials": 2},
        "storage_path": str(tmp_path / "ray_results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "retries": 0,
    }
    for key, value in overrides.items():
        spec[key] = value
    path = tmp_path / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
