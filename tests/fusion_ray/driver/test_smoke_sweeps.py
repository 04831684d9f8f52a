"""Every shipped file's ``--smoke`` path runs to the end on a CPU-only Ray: each sweep file in
sweeps/ and each HPO file in sweeps/hpo/, in the session's shared Ray, whatever resources the
file asks for (GPU trials are rehearsed on CPUs, and the parent run says so).

The study's hub datasets cannot be downloaded here, so their presets read a local copy in the
hub's own parquet layout that this module writes (``data.source_kwargs.data_dir``, the way a
cluster without network runs them); the models are shrunk with ``model.*`` overrides so that the
files' 180-odd smoke trials take minutes. Everything else (grids, presets, position methods,
operators, resources, evaluation lengths) is the file's own. Some of the files ask for GPUs, so
the rehearsal of GPU trials on CPUs is tested here too."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from fusion_ray.config import load_sweep, smoke_version
from fusion_ray.data.sources import HUB_DATASETS
from tests.conftest import ROOT

pytestmark = pytest.mark.ray

SWEEP_FILES = sorted(p.name for p in (ROOT / "sweeps").glob("*.yaml") if not p.name.startswith("_"))
HPO_FILES = sorted(p.name for p in (ROOT / "sweeps" / "hpo").glob("*.yaml"))

TINY_MODEL = ("model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32")
"""Small enough that a trial's time is Ray's start-up, not training."""


@pytest.fixture(scope="module")
def hub_copy(tmp_path_factory) -> Path:
    """A local copy of every hub dataset in the hub's layout (``<config>/<split>-00000-of-00001
    .parquet``, the dataset's own text and label columns and class count): short documents
    whose first word names the class."""
    root = tmp_path_factory.mktemp("hub_copy")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    for name, info in HUB_DATASETS.items():
        folder = root / name / (info.config or "")
        folder.mkdir(parents=True)
        for split in info.splits:
            rows = [
                {
                    info.text_column: " ".join(
                        [f"class{i % info.num_classes}"] * 3
                        + rng.choices(words, k=rng.randint(8, 40))
                    ),
                    info.label_column: i % info.num_classes,
                }
                for i in range(96 if split == "train" else 2 * info.num_classes + 8)
            ]
            pd.DataFrame(rows).to_parquet(folder / f"{split}-00000-of-00001.parquet")
    return root


def _overrides(path: Path, hub_copy: Path, tmp_path: Path, store) -> list[str]:
    """Tiny models, this test's own stores (a new MLflow store from ``mlflow_store``), and the
    local hub copy for each hub preset."""
    raw_presets = load_sweep(path).datasets if path.parent.name == "sweeps" else None
    if raw_presets is None:
        from fusion_ray.hpo import load_hpo

        raw_presets = load_hpo(path).spec.datasets
    hub = [
        f"datasets.{name}.data.source_kwargs.data_dir={hub_copy / preset.data.source_kwargs['dataset']}"
        for name, preset in raw_presets.items()
        if preset.data.source == "hub"
    ]
    stores = [
        f"storage_path={tmp_path / 'ray_results'}",
        f"tracking_uri={store()}",
    ]
    return [*TINY_MODEL, *stores, *hub]


def _asks_for_gpus(spec) -> bool:
    from fusion_ray.config import resources_for

    return any(resources_for(spec, name).use_gpu for name in spec.datasets)


def _parent_tags(tracker) -> dict[str, str]:
    (parent,) = tracker.client.search_runs(
        [tracker.experiment_id], filter_string="tags.role = 'sweep'"
    )
    return parent.data.tags


def test_a_shipped_sweep_file_asks_for_gpus():
    """The smoke tests below rehearse GPU trials on CPUs only if a shipped file asks for GPUs."""
    assert any(_asks_for_gpus(load_sweep(ROOT / "sweeps" / name)) for name in SWEEP_FILES)


@pytest.mark.parametrize("name", SWEEP_FILES)
def test_every_sweep_files_smoke_path_runs_on_cpus(
    name, tmp_path, hub_copy, ray_session, data_cache, mlflow_store, monkeypatch, capsys
):
    from fusion_ray.config.grid import expand
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.sweep import main

    path = ROOT / "sweeps" / name
    monkeypatch.chdir(tmp_path)
    overrides = _overrides(path, hub_copy, tmp_path, mlflow_store)
    assert main([str(path), "--smoke", "--no-report", *overrides]) == 0

    spec = smoke_version(load_sweep(path, overrides))
    cells = expand(spec)
    tracker = Tracker(spec.tracking_uri, spec.name)
    runs = tracker.trial_runs()
    assert sorted(r.data.tags["cell_id"] for r in runs) == sorted(c.cell_id for c in cells)
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len({c.seed for c in cells}) == 1 and {c.trial.train.epochs for c in cells} == {1}
    out = capsys.readouterr().out
    assert f"{len(cells)} finished now, 0 failed" in out and "mlflow ui" in out
    tags = _parent_tags(tracker)
    assert json.loads(tags["overrides"]) == overrides
    rehearsed = _asks_for_gpus(load_sweep(path))
    assert tags.get("smoke_gpu_trials_on_cpu") == ("true" if rehearsed else None)
    assert ("rehearsed on CPUs" in out) == rehearsed


@pytest.mark.parametrize("name", HPO_FILES)
def test_every_hpo_files_smoke_path_runs_on_cpus(
    name, tmp_path, hub_copy, ray_session, data_cache, mlflow_store, monkeypatch, capsys
):
    import yaml

    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.hpo import load_hpo
    from fusion_ray.hpo.cli import main

    path = ROOT / "sweeps" / "hpo" / name
    monkeypatch.chdir(tmp_path)
    overrides = _overrides(path, hub_copy, tmp_path, mlflow_store)
    output = tmp_path / "tuned.yaml"
    assert main([str(path), "--smoke", "--output", str(output), *overrides]) == 0

    plan = load_hpo(path, overrides)
    tuned = yaml.safe_load(output.read_text())["datasets"]
    assert set(tuned) == set(plan.tune.datasets)
    tracker = Tracker(plan.spec.tracking_uri, f"{plan.spec.name}-smoke")
    runs = tracker.trial_runs()
    operators = len(plan.tune.operators)
    assert len(runs) == len(plan.tune.datasets) * min(2, plan.tune.num_samples) * operators
    assert {r.info.status for r in runs} == {"FINISHED"}
    rehearsed = _asks_for_gpus(plan.spec)
    assert _parent_tags(tracker).get("smoke_gpu_trials_on_cpu") == ("true" if rehearsed else None)
    assert ("rehearsed on CPUs" in capsys.readouterr().out) == rehearsed
