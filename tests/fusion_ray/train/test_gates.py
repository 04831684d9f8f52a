"""What a trial measures besides accuracy: the gate of gated operators by position, the initial
scales of E and P, and the latency ratio to the sweep's baseline; how they reach MLflow; and
``analysis.sections.study.gates`` reading and plotting them from a real (sqlite) MLflow store."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist

from analysis.sections.study.gates import ID_COLUMNS, gate_figure, gate_frame, plot_gates
from fusion_ray.data import prepare_data
from fusion_ray.model import FUSIONS, POSITIONS, ModelSpec, build_classifier
from fusion_ray.model.fusion import GatedFusion
from fusion_ray.schema import (
    GATE_COLUMNS,
    GATES_FILE,
    INIT_METRICS,
    LATENCY_RATIO_METRIC,
    PREDICTIONS_FILE,
    ROLE_TAG,
    ROLE_TRIAL,
)
from fusion_ray.study.workload import final_metric_names, log_predictions
from fusion_ray.train import TrainSpec, run_local
from fusion_ray.train.evaluate import (
    gate_bucket_edges,
    gate_by_position,
    latency_baseline_spec,
    latency_metrics,
    measure_latency,
)
from fusion_ray.train.loop import initial_scales
from fusion_ray.train.report import load_checkpoint_dir
from tests.helpers import tiny_trial
from tests.synthetic import log_trial

GATED = ["gate_scalar", "gate_cnn", "gate_mlp", "gate_vector"]
CPU = torch.device("cpu")
ADD = {"name": "add", "kwargs": {}}


def _spec(**model) -> ModelSpec:
    return ModelSpec(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=64, **model)


def _final_checkpoint(out_dir: Path) -> Path:
    return sorted((out_dir / "checkpoints").glob("report_*"))[-1]


# ----------------------------------------------------------------------------- the gate method


@pytest.mark.unit
def test_the_gated_operators_are_exactly_the_convex_mixes():
    gated = [n for n in FUSIONS.names() if isinstance(FUSIONS.build(n, 4), GatedFusion)]
    assert gated == GATED


@pytest.mark.unit
@pytest.mark.parametrize("shared_p", [True, False], ids=["P[L,d]", "P[B,L,d]"])
@pytest.mark.parametrize("name", GATED)
def test_gate_weight_is_the_mix_forward_computes(name, shared_p):
    torch.manual_seed(0)
    fusion = FUSIONS.build(name, 8)
    E = 3 * torch.randn(3, 5, 8)
    P = torch.randn(5, 8) if shared_p else torch.randn(3, 5, 8)
    g = fusion.gate_weight(E, P)
    assert g.shape[-1] == (8 if name in ("gate_mlp", "gate_vector") else 1)
    assert ((g > 0) & (g < 1)).all()
    assert torch.equal(fusion(E, P), g * E + (1 - g) * P)


# ----------------------------------------------------------------------------- initial scales


@pytest.mark.unit
def test_initial_scales_match_a_direct_computation():
    scaled = build_classifier(_spec(scale_embeddings=True), 50, 3, seed=5)
    plain = build_classifier(_spec(scale_embeddings=False), 50, 3, seed=5)
    s, p = initial_scales(scaled, 40), initial_scales(plain, 40)
    assert set(s) == set(INIT_METRICS)
    weight = plain.embedding.weight.detach().double()  # [V, d], the padding row (zeros) included
    assert p["init_token_rms"] == pytest.approx(weight.square().mean().sqrt().item(), rel=1e-12)
    assert s["init_token_rms"] == pytest.approx(math.sqrt(16) * p["init_token_rms"], rel=1e-6)
    table = POSITIONS.build("sinusoidal", 16, 64).table[:40].double()  # positions 0..39
    assert p["init_position_rms"] == pytest.approx(table.square().mean().sqrt().item(), rel=1e-12)
    # sin^2 + cos^2 = 1 for each of the d/2 pairs: RMS 1/sqrt(2) at every length
    assert s["init_position_rms"] == p["init_position_rms"] == pytest.approx(0.5**0.5, rel=1e-6)


@pytest.mark.unit
def test_initial_position_scale_covers_max_length_and_is_zero_without_p():
    learned = build_classifier(_spec(position="learned"), 50, 3, seed=5)
    table = learned.position.table.weight.detach().double()[:10]  # positions 0..9
    rms = initial_scales(learned, 10)["init_position_rms"]
    assert rms == pytest.approx(table.square().mean().sqrt().item(), rel=1e-12)
    assert initial_scales(build_classifier(_spec(position="none"), 50, 3, seed=5), 10) == {
        "init_token_rms": initial_scales(learned, 10)["init_token_rms"],
        "init_position_rms": 0.0,
    }


@pytest.mark.unit
def test_initial_scales_do_not_depend_on_the_operator():
    scales = [initial_scales(build_classifier(_spec(fusion=n), 50, 3, seed=2), 64) for n in GATED]
    assert all(s == scales[0] for s in scales)


# ----------------------------------------------------------------------------- gate by position


@pytest.mark.unit
def test_bucket_edges_are_powers_of_two_up_to_max_length():
    assert gate_bucket_edges(64) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert gate_bucket_edges(100) == [0, 1, 2, 4, 8, 16, 32, 64, 100]
    assert gate_bucket_edges(1) == [0, 1]


@pytest.fixture(scope="module")
def prepared(data_cache):
    """The tiny trial's tokenised splits (48 test documents, max_length 64)."""
    return prepare_data(tiny_trial(data_cache).data)


