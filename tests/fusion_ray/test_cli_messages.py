"""What the command line says when a user gets something wrong: an unknown command, a YAML
syntax error, a bad value inherited from ``defaults:``, a mistyped override; and that it has a
version and plain help text."""

from __future__ import annotations

import pytest
import yaml

from fusion_ray.cli import COMMANDS
from fusion_ray.cli import main as cli_main
from fusion_ray.sweep import main as sweep_main
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


def test_an_unknown_command_is_an_error_with_a_suggestion(capsys):
    assert cli_main(["swep"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("error: unknown command 'swep'; did you mean 'sweep'?")
    assert cli_main([]) == 2 and "error: name a command" in capsys.readouterr().err
    assert cli_main(["--help"]) == 0 and "commands:" in capsys.readouterr().out


def test_the_version_is_the_installed_packages_with_its_commit(capsys):
    import subprocess
    from importlib.metadata import version

    assert cli_main(["--version"]) == 0
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = capsys.readouterr().out
    assert out.startswith(f"fusion-ray {version('fusion-ray')} (commit {head}")
    assert out.endswith(")\n")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "list"])
def test_every_commands_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "``" not in out


def _file(tmp_path, edit=None):
    path = tiny_sweep(tmp_path)
    if edit is not None:
        raw = yaml.safe_load(path.read_text())
        edit(raw)
        path.write_text(yaml.safe_dump(raw))
    return path


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\ngrid: {datasets: [a\nseeds: [0]\n")
    assert sweep_main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not valid YAML: line 3, column " in err and "<unicode string>" not in err


def test_a_bad_value_from_defaults_is_named_where_it_was_written(tmp_path, capsys):
    def bad_default(raw):
        raw["defaults"]["train"]["lr"] = -1

    assert sweep_main([str(_file(tmp_path, bad_default)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "defaults.train.lr: must be >= 1e-08 (got -1)" in err
    assert "datasets.short.train.lr" not in err

    def bad_preset(raw):  # the preset's own value is named as the preset's
        raw["datasets"]["short"]["train"] = {"lr": -1}

    assert sweep_main([str(_file(tmp_path / "own", bad_preset)), "--dry-run"]) == 2
    assert "datasets.short.train.lr: must be >= 1e-08" in capsys.readouterr().err


def test_a_mistyped_override_is_blamed_on_the_override_once(tmp_path, capsys):
    assert sweep_main([str(_file(tmp_path)), "--dry-run", "train.lrr=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("override train.lrr=3: train.lrr: unknown key") == 1
    assert "datasets.short.train.lrr" not in err


def test_the_closing_hint_opens_a_server_and_runs_mlflow_ui_on_a_file():
    """``mlflow ui --backend-store-uri http://...`` would start a second UI on a server's URI:
    for a server the hint is its address, without the password."""
    from fusion_ray.sweep import where_to_look

    served = where_to_look("http://admin:Pw-123456@mlflow.lab:5000")
    assert served == "the runs are on the MLflow server: open http://mlflow.lab:5000 in a browser"
    assert where_to_look("sqlite:///mlflow.db").startswith("mlflow ui --backend-store-uri sqlite:")


def test_an_address_that_names_no_cluster_is_refused_by_the_command_line(capsys, tmp_path):
    from fusion_ray.sweep import main as sweep_main

    with pytest.raises(SystemExit) as ended:
        sweep_main([str(tmp_path / "s.yaml"), "--dry-run", "--address", "head node"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "argument --address: 'head node' is no Ray cluster address" in err


def _parsers():
    from analysis.report import build_parser as report_parser
    from fusion_ray.hpo.cli import build_parser as hpo_parser
    from fusion_ray.sweep import build_parser as sweep_parser

    return {"sweep": sweep_parser, "hpo": hpo_parser, "report": report_parser}


@pytest.mark.parametrize("command", ["sweep", "hpo", "report"])
def test_every_option_has_help_and_the_usage_names_the_fusion_ray_command(command, capsys):
    import argparse

    parser = _parsers()[command](f"fusion-ray {command}")
    bare = [
        a.option_strings or [a.dest]
        for a in parser._actions
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert not bare, f"options of fusion-ray {command} without help: {bare}"
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: fusion-ray {command} ")


def test_list_help_is_its_usage_not_the_list(capsys):
    assert cli_main(["list", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fusion-ray list") and "entry-point group" not in out


def _complete(script: str, words: list[str]) -> list[str]:
    """What the completion function offers after ``words`` (the last one being completed), as
    bash runs it."""
    import shlex
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    line = " ".join(shlex.quote(w) for w in words)
    code = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
        '_fusion_ray_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_bash_completion_offers_commands_options_and_targets(capsys, tmp_path):
    assert cli_main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert script.rstrip().endswith("complete -o filenames -F _fusion_ray_complete fusion-ray")
    assert _complete(script, ["fusion-ray", "sw"]) == ["sweep"]
    assert set(_complete(script, ["fusion-ray", "sweep", "x.yaml", "--dr"])) == {"--dry-run"}
    assert "--zero-method" in _complete(script, ["fusion-ray", "report", "--z"])
    assert set(_complete(script, ["fusion-ray", "cluster", "sl"])) == {"slurm"}
    assert cli_main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert "bashcompinit" in zsh and script in zsh
