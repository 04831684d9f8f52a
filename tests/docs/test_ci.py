"""CI runs what the README tells a newcomer to run: `.ci/run` installs what the README's test
command installs and ends with its test part, verbatim, whose status is then the script's."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def _readme_test_command() -> tuple[str, str]:
    """The README's one-line test command, split into its install and its test part."""
    lines = (ROOT / "README.md").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith("python3 -m venv") and '".[dev]"' in x]
    install, tests = line.split(" && python -m pytest", 1)
    return install, "python -m pytest" + tests


def test_ci_ends_with_the_readmes_test_command():
    install, tests = _readme_test_command()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [x for x in ci.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert commands[0] == "set -euo pipefail"
    assert commands[-1] == tests  # the last command: a failed or empty test run fails CI
    for step in install.split(" && ")[2:]:  # after the venv and its activation: the installs
        assert step.replace("pip install ", "pip install --quiet ") in commands, step
    # every tier runs, each part on two workers: the unit tier and everything that is not unit
    assert "-m unit -n 2 &&" in tests and tests.endswith('-m "not unit" -n 2')
