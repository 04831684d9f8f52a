"""Which fusion-ray this is: the installed version (``pyproject.toml`` holds the one copy) and
the commit of the checkout it runs from, as ``fusion-ray --version`` prints them and every MLflow
run records (``git_sha``). Standard library only."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

GIT_SHA_ENV = "FUSION_RAY_GIT_SHA"
"""The commit to record where the package has no git checkout (an install from a wheel)."""


def version() -> str:
    """The installed distribution's version."""
    try:
        return metadata.version("fusion-ray")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "0+unknown"


def git_sha() -> str:
    """The commit of the checkout this package runs from (with ``+dirty`` if modified), else
    $FUSION_RAY_GIT_SHA (for installs without git metadata), else ``unknown``."""

    def git(*args: str) -> str:
        here = Path(__file__).resolve().parent
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=10, cwd=here
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get(GIT_SHA_ENV, "unknown")


def describe() -> str:
    """``fusion-ray VERSION (commit SHA)``: what ``--version`` prints (the commit as the runs
    record it; ``unknown`` without a checkout or $FUSION_RAY_GIT_SHA)."""
    return f"fusion-ray {version()} (commit {git_sha()})"
