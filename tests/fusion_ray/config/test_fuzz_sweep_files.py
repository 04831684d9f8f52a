"""Hostile input, seeded: every shipped sweep and HPO file (``sweeps/*.yaml``, ``sweeps/hpo/``)
mutated as values (types, sizes, unicode, path traversal, keys deleted or added, a block shared
through a YAML anchor and alias) and as text (an alias bomb, a self-referencing alias, merge keys,
a key written twice, tabs, deep nesting, numbers of 5,000 digits, NUL, a file too large, bytes
that are not UTF-8) goes through the validation path and ends in a clean error naming the field
(``SweepFileError`` or ``FileNotFoundError``; the command line's one message and exit 2), or in
an accepted file whose dry run works. Never a traceback, never a hang: the loader's limits bound
every case (file size, values after aliases, number length), and an alarm fails a case that
would still run after ``CASE_S`` seconds. A few seconds in all."""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusion_ray import api
from fusion_ray.config import SweepFileError, SweepSpec, load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.driver.preflight import preflight
from fusion_ray.hpo.cli import print_plan
from fusion_ray.hpo.spec import HpoFileError, HpoPlan, load_hpo
from fusion_ray.sweep import main as sweep_main
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

SWEEPS = sorted((ROOT / "sweeps").rglob("*.yaml"))
MUTATIONS = 3
"""Value mutations of each file (each changes one to three places)."""
CASE_S = 20
"""A case still running after this many seconds is a hang (they take well under one)."""
LONG = "x" * 5000
TRAVERSAL = "../" * 12 + "etc/passwd"
HOSTILE = [
    None, True, False, -1, 0, 1e308, -1e308, float("nan"), float("inf"), 10**12, -(10**12),
    2**64, 3.5, "", LONG, TRAVERSAL, "/etc/passwd", "sweeps/../../outside.yaml", "C:\\x\\..\\y",
    "${NOT_SET_ANYWHERE}", "<script>alert(1)</script>", "javascript:alert(1)", "file:///tmp/x",
    "sqlite:///", "a|b", "ünïcødé", "名前", "\u202egnp.exe", "😀", "\ufeffname", "a\x00b",
    "line\nbreak", [], [None], [1, "two", None], {}, {"unknown": 1}, {"name": LONG}, "1e308",
    "nan", "\x00",
]  # fmt: skip
NEW_KEYS = ["bogus", "lr", "seeds", "epochs", "x" * 300, "ключ", "<<"]


# ----------------------------------------------------------------------------- the path


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def alarm(signum: int, frame: Any) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _loader(path: Path) -> Callable[[Path], Any]:
    return load_hpo if path.parent.name == "hpo" else load_sweep


def _dry_run(loaded: SweepSpec | HpoPlan) -> str:
    """What ``--dry-run`` does after validation, in this process: a sweep's cells against its
    stores (planned for a cluster, ``--address``: where its trials fit is not this test's
    question), an HPO file's plan after the local store checks."""
    if isinstance(loaded, SweepSpec):
        return api.dry_run_text(loaded, address="10.0.0.1:6379")
    problems = preflight(loaded.spec.storage_path, loaded.spec.tracking_uri, remote=False)
    if problems:
        raise HpoFileError(loaded.path, problems)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_plan(loaded)
    return out.getvalue()


def _outcome(path: Path, case: str, names: list[str]) -> str:
    """``path`` validated and, when valid, dry-run: "valid" or "refused". A refusal must be
    one clean message that names one of ``names`` (when given); anything else fails the test."""
    try:
        with _deadline(CASE_S):
            text = _dry_run(_loader(path)(path))
        assert text.strip(), f"{case}: an empty dry run"
        return "valid"
    except (SweepFileError, FileNotFoundError) as err:
        message = str(err)
        assert "Traceback" not in message, f"{case}:\n{message[:2000]}"
        longest = max(len(line) for line in message.splitlines())
        assert longest < 1500, f"{case}: a {longest}-character line:\n{message[:300]}"
        assert not names or any(n in message for n in names), (
            f"{case}: the message names none of {names}:\n{message[:2000]}"
        )
        return "refused"
    except _Hang:
        pytest.fail(f"{case} still ran after {CASE_S} s:\n{path.read_text()[:800]}")
    except Exception as err:  # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(
            f"{case} raised {type(err).__name__}: {str(err)[:300]}\n{path.read_bytes()[:1500]!r}"
        )


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of sweeps/ (fragments and the sweeps an HPO file names are found), run from
    ``tmp_path``: the relative stores and storage paths of a dry run stay inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copytree(ROOT / "sweeps", tmp_path / "sweeps")
    return tmp_path / "sweeps"


