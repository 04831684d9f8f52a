"""Values no sweep can mean, refused by ``python -m fusion_ray.sweep FILE --dry-run`` before
anything starts: one message naming the field, exit 2, no traceback. Numbers that are not
finite, out of any usable range, written as true/false, or too long to read; paths and tracking
URIs that are empty or name no store; a sqlite store that is no database (left as it was)."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from fusion_ray.hpo.cli import main as hpo_main
from fusion_ray.sweep import main as sweep_main
from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.unit

DIGITS = "9" * 5000
SECRET = "S3cret-pw"


def _refusal(capsys, argv: list[str], main=sweep_main) -> str:
    """The command's one message (exit 2, no traceback)."""
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("problem(s) in") == 1, err[-3000:]
    assert SECRET not in err, "a refused tracking URI's password was shown"
    return err


@pytest.mark.parametrize(
    "override, said",
    [
        ("train.lr=1.0e-320", "train.lr: must be >= 1e-08 (got 1e-320)"),
        ("train.epochs=true", "train.epochs: must be a whole number, not true or false"),
        ("model.d_model=false", "model.d_model: must be a whole number, not true or false"),
        (
            "datasets.short.data.source_kwargs.n_train=1000000000000",
            "n_train: must be an integer in 1..10,000,000, got 1000000000000",
        ),
        ("retries=1000000000", "retries: must be <= 100 (got 1000000000)"),
        (
            "datasets.short.data.split_seed=9223372036854775808",
            "data.split_seed: must be <= 9223372036854775807",
        ),
        (
            "datasets.short.data.max_train_samples=1000000000000",
            "data.max_train_samples: must be <= 1000000000",
        ),
        (
            "datasets.short.data.max_eval_samples=1000000000000",
            "data.max_eval_samples: must be <= 1000000000",
        ),
        ("retries=true", "retries: must be a whole number, not true or false"),
        ("resources.cpus_per_worker=.inf", "resources.cpus_per_worker: must be a finite number"),
        ("resources.cpus_per_worker=true", "resources.cpus_per_worker: must be a number, not"),
        ("resources.workers=true", "resources.workers: must be a whole number, not true or"),
        ("resources.max_concurrent_trials=2.0", "resources.max_concurrent_trials: Input should"),
        ("seeds=[9223372036854775808]", "seeds: each seed must be in 0..9223372036854775807"),
        (f"seeds=[{DIGITS}]", "seeds.0: must be a number a setting can use (got one written"),
        (f"train.epochs={DIGITS}", "train.epochs: must be a number a setting can use"),
        (f"train.epochs=0x{'f' * 5000}", "train.epochs: must be a number a setting can use"),
        ("storage_path=''", "storage_path: must not be empty"),
        ('storage_path="a\\0b"', "storage_path: must not contain control or invisible"),
        ('storage_path="runs\\u202e"', "storage_path: must not contain control or invisible"),
        ("tracking_uri=''", "tracking_uri: must not be empty"),
        ("tracking_uri=sqlite:///", "tracking_uri: a sqlite store needs a database file"),
        ("tracking_uri='sqlite:///:memory:'", "tracking_uri: a sqlite store needs a database file"),
        ("tracking_uri='javascript:alert(1)'", "tracking_uri: javascript: is not an MLflow store"),
        ("tracking_uri=file:///tmp/mlruns", "tracking_uri: MLflow's file store"),
        ("tracking_uri=mlruns", "tracking_uri: MLflow's file store"),
        ("tracking_uri=http://", "tracking_uri: names no server"),
        (f"tracking_uri=http://admin:{SECRET}@", "names no server; use sqlite:///PATH"),
        (f"tracking_uri='http://admin:{SECRET}#x@127.0.0.1:5000'", "percent-encode it (# as %23)"),
        ("tracking_uri=sqlite:////dev/null", "/dev/null is not a regular file (a device"),
        ("storage_path=s3://", "storage_path: s3:// names no bucket; write s3://BUCKET/PREFIX"),
        ("storage_path=gs:///prefix", "storage_path: gs:// names no bucket"),
        ("address=10.0.0.5", "address: '10.0.0.5' is no Ray cluster address: write auto"),
        ("address='head node:6379'", "address: 'head node:6379' is no Ray cluster address"),
        ("address=head:70000", "address: 'head:70000': the port must be a number from 1"),
        ('description="a\\x1b[31m"', "description: must not contain control or invisible"),
        ("extends=[tuned/shared.yaml]", "override extends=[tuned/shared.yaml]: extends: is read"),
        ("train.epochs=1:30", "train.epochs: Input should be a valid integer"),
    ],
)
def test_a_value_no_sweep_can_mean_is_refused_naming_its_field(
    tmp_path, capsys, monkeypatch, override, said
):
    monkeypatch.chdir(tmp_path)
    path = tiny_sweep(tmp_path)
    err = _refusal(capsys, [str(path), override])
    assert said in err, err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]  # no store, no results


