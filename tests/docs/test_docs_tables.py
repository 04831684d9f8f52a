"""Every Markdown table of the documentation (docs/, the README) has as many cells in each row as
in its header, counted as the site's Markdown (Python-Markdown's tables) splits them: on every
``|`` that is neither escaped (``\\|``) nor inside a code span. A row with more cells loses the
rest silently on the site (a bare ``|effect|`` in a cell cut the decisions page's table)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
_SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def cells(row: str) -> int:
    """The cells of a table row as the site's Markdown counts them."""
    text = row.strip()
    text = text[1:] if text.startswith("|") else text
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    count, code, i = 1, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "`":
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            code = 0 if code == run else (run if code == 0 else code)
            i += run
            continue
        if ch == "|" and code == 0:
            count += 1
        i += 1
    return count


def tables(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """(header's line number, [(line number, row)]) of every table outside fenced code."""
    lines, out, fence = text.splitlines(), [], False
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            fence = not fence
        elif (
            not fence and "|" in lines[i] and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1])
        ):
            rows, j = [(i + 1, lines[i])], i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append((j + 1, lines[j]))
                j += 1
            out.append((i + 1, rows))
            i = j
            continue
        i += 1
    return out


def test_the_counter_splits_as_the_site_does():
    assert cells("| a | b |") == 2
    assert cells("| `a|b` | c |") == 2  # a pipe in a code span stays in its cell
    assert cells("| a \\| b | c |") == 2  # an escaped pipe too
    assert cells('| equivalent | a margin was given and "|effect| >= margin" |') == 4


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_row_has_its_headers_cell_count(page):
    bad = []
    for start, rows in tables(page.read_text(encoding="utf-8")):
        want = cells(rows[0][1])
        bad += [
            f"line {n}: {cells(row)} cells, the header (line {start}) has {want}"
            for n, row in rows[1:]
            if cells(row) != want
        ]
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_the_data_flow_picture_shows_every_box_it_draws():
    """docs/assets/dataflow.svg is what docs/dataflow.py draws (text kept as text), and the
    pages show it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dataflow", ROOT / "docs" / "dataflow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "assets" / "dataflow.svg").read_text()
    for _, _, text, _ in module.BOXES:
        for line in text.split("\n"):
            assert line.replace("&", "&amp;").replace(">", "&gt;") in committed, line
    assert b"<svg" in module.draw()
    for page in ("index.md", "architecture.md"):
        assert "assets/dataflow.svg" in (ROOT / "docs" / page).read_text()