@pytest.mark.unit
@pytest.mark.parametrize("pad_to", [None, 64], ids=["dynamic", "max_length"])
@pytest.mark.parametrize("name", GATED)
def test_gate_by_position_averages_the_gate_over_every_real_token(name, pad_to, prepared):
    split = prepared.test
    model = build_classifier(
        _spec(fusion=name), prepared.vocab_size, prepared.num_classes, seed=1
    ).eval()
    spec = TrainSpec(eval_batch_size=16, pad_to_multiple=8, precision="fp32")
    gates = gate_by_position(model, split, spec=spec, device=CPU, pad_to=pad_to, max_length=64)

    edges = gate_bucket_edges(64)
    assert list(gates.columns) == list(GATE_COLUMNS)
    assert gates["bucket_start"].tolist() == edges[:-1]
    assert gates["bucket_end"].tolist() == edges[1:]
    lengths = split.input_lengths
    assert gates["tokens"].sum() == lengths.sum()
    # the same gates computed one unpadded document at a time
    values = defaultdict(list)
    with torch.no_grad():
        for ids in split.ids:
            E, P = model.fusion_inputs(torch.tensor(ids)[None], None)
            g = model.fusion.gate_weight(E, P)
            g = g.expand(1, len(ids), g.size(-1))[0].double()  # [L, w]
            for start, end in zip(edges[:-1], edges[1:], strict=True):
                values[start].append(g[start:end].flatten())
    width = 16 if name in ("gate_mlp", "gate_vector") else 1
    for row in gates.itertuples():
        span = row.bucket_end - row.bucket_start
        assert row.tokens == np.clip(lengths - row.bucket_start, 0, span).sum()
        expected = torch.cat(values[row.bucket_start])
        assert expected.numel() == row.tokens * width
        if row.tokens == 0:
            assert math.isnan(row.gate_mean)
            continue
        assert 0 <= row.gate_mean <= 1
        assert row.gate_mean == pytest.approx(expected.mean().item(), abs=1e-6)
        assert row.gate_std == pytest.approx(expected.std(correction=0).item(), abs=1e-6)


def _ddp_gates(rank: int, world_size: int, init_file: str, data_cache: str, out: str) -> None:
    """One gloo rank of ``test_gate_by_position_sums_over_ddp_ranks`` (no Ray needed)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        data = prepare_data(tiny_trial(data_cache).data)
        model = build_classifier(_spec(fusion="gate_vector"), data.vocab_size, data.num_classes, 1)
        spec = TrainSpec(eval_batch_size=16)
        gates = gate_by_position(
            model,
            data.test,
            spec=spec,
            device=CPU,
            pad_to=None,
            max_length=64,
            rank=rank,
            world_size=world_size,
        )
        gates.to_parquet(Path(out, f"rank{rank}.parquet"), index=False)
    finally:
        dist.destroy_process_group()


@pytest.mark.process
def test_gate_by_position_sums_over_ddp_ranks(tmp_path, data_cache, prepared):
    """Each rank scores its share of the documents; every rank returns the whole split's table."""
    args = (2, str(tmp_path / "init"), data_cache, str(tmp_path))
    torch.multiprocessing.spawn(_ddp_gates, args=args, nprocs=2)
    model = build_classifier(
        _spec(fusion="gate_vector"), prepared.vocab_size, prepared.num_classes, 1
    )
    single = gate_by_position(
        model,
        prepared.test,
        spec=TrainSpec(eval_batch_size=16),
        device=CPU,
        pad_to=None,
        max_length=64,
    )
    for rank in (0, 1):
        ranked = pd.read_parquet(tmp_path / f"rank{rank}.parquet")
        pd.testing.assert_frame_equal(ranked, single, check_exact=False, rtol=1e-9)