def test_a_5000_digit_integer_in_the_file_is_refused_naming_its_field(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    path.write_text(path.read_text().replace("epochs: 2", f"epochs: {DIGITS}"))
    err = _refusal(capsys, [str(path)])
    assert "train.epochs: must be a number a setting can use (got one written with 5,000" in err


@pytest.mark.parametrize(
    "content, said",
    [
        (b"hello, not a database\n", "is not an SQLite database (it begins with b'hello, not a da"),
        (b"\x00" * 4096, "is not an SQLite database"),
    ],
)
def test_a_sqlite_store_that_is_no_database_is_said_to_be_one_and_left_alone(
    tmp_path, capsys, content, said
):
    db = tmp_path / "mlflow.db"
    db.write_bytes(content)
    path = tiny_sweep(tmp_path)
    err = _refusal(capsys, [str(path)])
    assert f"tracking_uri: {db} {said}" in err, err
    assert sweep_main([str(path)]) == 2  # a run is refused the same way, before Ray starts
    assert said in capsys.readouterr().err
    assert hashlib.sha256(db.read_bytes()).digest() == hashlib.sha256(content).digest()


def test_a_sqlite_store_that_is_a_folder_is_refused(tmp_path, capsys):
    (tmp_path / "mlflow.db").mkdir()
    err = _refusal(capsys, [str(tiny_sweep(tmp_path))])
    assert f"tracking_uri: {tmp_path / 'mlflow.db'} is a folder, not a database file" in err


def _nan_low(raw: dict) -> None:
    raw["tune"]["space"]["train.lr"]["low"] = float("nan")


@pytest.mark.parametrize(
    "edit, said",
    [
        ("tune.num_samples=true", "tune.num_samples: must be a whole number, not true or false"),
        ("tune.num_samples=1000000000", "tune.num_samples: must be <= 100000"),
        ("tune.seed=9223372036854775808", "tune.seed: must be <= 9223372036854775807"),
        (f"tune.seed={DIGITS}", "tune.seed: must be a number a setting can use"),
        ("tune.asha.grace_period=true", "tune.asha.grace_period: must be a whole number"),
        (_nan_low, "tune.space.train.lr.low: must be a finite number"),
        ("tracking_uri=''", "tracking_uri: must not be empty"),
        (f"tracking_uri=https://admin:{SECRET}@", "(got 'https://admin:***@')"),
    ],
)
def test_an_hpo_file_is_held_to_the_same_ranges(tmp_path, capsys, monkeypatch, edit, said):
    """The HPO file's own counts, seed and search bounds: strict whole numbers and finite
    numbers in a usable range."""
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((ROOT / "sweeps" / "hpo" / "quick.yaml").read_text())
    raw.update(sweeps=[str(ROOT / "sweeps" / "quickstart.yaml")], output="tuned.yaml")
    overrides = [edit] if isinstance(edit, str) else []
    if callable(edit):
        edit(raw)
    path = tmp_path / "hpo.yaml"
    path.write_text(yaml.safe_dump(raw))
    err = _refusal(capsys, [str(path), *overrides], hpo_main)
    assert said in err, err[-3000:]


@pytest.mark.parametrize(
    "address", ["auto", "local", "10.0.0.5:6379", "head-1.lab:6379", "[::1]:6379"]
)
def test_a_ray_address_is_accepted_as_ray_takes_it(address):
    from fusion_ray.checks import address_problem

    assert address_problem(address) is None


def test_a_sweep_path_that_is_no_file_is_said_to_be_what_it_is(tmp_path, capsys):
    """A folder, a FIFO, a loop of links, a name too long: one message saying which, exit 2
    (not "does not exist", not a traceback)."""
    import os

    (tmp_path / "folder.yaml").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    cases = [
        ("folder.yaml", "is a folder, not a sweep file"),
        ("fifo.yaml", "is not a regular file (a FIFO, socket or device)"),
        ("a.yaml", "cannot be read: a loop of symbolic links"),
        ("x" * 100_000 + ".yaml", "cannot be read: a name too long"),
    ]
    for name, said in cases:
        assert sweep_main([str(tmp_path / name), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err[-2000:]
        assert max(len(line) for line in err.splitlines()) < 1000, err[:300]


def test_a_fragment_that_extends_another_is_refused_naming_both(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    (tmp_path / "inner.yaml").write_text("defaults: {train: {lr: 0.002}}\n")
    (tmp_path / "outer.yaml").write_text("extends: [inner.yaml]\n")
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "extends": ["outer.yaml"]}, sort_keys=False))
    err = _refusal(capsys, [str(path)])
    assert "extends: 'outer.yaml' has an extends: of its own, which would not be read" in err
