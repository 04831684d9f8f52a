"""Contract checks for launch targets (``fusion_ray.launch``, entry-point group
``fusion_ray.launchers``).

``check_launcher(name)`` runs every check below on the target registered as ``name`` and raises
``AssertionError`` naming the target and the check that failed; fusion-ray's own
``tests/fusion_ray/launch/test_launcher_contract.py`` runs it over every registered target,
plug-ins included. The checks run ``bash`` (``bash -n`` on a script, bash reading the sweep
command's words back), so they need it on PATH.

The checks:
- declared: the target is a ``LaunchTarget`` with a docstring and a one-line ``summary``, and
  every option it declares has a help text (``fusion-ray cluster NAME --help`` documents it);
- well-formed with its example options (``example_args``): printable text; a shell script
  starts with ``#!``, passes ``bash -n`` and has only comment lines above its last directive
  line (so it runs nothing before the scheduler has read them); YAML loads as exactly
  ``documents`` mappings;
- the sweep command, for a target that ``runs_sweep``: the file holds ``python -m
  fusion_ray.sweep`` followed by the sweep file and its edits, each one word with its exact text
  (bash reads them back), with default and with hostile values (quotes, newlines, ``$(...)``,
  backquotes, spaces, ``#``, ``---``, Unicode line separators) in the sweep file and the edits;
- hostile values in every text option: each is refused with a ``ValueError`` naming the option,
  or the output is well-formed, keeps the sweep command's words, and has the shape of the same
  render with a plain value (as many lines for a script; the same keys and list lengths for
  YAML), so the value added no line, key or document.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from typing import Any

import yaml

from fusion_ray.launch import LAUNCHERS, LaunchTarget, options, target_parser

SWEEP_FILE = "sweeps/quickstart.yaml"
OVERRIDES = ("train.epochs=3", "seeds=[0,1]")
#: What broke renderers before: a value ending a comment or a line, a word, a document or a key.
HOSTILE = (
    "two words",
    "it's",
    'say "hi"',
    "$(echo INJECTED)",
    "`echo INJECTED`",
    "line\nbreak",
    "carriage\rreturn",
    "semi;colon && echo INJECTED",
    "# a comment",
    "back\\slash",
    "line\u2028separator",
    "next\x85line",
    "---",
    "-starts-with-a-dash",
    "tab\there",
    "{a: [b]}",
)
MARK = "python -m fusion_ray.sweep"


def _bash() -> str:
    bash = shutil.which("bash")
    assert bash is not None, "the launch target contract needs bash on PATH"
    return bash


def _where(name: str, what: str) -> str:
    return f"launch target {name!r} ({LAUNCHERS.origin(name)}): {what}"


def _parsed(name: str, sweep_file: str = SWEEP_FILE, overrides=OVERRIDES) -> argparse.Namespace:
    """The example options parsed, then the sweep file and edits set as given (argparse would
    read a hostile one starting with '-' as an option)."""
    target = LAUNCHERS.get(name)()
    words = [SWEEP_FILE] if target.runs_sweep else []
    args = target_parser(name).parse_intermixed_args([*words, *target.example_args()])
    if target.runs_sweep:
        args.sweep_file, args.overrides = sweep_file, list(overrides)
    return args


def check_declared(name: str) -> None:
    """A ``LaunchTarget`` with a docstring and a summary; every option has a help text."""
    target = LAUNCHERS.get(name)
    assert isinstance(target, type) and issubclass(target, LaunchTarget), _where(
        name, f"{target!r} is not a LaunchTarget subclass"
    )
    assert (target.__doc__ or "").strip(), _where(name, "no docstring")
    summary = target.summary
    assert summary and "\n" not in summary, _where(name, f"summary {summary!r}: one line")
    assert target.output in ("shell", "yaml"), _where(name, f"output {target.output!r}")
    help_text = target_parser(name).format_help()
    for action in options(name):
        flag = action.option_strings[0]
        assert (action.help or "").strip(), _where(name, f"option {flag} has no help text")
        assert flag in help_text, _where(name, f"{flag} is not in --help")


def _sweep_words(name: str, line: str) -> list[str]:
    """The words bash reads after ``python -m fusion_ray.sweep`` on ``line`` (a trailing ``&``
    dropped; variables it names are empty)."""
    rest = line.split(MARK, 1)[1].rstrip().removesuffix("&")
    script = f"set -- {rest}\nprintf '%s\\0' \"$@\"\n"
    done = subprocess.run(
        [_bash(), "--norc", "--noprofile"],
        input=script.encode("utf-8", "surrogateescape"),
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert done.returncode == 0, _where(name, f"bash cannot read {line!r}: {done.stderr!r}")
    return done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) else []


def _commands(name: str, text: str) -> list[str]:
    """The lines (a script) or strings (YAML: a whole command) that run the sweep."""
    target = LAUNCHERS.get(name)
    if target.output == "shell":
        return [line for line in text.split("\n") if MARK in line and not line.startswith("#")]
    return [s for document in yaml.safe_load_all(text) for s in _strings(document) if MARK in s]


def _check_shell(name: str, text: str) -> None:
    lines = text.split("\n")
    assert lines[0].startswith("#!"), _where(name, f"the script starts {lines[0][:60]!r}")
    directive = LAUNCHERS.get(name).directive
    if directive:
        last = max((i for i, line in enumerate(lines) if line.startswith(directive)), default=None)
        assert last is not None, _where(name, f"no {directive} line")
        above = [line for line in lines[:last] if line.strip() and not line.startswith("#")]
        assert not above, _where(name, f"commands above the last {directive} line: {above[:3]}")
    done = subprocess.run(
        [_bash(), "-n"], input=text.encode("utf-8", "surrogateescape"), capture_output=True
    )
    assert done.returncode == 0, _where(name, f"bash -n: {done.stderr.decode(errors='replace')}")


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def check_well_formed(name: str, text: str) -> Any:
    """``text`` is well-formed for the target's kind; returns its shape (line count, or the
    YAML documents' keys and list lengths)."""
    target = LAUNCHERS.get(name)
    bad = [char for char in text if not (char.isprintable() or char == "\n")]
    assert not bad, _where(name, f"characters that are not printable: {bad[:5]}")
    if target.output == "shell":
        _check_shell(name, text)
        return len(text.split("\n"))
    documents = list(yaml.safe_load_all(text))
    assert len(documents) == target.documents, _where(
        name, f"{len(documents)} YAML documents, expected {target.documents}"
    )
    assert all(isinstance(d, dict) for d in documents), _where(name, "a document is no mapping")
    return [_shape(d) for d in documents]


