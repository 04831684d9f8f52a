"""The sweep file: every shipped file validates; bad files fail with every problem, before Ray starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import yaml

from fusion_ray.config import Resources, SweepFileError, load_sweep, resources_for
from fusion_ray.config.grid import expand
from fusion_ray.study.trial import TrialJob
from fusion_ray.sweep import main as sweep_main
from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.unit

SWEEP_FILES = sorted(p for p in (ROOT / "sweeps").glob("*.yaml") if not p.name.startswith("_"))
FRAGMENTS = sorted((ROOT / "sweeps").glob("_*.yaml"))


def test_there_are_sweep_files():
    names = {p.name for p in SWEEP_FILES}
    assert {"quickstart.yaml", "full_grid.yaml"} <= names


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_every_shipped_sweep_file_validates_and_expands(path: Path, monkeypatch):
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray")
    spec = load_sweep(path)
    cells = expand(spec)
    assert cells, f"{path.name} expands to no cells"
    assert len({c.cell_id for c in cells}) == len(cells), "cell ids must be unique"
    # seed-major: all cells of a seed come before any cell of the next seed
    seeds = [c.seed for c in cells]
    assert seeds == sorted(seeds, key=spec.seeds.index)


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_every_shipped_sweep_file_has_a_dry_run(path: Path, tmp_path, monkeypatch, capsys):
    """Planned for a cluster that is not there (``--address``), every file dry-runs, saying its
    placement could not be checked; run here, a file
    whose trials this machine cannot hold (GPUs) still gets its plan, with a warning that a real
    run here would be refused and the fix, which works (its GPU trials rehearsed on CPUs)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    assert sweep_main([str(path), "--dry-run", "--address", nowhere]) == 0
    out = capsys.readouterr().out
    n_cells = len(expand(load_sweep(path)))
    assert f"{n_cells} cells (0 already FINISHED" in out
    assert out.count(" pending ") == n_cells
    assert f"placement: WARNING: not checked: no Ray head answers at {nowhere}" in out
    spec = load_sweep(path)
    wants_gpus = any(resources_for(spec, d).use_gpu for d in spec.datasets)
    monkeypatch.delenv("FUSION_RAY_CPU_FALLBACK", raising=False)
    here = sweep_main([str(path), "--dry-run"])
    captured = capsys.readouterr()
    assert here == 0 and out.count(" pending ") == captured.out.count(" pending ")
    if wants_gpus and not torch.cuda.is_available():
        assert "placement: WARNING: this machine cannot run these trials" in captured.out
        assert "FUSION_RAY_CPU_FALLBACK=1 for the whole sweep" in captured.out
        monkeypatch.setenv("FUSION_RAY_CPU_FALLBACK", "1")
        assert sweep_main([str(path), "--dry-run"]) == 0
        assert (
            "every trial fits this machine with its GPU trials on CPUs" in capsys.readouterr().out
        )
    else:
        assert "placement: every trial fits this machine" in captured.out


def test_every_fragment_is_used_by_a_sweep():
    used = set()
    for path in SWEEP_FILES:
        used |= set(yaml.safe_load(path.read_text()).get("extends", []))
    assert {p.name for p in FRAGMENTS} <= used


def _write(tmp_path: Path, mutate) -> Path:
    path = tiny_sweep(tmp_path)
    raw = yaml.safe_load(path.read_text())
    mutate(raw)
    path.write_text(yaml.safe_dump(raw))
    return path


def _problems(path: Path) -> str:
    with pytest.raises(SweepFileError) as info:
        load_sweep(path)
    return str(info.value)


def test_unknown_fusion_names_the_allowed_ones(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r["grid"].update(fusions=["add", "gated_sum"])))
    assert "grid.fusions[1]" in msg and "gated_sum" in msg
    assert "gate_scalar" in msg and "concat" in msg  # the allowed values


def test_unknown_fusion_option_is_an_error(tmp_path):
    msg = _problems(
        _write(tmp_path, lambda r: r["grid"].update(fusions=[{"name": "gate_cnn", "kernel_sz": 3}]))
    )
    assert "kernel_sz" in msg and "kernel_size" in msg


def test_unknown_key_is_an_error(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r["defaults"]["train"].update(learning_rate=0.1)))
    assert "learning_rate" in msg and "unknown key" in msg


def test_empty_seeds(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(seeds=[])))
    assert "seeds" in msg


