"""Reports the analysis refuses, with the reason: nothing to compare (exit 3) and impossible
logged metrics (exit 2). Experiments are logged once for the module into a sqlite store."""

from __future__ import annotations

import os
import socket
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analysis.load import ImpossibleMetricsError, check_metrics, metric_problems
from analysis.load import store as store_module
from analysis.report import ReportOptions, build_report, main
from analysis.stats.pairing import NothingToCompareError
from fusion_ray.store_errors import HTTP_RETRIES_ENV, HTTP_TIMEOUT_ENV
from tests.synthetic import SyntheticSweep, log_synthetic_sweep, log_trial, simulate_trial

pytestmark = pytest.mark.unit


def sweep(name, operators=("add", "concat"), seeds=(0, 1, 2), **kw):
    return SyntheticSweep(
        name=name,
        datasets={"d": "short"},
        operators=operators,
        seeds=seeds,
        test_size=40,
        predictions=False,
        **kw,
    )


@pytest.fixture(scope="module")
def store(mlflow_store):
    from mlflow import MlflowClient

    uri = mlflow_store()  # on the RAM disk
    log_synthetic_sweep(sweep("one_operator", operators=("add",)), uri)
    log_synthetic_sweep(sweep("two_operators"), uri)
    # add ran seeds 0 and 1, concat seeds 2 and 3: no seed in common
    log_synthetic_sweep(sweep("disjoint", ("add",), (0, 1), cells_artifact=False), uri)
    log_synthetic_sweep(sweep("disjoint", ("concat",), (2, 3), with_parent=False), uri)
    # the sweep logged twice with another setting under the same name: every cell has two
    # FINISHED runs of different configs, and which one is the cell cannot be told
    log_synthetic_sweep(sweep("duplicated", cells_artifact=False), uri)
    changed = sweep("duplicated", with_parent=False, cell_salt="epochs=5")
    log_synthetic_sweep(replace(changed, extra_params={"train.epochs": "5"}), uri)
    # the same sweep logged twice (two drivers): each cell's first FINISHED run counts
    log_synthetic_sweep(sweep("twice", cells_artifact=False), uri)
    log_synthetic_sweep(sweep("twice", with_parent=False), uri)
    impossible = sweep("impossible")
    ids = log_synthetic_sweep(impossible, uri, skip=[("d", "concat", 2)])
    bad = simulate_trial(impossible, "d", "short", "sinusoidal", "none", "concat", 2)
    bad_id = log_trial(
        MlflowClient(uri),
        ids["experiment_id"],
        tags=bad.tags,
        params=bad.params,
        final_metrics={"test_correct": 150.5, "test_total": 100, "test_acc": 1.505},
        parent_run_id=ids["parent_run_id"],
    )
    return {"uri": uri, "bad_run": bad_id, "bad_cell": bad.tags["cell_id"]}


def test_a_sweep_logged_twice_counts_each_cell_once(store, tmp_path):
    result = build_report("twice", store["uri"], ReportOptions(baseline="add", out=tmp_path))
    assert len(result.pairing.pairs) == 3 and len(result.pairing.set_aside) == 6
    assert result.pairing.duplicates.empty
    assert any(w.startswith("6 FINISHED run(s) set aside") for w in result.warnings)


@pytest.mark.parametrize(
    "experiment, baseline, reason",
    [
        (
            "one_operator",
            "add",
            "only one operator, 'add', has FINISHED runs: no other to compare with it",
        ),
        (
            "two_operators",
            "gate_mlp",
            "the baseline operator 'gate_mlp' has no FINISHED run; operators present: add, concat",
        ),
        (
            "disjoint",
            "add",
            "no seed in common between the baseline 'add' and any other operator within any "
            "group (dataset x position x attention_position)",
        ),
        (
            "duplicated",
            "add",
            "every cell's runs are duplicated: each of the 6 cell(s) with FINISHED runs has "
            "several FINISHED runs, so none is used",
        ),
    ],
)
def test_nothing_to_compare_names_the_reason(store, tmp_path, capsys, experiment, baseline, reason):
    with pytest.raises(NothingToCompareError) as err:
        build_report(experiment, store["uri"], ReportOptions(baseline=baseline, out=tmp_path))
    assert f"nothing to compare in experiment {experiment!r}: {reason}" in str(err.value)
    assert not (tmp_path / "report.md").exists()
    args = ["--experiment", experiment, "--tracking-uri", store["uri"], "--baseline", baseline]
    assert main([*args, "--out", str(tmp_path)]) == 3
    printed = capsys.readouterr()
    assert reason in printed.err and printed.out == ""


