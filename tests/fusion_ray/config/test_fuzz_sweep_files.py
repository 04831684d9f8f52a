"""Hostile input: random mutations of every shipped sweep file end in a valid sweep or in the
sweep file's own error (``SweepFileError``, or a missing file), never in a traceback or a hang,
and no message echoes a long value in full."""

from __future__ import annotations

import copy
import random
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from fusion_ray.config import SweepFileError, load_sweep
from fusion_ray.hpo.spec import load_hpo
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

SWEEPS = sorted((ROOT / "sweeps").rglob("*.yaml"))
MUTATIONS = 40
LONG = "x" * 5000
HOSTILE = [
    None, True, -1, 0, 1e308, -1e308, float("nan"), float("inf"), 10**12, -(10**12), 3.5, "",
    LONG, "../../etc/passwd", "${NOT_SET_ANYWHERE}", "<script>alert(1)</script>", "a|b",
    [], [None], [1, "two", None], {}, {"unknown": 1}, {"name": LONG}, "1e308", "nan", "\x00",
]  # fmt: skip


def _leaves(node, path=()):
    """Every (path, value) of a YAML tree, inner nodes included."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))


def _set(tree, path, value):
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _delete(tree, path):
    node = tree
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


def _mutate(raw: dict, rng: random.Random) -> dict:
    tree = copy.deepcopy(raw)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p, _ in _leaves(tree) if p]
        where = rng.choice(paths)
        kind = rng.random()
        try:
            if kind < 0.6:
                _set(tree, where, copy.deepcopy(rng.choice(HOSTILE)))
            elif kind < 0.8:
                _delete(tree, where)
            else:
                parent = where[:-1]
                node = tree
                for key in parent:
                    node = node[key]
                if isinstance(node, dict):
                    node[rng.choice(["bogus", "lr", "seeds", "epochs", "x" * 300])] = rng.choice(
                        HOSTILE
                    )
        except (KeyError, IndexError, TypeError):
            continue
    return tree


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: str(p.relative_to(ROOT / "sweeps")))
def test_random_mutations_end_in_a_sweep_or_a_clear_error(sweep: Path, tmp_path):
    raw = yaml.safe_load(sweep.read_text())
    rng = random.Random(sweep.name)
    tree = tmp_path / "sweeps"  # a copy, so fragments and the sweeps an HPO file names are found
    shutil.copytree(ROOT / "sweeps", tree)
    load = load_hpo if sweep.parent.name == "hpo" else load_sweep
    previous = signal.signal(signal.SIGALRM, _alarm)
    outcomes = {"valid": 0, "refused": 0}
    try:
        for i in range(MUTATIONS):
            path = tree / sweep.relative_to(ROOT / "sweeps")
            text = yaml.safe_dump(_mutate(raw, rng), sort_keys=False, allow_unicode=True)
            path.write_text(text)
            signal.alarm(30)
            try:
                load(path)
                outcomes["valid"] += 1
            except (SweepFileError, FileNotFoundError) as err:
                outcomes["refused"] += 1
                lines = str(err).splitlines()
                assert "Traceback" not in str(err)
                longest = max(len(line) for line in lines)
                assert longest < 1500, (
                    f"mutation {i}: a {longest}-character line:\n{lines[0][:300]}"
                )
            except _Hang:
                pytest.fail(f"mutation {i} of {sweep.name} took over 30 s:\n{text[:800]}")
            except Exception as err:  # noqa: BLE001 - the point: nothing else may escape
                pytest.fail(
                    f"mutation {i} of {sweep.name} raised {type(err).__name__}: {str(err)[:300]}"
                    f"\n{text[:1500]}"
                )
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert outcomes["refused"] > 0  # the mutations do reach the checks