def test_duplicate_seeds(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(seeds=[0, 1, 1])))
    assert "duplicate seeds [1]" in msg


def test_negative_values(tmp_path):
    def mutate(r):
        r["defaults"]["train"]["lr"] = -0.1
        r["resources"]["workers"] = -2
        r["seeds"] = [-1, 0]

    msg = _problems(_write(tmp_path, mutate))
    assert "train.lr" in msg and "resources.workers" in msg and "seeds" in msg


def test_missing_dataset(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r["grid"].update(datasets=["short", "arxiv"])))
    assert "'arxiv' has no entry under datasets" in msg


def test_all_problems_are_reported_at_once(tmp_path):
    def mutate(r):
        r["grid"]["fusions"] = ["add", "nope"]
        r["grid"]["datasets"] = ["short", "missing"]
        r["defaults"]["model"]["d_model"] = 15  # not divisible by n_heads=2

    msg = _problems(_write(tmp_path, mutate))
    assert "nope" in msg and "missing" in msg and "d_model" in msg
    assert msg.count(str(tmp_path)) >= 3  # every line names the file


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sweep(tmp_path / "nope.yaml")


def test_cli_rejects_bad_file_before_starting_ray(tmp_path, capsys, monkeypatch):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for an invalid sweep file")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    path = _write(tmp_path, lambda r: r["grid"].update(fusions=["bogus"]))
    assert sweep_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "allowed" in err


def test_values_that_would_fail_only_after_training_are_rejected(tmp_path):
    def mutate(r):
        r["defaults"]["train"]["grad_clip"] = -1.0  # would flip gradients
        r["defaults"]["train"]["latency_batch_size"] = 0  # would fail after training
        r["defaults"]["train"]["pad_to_multiple"] = 0  # would fail at the first batch
        r["defaults"]["model"]["fusion"] = "concat"  # silently overridden by the grid
        r["baseline"] = "gate_scaler"  # a typo would compare nothing

    msg = _problems(_write(tmp_path, mutate))
    assert "grad_clip" in msg and "latency_batch_size" in msg and "pad_to_multiple" in msg
    assert "defaults.model.fusion" in msg and "gate_scaler" in msg


def test_a_sweep_that_expands_to_nothing_is_an_error(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(exclude=[{"datasets": ["short"]}])))
    assert "expands to no cells" in msg


def test_extends_fragment_and_env_expansion(tmp_path, monkeypatch):
    (tmp_path / "tuned.yaml").write_text(
        yaml.safe_dump({"defaults": {"train": {"lr": 0.0042, "batch_size": 16}}})
    )
    monkeypatch.setenv("MY_STORE", str(tmp_path / "store"))

    def mutate(r):
        r.update(extends=["tuned.yaml"], storage_path="${MY_STORE}/runs")
        del r["defaults"]["train"]["lr"]  # taken from the fragment
        r["defaults"]["train"]["batch_size"] = 8  # the file itself wins over a fragment

    spec = load_sweep(_write(tmp_path, mutate))
    assert spec.storage_path == f"{tmp_path}/store/runs"
    assert all(c.trial.train.lr == 0.0042 and c.trial.train.batch_size == 8 for c in expand(spec))


def test_include_and_exclude_rules(tmp_path):
    def mutate(r):
        r["grid"]["fusions"] = ["add", "concat"]
        r["include"] = [{"fusions": [{"name": "gate_cnn", "kernel_size": 5}]}]
        r["exclude"] = [{"fusions": ["concat"], "datasets": ["short"]}]

    cells = expand(load_sweep(_write(tmp_path, mutate)))
    fusions = sorted({c.fusion for c in cells})
    assert fusions == ["add", "gate_cnn(kernel_size=5)"]
    assert all(
        c.trial.model.fusion_kwargs == {"kernel_size": 5}
        for c in cells
        if c.fusion.startswith("gate_cnn")
    )


def test_cell_ids_are_stable_and_depend_on_the_config(tmp_path):
    path = tiny_sweep(tmp_path)
    first = {(c.fusion, c.seed): c.cell_id for c in expand(load_sweep(path))}
    again = {(c.fusion, c.seed): c.cell_id for c in expand(load_sweep(path))}
    assert first == again
    changed = _write(tmp_path, lambda r: r["defaults"]["train"].update(lr=0.002))
    other = {(c.fusion, c.seed): c.cell_id for c in expand(load_sweep(changed))}
    assert set(first.values()).isdisjoint(other.values())


