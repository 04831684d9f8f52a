"""Pairing checks of analysis.stats.pairing.pair_runs on hand-built run frames (no MLflow store)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.stats import compare
from analysis.stats.pairing import PairingError, pair_runs

pytestmark = pytest.mark.unit


def run(op, seed, *, dataset="arxiv", status="FINISHED", correct=60, lr="0.0003", **params):
    row = {
        "run_id": f"{dataset}-{op}-{seed}-{status}-{lr}-{correct}",
        "run_name": f"{op}-{seed}",
        "status": status,
        "artifact_uri": "/nowhere",
        # a cell id hashes the whole config: other params, another cell
        "cell_id": "/".join([dataset, op, str(seed), lr, *map(str, sorted(params.items()))]),
        "dataset": dataset,
        "position": "sinusoidal",
        "attention_position": "none",
        "operator": op,
        "seed": seed,
        "test_correct": correct,
        "test_total": 100,
        "test_acc": correct / 100,
        "params.seed": str(seed),
        "params.model.fusion": op.split("(")[0],
        "params.train.lr": lr,
        "params.model.d_model": "128",
    }
    if op.startswith("gate_cnn"):
        row["params.model.fusion_kwargs.kernel_size"] = "3"
    else:  # the sweep flattens an empty kwargs dict to the param "{}"
        row["params.model.fusion_kwargs"] = "{}"
    row.update({f"params.{k}": v for k, v in params.items()})
    return row


def frame(rows):
    df = pd.DataFrame(rows)
    df["seed"] = df["seed"].astype("Int64")
    df["test_correct"] = df["test_correct"].astype("Int64")
    df["test_total"] = df["test_total"].astype("Int64")
    return df


def test_complete_pairs_and_operator_params_may_differ():
    rows = [
        run(op, s, correct=60 + s + (3 if op != "add" else 0))
        for s in range(3)
        for op in ("add", "gate_cnn(kernel_size=3)")
    ]
    p = pair_runs(frame(rows))
    assert len(p.pairs) == 3 and p.incomplete.empty and p.duplicates.empty
    assert set(p.pairs["operator"]) == {"gate_cnn(kernel_size=3)"}
    assert (p.pairs["correct"] - p.pairs["baseline_correct"] == 3).all()
    stats = compare(p).table
    assert stats.loc[0, "wins"] == 3 and stats.loc[0, "mean_delta"] == pytest.approx(3.0)


def test_incomplete_blocks_are_named_with_the_status_of_what_is_missing():
    rows = [run(op, s) for s in range(4) for op in ("add", "concat", "gate_scalar")]
    rows = [r for r in rows if not (r["operator"] == "gate_scalar" and r["seed"] == 3)]
    rows = [r for r in rows if not (r["operator"] == "concat" and r["seed"] == 2)]
    rows.append(run("concat", 2, status="FAILED"))
    p = pair_runs(frame(rows))
    missing = {(int(r.seed), r.missing) for r in p.incomplete.itertuples()}
    assert missing == {(3, "gate_scalar (no run)"), (2, "concat (FAILED)")}
    counts = p.pairs.groupby("operator").size().to_dict()
    assert counts == {"concat": 3, "gate_scalar": 3}  # only complete pairs


def test_a_cell_finished_twice_counts_once_the_first_to_finish():
    """Two FINISHED runs of one cell id (two drivers ran it): the one that finished first is
    used, the other set aside and counted; no cell counts twice."""
    rows = [run(op, s) for s in range(3) for op in ("add", "gate_scalar")]
    late = run("gate_scalar", 1, correct=70)  # a second FINISHED run of the same cell
    rows.append(late)
    df = frame(rows)
    df["end_time"] = pd.to_datetime(range(len(df)), unit="s", utc=True)
    df.loc[df["run_id"] == late["run_id"], "end_time"] = pd.Timestamp(0, unit="s", tz="UTC")
    p = pair_runs(df)  # the late-logged row finished first here
    assert p.duplicates.empty and len(p.pairs) == 3
    (aside,) = p.set_aside.itertuples()
    assert aside.run_id != late["run_id"] and aside.kept_run_id == late["run_id"]
    assert int(p.pairs.loc[p.pairs["seed"] == 1, "correct"].iloc[0]) == 70
    df["end_time"] = pd.to_datetime(range(len(df)), unit="s", utc=True)  # now it finished last
    p = pair_runs(df)
    assert p.set_aside["run_id"].tolist() == [late["run_id"]]
    assert int(p.pairs.loc[p.pairs["seed"] == 1, "correct"].iloc[0]) == 60


def test_runs_of_one_cell_with_different_configs_are_reported_and_not_used():
    rows = [run(op, s) for s in range(3) for op in ("add", "gate_scalar")]
    other = run("gate_scalar", 1, correct=70)
    other["cell_id"] += "/other-settings"  # its config differs somewhere
    rows.append(other)
    p = pair_runs(frame(rows))
    assert len(p.duplicates) == 1 and p.set_aside.empty
    dup = p.duplicates.iloc[0]
    assert dup["operator"] == "gate_scalar" and dup["seed"] == 1
    assert len(dup["run_ids"].split(", ")) == 2
    assert sorted(p.pairs["seed"]) == [0, 2]
    assert "gate_scalar (duplicate runs)" in set(p.incomplete["missing"])


def test_param_mismatch_is_an_error_naming_the_param_and_runs():
    rows = [run(op, s) for s in range(3) for op in ("add", "gate_scalar")]
    rows[3] = run("gate_scalar", 1, lr="0.001")
    with pytest.raises(PairingError) as err:
        pair_runs(frame(rows))
    msg = str(err.value)
    assert "train.lr: '0.001' vs '0.0003'" in msg
    assert "seed=1" in msg and "gate_scalar" in msg and rows[3]["run_id"] in msg
    assert "--by" in msg and "--ignore-param" in msg


def test_execution_only_params_may_differ_inside_a_pair():
    """``train.cuda_graphs`` changes how a step is launched, not what it computes (and not the
    cell id): a pair whose two runs differ in it is still a pair; any other train param is not."""
    graphed = {"train.cuda_graphs": "True"}
    rows = [
        run(op, s, **({} if op == "add" else graphed)) for s in range(3) for op in ("add", "concat")
    ]
    assert len(pair_runs(frame(rows)).pairs) == 3
    rows[1] = run("concat", 0, **graphed, **{"train.pad_to_multiple": "64"})
    with pytest.raises(PairingError, match="train.pad_to_multiple"):
        pair_runs(frame(rows))


def test_missing_param_on_one_side_is_a_mismatch_and_all_problems_are_listed():
    rows = [run(op, s) for s in range(3) for op in ("add", "concat")]
    rows[1] = run("concat", 0, **{"data.max_length": "512"})
    rows[5] = run("concat", 2, **{"model.d_model": "64"})
    with pytest.raises(PairingError) as err:
        pair_runs(frame(rows))
    msg = str(err.value)
    assert "2 seed pair(s)" in msg
    assert "data.max_length: '512' vs <absent>" in msg
    assert "model.d_model: '64' vs '128'" in msg


def test_ignore_params_and_by():
    rows = [run(op, s, cache=f"/tmp/{s}{op}") for s in range(2) for op in ("add", "concat")]
    with pytest.raises(PairingError, match="cache"):
        pair_runs(frame(rows))
    assert len(pair_runs(frame(rows), ignore_params=["cache"]).pairs) == 2

    grid = [
        run(op, s, lr=lr)
        for lr in ("0.001", "0.0003")
        for s in range(2)
        for op in ("add", "concat")
    ]
    p = pair_runs(frame(grid), by=["train.lr"])
    assert len(p.pairs) == 4 and p.duplicates.empty
    assert "train.lr" in p.keys
    assert set(compare(p).table["train.lr"]) == {"0.001", "0.0003"}
    # an operator logged only at the other learning rate is not silently paired
    skewed = [r for r in grid if (r["operator"] == "add") == (r["params.train.lr"] == "0.0003")]
    with pytest.raises(PairingError, match="train.lr"):
        pair_runs(frame(skewed))


def test_duplicates_hint_at_a_varied_param():
    grid = [
        run(op, s, lr=lr)
        for lr in ("0.001", "0.0003")
        for s in range(2)
        for op in ("add", "concat")
    ]
    p = pair_runs(frame(grid))
    assert len(p.duplicates) == 4
    assert set(p.duplicates["differing_params"]) == {"train.lr"}


def test_runs_missing_metrics_are_excluded_and_groups_without_baseline_named():
    rows = [run(op, s) for s in range(2) for op in ("add", "concat")]
    rows.append(run("concat", 0, dataset="imdb"))
    bad = run("concat", 1)
    bad["test_correct"] = None
    bad["run_id"] = "broken"
    rows.append(bad)
    p = pair_runs(frame(rows))
    assert list(p.excluded["run_id"]) == ["broken"]
    assert "test_correct" in p.excluded.iloc[0]["missing"]
    assert list(p.no_baseline["dataset"]) == ["imdb"]


def test_unknown_baseline_is_noted():
    rows = [run(op, s) for s in range(2) for op in ("add", "concat")]
    p = pair_runs(frame(rows), baseline="gate_scalar")
    assert p.pairs.empty
    assert "baseline 'gate_scalar' has no FINISHED run" in p.notes[0]


def test_seed_with_only_unfinished_runs_is_an_incomplete_block():
    rows = [run(op, s) for s in range(2) for op in ("add", "concat")]
    rows += [run("add", 2, status="RUNNING"), run("concat", 2, status="RUNNING")]
    p = pair_runs(frame(rows))
    assert len(p.pairs) == 2
    (block,) = p.incomplete.itertuples()
    assert block.seed == 2 and block.missing == "add (RUNNING), concat (RUNNING)"
