"""The example trainable package (examples/digits), installed as a user would: its own tests
(fusion-ray's contract suite on ``digits_mlp``, the pairing by the seed) pass, fusion-ray's
contract test over every registered trainable covers it, and ``fusion-ray list`` shows it with
its package."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers import install_example

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The example package pip-installed, once for the module, into a folder of its own."""
    return install_example(tmp_path_factory.mktemp("example_digits") / "site", "digits")


def _run(site: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{site}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_example_own_tests_pass_through_the_contract_kit(site):
    proc = _run(site, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/digits/tests")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "\n8 passed" in proc.stdout, proc.stdout[-2000:]


def test_the_contract_test_over_every_trainable_covers_the_installed_example(site):
    listed = _run(site, "-m", "fusion_ray.cli", "list").stdout
    assert "  digits_mlp           [fusion-ray-digits]  fusion_ray_digits.trainable.train" in listed
    test = "tests/fusion_ray/trainables/test_trainables.py::test_every_registered_trainable_keeps_the_contract"
    proc = _run(site, "-m", "pytest", "-q", "-p", "no:cacheprovider", test)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