def test_study_cell_ids_never_change():
    """Finished cells are found by id: an id that changes silently re-runs a whole sweep. These
    are Table 1's first and last ids as its presets stand; a setting added to the schema later
    stays out of the id while it holds its default, and the confound sweep's scaled arm is
    Table 1 (same ids), so a lab that ran Table 1 runs only the unscaled arm."""
    cells = expand(load_sweep(ROOT / "sweeps" / "table1.yaml"))
    assert (cells[0].cell_id, cells[-1].cell_id) == ("055c68517d058a49", "b3fc1fd1fad49c5f")
    assert len({c.cell_id for c in cells}) == 90
    confound = expand(load_sweep(ROOT / "sweeps" / "confound.yaml"))
    scaled = {c.cell_id for c in confound if dict(c.axes)["model.scale_embeddings"] == "true"}
    assert scaled == {c.cell_id for c in cells}


def test_a_setting_at_its_default_stays_out_of_the_id_but_counts_when_set(tmp_path):
    base = {c.seed: c.cell_id for c in expand(load_sweep(tiny_sweep(tmp_path)))}
    default = _write(tmp_path, lambda r: r["defaults"]["train"].update(pad_to_multiple=1))
    assert {c.seed: c.cell_id for c in expand(load_sweep(default))} == base
    set_it = _write(tmp_path, lambda r: r["defaults"]["train"].update(pad_to_multiple=8))
    assert set({c.seed: c.cell_id for c in expand(load_sweep(set_it))}.values()).isdisjoint(
        base.values()
    )


def test_a_gpu_trial_on_a_node_without_cuda_fails_clearly(tmp_path, monkeypatch):
    import torch

    from fusion_ray.study.trial import run_cell

    if torch.cuda.is_available():
        pytest.skip("this node has CUDA")
    monkeypatch.delenv("FUSION_RAY_CPU_FALLBACK", raising=False)
    cell = expand(load_sweep(tiny_sweep(tmp_path)))[0]
    job = TrialJob(
        cell_id=cell.cell_id,
        sweep="tiny",
        tune_run="tiny-run",
        trial=cell.trial,
        resources=Resources(workers=1, use_gpu=True, cpus_per_worker=1, gpus_per_worker=1),
        train_storage=str(tmp_path / "train"),
    )
    with pytest.raises(RuntimeError, match="no CUDA: install a CUDA build of torch"):
        run_cell(job)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"name: x\nseeds: [0]\na: &a [1, *a]\n", "contains it"),
        (b"name: caf\xe9\n", "not UTF-8"),
        (
            b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + b"".join(
                b"%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n"
                % ((98 + i, 98 + i) + (97 + i,) * 10)
                for i in range(8)
            ),
            "expands to more than",
        ),
        (b"name: x\n" + b"#" * (1 << 20) + b"\n", "at most"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    ],
    ids=["self-alias", "non-utf8", "alias-bomb", "too-large", "too-deep"],
)
def test_hostile_files_get_one_line_errors(tmp_path, content, message):
    """Each is refused with one line naming what is wrong: the file's size is checked before it
    is parsed, and values are counted as aliases expand, up to a bound (no timing asserted: a
    loader without these bounds would not finish)."""
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    with pytest.raises(SweepFileError, match=message):
        load_sweep(path)


@pytest.mark.parametrize("name", ["..", ".hidden", "-x", "a/b", "x" * 101])
def test_sweep_names_that_would_escape_or_hide_folders_are_refused(tmp_path, name):
    msg = _problems(_write(tmp_path, lambda r: r.update(name=name)))
    assert "name" in msg


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_numbers_are_caught_before_training(tmp_path, value):
    path = tiny_sweep(tmp_path)
    path.write_text(path.read_text().replace("lr: 0.001", f"lr: {value}"))
    assert "train.lr: must be a finite number" in _problems(path)


def test_option_values_of_grid_entries_are_checked_in_the_model_they_build(tmp_path):
    msg = _problems(
        _write(
            tmp_path,
            lambda r: r["grid"].update(fusions=["add", {"name": "gate_cnn", "kernel_size": 4}]),
        )
    )
    assert "gate_cnn(kernel_size=4)" in msg and "positive odd integer" in msg


def test_unwritable_storage_is_caught_before_ray_starts(tmp_path, capsys):
    path = _write(tmp_path, lambda r: r.update(storage_path="/proc/fusion_ray_results"))
    assert sweep_main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "storage_path: /proc/fusion_ray_results cannot be written" in err