def test_no_common_seed_lists_each_operators_seeds(store, tmp_path):
    with pytest.raises(NothingToCompareError) as err:
        build_report("disjoint", store["uri"], ReportOptions(out=tmp_path))
    assert (
        "dataset=d, position=sinusoidal, attention_position=none: add: seeds 0, 1; "
        "concat: seeds 2, 3" in str(err.value)
    )


def test_an_operator_filter_that_leaves_only_the_baseline_is_refused(store, tmp_path):
    options = ReportOptions(out=tmp_path, only_operators=("add",))
    with pytest.raises(NothingToCompareError, match="only one operator, 'add'") as err:
        build_report("two_operators", store["uri"], options)
    assert "Only the runs of operators add were selected" in str(err.value)


def test_an_impossible_run_is_rejected_by_name(store, tmp_path, capsys):
    with pytest.raises(ImpossibleMetricsError) as err:
        build_report("impossible", store["uri"], ReportOptions(out=tmp_path))
    msg = str(err.value)
    assert f"run {store['bad_run']} (cell_id {store['bad_cell']}, dataset=d, " in msg
    assert "fusion=concat, seed=2): test_correct 150.5 is not a whole number >= 0" in msg
    assert "test_correct 150.5 > test_total 100" in msg and "test_acc 1.505 is outside" in msg
    assert msg.startswith("1 FINISHED trial run(s) of experiment 'impossible'")
    assert "inconsistent" in msg and "delete" in msg.lower()
    args = ["--experiment", "impossible", "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    assert main(args) == 2
    assert store["bad_run"] in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


def runs(*rows):
    """A frame of FINISHED runs from (test_correct, test_total, test_acc[, status]) rows."""
    records = []
    for i, (correct, total, acc, *status) in enumerate(rows):
        records.append(
            {
                "run_id": f"r{i}",
                "cell_id": f"c{i}",
                "status": status[0] if status else "FINISHED",
                "dataset": "d",
                "operator": "add",
                "seed": i,
                "test_correct": correct,
                "test_total": total,
                "test_acc": acc,
            }
        )
    return pd.DataFrame(records)


@pytest.mark.parametrize(
    "correct, total, acc, problem",
    [
        (-1, 100, -0.01, "test_correct -1 is not a whole number >= 0"),
        (50, 100.5, 0.5, "test_total 100.5 is not a whole number >= 0"),
        (50, -100, 0.5, "test_total -100 is not a whole number >= 0"),
        (0, 0, 0.0, "test_total is 0"),
        (101, 100, 1.01, "test_correct 101 > test_total 100"),
        (50, 100, 1.5, "test_acc 1.5 is outside [0, 1]"),
        (50, 100, -0.5, "test_acc -0.5 is outside [0, 1]"),
        (50, 100, 0.6, "test_acc 0.6 disagrees with test_correct / test_total = 0.5"),
    ],
)
def test_each_impossible_value_is_named(correct, total, acc, problem):
    frame = runs((50, 100, 0.5), (correct, total, acc))
    problems = metric_problems(frame)
    assert list(problems) == [1] and problem in problems[1]
    with pytest.raises(ImpossibleMetricsError, match="run r1 \\(cell_id c1, dataset=d"):
        check_metrics(frame, "x")


def test_only_the_impossible_finished_run_is_named():
    frame = runs(
        (50, 100, 0.5 + 5e-7),  # round-off of a logged float
        (0, 100, 0.0),
        (100, 100, 1.0),
        (np.nan, 100, np.nan),  # missing: pairing lists it as excluded
        (150.5, 100, 1.505, "FAILED"),  # never analysed
        (7, 5, 1.4),
    )
    assert list(metric_problems(frame)) == [5]
    with pytest.raises(ImpossibleMetricsError) as err:
        check_metrics(frame, "x")
    assert "run r5 " in str(err.value) and "run r4 " not in str(err.value)
    check_metrics(frame.iloc[:5], "x")  # the rest passes


def test_a_mistyped_sqlite_path_is_an_error_and_creates_no_database(tmp_path, capsys):
    from analysis.report import main as report_main

    missing = tmp_path / "typo.db"
    code = report_main(["--experiment", "x", "--tracking-uri", f"sqlite:///{missing}", "--no-log"])
    assert code == 2
    assert f"no MLflow store at {missing}" in capsys.readouterr().err
    assert not missing.exists()


# ----------------------------------------------------------------------------- the store itself


@pytest.fixture
def refusing_server():
    """An HTTP server on loopback that answers every request 401, as MLflow's basic-auth app
    answers a client without valid credentials."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            body = b"You are not authenticated."
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_DELETE = _refuse

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_server_that_refuses_the_credentials_is_one_message_and_exit_8(
    refusing_server, tmp_path, capsys
):
    args = ["--experiment", "x", "--tracking-uri", refusing_server, "--out", str(tmp_path)]
    assert main(args) == 8
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: the MLflow server at {refusing_server} refused the report's credentials "
        "(401 unauthenticated): set MLFLOW_TRACKING_USERNAME"
    )
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("answer", ["refused", "silent"])
def test_a_server_that_is_down_is_one_message_after_one_try_and_exit_10(
    answer, tmp_path, capsys, monkeypatch
):
    """A port nothing listens on (the connection is refused) and a server that takes the
    connection but never answers: the report sends its first request once and waits
    ``FIRST_CONTACT_S`` (1 s here) for it, where MLflow's client would retry for minutes; then
    one message, exit 10, nothing written, and MLflow's own settings as they were."""
    monkeypatch.setattr(store_module, "FIRST_CONTACT_S", 1)
    monkeypatch.delenv(HTTP_RETRIES_ENV, raising=False)
    monkeypatch.setenv(HTTP_TIMEOUT_ENV, "77")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if answer == "silent":
            listener.listen(8)  # the kernel takes the connection; nobody reads or answers
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        args = ["--experiment", "x", "--tracking-uri", uri, "--out", str(tmp_path / "r")]
        assert main(args) == 10
    err = capsys.readouterr().err
    assert err == (
        f"error: no MLflow server answers at {uri} (the report's first request waits 1 s): "
        "start it or fix --tracking-uri, then run the report again\n"
    )
    assert not (tmp_path / "r").exists()
    assert HTTP_RETRIES_ENV not in os.environ and os.environ[HTTP_TIMEOUT_ENV] == "77"


@pytest.mark.parametrize(
    "uri, said",
    [
        ("javascript:alert(1)", "the tracking URI javascript:alert(1) names no MLflow store"),
        ("file:///nowhere/mlruns", "the tracking URI file:///nowhere/mlruns names no MLflow store"),
    ],
)
def test_a_uri_that_names_no_store_is_one_message(tmp_path, capsys, uri, said):
    assert main(["--experiment", "x", "--tracking-uri", uri, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1


def test_a_sqlite_file_that_is_no_database_is_said_to_be_one_and_left_alone(tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"not a database at all\n")
    args = ["--experiment", "x", "--tracking-uri", f"sqlite:///{db}", "--out", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"error: {db} is not an SQLite database (it begins with b'not a database a" in err
    assert "Traceback" not in err and db.read_bytes() == b"not a database at all\n"


def test_a_report_folder_that_cannot_be_written_is_one_message(store, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "report"
    args = ["--experiment", "two_operators", "--tracking-uri", store["uri"], "--no-log"]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error: the report could not be written (Not a directory" in err, err[-2000:]
    assert "Traceback" not in err
