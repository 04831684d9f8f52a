"""Contract checks for launch targets (``fusion_ray.launch``, entry-point group
``fusion_ray.launchers``).

``check_launcher(name)`` runs every check below on the target registered as ``name`` and raises
``AssertionError`` naming the target and the check that failed; fusion-ray's own
``tests/fusion_ray/launch/test_launcher_contract.py`` runs it over every registered target,
plug-ins included. The checks run ``bash`` (``bash -n`` on a script; the script itself, and the
shell commands of a YAML file, with every command replaced by a recorder), so they need it on
PATH.

The checks:
- declared: the target is a ``LaunchTarget`` with a docstring and a one-line ``summary``, and
  every option it declares has a help text (``fusion-ray cluster NAME --help`` documents it);
  every one of its ``code_options`` is one of its options;
- well-formed with its example options (``example_args``): printable text; a shell script
  starts with ``#!``, passes ``bash -n`` and has only comment lines above its last directive
  line (so it runs nothing before the scheduler has read them); YAML loads as exactly
  ``documents`` mappings;
- the sweep command, for a target that ``runs_sweep``: the file holds ``python -m
  fusion_ray.sweep`` followed by the sweep file and its edits, each one word with its exact text
  (bash reads them back, and the file run with every command recorded calls it so), with
  default and with hostile values (quotes, newlines, ``$(...)``, backquotes, spaces, ``#``,
  ``---``, Unicode line separators) in the sweep file and the edits;
- hostile values in every option that takes a value, whatever its type, as given and as the
  end of a path (each value goes through the option's own ``type`` as argparse would; a value
  the type refuses is refused):
  each is refused with a ``ValueError`` naming the option, or the output is well-formed, keeps
  the sweep command's words, and has the shape of the same render with a plain value (as many
  lines for a script; the same keys and list lengths for YAML), so the value added no line, key
  or document;
- literal arrival: the file is run (a script; a YAML file's shell commands) by bash in an empty
  folder with ``example_environment``, an empty ``PATH`` and every command it calls (``cd``,
  ``exec`` and ``test`` too) replaced by a recorder of its words (a YAML file's strings under the target's
  ``shell_keys``, each in a subshell). A hostile value of any option but the
  ``code_options`` never runs a command of its own (the values carry ``$(fusion_ray_probe)``,
  backquotes, ``;``, ``&&``, ``|``, quotes and line breaks around one), and reaches the file as
  the exact text given: a word of a recorded command, of a directive line or (YAML) a string
  holds it whole (a ``--flag=VALUE``, a path under it, a line written to a file).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from fusion_ray.launch import LAUNCHERS, LaunchTarget, options, target_parser
from fusion_ray.launch.shell import shell_join, shell_word

SWEEP_FILE = "sweeps/quickstart.yaml"
OVERRIDES = ("train.epochs=3", "seeds=[0,1]")
PROBE = "fusion_ray_probe"
"""A command no system has: a value that makes the file call it ran as code."""
#: What broke renderers before: a value ending a comment or a line, a word, a document or a key,
#: or running as code.
HOSTILE = (
    "two words",
    "it's",
    'say "hi"',
    f"$({PROBE})",
    f"`{PROBE}`",
    "line\nbreak",
    f"line\n{PROBE}",
    "carriage\rreturn",
    f"semi;colon && {PROBE}",
    f"x|{PROBE}",
    f"x'; {PROBE}; '",
    f'x"; {PROBE}; "',
    "# a comment",
    "back\\slash",
    "line\u2028separator",
    "next\x85line",
    "---",
    "-starts-with-a-dash",
    "tab\there",
    "{a: [b]}",
    "${HOME}",
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
    flags = {f for action in options(name) for f in action.option_strings}
    for action in options(name):
        flag = action.option_strings[0]
        assert (action.help or "").strip(), _where(name, f"option {flag} has no help text")
        assert flag in help_text, _where(name, f"{flag} is not in --help")
    for flag in target.code_options:
        assert flag in flags, _where(name, f"code_options names {flag}, which is no option")


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


def _shell_strings(name: str, text: str) -> list[str]:
    """A YAML file's strings under its target's ``shell_keys`` (what a shell runs)."""
    keys = set(LAUNCHERS.get(name).shell_keys)

    def under(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [
                s
                for key, item in value.items()
                for s in (_strings(item) if key in keys else under(item))
            ]
        if isinstance(value, list):
            return [s for item in value for s in under(item)]
        return []

    return [s for document in yaml.safe_load_all(text) for s in under(document)]


def _recorded_yaml(name: str, text: str) -> list[list[str]]:
    """The commands a YAML file's shell strings call, each run in a subshell of its own."""
    strings = _shell_strings(name, text)
    if not strings:
        return []
    script = "\n".join(f"( eval -- {shell_word(s)} )" for s in strings) + "\n"
    return run_recorded(name, script)


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
                check_sweep_arrival(name, text, sweep_file, overrides)