def _copy_of(tree: Path, sweep: Path) -> Path:
    return tree / sweep.relative_to(ROOT / "sweeps")


# ----------------------------------------------------------------------------- value mutations


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) of a YAML tree, inner nodes included."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))


def _parent(tree: Any, path: tuple) -> Any:
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _nearby(value: Any, rng: random.Random) -> Any:
    """A value of the same kind as ``value``, often still valid: a number scaled, a string
    with a letter added, a list with an item repeated or dropped."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):  # sizes stay small: validation builds the model's tables
        return value * rng.choice([0, 2, -1]) + rng.choice([0, 1])
    if isinstance(value, float):
        return value * rng.choice([0.5, 2.0, -1.0])
    if isinstance(value, str):
        return value + rng.choice(["ü", "_2", " ", "/.."])
    if isinstance(value, list) and value:
        return value + value[:1] if rng.random() < 0.5 else value[1:]
    return value


def _mutate(raw: dict, rng: random.Random) -> tuple[dict, list[str]]:
    """One to three random edits of ``raw``; with the names a refusal must mention (the keys
    of the values set; none when something was only deleted: its absence may show elsewhere)."""
    tree, names = copy.deepcopy(raw), []
    for _ in range(rng.choice([1, 1, 2, 3])):
        paths = [p for p, _ in _leaves(tree) if p]
        where, kind = rng.choice(paths), rng.random()
        keys = [str(k)[:40] for k in where if isinstance(k, str)]
        node = _parent(tree, where)
        if kind < 0.4:
            node[where[-1]] = copy.deepcopy(rng.choice(HOSTILE))
            names += keys
        elif kind < 0.6:
            node[where[-1]] = _nearby(node[where[-1]], rng)
            names += keys
        elif kind < 0.75:
            del node[where[-1]]
        elif kind < 0.88:  # a block shared with another place: an anchor and an alias
            source = rng.choice(paths)
            if source[: len(where)] != where and where[: len(source)] != source:
                node[where[-1]] = _parent(tree, source)[source[-1]]
                names += keys
        elif isinstance(node, dict):
            key = rng.choice(NEW_KEYS)
            node[key] = copy.deepcopy(rng.choice(HOSTILE))
            names += keys[:-1] + [key[:40]]
    return tree, names


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: str(p.relative_to(ROOT / "sweeps")))
def test_random_value_mutations_end_in_a_dry_run_or_an_error_naming_the_field(
    sweep: Path, tree: Path
):
    path = _copy_of(tree, sweep)
    raw = yaml.safe_load(sweep.read_text())
    named = not sweep.name.startswith("_")  # a fragment is no sweep: refused whatever changes
    rng = random.Random(sweep.name)
    for i in range(MUTATIONS):
        mutated, names = _mutate(raw, rng)
        try:
            text = yaml.safe_dump(mutated, sort_keys=False, allow_unicode=True)
        except yaml.YAMLError:
            continue  # a value YAML cannot write (the fuzzing's own limit, not the loader's)
        path.write_text(text, encoding="utf-8")
        _outcome(path, f"mutation {i} of {sweep.name}", names if named else [])


# ----------------------------------------------------------------------------- text mutations

BOMB = "".join(
    f"  l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10) if n else ', '.join(['lol'] * 10)}]\n"
    for n in range(10)
)
"""Ten levels of ten aliases each: 10**10 values once expanded, 1 KB as text."""


def _append(text: str) -> Callable[[str], str]:
    return lambda raw: raw.rstrip("\n") + "\n" + text


def _set_top(key: str, value: str) -> Callable[[str], str]:
    """The top-level ``key:`` line replaced (or added) with ``key: value`` as written."""

    def edit(raw: str) -> str:
        line = re.compile(rf"^{re.escape(key)}:.*$", re.M)
        if line.search(raw):
            return line.sub(lambda _: f"{key}: {value}", raw, count=1)
        return raw.rstrip("\n") + f"\n{key}: {value}\n"

    return edit


def _number_at(key: str, number: str) -> Callable[[str], str]:
    """The first ``key: <number>`` anywhere (block or flow style) given ``number`` as written."""

    def edit(raw: str) -> str:
        found = re.compile(rf"(\b{re.escape(key)}: )[-+0-9.e]+")
        assert found.search(raw), f"no {key}: in the file"
        return found.sub(lambda m: m.group(1) + number, raw, count=1)

    return edit


def _axis(key: str, levels: str) -> Callable[[str], str]:
    """The grid's setting axis ``key`` given ``levels`` as written (quickstart's grid has one)."""

    def edit(raw: str) -> str:
        found = re.compile(rf"^(\s+){re.escape(key)}: .*$", re.M)
        assert found.search(raw), f"no {key}: axis in the file"
        return found.sub(lambda m: f"{m.group(1)}{key}: {levels}", raw, count=1)

    return edit


# (case, files it applies to, the edit of the text, what the refusal must say)
TEXT_CASES: list[tuple[str, str, Callable[[str], str], list[str]]] = [
    ("alias bomb", "*.yaml", _append(f"bomb:\n{BOMB}"), ["expands to more than"]),
    (
        "alias bomb in a field",
        "quickstart.yaml",
        lambda raw: _set_top("description", "*l9")(f"x_defs:\n{BOMB}" + raw),
        ["expands to more than"],
    ),
    ("self-referencing alias", "*.yaml", _append("loop: &loop [1, *loop]\n"), ["contains it"]),
    ("a key written twice", "*.yaml", _append("name: twice\n"), ["appears twice"]),
    ("tabs", "quickstart.yaml", lambda raw: raw.replace("\n  ", "\n\t", 1), ["tabs"]),
    ("deep nesting", "*.yaml", _append("deep: " + "[" * 1000 + "]" * 1000 + "\n"), ["nested"]),
    ("5,000 digits", "quickstart.yaml", _number_at("max_concurrent_trials", "9" * 5000), ["max_concurrent_trials"]),
    ("5,000 negative digits", "quickstart.yaml", _number_at("max", "-" + "9" * 5000), ["max"]),
    ("hexadecimal of 5,000 digits", "quickstart.yaml", _number_at("d_model", "0x" + "f" * 5000), ["d_model"]),
    ("an integer of 1e12", "quickstart.yaml", _number_at("n_train", "1000000000000"), ["n_train"]),
    ("a learning rate of 1e-320", "quickstart.yaml", _number_at("lr", "1.0e-320"), ["lr"]),
    ("epochs: true", "quickstart.yaml", _number_at("epochs", "true"), ["epochs"]),
    ("unicode name", "*.yaml", _set_top("name", "名前-ünï😀"), ["name"]),
    ("unicode key", "quickstart.yaml", _append("ñame_😀: 1\n"), ["unknown key"]),
    ("right-to-left override", "quickstart.yaml", _set_top("storage_path", '"runs\\u202e"'), ["storage_path"]),
    ("NUL in a path", "quickstart.yaml", _set_top("storage_path", '"a\\0b"'), ["storage_path"]),
    ("traversal in extends", "table1.yaml", _set_top("extends", f"[{TRAVERSAL}]"), ["extends"]),
    ("traversal in storage_path", "*.yaml", _set_top("storage_path", TRAVERSAL), ["storage_path"]),
    ("traversal in tracking_uri", "quickstart.yaml", _set_top("tracking_uri", f"sqlite:///{TRAVERSAL}"), ["tracking_uri"]),
    ("traversal in output", "hpo/*.yaml", _set_top("output", "../" * 12 + "tmp/fuzz-out.yaml"), []),
    ("traversal in sweeps", "hpo/*.yaml", _set_top("sweeps", f"[{TRAVERSAL}]"), ["sweeps"]),
    ("javascript tracking_uri", "*.yaml", _set_top("tracking_uri", "'javascript:alert(1)'"), ["tracking_uri"]),
    ("empty tracking_uri", "*.yaml", _set_top("tracking_uri", "''"), ["tracking_uri"]),
    ("a file too large", "quickstart.yaml", _append("#" + "x" * (1 << 20) + "\n"), ["bytes"]),
    ("not UTF-8", "quickstart.yaml", lambda raw: raw.replace("name:", "name: \udcff", 1), ["UTF-8"]),
    # round three: coercion duplicates, YAML 1.1 numbers, control characters, reserved
    # characters in URIs, no bucket, an address that is none
    ("levels true and 1", "quickstart.yaml", _axis("model.scale_embeddings", "[true, 1]"), ["'true' and '1' are one value"]),
    ("levels true and 'True'", "quickstart.yaml", _axis("model.scale_embeddings", "[true, 'True']"), ["'true' and 'True' are one value"]),
    ("levels false, no, off", "quickstart.yaml", _axis("model.scale_embeddings", "[false, 'no', 'off']"), ["'false' and 'no' are one value"]),
    ("epochs: 1:30 (base 60)", "quickstart.yaml", _number_at("epochs", "1:30"), ["epochs", "1:30"]),
    ("lr: 1:30.5 (base 60)", "quickstart.yaml", _number_at("lr", "1:30.5"), ["lr", "1:30.5"]),
    ("control characters in description", "*.yaml", _set_top("description", '"red \\e[31m bell \\a"'), ["description", "U+001B"]),
    ("'#' in a password", "quickstart.yaml", _set_top("tracking_uri", "'http://admin:Sec#ret-77@127.0.0.1:5000'"), ["tracking_uri", "%23"]),
    ("'?' in a password", "*.yaml", _set_top("tracking_uri", "'https://admin:Sec?ret-77@mlflow.lab'"), ["tracking_uri", "%3F"]),
    ("a space in a password", "quickstart.yaml", _set_top("tracking_uri", "'http://admin:a b@127.0.0.1:5000'"), ["tracking_uri", "white space"]),
    ("s3:// with no bucket", "*.yaml", _set_top("storage_path", "s3://"), ["storage_path", "no bucket"]),
    ("an address with no port", "quickstart.yaml", _set_top("address", "10.0.0.5"), ["address", "HOST:PORT"]),
    ("an address of two words", "quickstart.yaml", _set_top("address", "'head node:6379'"), ["address"]),
]  # fmt: skip
"""Each case is applied to one file (of those its pattern matches, chosen by a seeded draw)."""


@pytest.mark.parametrize("case", TEXT_CASES, ids=lambda c: c[0])
def test_hostile_yaml_ends_in_an_error_naming_its_cause(case, tree: Path):
    name, pattern, edit, names = case
    files = sorted(tree.glob(pattern))
    path = random.Random(name).choice([f for f in files if not f.name.startswith("_")])
    raw = path.read_text(encoding="utf-8")
    text = edit(raw)
    assert text != raw, f"{name}: the edit changed nothing in {path.name}"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    outcome = _outcome(path, f"{name} in {path.name}", names)
    assert outcome == "refused" or not names, f"{name} in {path.name} was accepted"


def test_anchors_aliases_and_merge_keys_are_read_as_yaml_means_them(tree: Path):
    """quickstart's presets given the defaults' dropout once more, through an anchor, an alias
    and a merge key: the same cells."""
    path = tree / "quickstart.yaml"
    cells = [c.cell_id for c in expand(load_sweep(path))]
    raw = path.read_text()
    for end, preset in [
        ("max_length: 96\n", "model: &m {dropout: 0.1}"),
        ("max_length: 128\n", "model: *m"),
        ("max_length: 160\n", "model: {<<: *m, d_model: 32}"),
    ]:
        assert raw.count(end) == 1
        raw = raw.replace(end, f"{end}    {preset}\n")
    path.write_text(raw)
    assert _outcome(path, "presets through an anchor", []) == "valid"
    assert [c.cell_id for c in expand(load_sweep(path))] == cells


def test_the_command_line_says_the_hostile_cases_in_one_message(tree: Path, capsys):
    """Through ``python -m fusion_ray.sweep FILE --dry-run``: exit 2, the field named, no
    traceback, for an alias bomb, a 5,000-digit number and a nonsense store."""
    path = tree / "quickstart.yaml"
    raw = path.read_text()
    cases = [
        (f"x_bomb:\n{BOMB}" + raw, "expands to more than"),
        (_number_at("max_concurrent_trials", "9" * 5000)(raw), "resources.max_concurrent_trials"),
        (_set_top("tracking_uri", "'javascript:alert(1)'")(raw), "tracking_uri: javascript:"),
    ]
    for text, said in cases:
        path.write_text(text)
        assert sweep_main([str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err[-2000:]
