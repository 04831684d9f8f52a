"""What a newcomer's mistakes in a sweep file get, at once: the line of the key a problem names,
the key a misspelled one is close to, and both before torch, Ray or MLflow are imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from fusion_ray.config.files import MAX_FILE_BYTES, MAX_VALUES, SweepFileError, check_file_shape
from fusion_ray.config.messages import key_lines
from tests.conftest import ROOT, tiny_sweep

pytestmark = pytest.mark.unit


def _misspelt(tmp_path):
    path = tiny_sweep(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["seed"] = spec.pop("seeds")
    spec["datasets"]["short"]["data"]["max_lenght"] = spec["datasets"]["short"]["data"].pop(
        "max_length"
    )
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_misspelt_key_is_named_with_its_line_and_the_key_it_is_close_to(tmp_path):
    path = _misspelt(tmp_path)
    lines = path.read_text().splitlines()
    with pytest.raises(SweepFileError) as caught:
        check_file_shape(path)
    text = str(caught.value)
    seed_line = next(i for i, line in enumerate(lines, 1) if line.startswith("seed:"))
    length_line = next(i for i, line in enumerate(lines, 1) if "max_lenght" in line)
    assert f"{path}:{seed_line}: seed: unknown key; did you mean 'seeds'?" in text
    assert (
        f"{path}:{length_line}: datasets.short.data.max_lenght: unknown key; did you mean "
        "'max_length'?" in text
    )


def test_a_key_close_to_nothing_is_only_unknown(tmp_path):
    path = tiny_sweep(tmp_path, colour="blue")
    with pytest.raises(
        SweepFileError, match="colour: unknown key; remove it or check its spelling"
    ):
        check_file_shape(path)


def test_the_lines_of_a_file_whose_aliases_repeat_blocks_are_read_once(tmp_path):
    """An alias is its anchor's node again: walked once, whatever the repetition."""
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(rows) + "\n")
    lines = key_lines(path, MAX_FILE_BYTES, MAX_VALUES)
    assert {k: v for k, v in lines.items() if "[" not in k} == {
        name: i for i, name in enumerate("abcdefghi", 1)
    }
    assert lines["a[9]"] == 1  # each item its line (an alias: its anchor's)
    # and the whole command says what is wrong with it (a walk of its 10**9 values would not
    # end before the limit: the subprocess's timeout turns a hang into a failure)
    done = subprocess.run(
        [sys.executable, "-m", "fusion_ray.sweep", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "expands to more than 100,000 values" in done.stderr


def _refused_before_torch_ray_or_mlflow(path) -> str:
    """``fusion_ray.sweep``'s main on ``path`` in a fresh interpreter: it exits 2 with neither
    torch, Ray nor MLflow imported; its stderr."""
    code = (
        "import sys\n"
        "from fusion_ray.sweep import main\n"
        f"code = main([{str(path)!r}])\n"
        "loaded = [m for m in ('torch', 'ray', 'mlflow') if m in sys.modules]\n"
        "print(code, loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.stdout.split("\n")[-2] == "2 []", done.stdout + done.stderr
    return done.stderr


def test_the_files_problems_are_said_before_torch_ray_or_mlflow_load(tmp_path):
    path = _misspelt(tmp_path)
    stderr = _refused_before_torch_ray_or_mlflow(path)
    assert "did you mean 'seeds'?" in stderr


def _misnamed(tmp_path):
    path = tiny_sweep(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["grid"]["fusions"] = ["add", "gate_scaler"]
    spec["datasets"]["short"]["data"]["source"] = "synthetik"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_misspelt_registry_name_is_said_before_torch_ray_or_mlflow_load(tmp_path):
    """The names a file selects are checked without the registries' code (which imports torch),
    with the line of the value and the name it is close to."""
    path = _misnamed(tmp_path)
    lines = path.read_text().splitlines()
    stderr = _refused_before_torch_ray_or_mlflow(path)
    gate_line = next(i for i, line in enumerate(lines, 1) if "gate_scaler" in line)
    source_line = next(i for i, line in enumerate(lines, 1) if "synthetik" in line)
    assert (
        f"{path}:{gate_line}: grid.fusions[1]: unknown fusion 'gate_scaler'; allowed: add, "
        "concat, gate_scalar, gate_cnn, gate_mlp, gate_vector, mlp; did you mean 'gate_scalar'?"
    ) in stderr
    assert (
        f"{path}:{source_line}: datasets.short.data.source: unknown data source 'synthetik'; "
        "allowed: hub, local, synthetic; did you mean 'synthetic'?"
    ) in stderr


def test_the_full_check_says_a_misspelt_name_in_the_same_words(tmp_path):
    from fusion_ray.config import load_sweep

    path = _misnamed(tmp_path)
    with pytest.raises(SweepFileError) as fast:
        check_file_shape(path)
    raw = yaml.safe_load(path.read_text())
    with pytest.raises(SweepFileError) as full:
        load_sweep(path)
    assert str(fast.value) == str(full.value), raw


def test_the_names_checked_before_the_registries_are_the_registries_own():
    """config.names lists this package's entries of each registry, for the check before torch;
    it must list exactly what each registry registers itself."""
    import importlib

    from fusion_ray.config.names import FAMILIES

    for family in FAMILIES:
        registry = getattr(importlib.import_module(family.module), family.attribute)
        own = [n for n in registry.names() if registry.origin(n) == "fusion-ray"]
        assert list(family.built_in) == own, family.family
        assert registry.family == family.family and registry.group == family.group


def test_a_name_registered_in_this_process_passes_the_check_before_the_registries(tmp_path):
    """Code that registers an entry has imported its registry: the check then asks it."""
    from fusion_ray.config.names import FUSIONS as FAMILY
    from fusion_ray.model import FUSIONS
    from fusion_ray.model.fusion import Add

    path = tiny_sweep(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["grid"]["fusions"] = ["add", "add_again"]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    FUSIONS.register("add_again")(Add)
    try:
        assert "add_again" in FAMILY.names()
        check_file_shape(path)
    finally:
        FUSIONS.unregister("add_again")


def test_a_rule_between_settings_inherited_from_defaults_is_said_once_where_they_are_written(
    tmp_path,
):
    """n_heads and d_model both from defaults.model: one problem at defaults.model's line, not
    one per dataset at each preset's line."""
    from fusion_ray.config import load_sweep

    path = tiny_sweep(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["defaults"]["model"]["d_model"] = 15
    spec["grid"]["datasets"] = ["short", "long"]
    spec["datasets"]["long"] = spec["datasets"]["short"]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    lines = path.read_text().splitlines()
    with pytest.raises(SweepFileError) as caught:
        load_sweep(path)
    text = str(caught.value)
    model_line = next(
        i
        for i, line in enumerate(lines, 1)
        if line.strip() == "model:" and lines[i - 2].strip() == "defaults:"
    )
    assert text.count("does not divide") == 1, text
    assert (
        f"{path}:{model_line}: defaults.model: model.n_heads=2 does not divide model.d_model=15"
        in text
    )
