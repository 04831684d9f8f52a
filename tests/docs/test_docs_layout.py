"""Documentation that cannot drift from the code: the Code layout page names every module of
``fusion_ray`` and ``analysis``, the Registry entries page (as MkDocs builds it) names every entry
of every registry, and no text of the repository points readers at a document it does not
contain."""

from __future__ import annotations

import importlib.util
import re
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

LAYOUT = ROOT / "docs" / "reference" / "layout.md"


def _rows() -> dict[str, str]:
    """Each path of the layout table's first column (a module, or a package ending in ``/``) ->
    the text of its row."""
    rows = {}
    for line in LAYOUT.read_text().splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `") or len(cells) < 2:
            continue
        for path in re.findall(r"`([^`]+)`", cells[0]):
            rows[path] = line
    return rows


def _unnamed(rows: dict[str, str]) -> list[str]:
    missing = []
    for package in ("fusion_ray", "analysis"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in rows:
                continue
            directory = rel.rpartition("/")[0] + "/"
            if path.name == "__init__.py" and directory in rows:
                continue  # a package is named by its own row
            owner = max(
                (k for k in rows if k.endswith("/") and rel.startswith(k)), key=len, default=None
            )
            inner = rel[len(owner) :] if owner else rel
            if path.name == "__init__.py":
                inner = inner.removesuffix("__init__.py")  # a subpackage named in its parent's row
            if owner is None or f"`{inner}`" not in rows[owner]:
                missing.append(rel)
    return missing


def test_the_layout_page_names_every_module():
    missing = _unnamed(_rows())
    assert not missing, (
        "modules the Code layout page (docs/reference/layout.md) does not name; add each to its "
        "package's row, or give a module at a package's root a row of its own:\n"
        + "\n".join(missing)
    )


def test_the_layout_check_sees_a_module_left_out():
    rows = _rows()
    rows["fusion_ray/driver/"] = rows["fusion_ray/driver/"].replace("`storage.py`", "storage")
    del rows["fusion_ray/cli.py"]
    assert _unnamed(rows) == ["fusion_ray/cli.py", "fusion_ray/driver/storage.py"]


def test_the_registries_page_as_built_names_every_registry_entry():
    """docs/reference/registries.md through the MkDocs hook (docs/hooks.py), as the site shows it:
    every entry of every registry of ``fusion-ray list``, the decision rules and the report
    statistics."""
    from analysis.stats import statistics
    from fusion_ray.cli import registries
    from fusion_ray.decide.rules import RULES

    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.on_page_markdown(
        (ROOT / "docs" / "reference" / "registries.md").read_text(), None, None, None
    )
    missing = [
        f"{title}: {name}"
        for title, registry in [*registries().items(), ("decision rules", RULES)]
        for name in registry.names()
        if f"| `{name}` | {registry.origin(name)} |" not in page
    ]
    missing += [f"statistics: {s.name}" for s in statistics() if f"| `{s.name}` |" not in page]
    assert not missing, "registry entries the Registry entries page leaves out:\n" + "\n".join(
        missing
    )


def test_no_text_points_at_a_document_the_repository_does_not_have():
    """A name such as ``README.md`` or ``RESULTS.md`` in the code, tests or docs is a file of the
    repository (a reader can open it), not a document kept somewhere else."""
    files = subprocess.run(
        ["git", "ls-files", "fusion_ray", "analysis", "tests", "docs", "bench", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    tracked = {p.rpartition("/")[2] for p in subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()}  # fmt: skip
    outside = [
        f"{rel}: {name}"
        for rel in files
        if rel.endswith((".py", ".md", ".yml", ".yaml", ".toml"))
        for name in sorted(set(re.findall(r"\b[A-Z][A-Z_]+\.md\b", (ROOT / rel).read_text())))
        if name not in tracked
    ]
    assert not outside, "documents the repository does not have:\n" + "\n".join(outside)
