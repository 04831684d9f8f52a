"""The MLflow schema is spelt once, in fusion_ray.schema: the writer's code stays inside it, and
analysis reads the same module (tests/test_architecture.py keeps it to the standard library)."""

from __future__ import annotations

import json

import pytest

import fusion_ray.schema
from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.schema import axis_text
from fusion_ray.train import run_local
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (3, "3"),
        (0.5, "0.5"),
        ("cosine", "cosine"),
        ([1, 2], "[1, 2]"),
        ({"b": 1, "a": 2}, '{"a": 2, "b": 1}'),
    ],
)
def test_axis_text_is_the_one_spelling_of_a_level(value, text):
    assert axis_text(value) == text


def test_analysis_reads_the_level_texts_the_sweep_writes():
    from analysis.load import parse_grid_axes

    written = {"model.scale_embeddings": [axis_text(v) for v in (False, True)]}
    notes: list[str] = []
    assert parse_grid_axes(json.dumps(written), notes) == written
    assert not notes


def test_a_cell_is_tagged_with_the_schema_tags(tmp_path):
    cell = expand(load_sweep(tiny_sweep(tmp_path)))[0]
    tags = cell.tags("tiny", "abc123")
    assert set(tags) == set(fusion_ray.schema.TRIAL_TAGS) | {
        fusion_ray.schema.ROLE_TAG,
        fusion_ray.schema.GATED_TAG,
    }
    assert tags[fusion_ray.schema.ROLE_TAG] == fusion_ray.schema.ROLE_TRIAL
    assert fusion_ray.schema.OPERATOR_PARAM in cell.params()


def test_the_loop_reports_only_schema_metrics(tmp_path, data_cache):
    cell = expand(load_sweep(tiny_sweep(tmp_path)))[0]
    trial = cell.trial
    trial.data.cache_dir = data_cache
    baseline = {"name": "add", "kwargs": {}}
    final = run_local(trial, str(tmp_path / "out"), latency_baseline=baseline)
    reports = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for epoch in reports[:-1]:
        assert set(epoch) == {"epoch", *fusion_ray.schema.EPOCH_METRICS}
    assert set(final) == {
        "final",
        *fusion_ray.schema.FINAL_METRICS,
        *fusion_ray.schema.INIT_METRICS,
        fusion_ray.schema.LATENCY_RATIO_METRIC,
        *fusion_ray.schema.REFERENCE_METRICS,
        *fusion_ray.schema.LENGTH_QUARTER_METRICS,
    }
