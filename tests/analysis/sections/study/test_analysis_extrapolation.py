"""Train short, test long (``analysis.sections.study.extrapolation``) on a real (temporary, sqlite) MLflow store.

Experiment ``tstl`` is made by hand: dataset ``order``, sinusoidal positions, no attention-level
position, operators add (the baseline), concat and gate_scalar, seeds 0-5, training length
(``data.max_length``) 64, evaluated at L = 64, 128 and 256 on 100 test documents: 40 of 50
tokens, 20 of 100, 20 of 200 and 20 of 300. Correct counts per class of documents
(50 / 100 / 200 / 300 tokens), with s = 20 + seed:

    add, concat   L=64: s, 8, 6, 5      L=128: s, 10, 8, 6          L=256: s, 10, 9, 6
    gate_scalar   L=64: s+1, 8, 6, 5    L=128: s+1, 10+u, 8+v, 6    L=256: s+1, 10+u, 9+v+w, 6

with u, v, w per seed below. So gate_scalar's delta against add (pp, 100 documents) is 1 at 64,
1 + u + v at 128 and 1 + u + v + w at 256; its least-squares slope on log2(L) = 6, 7, 8 is
(delta at 256 - delta at 64) / 2 = (u + v + w) / 2 pp per doubling. concat is add's twin (every
delta 0). Each run logs its per-length metrics and ``test_predictions_by_length.parquet`` (the
first k documents of a class right, the others wrong). Experiment ``plain`` is a simulated sweep
without evaluation lengths.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.load import eval_length_metric, eval_length_metrics, load_experiment
from analysis.report import ReportOptions, build_report
from analysis.sections.study.extrapolation import (
    FIT,
    LONGER,
    analyse_extrapolation,
    length_counts,
    run_ladder,
    seed_scores,
    slope_weights,
)
from analysis.stats import holm, wilcoxon_signed_rank
from analysis.stats.pairing import pair_runs
from fusion_ray.schema import LENGTH_PREDICTIONS_FILE, ROLE_SWEEP, ROLE_TAG
from tests.synthetic import SyntheticSweep, flat_config, log_synthetic_sweep, log_trial

pytestmark = pytest.mark.unit

SEEDS = range(6)
LENGTHS = (64, 128, 256)
#: (document length, number of documents) of the test split, in document-id order.
CLASSES = ((50, 40), (100, 20), (200, 20), (300, 20))
U = (1, 2, 0, 3, 2, 2)
V = (1, 2, -1, 2, 1, 2)
W = (1, 1, 0, 2, 1, 2)
OPERATORS = ("add", "concat", "gate_scalar")
EXTRAPOLATION_FILES = (
    "extrapolation.csv",
    "extrapolation_accuracy.csv",
    "extrapolation_interaction.csv",
    "truncation_ladder.csv",
)


def _class_counts(op: str, seed: int) -> dict[int, tuple[int, int, int, int]]:
    """L -> correct documents of each class (module docstring)."""
    s = 20 + seed
    if op != "gate_scalar":
        return {64: (s, 8, 6, 5), 128: (s, 10, 8, 6), 256: (s, 10, 9, 6)}
    u, v, w = U[seed], V[seed], W[seed]
    return {
        64: (s + 1, 8, 6, 5),
        128: (s + 1, 10 + u, 8 + v, 6),
        256: (s + 1, 10 + u, 9 + v + w, 6),
    }


def _predictions(counts: dict[int, tuple[int, ...]]) -> pd.DataFrame:
    """The by-length predictions: per L, the first k documents of each class right."""
    length = np.concatenate([np.full(n, size) for size, n in CLASSES])
    label = np.arange(len(length)) % 4
    frames = []
    for L, per_class in counts.items():
        right = np.concatenate(
            [np.arange(n) < k for (_, n), k in zip(CLASSES, per_class, strict=True)]
        )
        frames.append(
            pd.DataFrame(
                {
                    "doc": np.arange(len(length)),
                    "length": length,
                    "label": label,
                    "eval_length": L,
                    "pred": np.where(right, label, (label + 1) % 4),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _log_tstl(client, root: Path) -> None:
    """Experiment ``tstl`` (module docstring)."""
    exp = client.create_experiment("tstl", artifact_location=str(root / "art_tstl"))
    parent = client.create_run(exp, tags={ROLE_TAG: ROLE_SWEEP, "sweep": "tstl"}).info.run_id
    for seed in SEEDS:
        for op in OPERATORS:
            params = flat_config("order", "short", "sinusoidal", "none", op, seed, max_length=64)
            params["data.eval_lengths"] = str(list(LENGTHS))
            counts = _class_counts(op, seed)
            final = {"test_correct": sum(counts[64]), "test_total": 100}
            final["test_acc"] = final["test_correct"] / 100
            for L, per_class in counts.items():
                final |= {
                    f"test_acc_at_{L}": sum(per_class) / 100,
                    f"test_correct_at_{L}": sum(per_class),
                    f"test_total_at_{L}": 100,
                }
            tags = {
                "cell_id": f"order-{op}-{seed}",
                "dataset": "order",
                "position": "sinusoidal",
                "attention_position": "none",
                "fusion": op,
                "seed": seed,
                "sweep": "tstl",
                "git_sha": "abc",
            }
            run_id = log_trial(
                client, exp, tags=tags, params=params, final_metrics=final, parent_run_id=parent
            )
            path = root / f"{op}-{seed}" / LENGTH_PREDICTIONS_FILE
            path.parent.mkdir()
            _predictions(counts).to_parquet(path, index=False)
            client.log_artifact(run_id, str(path))
    client.set_terminated(parent, "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("extrapolation")
    uri = mlflow_store()  # on the RAM disk
    _log_tstl(MlflowClient(uri), root)
    plain = SyntheticSweep(
        name="plain",
        datasets={"short": "short"},
        operators=("add", "gate_scalar"),
        seeds=(0, 1, 2),
        test_size=40,
    )
    log_synthetic_sweep(plain, uri, artifact_location=str(root / "art_plain"))
    return {"uri": uri, "root": root}


@pytest.fixture(scope="module")
def analysis(store):
    exp = load_experiment("tstl", store["uri"])
    pairing = pair_runs(exp.runs, "add")
    return analyse_extrapolation(pairing)


def _row(frame: pd.DataFrame, **where) -> pd.Series:
    for k, v in where.items():
        frame = frame[frame[k] == v]
    assert len(frame) == 1, where
    return frame.iloc[0]


# ----------------------------------------------------------------------------- loading


def test_per_length_metrics_parse_by_name():
    assert eval_length_metric("test_correct_at_128") == ("test_correct_at_", 128)
    assert eval_length_metric("test_acc_at_64") == ("test_acc_at_", 64)
    for name in ("test_acc_at_", "test_acc_at_0", "test_acc_at_x", "test_acc", "val_acc_at_64"):
        assert eval_length_metric(name) is None
    found = eval_length_metrics(["test_total_at_64", "x", "test_acc_at_128", "test_acc_at_64"])
    assert found == ["test_acc_at_64", "test_total_at_64", "test_acc_at_128"]


def test_per_length_metrics_become_columns_on_both_loading_paths(store):
    by_sql = load_experiment("tstl", store["uri"], method="sql").runs
    by_api = load_experiment("tstl", store["uri"], method="search_runs").runs
    names = [
        f"{p}{L}" for L in LENGTHS for p in ("test_acc_at_", "test_correct_at_", "test_total_at_")
    ]
    assert eval_length_metrics(by_sql.columns) == names
    times = ["start_time", "end_time"]
    pd.testing.assert_frame_equal(by_sql.drop(columns=times), by_api.drop(columns=times))
    run = by_sql[(by_sql["operator"] == "gate_scalar") & (by_sql["seed"] == 3)].iloc[0]
    assert run["test_correct_at_128"] == 23 + 1 + 10 + 3 + 8 + 2 + 6
    assert by_sql["test_total_at_256"].dtype == np.float64


def test_a_sweep_without_eval_lengths_has_no_such_column(store):
    runs = load_experiment("plain", store["uri"]).runs
    assert eval_length_metrics(runs.columns) == []
    assert analyse_extrapolation(pair_runs(runs, "add")) is None


def test_impossible_per_length_counts_are_left_out_with_a_warning():
    runs = pd.DataFrame(
        {
            "run_id": ["ok", "over", "half", "off"],
            "test_acc_at_64": [0.5, 1.2, math.nan, 0.9],
            "test_correct_at_64": [50, 120, 50.5, 50],
            "test_total_at_64": [100, 100, 100, 100],
        }
    )
    warns: list[str] = []
    counts = length_counts(runs, warns)
    assert counts.to_dict("records") == [
        {"run_id": "ok", "eval_length": 64, "correct": 50, "total": 100}
    ]
    assert len(warns) == 1 and "3 per-length count(s)" in warns[0]
    assert "over at 64" in warns[0] and "half at 64" in warns[0] and "off at 64" in warns[0]


# ----------------------------------------------------------------------------- curves, deltas


def test_curves_are_mean_and_sd_over_seeds(analysis):
    acc = analysis.accuracy
    assert analysis.lengths == list(LENGTHS) and analysis.train_lengths == [64]
    offsets = np.arange(6)  # s = 20 + seed: every count moves with the seed
    expected = {
        ("add", 64): 39 + offsets,
        ("add", 256): 45 + offsets,
        ("gate_scalar", 64): 40 + offsets,
        ("gate_scalar", 128): 44 + offsets + np.add(U, V) + 1,
        ("gate_scalar", 256): 45 + offsets + np.add(np.add(U, V), W) + 1,
    }
    for (op, L), values in expected.items():
        r = _row(acc, operator=op, eval_length=L)
        assert r["n_runs"] == 6 and r["train_length"] == 64
        assert r["acc_mean"] == pytest.approx(values.mean())
        assert r["acc_sd"] == pytest.approx(values.std(ddof=1))
        assert (r["acc_min"], r["acc_max"]) == (values.min(), values.max())


def test_per_length_paired_deltas_match_a_hand_computation(analysis):
    table = analysis.stats
    assert len(table) == 6  # 2 operators x 3 lengths: one Holm family
    hand = {
        64: np.ones(6, dtype=int),
        128: 1 + np.add(U, V),
        256: 1 + np.add(np.add(U, V), W),
    }
    for L, deltas in hand.items():
        r = _row(table, operator="gate_scalar", eval_length=L)
        assert r["mean_delta"] == pytest.approx(deltas.mean())  # 100 documents: 1 count = 1 pp
        assert r["wins"] == int((deltas > 0).sum()) and r["ties"] == int((deltas == 0).sum())
        assert r["p_wilcoxon"] == pytest.approx(wilcoxon_signed_rank(deltas).pvalue)
        assert r["beyond_training"] == (L > 64)
        twin = _row(table, operator="concat", eval_length=L)
        assert twin["mean_delta"] == 0 and twin["p_wilcoxon"] == 1.0
    # every delta at 64 is +1 (tied): the conditional exact p is 2/2^6
    assert _row(table, operator="gate_scalar", eval_length=64)["p_wilcoxon"] == pytest.approx(
        2 / 64
    )
    assert table["p_holm"].to_numpy() == pytest.approx(holm(table["p_wilcoxon"].to_numpy()))


def test_slope_interaction_matches_a_hand_computation(analysis):
    slopes = np.add(np.add(U, V), W) / 2.0  # (delta at 256 - delta at 64) / 2
    per_seed = analysis.seed_slopes
    got = per_seed[per_seed["operator"] == "gate_scalar"].sort_values("seed")["slope"]
    assert got.to_numpy() == pytest.approx(slopes)
    r = _row(analysis.slopes, operator="gate_scalar")
    exact = stats.wilcoxon(slopes, method="exact", alternative="two-sided").pvalue
    assert r["p_wilcoxon"] == pytest.approx(exact)
    assert r["wilcoxon_method"] == "exact"
    assert r["median_slope"] == pytest.approx(np.median(slopes))
    i, j = np.triu_indices(6)
    assert r["hl_estimate"] == pytest.approx(np.median((slopes[i] + slopes[j]) / 2))
    assert (r["wins"], r["losses"]) == (5, 1)
    twin = _row(analysis.slopes, operator="concat")
    assert twin["ties"] == 6 and twin["p_wilcoxon"] == 1.0
    # Holm over the two slope tests: the smaller p doubled
    assert r["p_holm"] == pytest.approx(min(1.0, 2 * exact))


def test_slopes_are_least_squares_for_any_lengths():
    lengths = [100, 300, 1000, 5000]
    rng = np.random.default_rng(0)
    deltas = rng.integers(-20, 20, size=(5, 4))
    u = slope_weights(lengths)
    slope = len(lengths) * seed_scores(deltas, lengths) / float(u @ u)
    for row, value in zip(deltas, slope, strict=True):
        assert value == pytest.approx(np.polyfit(np.log2(lengths), row, 1)[0], abs=1e-5)
    # equal deltas at every length: an exact zero, not round-off of either sign
    assert np.all(seed_scores(np.full((3, 4), 7), lengths) == 0.0)
    assert list(slope_weights([64, 128, 256])) == [-3.0, 0.0, 3.0]


# ----------------------------------------------------------------------------- the ladder


def test_ladder_of_a_hand_made_predictions_table():
    """Six documents of 10, 30, 30, 50, 80 and 90 tokens at L = 20, 40, 80."""
    length = np.array([10, 30, 30, 50, 80, 90])
    right = {  # per L, which documents are predicted right
        20: [1, 0, 0, 1, 0, 0],
        40: [1, 1, 0, 0, 1, 0],
        80: [1, 1, 1, 1, 1, 1],
    }
    frames = [
        pd.DataFrame(
            {
                "doc": np.arange(6),
                "length": length,
                "label": np.zeros(6, dtype=int),
                "eval_length": L,
                "pred": 1 - np.array(r),
            }
        )
        for L, r in right.items()
    ]
    preds = pd.concat(frames, ignore_index=True)
    rows = run_ladder(preds, {20: (2, 6), 40: (3, 6), 80: (6, 6)})
    got = {
        (r["l1"], r["l2"], r["documents"]): (r["n_docs"], r["correct_l1"], r["correct_l2"])
        for r in rows
    }
    assert got == {
        (20, 40, FIT): (2, 0, 1),  # documents 1, 2 (30 tokens)
        (20, 40, LONGER): (3, 1, 1),  # documents 3, 4, 5
        (40, 80, FIT): (2, 1, 2),  # documents 3, 4 (50 and 80 tokens)
        (40, 80, LONGER): (1, 0, 1),  # document 5 (90 tokens)
    }
    # predictions that disagree with the logged counts are refused
    assert run_ladder(preds, {40: (4, 6)}) is None


def test_ladder_gains_and_paired_deltas_match_a_hand_computation(analysis):
    ladder = analysis.ladder
    assert len(ladder) == 8  # 2 operators x 2 steps x 2 sets of documents
    u, v, w = (np.array(x) for x in (U, V, W))
    hand = {  # (l1, l2, documents): (documents, add's gain in pp, per-seed delta of gains in pp)
        (64, 128, FIT): (20, 10.0, 5.0 * u),
        (64, 128, LONGER): (40, 7.5, 2.5 * v),
        (128, 256, FIT): (20, 5.0, 5.0 * w),
        (128, 256, LONGER): (20, 0.0, np.zeros(6)),
    }
    for (l1, l2, docs), (n_docs, base_gain, delta) in hand.items():
        r = _row(ladder, operator="gate_scalar", l1=l1, l2=l2, documents=docs)
        assert r["n_docs"] == n_docs and r["n_pairs"] == 6
        assert r["baseline_gain_mean"] == pytest.approx(base_gain)
        assert r["gain_mean"] == pytest.approx(base_gain + delta.mean())
        assert r["mean_delta"] == pytest.approx(delta.mean())
        assert r["p_wilcoxon"] == pytest.approx(wilcoxon_signed_rank(delta).pvalue)
        assert r["beyond_training"]
    twin = ladder[ladder["operator"] == "concat"]
    assert (twin["mean_delta"] == 0).all() and (twin["p_wilcoxon"] == 1.0).all()
    assert ladder["p_holm"].to_numpy() == pytest.approx(holm(ladder["p_wilcoxon"].to_numpy()))


# ----------------------------------------------------------------------------- the report


def test_the_report_has_the_section_files_and_figure(store, tmp_path):
    result = build_report("tstl", store["uri"], ReportOptions(out=tmp_path, log_to_mlflow=False))
    text = (tmp_path / "report.md").read_text()
    for heading in (
        "## Train short, test long",
        "**Operator effect at each evaluation length.**",
        "**Does the operator effect change with evaluation length?**",
        "**Truncation ladder: accuracy gained from a longer truncation, on the same documents.**",
        "a gain on them comes from seeing more of each document",
    ):
        assert heading in text
    assert "| order | sinusoidal | none | gate_scalar | 128 (2× T) | 6 |" in text
    assert "figures/accuracy_by_eval_length.png" in text
    assert (tmp_path / "figures" / "accuracy_by_eval_length.pdf").is_file()
    for name in EXTRAPOLATION_FILES:
        assert (tmp_path / name).is_file(), name
    csv = pd.read_csv(tmp_path / "extrapolation_interaction.csv")
    assert set(csv["operator"]) == {"concat", "gate_scalar"}
    payload = json.loads((tmp_path / "stats.json").read_text())["extrapolation"]
    assert payload["eval_lengths"] == list(LENGTHS) and payload["train_lengths"] == [64]
    assert payload["by_length"]["m"] == 6 and payload["slopes"]["m"] == 2
    assert payload["truncation_ladder"]["m"] == 8
    assert "extrapolation:ladder" in result.tables


def test_without_lengths_the_ladder_is_not_read(store, tmp_path):
    options = ReportOptions(out=tmp_path, log_to_mlflow=False, lengths=False, make_figures=False)
    build_report("tstl", store["uri"], options)
    text = (tmp_path / "report.md").read_text()
    assert "**Operator effect at each evaluation length.**" in text
    assert "Not computed: --no-lengths" in text
    assert not (tmp_path / "truncation_ladder.csv").exists()
    assert (tmp_path / "extrapolation.csv").is_file()


def test_a_sweep_without_eval_lengths_gets_none_of_it(store, tmp_path):
    options = ReportOptions(out=tmp_path, log_to_mlflow=False, make_figures=False)
    result = build_report("plain", store["uri"], options)
    text = (tmp_path / "report.md").read_text()
    assert "Train short, test long" not in text and "evaluation length" not in text
    for name in EXTRAPOLATION_FILES:
        assert not (tmp_path / name).exists(), name
    assert "extrapolation" not in json.loads((tmp_path / "stats.json").read_text())
    assert not any(k.startswith("extrapolation") for k in result.tables)
    assert not list((tmp_path / "tables").glob("*extrapolation*"))


def test_a_grid_axis_splits_every_family_by_level(store):
    runs = load_experiment("tstl", store["uri"]).runs
    axis = "model.scale_embeddings"
    runs[axis] = np.where(runs["seed"] % 2 == 0, "true", "false")
    ex = analyse_extrapolation(pair_runs(runs, "add", axes=[axis]))
    for frame in (ex.accuracy, ex.stats, ex.slopes, ex.ladder):
        assert set(frame[axis]) == {"true", "false"}
    r = _row(ex.stats, operator="gate_scalar", eval_length=256, **{axis: "false"})
    odd = (1 + np.add(np.add(U, V), W))[1::2]  # seeds 1, 3, 5
    assert r["n_pairs"] == 3 and r["mean_delta"] == pytest.approx(odd.mean())
    assert len(ex.slopes) == 4  # 2 operators x 2 levels


def test_fire_evaluated_beyond_its_training_length_gets_a_note():
    """FIRE's MLP input psi(|i-j|) / psi(max(threshold, i)) exceeds 1 to the right of a query in
    this bidirectional encoder: the length section says how far, at T and at the longest L."""
    from types import SimpleNamespace

    import pandas as pd

    from analysis.sections.study.extrapolation import fire_input_ceiling, fire_note

    assert fire_input_ceiling(512 + 1) == pytest.approx(1.0)  # psi(512) / psi(512)
    assert round(fire_input_ceiling(1024), 2) == 1.17 and round(fire_input_ceiling(4096), 2) == 1.52
    runs = pd.DataFrame({"attention_position": ["rope", "fire"]})
    ctx = SimpleNamespace(pairing=SimpleNamespace(runs=runs))
    ex = SimpleNamespace(lengths=[1024, 2048, 4096], train_lengths=[1024])
    (note, _) = fire_note(ctx, ex)
    assert "1.17 at the training length 1024 and 1.52 at 4096" in note
    assert fire_note(SimpleNamespace(pairing=SimpleNamespace(runs=runs.iloc[:1])), ex) == []
    assert fire_note(ctx, SimpleNamespace(lengths=[512, 1024], train_lengths=[1024])) == []
