"""The MLflow schema is spelt once on each side: fusion_ray.schema (the writer) and analysis.schema
(the reader, which must not import fusion_ray). These tests keep the two copies equal and the
writer's code inside its schema."""

from __future__ import annotations

import json

import fusion_ray.schema
from fusion_ray.config import load_sweep
from fusion_ray.grid import expand
from fusion_ray.train import run_local
from tests.conftest import tiny_sweep


def _constants(module) -> dict[str, object]:
    return {k: v for k, v in vars(module).items() if k.isupper()}


def test_analysis_keeps_the_same_schema_as_fusion_ray():
    import analysis.schema

    writer, reader = _constants(fusion_ray.schema), _constants(analysis.schema)
    assert writer, "fusion_ray.schema defines no constants"
    missing = sorted(set(writer) - set(reader))
    assert not missing, f"analysis.schema lacks {missing}"
    differ = {k: (writer[k], reader[k]) for k in writer if writer[k] != reader[k]}
    assert not differ, f"fusion_ray.schema and analysis.schema disagree: {differ}"


def test_a_cell_is_tagged_with_the_schema_tags(tmp_path):
    cell = expand(load_sweep(tiny_sweep(tmp_path)))[0]
    tags = cell.tags("tiny", "abc123")
    assert set(tags) == set(fusion_ray.schema.TRIAL_TAGS) | {fusion_ray.schema.ROLE_TAG}
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
    }
