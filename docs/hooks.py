"""MkDocs hook: a page line ``<!-- generated: NAME -->`` becomes ``GENERATORS[NAME]()`` of
``docs/reference_gen.py`` (the reference pages' generated parts), on every build and serve."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_gen import GENERATORS  # noqa: E402

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def generated(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(
                f"{page.file.src_path}: no generator {name!r}; known: {list(GENERATORS)}"
            )
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
