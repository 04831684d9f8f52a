"""Text that every launch target writes into a generated file: bash words that carry any value
exactly (``shell_word``), and the checks of what no file can carry (``text_problem``), what
``python -m fusion_ray.sweep`` would misread (``sweep_command_problems``) and what a path
expanded on a node may hold (``node_tmp_problem``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence


def text_problem(what: str, value: str) -> str | None:
    """Why ``value`` (given as ``what``) cannot be carried into a generated file at all, or None:
    a NUL (no shell word or command-line argument holds one) or text that is not Unicode (a lone
    surrogate that is no undecodable byte of a file name)."""
    if "\0" in value:
        return f"{what}: contains a NUL character, which no command-line argument can hold"
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return f"{what} {ascii(value)[:80]}: not valid text (a lone UTF-16 surrogate)"
    return None


#: A sweep file edit as ``fusion-ray sweep`` takes it: a dotted key, ``=``, a YAML value.
_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=.*", re.ASCII | re.DOTALL)


def sweep_command_problems(sweep_file: str, overrides: Sequence[str]) -> list[str]:
    """What keeps ``python -m fusion_ray.sweep SWEEP_FILE OVERRIDES...`` from taking these as
    its sweep file and edits: a word starting with '-' would be read as an option (an override
    ``--address=...`` would move the sweep to another cluster)."""
    out = []
    if not sweep_file or sweep_file.startswith("-"):
        out.append(
            f"the sweep file {sweep_file!r}: a path not starting with '-' (write "
            f"./{sweep_file} for a file of that name)"
        )
    for i, override in enumerate(overrides):
        if not _OVERRIDE.fullmatch(override):
            out.append(
                f"override {i + 1} {override!r}: write KEY=VALUE with a dotted key, e.g. "
                "train.epochs=3"
            )
    return out


def shell_word(value: str) -> str:
    """``value`` as one bash word written in printable characters on one line: ``shlex.quote``
    when ``value`` is printable, else bash's ``$'...'`` with every other character written as
    its UTF-8 bytes (``\\xHH``), so that no newline, carriage return, control character or
    Unicode line separator reaches a generated file as itself. Refuses what ``text_problem``
    refuses."""
    problem = text_problem("a shell word", value)
    if problem:
        raise ValueError(problem)
    if value.isprintable():
        return shlex.quote(value)
    out = []
    for char in value:
        if char in "\\'":
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        else:
            out += [f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape")]
    return "$'" + "".join(out) + "'"


def shell_join(words: Sequence[str]) -> str:
    """``words`` as one line of bash words (``shell_word`` each)."""
    return " ".join(shell_word(word) for word in words)


def in_double_quotes(value: str) -> str:
    """``value`` to be written between double quotes in bash: '\\', '"', '$' and '`' escaped, so
    that bash reads back exactly ``value`` (where a path is followed by more text, e.g.
    ``"PATH/bin:$PATH"``)."""
    return re.sub(r'([\\"$`])', r"\\\1", value)


_VARIABLE = r"[A-Za-z_][A-Za-z0-9_]*"
#: Characters ``--node-tmp`` may hold as themselves: printable, and nothing that a shell reads
#: inside double quotes (``$`` only as a variable reference, below).
_TMP_LITERAL = re.compile(r"""[^$`\\"'{}]""")
_TMP_REFERENCE = re.compile(
    rf"\$(?:(?P<bare>{_VARIABLE})|\{{(?P<name>{_VARIABLE})(?P<default>:?-)?)"
)


def node_tmp_problem(text: str) -> str | None:
    """Why ``text`` is no ``--node-tmp``, or None: a path of printable characters (no quotes,
    backquote, '\\', '{' or '}'), with ``$VAR``, ``${VAR}`` and ``${VAR:-DEFAULT}`` (``DEFAULT``
    of the same form) expanded on each node, and nothing else a shell would run or expand."""
    if not text.isprintable() or not text.strip():
        return "one non-empty line without control characters"
    at, depth, wrong = 0, 0, None  # depth: the ${VAR:-... open around ``at``
    while at < len(text) and wrong is None:
        at, depth, wrong = _node_tmp_step(text, at, depth)
    if wrong is None and depth:
        wrong = "a '${' not closed"
    if wrong is None:
        return None
    return (
        f"{wrong}: a path, with only $VAR, ${{VAR}} or ${{VAR:-DEFAULT}} expanded on the node (no "
        "quotes, '\\', backquotes or $(...); ~ is not expanded: write $HOME)"
    )


def _node_tmp_step(text: str, at: int, depth: int) -> tuple[int, int, str | None]:
    """One step of ``node_tmp_problem`` at ``at``: the next position and depth, or what is
    wrong there."""
    reference = _TMP_REFERENCE.match(text, at)
    if _TMP_LITERAL.match(text, at):
        return at + 1, depth, None
    if text[at] == "}" and depth:
        return at + 1, depth - 1, None
    if reference is None:
        return at, depth, f"{text[at]!r} at character {at + 1}"
    if reference.group("default") is not None:
        return reference.end(), depth + 1, None
    if reference.group("name") is None:
        return reference.end(), depth, None
    if text.startswith("}", reference.end()):
        return reference.end() + 1, depth, None
    return at, depth, f"no '}}' at character {reference.end() + 1}"