def test_an_unreachable_tracking_server_is_one_line_from_one_probe(tmp_path, capsys):
    """The pre-flight check sends one request with its own timeout (not MLflow's client, which
    retries for minutes), and says so: one line, exit 2, before Ray starts."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = _write(tmp_path, lambda r: r.update(tracking_uri=f"http://127.0.0.1:{port}"))
    assert sweep_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"tracking_uri: no MLflow server answers at http://127.0.0.1:{port} within " in err
    assert "Traceback" not in err


def test_a_boolean_seed_is_a_type_error_not_a_duplicate(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(seeds=[True, 1])))
    assert "seeds.0: must be a whole number, not true or false" in msg and "duplicate" not in msg


def test_a_bad_value_of_a_required_field_is_reported_once(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(name=5, seeds="x")))
    assert (
        "name: Input should be a valid string" in msg
        and "seeds: Input should be a valid list" in msg
    )
    assert "required field is missing" not in msg


# ----------------------------------------------------------------------------- YAML corner cases


def test_a_key_written_twice_is_an_error_naming_both_lines(tmp_path):
    path = tiny_sweep(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("seeds:", "retries: 3\nretries: 1\nseeds:", 1))
    first = text[: text.index("seeds:")].count("\n") + 1
    msg = _problems(path)
    assert f"key 'retries' appears twice in one mapping, on lines {first} and {first + 1}" in msg


def test_a_byte_order_mark_and_windows_line_endings_read_as_the_same_file(tmp_path):
    path = tiny_sweep(tmp_path)
    plain = [c.cell_id for c in expand(load_sweep(path))]
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    assert [c.cell_id for c in expand(load_sweep(path))] == plain


def test_tab_indentation_says_to_indent_with_spaces(tmp_path):
    path = tiny_sweep(tmp_path)
    path.write_text(path.read_text() + "defaults:\n\tmodel: {}\n")
    assert "indent with spaces" in _problems(path)


def test_seeds_beyond_two_to_the_32_are_valid_and_distinct(tmp_path):
    from fusion_ray.data.batching import epoch_rng
    from fusion_ray.seeds import derive_seed

    big = [2**32, 2**32 + 1, 2**40]
    path = _write(tmp_path, lambda r: r.update(seeds=big))
    cells = expand(load_sweep(path))
    assert {c.seed for c in cells} == set(big)
    assert len({c.cell_id for c in cells}) == len(cells)
    assert len({derive_seed(s, "model/encoder") for s in big}) == 3
    assert len({int(epoch_rng(s, 0).integers(2**62)) for s in big}) == 3


def test_non_ascii_names_are_refused_where_they_name_folders_and_kept_elsewhere(tmp_path):
    msg = _problems(_write(tmp_path, lambda r: r.update(name="étude")))
    assert "name" in msg and "étude" in msg
    path = _write(tmp_path, lambda r: r.update(description="Étude de la fusion, 長さ"))
    assert load_sweep(path).description == "Étude de la fusion, 長さ"


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_smoke_and_cpu_rehearsal_transform_the_validated_sweep_without_building_it_again(
    path, monkeypatch
):
    """``smoke_version`` and ``placement.on_cpus`` make new values from the validated sweep:
    their cells are those a fresh validation of the same settings builds, and building them
    runs no validation step."""
    import dataclasses

    import fusion_ray.config.rules as config_rules
    from fusion_ray.config import SweepSpec, smoke_version
    from fusion_ray.driver.placement import on_cpus

    spec = load_sweep(path)
    expand(spec)

    def no_second_validation(*args, **kwargs):
        raise AssertionError("the grid was built and validated again")

    with monkeypatch.context() as patched:
        patched.setattr(config_rules, "build_points", no_second_validation)
        smoke = smoke_version(spec)
        rehearsed = on_cpus(smoke)
        transformed = [(c.cell_id, dataclasses.asdict(c.trial)) for c in expand(rehearsed)]
    rebuilt = SweepSpec.model_validate(on_cpus(smoke).model_dump(exclude_unset=True))
    assert rebuilt.kept_points() is None
    assert transformed == [(c.cell_id, dataclasses.asdict(c.trial)) for c in expand(rebuilt)]
    assert {c.trial.train.epochs for c in expand(smoke)} == {1}