def check_sweep_command(name: str, text: str, sweep_file: str, overrides) -> None:
    """The file runs ``python -m fusion_ray.sweep SWEEP_FILE OVERRIDES...``, each word exact."""
    commands = _commands(name, text)
    assert commands, _where(name, f"no line runs {MARK}")
    expected = [sweep_file, *overrides]
    for line in commands:
        words = _sweep_words(name, line)
        assert words[: len(expected)] == expected, _where(
            name, f"the sweep command gives {words!r}, expected {expected!r} first"
        )


def _render(name: str, args: argparse.Namespace, flag: str) -> str | None:
    """The output, or None when the target refuses the value, naming ``flag``."""
    try:
        return LAUNCHERS.get(name)().render(args)
    except ValueError as exc:
        assert flag in str(exc), _where(name, f"refused without naming {flag}: {exc}")
        return None


def check_default_render(name: str) -> None:
    """The example options render a well-formed file that runs the sweep as given."""
    args = _parsed(name)
    text = LAUNCHERS.get(name)().render(args)
    check_well_formed(name, text)
    if LAUNCHERS.get(name).runs_sweep:
        check_sweep_command(name, text, SWEEP_FILE, OVERRIDES)


def check_hostile_sweep_arguments(name: str) -> None:
    """Hostile sweep files and edits: refused, naming them, or carried exactly."""
    if not LAUNCHERS.get(name).runs_sweep:
        return
    for value in HOSTILE:
        cases = [
            (f"sweeps/{value}.yaml", OVERRIDES, "sweep file"),
            (value, (), "sweep file"),
            (SWEEP_FILE, (f"train.note={value}", *OVERRIDES), "override 1"),
            (SWEEP_FILE, (value,), "override 1"),
        ]
        for sweep_file, overrides, what in cases:
            text = _render(name, _parsed(name, sweep_file, overrides), what)
            if text is not None:
                check_well_formed(name, text)
                check_sweep_command(name, text, sweep_file, overrides)


def _text_options(name: str) -> list[argparse.Action]:
    """The options that take any text (not numbers, flags or choices)."""
    return [
        action
        for action in options(name)
        if action.nargs is None and action.type in (None, str) and not action.choices
    ]


def check_hostile_options(name: str) -> None:
    """Each text option with each hostile value: refused naming the option, or a well-formed
    file with the sweep command intact and the shape of a plain value's render."""
    runs_sweep = LAUNCHERS.get(name).runs_sweep
    for action in _text_options(name):
        flag = action.option_strings[0]
        append = isinstance(action.default, list)  # action="append": a list of values
        plain = _parsed(name)
        setattr(plain, action.dest, ["plain"] if append else "plain")
        plain_text = _render(name, plain, flag)
        plain_shape = check_well_formed(name, plain_text) if plain_text is not None else None
        for value in HOSTILE:
            args = _parsed(name)
            setattr(args, action.dest, [value] if append else value)
            text = _render(name, args, flag)
            if text is None:
                continue
            shape = check_well_formed(name, text)
            if plain_shape is not None:
                assert shape == plain_shape, _where(
                    name, f"{flag}={value!r} changes the file's shape (a line, key or document)"
                )
            if runs_sweep:
                check_sweep_command(name, text, SWEEP_FILE, OVERRIDES)


def check_launcher(name: str) -> None:
    """Every contract check on the launch target registered as ``name``."""
    check_declared(name)
    check_default_render(name)
    check_hostile_sweep_arguments(name)
    check_hostile_options(name)
