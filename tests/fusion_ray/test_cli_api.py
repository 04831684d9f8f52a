"""One ``fusion-ray`` command, command-line overrides, and the Python API: the same cells, ids
and messages as the module commands and the edited file."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fusion_ray import api
from fusion_ray.config import SweepFileError, load_sweep
from fusion_ray.config.grid import expand
from tests.conftest import ROOT

QUICKSTART = ROOT / "sweeps" / "quickstart.yaml"


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fusion_ray.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.process
def test_the_python_api_dry_run_is_the_clis(tmp_path, monkeypatch):
    proc = _cli("sweep", str(QUICKSTART), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(tmp_path)
    spec = api.load(QUICKSTART)
    todo = api.dry_run(spec)
    assert proc.stdout.strip() == api.dry_run_text(spec, todo)
    assert len(todo.cells) == 168 and not todo.done  # the adaptive quickstart's worst case
    assert not (tmp_path / "mlflow.db").exists()  # a dry run creates no store


@pytest.mark.unit
def test_overrides_change_cell_ids_exactly_as_the_edited_file_does(tmp_path):
    overrides = ["train.epochs=3", "seeds=[0, 1]", "datasets.long.data.max_length=150"]
    by_override = [(c.cell_id, c.label) for c in expand(load_sweep(QUICKSTART, overrides))]
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["seeds"] = [0, 1]
    for preset in raw["datasets"].values():
        preset.setdefault("train", {})["epochs"] = 3
    raw["datasets"]["long"]["data"]["max_length"] = 150
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(raw))
    by_edit = [(c.cell_id, c.label) for c in expand(load_sweep(edited))]
    assert by_override == by_edit
    unchanged = {c.cell_id for c in expand(load_sweep(QUICKSTART))}
    assert unchanged.isdisjoint(cid for cid, _ in by_override)


@pytest.mark.process
def test_bad_overrides_are_file_problems_before_anything_starts(tmp_path):
    with pytest.raises(SweepFileError, match="write key=value"):
        api.load(QUICKSTART, ["epochs"])
    # the problem names the override that caused it, as the user wrote it
    with pytest.raises(
        SweepFileError, match=r"override train\.epochs=0: train\.epochs: must be > 0"
    ):
        api.load(QUICKSTART, ["train.epochs=0"])
    proc = _cli("sweep", str(QUICKSTART), "train.lr=fast", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "train.lr" in proc.stderr and "fast" in proc.stderr


@pytest.mark.process
def test_fusion_ray_list_names_every_entry_with_its_options_and_origin(tmp_path):
    from fusion_ray.cli import registries

    proc = _cli("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for title, registry in registries().items():
        assert f"{title} (entry-point group {registry.group}):" in proc.stdout
        for name in registry.names():
            assert f"  {name} " in proc.stdout
    assert "gate_cnn             [fusion-ray]  options: kernel_size=7" in proc.stdout


@pytest.mark.process
def test_fusion_ray_without_a_command_shows_the_commands(tmp_path):
    """A usage error: the commands and the error go to stderr, exit 2 (``--help`` prints the
    same list to stdout, exit 0)."""
    proc = _cli(cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.rstrip().endswith("error: name a command")
    for command in ("sweep", "hpo", "report", "train", "cluster", "list"):
        assert f"  {command} " in proc.stderr


@pytest.mark.unit
def test_options_may_follow_the_file_and_precede_overrides(tmp_path, monkeypatch, capsys):
    """``fusion-ray sweep FILE --dry-run key=value``: options and overrides in any order."""
    from fusion_ray.sweep import main

    monkeypatch.chdir(tmp_path)
    assert main([str(QUICKSTART), "--dry-run", "seeds=[0, 1]"]) == 0
    assert capsys.readouterr().out.startswith("sweep quickstart: 24 cells")


@pytest.mark.unit
def test_sweep_and_hpo_share_the_common_options(capsys):
    """--dry-run, --address and --verbose come from one parser (fusion_ray.cli.common_options)."""
    from fusion_ray.hpo.cli import main as hpo_main
    from fusion_ray.sweep import main as sweep_main

    helps = []
    for main in (sweep_main, hpo_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        helps.append(" ".join(capsys.readouterr().out.split()))
    common = "--verbose {0,1,2} Ray Tune's own output and the libraries' start-up lines"
    assert all(common in text for text in helps)
    assert all(
        "--address ADDRESS Ray cluster address: auto, local or HOST:PORT (default: the file's" in t
        for t in helps
    )