@pytest.mark.unit
def test_gate_by_position_refuses_an_ungated_operator(prepared):
    model = build_classifier(
        _spec(fusion="concat"), prepared.vocab_size, prepared.num_classes, seed=1
    )
    with pytest.raises(TypeError, match="only gated operators"):
        gate_by_position(
            model, prepared.test, spec=TrainSpec(), device=CPU, pad_to=None, max_length=64
        )


# ----------------------------------------------------------------------------- latency ratio


@pytest.mark.unit
def test_latency_baseline_is_checked_before_training():
    own = _spec(fusion="gate_cnn", fusion_kwargs={"kernel_size": 3})
    assert latency_baseline_spec(own, None) is None
    assert latency_baseline_spec(own, {"name": "gate_cnn", "kwargs": {"kernel_size": 3}}) == own
    assert latency_baseline_spec(own, ADD) == _spec(fusion="add")
    for bad, match in [
        ({"name": "nope", "kwargs": {}}, "nope"),
        ({"name": 3}, "must be"),
        ("add", "must be"),
        ({"name": "add", "kwargs": [1]}, "must be"),
        ({"name": "gate_cnn", "kwargs": {"kernel_size": 4}}, "kernel_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            latency_baseline_spec(own, bad)


@pytest.mark.unit
def test_latency_is_timed_for_each_model_and_the_baseline_itself_gives_one(data_cache, prepared):
    trial = tiny_trial(data_cache)
    model = build_classifier(trial.model, prepared.vocab_size, prepared.num_classes, trial.seed)
    other = build_classifier(_spec(fusion="add"), prepared.vocab_size, prepared.num_classes, 0)
    timings = measure_latency([model, other], prepared.test, trial.train, CPU, None)
    assert len(timings) == 2 and all(t > 0 for t in timings)
    own = latency_metrics(model, prepared, trial, CPU, None, trial.model)
    assert own[LATENCY_RATIO_METRIC] == 1.0 and own["latency_ms_per_sample"] > 0
    against_add = latency_metrics(
        model, prepared, trial, CPU, None, latency_baseline_spec(trial.model, ADD)
    )
    assert 0 < against_add[LATENCY_RATIO_METRIC] < math.inf
    assert LATENCY_RATIO_METRIC not in latency_metrics(model, prepared, trial, CPU, None, None)


# ----------------------------------------------------------------------------- whole trials


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory, data_cache):
    """A tiny gate_scalar trial timed against ``add``: (trial, final metrics, final checkpoint)."""
    out = tmp_path_factory.mktemp("gated_run")
    trial = tiny_trial(data_cache, epochs=2)
    final = run_local(trial, str(out), latency_baseline=ADD)
    return trial, final, _final_checkpoint(out)


@pytest.fixture(scope="module")
def add_run(tmp_path_factory, data_cache):
    """A tiny trial of the baseline operator itself: (trial, final metrics, final checkpoint)."""
    out = tmp_path_factory.mktemp("add_run")
    trial = tiny_trial(data_cache, epochs=1)
    trial.model.fusion = "add"
    final = run_local(trial, str(out), latency_baseline=ADD)
    return trial, final, _final_checkpoint(out)


@pytest.mark.unit
def test_a_gated_trial_keeps_its_gates_from_the_best_epoch(gated_run, prepared):
    trial, final, checkpoint = gated_run
    gates = pd.read_parquet(checkpoint / GATES_FILE)
    assert list(gates.columns) == list(GATE_COLUMNS)
    assert gates["bucket_start"].iloc[0] == 0
    assert gates["bucket_end"].iloc[-1] == trial.data.max_length
    assert (gates["bucket_start"].iloc[1:].to_numpy() == gates["bucket_end"].iloc[:-1]).all()
    assert gates["tokens"].sum() == prepared.test.input_lengths.sum()
    real = gates[gates["tokens"] > 0]
    assert real["gate_mean"].between(0, 1).all() and (real["gate_std"] >= 0).all()
    # the same table again from the best weights (the ones the test metrics come from)
    model = build_classifier(trial.model, prepared.vocab_size, prepared.num_classes, trial.seed)
    model.load_state_dict(load_checkpoint_dir(checkpoint)["best_model"])
    again = gate_by_position(
        model, prepared.test, spec=trial.train, device=CPU, pad_to=None, max_length=64
    )
    pd.testing.assert_frame_equal(gates, again)
    # only the final checkpoint carries the gates (the epochs' checkpoints do not)
    assert [p.parent for p in checkpoint.parent.glob(f"*/{GATES_FILE}")] == [checkpoint]


@pytest.mark.unit
def test_final_metrics_carry_the_initial_scales_and_the_latency_ratio(gated_run, prepared):
    trial, final, _ = gated_run
    fresh = build_classifier(trial.model, prepared.vocab_size, prepared.num_classes, trial.seed)
    assert {k: final[k] for k in INIT_METRICS} == initial_scales(fresh, trial.data.max_length)
    assert 0 < final[LATENCY_RATIO_METRIC] < math.inf


@pytest.mark.unit
def test_the_baseline_operator_has_ratio_one_and_no_gates(add_run):
    _, final, checkpoint = add_run
    assert final[LATENCY_RATIO_METRIC] == 1.0
    assert (checkpoint / PREDICTIONS_FILE).exists() and not (checkpoint / GATES_FILE).exists()


# ----------------------------------------------------------------------------- MLflow


AXIS = "axis.model.scale_embeddings"


def _tags(dataset: str, fusion: str, seed: int, **extra: str) -> dict[str, str]:
    return {
        ROLE_TAG: ROLE_TRIAL,
        "dataset": dataset,
        "fusion": fusion,
        "position": "sinusoidal",
        "attention_position": "none",
        "seed": str(seed),
        **extra,
    }


def _synthetic_gates(value: float) -> pd.DataFrame:
    edges = gate_bucket_edges(16)
    n = len(edges) - 1
    return pd.DataFrame(
        {
            "bucket_start": edges[:-1],
            "bucket_end": edges[1:],
            "tokens": [10] * (n - 1) + [0],  # the last bucket holds no tokens
            "gate_mean": [value] * (n - 1) + [math.nan],
            "gate_std": [0.1] * (n - 1) + [math.nan],
        }
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store, gated_run, add_run):
    """A sqlite MLflow store: the two real trials logged by the sweep's tracker, and synthetic
    gate_vector runs (seeds 0-2 on two datasets, one FAILED run that must be ignored)."""
    from fusion_ray.driver.tracking import Tracker

    root = tmp_path_factory.mktemp("gates_store")
    tracker = Tracker(mlflow_store(), "gates")
    client, ids = tracker.client, {}
    for key, (trial, final, checkpoint) in {"real": gated_run, "add": add_run}.items():
        tags = _tags("short", trial.model.fusion, trial.seed, **{AXIS: "true"})
        run_id = client.create_run(tracker.experiment_id, tags=tags).info.run_id
        tracker.log_final(run_id, final, final_metric_names(final))
        assert log_predictions(tracker, run_id, str(checkpoint))
        tracker.finish(run_id)
        ids[key] = run_id
    for dataset, axis in [("short", "true"), ("long", "false")]:
        for seed, status in [(0, "FINISHED"), (1, "FINISHED"), (2, "FINISHED"), (3, "FAILED")]:
            run_id = log_trial(
                client,
                tracker.experiment_id,
                tags=_tags(dataset, "gate_vector", seed, **{AXIS: axis}),
                params={},
                final_metrics={},
                status=status,
            )
            _synthetic_gates(0.2 + 0.1 * seed).to_parquet(root / GATES_FILE, index=False)
            client.log_artifact(run_id, str(root / GATES_FILE))
            ids[(dataset, seed)] = run_id
    return client, ids


@pytest.mark.unit
def test_the_tracker_logs_the_new_metrics_and_the_gates_of_gated_runs(store, gated_run):
    client, ids = store
    metrics = client.get_run(ids["real"]).data.metrics
    final = gated_run[1]
    for name in (*INIT_METRICS, LATENCY_RATIO_METRIC):
        assert metrics[name] == pytest.approx(final[name], rel=1e-12)
    artifacts = {a.path for a in client.list_artifacts(ids["real"])}
    assert artifacts == {PREDICTIONS_FILE, GATES_FILE}
    assert {a.path for a in client.list_artifacts(ids["add"])} == {PREDICTIONS_FILE}
    assert client.get_run(ids["add"]).data.metrics[LATENCY_RATIO_METRIC] == 1.0


@pytest.mark.unit
def test_gate_frame_reads_the_finished_gated_runs_with_their_tags(store, gated_run):
    client, ids = store
    frame = gate_frame(client, list(ids.values()))
    expected_runs = {ids["real"]} | {ids[(d, s)] for d in ("short", "long") for s in (0, 1, 2)}
    assert set(frame["run_id"]) == expected_runs  # no ungated, no FAILED run
    assert list(frame.columns) == [*ID_COLUMNS, AXIS, *GATE_COLUMNS]
    assert str(frame["seed"].dtype) == "Int64"
    real = frame[frame["run_id"] == ids["real"]]
    assert real[["dataset", "operator", AXIS]].drop_duplicates().values.tolist() == [
        ["short", "gate_scalar", "true"]
    ]
    logged = pd.read_parquet(gated_run[2] / GATES_FILE)
    pd.testing.assert_frame_equal(real[list(GATE_COLUMNS)].reset_index(drop=True), logged)
    assert gate_frame(client, [ids["add"]]).empty


@pytest.mark.unit
def test_plot_gates_draws_one_panel_per_dataset_and_axis_level(store, tmp_path):
    client, ids = store
    frame = gate_frame(client, list(ids.values()))
    fig = gate_figure(frame)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in axes) == [
        "long, model.scale_embeddings=false",
        "short, model.scale_embeddings=true",
    ]
    short = next(ax for ax in axes if ax.get_title().startswith("short"))
    lines = {line.get_label(): line for line in short.get_lines()}
    assert set(lines) >= {"gate_scalar (1)", "gate_vector (3)"}
    # mean over seeds 0.2, 0.3, 0.4 in every bucket but the one without tokens, left out
    vector = lines["gate_vector (3)"].get_ydata()
    assert len(vector) == len(gate_bucket_edges(16)) - 2 and np.allclose(vector, 0.3)
    assert any(line.get_ydata()[0] == 0.5 for line in short.get_lines())  # the 0.5 reference

    # panels in the order the frame first holds them (the report hands it in display order)
    first = [ax.get_title() for ax in axes]
    backwards = gate_figure(frame.iloc[::-1])
    assert [ax.get_title() for ax in backwards.axes if ax.get_visible()] == first[::-1]

    path = plot_gates(frame, tmp_path / "figs" / "gates.png")
    assert path == tmp_path / "figs" / "gates.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_gates(frame.iloc[0:0], tmp_path / "empty.png") is None
    assert not (tmp_path / "empty.png").exists()


@pytest.mark.unit
def test_gated_runs_are_chosen_by_their_tag_not_their_name(tmp_path):
    import pandas as pd

    from analysis.sections.study.gates import gated_runs
    from fusion_ray.config import load_sweep
    from fusion_ray.config.grid import expand
    from fusion_ray.schema import GATED_TAG
    from tests.conftest import tiny_sweep

    runs = pd.DataFrame(
        {
            "operator": ["my_gate", "add", "gate_scalar", "gate_cnn"],
            GATED_TAG: ["true", "false", None, "false"],
        }
    )
    # a plug-in's gate is found by its tag; an untagged (older) run by the built-in name; a tag
    # that says "false" wins over a name
    assert list(gated_runs(runs)["operator"]) == ["my_gate", "gate_scalar"]
    assert list(gated_runs(runs.drop(columns=[GATED_TAG]))["operator"]) == [
        "gate_scalar",
        "gate_cnn",
    ]
    cells = expand(load_sweep(tiny_sweep(tmp_path)))
    assert {c.fusion: c.tags("s", "sha")[GATED_TAG] for c in cells} == {
        "add": "false",
        "gate_scalar": "true",
    }