def check_sweep_arrival(name: str, text: str, sweep_file: str, overrides) -> None:
    """Run (every command recorded), the file calls ``python -m fusion_ray.sweep`` with the
    sweep file and its edits as its next words, exactly, and calls nothing a value put there."""
    target = LAUNCHERS.get(name)
    if target.output == "shell":
        calls = run_recorded(name, text)
    else:
        calls = _recorded_yaml(name, text)
    ran = [call for call in calls if call and PROBE in call[0]]
    assert not ran, _where(name, f"the sweep file or an edit runs a command: {ran[0]!r}")
    expected = [sweep_file, *overrides]
    sweeps = [call[3:] for call in calls if call[:3] == ["python", "-m", "fusion_ray.sweep"]]
    assert sweeps, _where(name, f"run, the file never calls {MARK} (commands: {calls[:8]!r})")
    for words in sweeps:
        assert words[: len(expected)] == expected, _where(
            name, f"run, the file calls {MARK} with {words!r}, expected {expected!r} first"
        )


def _valued_options(name: str) -> list[argparse.Action]:
    """The options that take a value (any type; not flags)."""
    return [action for action in options(name) if action.nargs != 0]


def _converted(action: argparse.Action, value: str) -> Any:
    """``value`` as argparse hands it to the target (through the option's ``type``, in a list
    for an option given many times or taking many values), or None when argparse refuses it."""
    convert = action.type if callable(action.type) else str
    try:
        parsed = convert(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return None
    if action.choices is not None and parsed not in action.choices:
        return None
    many = isinstance(action.default, list) or action.nargs in ("*", "+")
    return [parsed] if many else parsed


def check_hostile_options(name: str) -> None:
    """Each option that takes a value with each hostile value: refused (by its type or by the
    target, naming the option), or a well-formed file with the sweep command intact, the shape
    of a plain value's render, and (but for ``code_options``) the value arrived literally and
    ran nothing."""
    target = LAUNCHERS.get(name)
    for action in _valued_options(name):
        flag = action.option_strings[0]
        plain_value = _converted(action, "plain")
        plain_shape = None
        if plain_value is not None:
            plain = _parsed(name)
            setattr(plain, action.dest, plain_value)
            plain_text = _render(name, plain, flag)
            plain_shape = check_well_formed(name, plain_text) if plain_text is not None else None
        for value in (*HOSTILE, *(f"/srv/{v}" for v in HOSTILE)):  # as it is, and as a path
            converted = _converted(action, value)
            if converted is None:
                continue
            args = _parsed(name)
            setattr(args, action.dest, converted)
            text = _render(name, args, flag)
            if text is None:
                continue
            shape = check_well_formed(name, text)
            if plain_shape is not None:
                assert shape == plain_shape, _where(
                    name, f"{flag}={value!r} changes the file's shape (a line, key or document)"
                )
            if target.runs_sweep:
                check_sweep_command(name, text, SWEEP_FILE, OVERRIDES)
            if flag not in target.code_options:
                check_literal_arrival(name, text, flag, converted)


RECORDER = r"""
command_not_found_handle() { printf '%s\0' "$#" "$@" >> "$FUSION_RAY_CALLS"; return 0; }
cd() { command_not_found_handle cd "$@"; }
exec() { command_not_found_handle exec "$@"; }
test() { command_not_found_handle test "$@"; }
"""
"""Bash run before the file: a command found nowhere (``PATH`` is an empty folder) is recorded
with its words instead of run; ``cd``, ``exec`` and ``test`` too (they would leave the folder or
the shell, or skip a command whose words the check looks for)."""


_SSH_ARGUMENT_OPTIONS = set("BbcDEeFIiJLlmOoPpQRSWw")
"""ssh's options that take the next word as their argument."""


def _shell_carried(call: list[str]) -> tuple[str, list[str]] | None:
    """The shell code a recorded command hands to another shell, with its arguments: ``ssh
    [OPTIONS] [--] HOST WORDS...`` (the remote shell runs WORDS joined by spaces), or ``bash -c
    CODE NAME ARGS...`` (also ``sh``), anywhere in a command's words (after ``srun ...``)."""
    if call and call[0] == "ssh":
        at = 1
        while at < len(call) and call[at].startswith("-") and call[at] != "--":
            option = call[at]
            at += 2 if len(option) == 2 and option[1] in _SSH_ARGUMENT_OPTIONS else 1
        at += 1 if at < len(call) and call[at] == "--" else 0
        remote = call[at + 1 :]
        return (" ".join(remote), []) if remote else None
    for at, word in enumerate(call[:-2]):
        if word in ("bash", "sh") and call[at + 1] == "-c":
            return call[at + 2], call[at + 4 :]
    return None


def run_recorded(name: str, script: str, depth: int = 0) -> list[list[str]]:
    """The commands ``script`` calls, each as its words, when bash runs it in an empty folder
    with the target's ``example_environment`` and every command recorded instead of run; and
    the commands of the shell code those hand to another shell (``ssh HOST CODE``, ``bash -c
    CODE``), run the same way, three shells deep."""
    with tempfile.TemporaryDirectory(prefix="fusion-ray-contract-") as folder:
        root = Path(folder)
        (root / "bin").mkdir()
        (root / "home").mkdir()
        calls = root / "calls"
        calls.touch()
        path = root / "file.sh"
        path.write_bytes((RECORDER + script).encode("utf-8", "surrogateescape"))
        env = {
            **LAUNCHERS.get(name).example_environment,
            "PATH": str(root / "bin"),
            "HOME": str(root / "home"),
            "FUSION_RAY_CALLS": str(calls),
            "LC_ALL": "C.UTF-8",
        }
        try:
            subprocess.run(
                [_bash(), "--norc", "--noprofile", str(path)],
                cwd=root / "home", env=env, capture_output=True, timeout=60,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise AssertionError(
                _where(name, "the file ran for a minute with every command recorded")
            ) from None
        data = calls.read_bytes().decode("utf-8", "surrogateescape").split("\0")
    out, at = [], 0
    while at < len(data) - 1:
        count = int(data[at])
        out.append(data[at + 1 : at + 1 + count])
        at += 1 + count
    for call in list(out) if depth < 3 else []:
        carried = _shell_carried(call)
        if carried is not None:
            code, arguments = carried
            out += run_recorded(name, f"set -- {shell_join(arguments)}\n{code}\n", depth + 1)
    return out


def _arrived(value: str, words: list[str]) -> bool:
    """Whether a word holds ``value`` whole, as given (not split, quoted into other text, or
    cut short)."""
    return any(value in word for word in words)


def check_literal_arrival(name: str, text: str, flag: str, value: Any) -> None:
    """``value`` (of ``flag``, not a code option) ran no command of its own and reached the
    file as the exact text given (see the module's docstring)."""
    target = LAUNCHERS.get(name)
    values = [str(v) for v in (value if isinstance(value, list) else [value])]
    if target.output == "shell":
        calls = run_recorded(name, text)
        words = [word for call in calls for word in call]
        if target.directive:
            words += [
                word
                for line in text.split("\n")
                if line.startswith(target.directive)
                for word in line[len(target.directive) :].split()
            ]
    else:
        calls = _recorded_yaml(name, text)
        strings = [s for document in yaml.safe_load_all(text) for s in _strings(document)]
        words = strings + [word for call in calls for word in call]
    ran = [call for call in calls if call and PROBE in call[0]]
    assert not ran, _where(name, f"{flag}={values[0]!r} runs a command of its own: {ran[0]!r}")
    for one in values:
        assert _arrived(one, words), _where(
            name,
            f"{flag}={one!r} does not reach the file as the text given (no word of a command "
            "or directive, no string, holds it whole); quote it for the shell "
            "(fusion_ray.launch.shell.shell_word), or refuse it with a ValueError naming the "
            f"option; or, if it is shell code by design, list {flag} in code_options",
        )


def check_launcher(name: str) -> None:
    """Every contract check on the launch target registered as ``name``."""
    check_declared(name)
    check_default_render(name)
    check_hostile_sweep_arguments(name)
    check_hostile_options(name)
