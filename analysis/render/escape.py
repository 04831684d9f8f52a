"""Text from the tracking store, made safe for report.md.

Everything the report prints from MLflow (operator, dataset, position and axis names and values,
experiment, run and comparison names, any tag or param text) is data: whoever can write a tag
to a shared server chooses it. In report.md it must show as itself, never as Markdown or HTML
markup: a ``|`` must not split a table cell, ``<script>`` or ``<img onerror=...>`` must not
become HTML, ``[x](javascript:...)`` must not become a link, ``*``, ``_``, backticks must not
start emphasis or code, and a newline must not start a line (a heading, a table row). The
report's own markup (its headings, bold, tables and code spans) stays: escape the data, not the
template.

- ``md(value)``: a value inside Markdown text or a table cell. ``&``, ``<`` and ``>`` become
  ``&amp;``, ``&lt;`` and ``&gt;``; ``\\``, backticks, ``*``, ``~``, ``|``, ``[`` and ``]`` get a
  backslash, as do ``_`` where it could open or close emphasis (not inside a word, so
  ``gate_scalar`` stays as it is) and a ``(`` right after ``]``; a line break shows as ``\\n``.
- ``md_code(value)``: a value in a code span, its fence longer than any run of backticks in it;
  a value a code span cannot hold safely (``<``, ``>``, ``&``, ``|``, a line break, link
  syntax) is ``md(value)`` instead.
- ``md_cell(text)``: a table cell that may be a formatted number of the report (``66.00 ± 1.63*``,
  ``+1.25 [+0.50, +2.00]``) or data: like ``md`` but a lone ``*`` (a significance mark cannot
  pair with anything in its cell) and brackets that do not form link syntax are kept.
- ``md_prose(text)``: a sentence composed elsewhere (a warning, a note, a caption, a footnote)
  with its own code spans around raw data: code spans that are safe are kept, the others shown
  as ``md`` text; the text outside them is ``md`` text (so it has no emphasis or links of its
  own: the report writes its bold around it), line breaks become spaces, and a block marker at
  the start (``#``, ``-``, ``1.`` ...) is escaped.
- ``fence(value)``: a raw code span around ``value`` (its fence longer than its backticks), for
  prose that is later written through ``md_prose`` (and to LaTeX, which reads code spans).
- ``line_start(markdown)``: escaped text made safe to begin a line or a list item (a leading
  ``#``, ``-``, ``+``, ``=`` or ``1.`` escaped), where a name comes first.

HTML entities (``&lt;``) show as the character they name everywhere but inside a code span, so
no value that needs one is put in a code span. stats.json and the CSV files keep the raw values:
escaping is for Markdown only.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["fence", "line_start", "md", "md_cell", "md_code", "md_prose"]

#: Line breaks (CommonMark's, and Unicode's that some renderers honour).
_LINE_BREAK = re.compile(r"\r\n|[\r\n\x0b\x0c\x85\u2028\u2029]")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
#: Characters escaped with a backslash wherever they are in a value.
_BACKSLASHED = frozenset("\\`*~|[]")
#: What a code span cannot hold safely: HTML-ish characters (entities do not work inside a code
#: span), a table's cell separator, a line break, and link syntax (should a parser not see the
#: span where this module does).
_UNSAFE_CODE = re.compile(r"[<>&|\r\n\x0b\x0c\x85\u2028\u2029]|\][(\[]")
#: A code span as CommonMark reads one: a backtick run not escaped, its content, the same run.
_CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
#: A block marker at the start of a line: heading, list item, block quote, setext underline.
_BLOCK_START = re.compile(r"^( {0,3})([#=+-]|\d{1,9}(?=[.)]))")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _intraword(text: str, i: int) -> bool:
    """Whether ``text[i]`` (an underscore) sits between two letters or digits, where it can
    neither open nor close emphasis."""
    return 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()


def _kept_in_cell(ch: str, nxt: str, lone_star: bool) -> bool:
    """Whether a table cell keeps ``ch`` (followed by ``nxt``) as it is: a lone ``*`` cannot
    pair, and brackets form no link unless a ``]`` is followed by ``(`` or ``[`` (no line of
    report.md can define a link reference: every line starts with the report's own text)."""
    if ch == "*":
        return lone_star
    if ch == "[":
        return True
    return ch == "]" and nxt not in ("(", "[")


def _escape(text: str, cell: bool) -> str:
    text = _LINE_BREAK.sub("\n", text)
    lone_star = cell and text.count("*") == 1
    out: list[str] = []
    for i, ch in enumerate(text):
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if ch in _ENTITIES:
            out.append(_ENTITIES[ch])
        elif ch == "\n":
            out.append("\\n")
        elif ch == "_" and not _intraword(text, i):
            out.append("\\_")
        elif ch == "(" and i and text[i - 1] == "]":
            out.append("\\(")
        elif cell and _kept_in_cell(ch, nxt, lone_star):
            out.append(ch)
        elif ch in _BACKSLASHED:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def md(value: Any) -> str:
    """``value`` as text in Markdown (inline or in a table cell): it shows as itself."""
    return _escape(_text(value), cell=False)


def md_cell(value: Any) -> str:
    """A table cell's text: data, or a number the report formatted (its marks kept as they
    are when they cannot form markup in the cell: a lone ``*``, brackets without link syntax)."""
    return _escape(_text(value), cell=True)


def fence(value: Any) -> str:
    """A code span around ``value``, unescaped: its fence one backtick longer than the longest
    run of backticks inside, padded with a space where the value starts or ends with a backtick
    (or with a space on both sides, which a code span would strip)."""
    text = _text(value)
    runs = [len(r) for r in re.findall(r"`+", text)]
    ticks = "`" * (max(runs, default=0) + 1)
    padded = text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip())
    pad = " " if padded else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_code(value: Any) -> str:
    """``value`` in a code span (as ``md`` text when a code span cannot hold it safely)."""
    text = _text(value)
    if not text or _UNSAFE_CODE.search(text):
        return md(text)
    return fence(text)


def _span_content(span: re.Match) -> str:
    inner = span.group(2)
    if len(inner) > 2 and inner[0] == inner[-1] == " " and inner.strip():
        return inner[1:-1]
    return inner


def md_prose(text: Any) -> str:
    """A sentence with the report's own code spans around raw data, safe for report.md: safe
    code spans are kept, the rest is escaped (see the module's docstring). One line."""
    text = _LINE_BREAK.sub(" ", _text(text))
    out, pos = [], 0
    for span in _CODE_SPAN.finditer(text):
        out.append(md(text[pos : span.start()]))
        content = _span_content(span)
        out.append(md(content) if _UNSAFE_CODE.search(content) else span.group(0))
        pos = span.end()
    out.append(md(text[pos:]))
    return line_start("".join(out))


def line_start(markdown: str) -> str:
    """``markdown`` (already escaped) made safe to begin a line or a list item: a leading
    ``#``, ``-``, ``+``, ``=`` or ``1.`` is escaped, so that it stays text."""
    match = _BLOCK_START.match(markdown)
    if match is None:
        return markdown
    indent, marker = match.groups()
    end = match.end()
    if marker.isdigit():  # escape the ``.`` or ``)`` after the number
        return markdown[:end] + "\\" + markdown[end:]
    return indent + "\\" + markdown[len(indent) :]
