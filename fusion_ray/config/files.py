"""Sweep files on disk: reading YAML safely (unique keys, size limits, ``${VAR}`` expansion,
``extends:`` fragments), ``key=value`` overrides as edits of the file, validation as a whole
(``load_sweep``: every problem at once, before Ray starts) and the smoke version of a sweep.
"""

from __future__ import annotations

import collections
import collections.abc
import copy
import errno
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from fusion_ray.checks import shorten, shorten_runs
from fusion_ray.config.combinations import deep_merge, set_dotted
from fusion_ray.config.messages import key_lines, line_suffix
from fusion_ray.config.names import name_problems
from fusion_ray.config.spec import SweepSpec, error_lines
from fusion_ray.config.trainable import TrainableSweep, trainable_sweep_problems
from fusion_ray.redact import redact

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in strings (for storage paths and URIs)."""
    if isinstance(value, str):

        def sub(m: re.Match) -> str:
            if m.group(1) in os.environ:
                return os.environ[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ValueError(f"environment variable {m.group(1)} is not set")

        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v) for v in value]
    return value


class SweepFileError(ValueError):
    """A sweep file with problems; the message lists every one as ``file:line: field: problem``
    (the line of the key the problem names, where the file has it), with no credential in it (a
    refused tracking URI's password is shown as ``***``)."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.path = shorten(redact(str(path)), 200)
        self.problems = [shorten_runs(redact(p)) for p in problems]
        lines_of = key_lines(path, MAX_FILE_BYTES, MAX_VALUES)
        lines = "\n".join(f"  {self.path}{line_suffix(p, lines_of)}: {p}" for p in self.problems)
        super().__init__(f"{len(problems)} problem(s) in sweep file {self.path}:\n{lines}")


MAX_FILE_BYTES = 1 << 20
"""A sweep file or fragment larger than this is refused (real ones are a few kilobytes)."""
MAX_VALUES = 100_000
"""The most values a file may hold once YAML aliases are expanded (an alias bomb has billions)."""
MAX_INT_CHARS = 100
"""An integer written with more characters than this is kept as the text it is, so the field it
is written for refuses it by name (Python would refuse to convert one of over 4,300 digits, and
a hexadecimal one has no such limit at all)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML would silently keep
    the last, so an edited value could be overridden by a forgotten one further down)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges a mapping in; the keys written here win
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, collections.abc.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping, on lines {seen[key]} and {line}; "
                    "keep one of them",
                    key_node.start_mark,
                )
            if isinstance(key, collections.abc.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    # Not overrides of construct_yaml_int/float (which return numbers only): registered for
    # the int and float tags below in their place.
    def _construct_int(self, node: yaml.ScalarNode) -> int | str:
        text = self.construct_scalar(node)
        if len(text) > MAX_INT_CHARS:
            return text  # no setting takes such a number: its field refuses the text, named
        if ":" in text:
            return text  # YAML 1.1's base 60 (1:30 is 90): kept as written, refused by name
        return super().construct_yaml_int(node)

    def _construct_float(self, node: yaml.ScalarNode) -> float | str:
        text = self.construct_scalar(node)
        if ":" in text:
            return text  # YAML 1.1's base 60 (1:30.5 is 90.5)
        return super().construct_yaml_float(node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader._construct_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _UniqueKeyLoader._construct_float)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one problem: where (line and column, 1-based), what, and the fix for
    the usual causes (the file's name is the problem's prefix)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = "; ".join(x for x in (exc.context, exc.problem) if x)
        text = f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    else:
        text = str(exc)
    if "character '\\t'" in text or "'\\t'" in str(exc):
        text += " (indent with spaces: YAML does not allow tabs for indentation)"
    return f"not valid YAML: {text}"


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no file a sweep can be read from (a folder, a FIFO or device, a loop of
    links, a name too long), or None; FileNotFoundError when nothing is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(
            f"sweep file {shorten(str(path))} does not exist; see sweeps/ for examples"
        ) from None
    except OSError as exc:  # ELOOP, ENAMETOOLONG, EACCES, ENOTDIR ...
        what: dict[int | None, str] = {
            errno.ELOOP: "a loop of symbolic links",
            errno.ENAMETOOLONG: "a name too long",
        }
        return f"cannot be read: {what.get(exc.errno, exc.strerror or str(exc))}; give a sweep file's path"
    if stat.S_ISDIR(mode):
        return "is a folder, not a sweep file; give a .yaml file (see sweeps/ for examples)"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a FIFO, socket or device); give a .yaml file"
    return None


def _read_yaml(path: Path) -> dict[str, Any]:
    problem = _not_a_file(path)
    if problem:
        raise SweepFileError(path, [problem])
    data = path.read_bytes()
    if len(data) > MAX_FILE_BYTES:
        raise SweepFileError(
            path, [f"the file is {len(data):,} bytes; a sweep file has at most {MAX_FILE_BYTES:,}"]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SweepFileError(
            path,
            [
                f"not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); save it as UTF-8"
            ],
        ) from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise SweepFileError(path, [_yaml_problem(exc)]) from exc
    except RecursionError:
        raise SweepFileError(path, ["the YAML is nested too deeply"]) from None
    problem = _size_problem(raw)
    if problem:
        raise SweepFileError(path, [problem])
    if not isinstance(raw, dict):
        raise SweepFileError(path, ["top level must be a mapping with name, seeds, grid, datasets"])
    return raw


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A sweep-shaped YAML file's top-level mapping, read with the limits of a sweep file (size,
    aliases, unique keys, long numbers); ``SweepFileError`` or ``FileNotFoundError`` saying why
    it cannot be."""
    return _read_yaml(Path(path))


def _size_problem(value: Any) -> str | None:
    """Why a loaded YAML value cannot be used: it contains itself (a self-referencing alias), or
    it expands to more than MAX_VALUES values (aliases repeating large blocks)."""
    count, on_path = 0, set()

    def walk(node: Any) -> str | None:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            return f"the file expands to more than {MAX_VALUES:,} values (YAML aliases repeating large blocks); write the values out"
        if not isinstance(node, (dict, list)):
            return None
        if id(node) in on_path:
            return "a YAML alias refers to a block that contains it; a sweep file must be a tree"
        on_path.add(id(node))
        children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        problem = next((p for p in map(walk, children) if p), None)
        on_path.discard(id(node))
        return problem

    return walk(value)


def read_sweep_dict(path: str | Path) -> dict[str, Any]:
    """The sweep file with its ``extends:`` fragments merged under it and ``${VAR}`` expanded."""
    path = Path(path)
    raw = _read_yaml(path)
    merged: dict[str, Any] = {}
    fragments = raw.get("extends", []) or []
    if not isinstance(fragments, list) or not all(
        isinstance(f, str) and f and "\0" not in f for f in fragments
    ):
        raise SweepFileError(
            path,
            [
                f"extends: {shorten(repr(fragments))} is not a list of file paths; write "
                "extends: [tuned/shared.yaml, ...] (paths relative to this file)"
            ],
        )
    for fragment in fragments:
        try:
            fragment_path = (path.parent / fragment).resolve()
            found = fragment_path.is_file()
        except (OSError, RuntimeError) as exc:  # a name too long, a loop of links, ...
            fragment_path, found = Path(shorten(fragment)), False
            fragment = f"{shorten(fragment)} ({getattr(exc, 'strerror', None) or exc})"
        if not found:
            raise SweepFileError(
                path,
                [
                    f"extends: fragment {shorten(repr(fragment))} not found at "
                    f"{shorten(str(fragment_path))}; fix the path or run the phase that writes it"
                ],
            )
        try:
            found_raw = _read_yaml(fragment_path)
        except SweepFileError as exc:  # named by the key that brought it in
            name = shorten(repr(fragment))
            raise SweepFileError(path, [f"extends: {name}: {p}" for p in exc.problems]) from None
        if "extends" in found_raw:
            raise SweepFileError(
                path,
                [
                    f"extends: {shorten(repr(fragment))} has an extends: of its own, which "
                    "would not be read (fragments do not extend others); list its fragments "
                    "in this file's extends: before it, and remove them from the fragment"
                ],
            )
        merged = deep_merge(merged, found_raw)
    merged = deep_merge(merged, raw)
    try:
        return _expand_env(merged)
    except ValueError as exc:
        raise SweepFileError(
            path, [f"{exc}; export it or give a default as ${{VAR:-default}}"]
        ) from exc


def validate_collecting(model: type[BaseModel], raw: dict[str, Any]) -> tuple[Any, list[str]]:
    """``raw`` validated as ``model``, collecting every schema problem: after each failed attempt
    the offending values are dropped (their defaults apply) and the rest is validated again, so
    one bad value does not hide the others. Returns (the model or None, the problems)."""
    problems: list[str] = []
    reported: set[tuple] = set()  # a dropped bad value is then "missing": say it once
    attempt = copy.deepcopy(raw)
    for _ in range(8):
        try:
            return model.model_validate(attempt), problems
        except ValidationError as exc:
            fresh = [e for e in exc.errors() if not _after_a_drop(e, reported)]
            reported |= {e["loc"] for e in exc.errors()}
            problems += [p for p in error_lines(fresh, model) if p not in problems]
            if not _drop_invalid(attempt, exc):
                break
    return None, problems


def _after_a_drop(err: Any, reported: set[tuple]) -> bool:
    """An error that only says a value reported before was dropped: the value now missing, or a
    list left empty by dropping its bad items."""
    loc = err["loc"]
    if err["type"] == "missing":
        return loc in reported
    return err["type"] == "too_short" and any(r[: len(loc)] == loc != r for r in reported)


def validate_sweep_dict(raw: dict[str, Any]) -> tuple[SweepSpec | None, list[str]]:
    """Schema, then semantics, of a sweep-shaped mapping: the spec (None if the schema never
    validates) and every problem found."""
    spec, problems = validate_collecting(SweepSpec, raw)
    if spec is not None:
        # lazy: the rules check names against the model registries, which import torch (~1.3 s):
        # reading a file and its schema's problems stay fast
        from fusion_ray.config.rules import semantic_problems

        problems += semantic_problems(spec)
    return spec, problems


TRAINABLE_FILE = (
    "trainable: this file names a trainable ({name}): load it with fusion_ray.api.load (or "
    "config.workload.load_any), which reads either kind of sweep file"
)


def load_trainable_sweep(path: str | Path, overrides: Sequence[str] = ()) -> TrainableSweep:
    """Read and validate a trainable sweep file, with ``key=value`` overrides applied as edits;
    raises ``SweepFileError`` listing every problem (nothing is imported: the trainable's name
    is checked against the installed ones)."""
    raw = apply_overrides(read_sweep_dict(path), overrides, path)
    spec, problems = validate_trainable_dict(raw)
    if spec is None or problems:
        raise SweepFileError(path, problems)
    return spec


def validate_trainable_dict(raw: dict[str, Any]) -> tuple[TrainableSweep | None, list[str]]:
    """Schema, then semantics (``trainable_sweep_problems``), of a trainable's sweep mapping:
    the spec (None if the schema never validates) and every problem found."""
    spec, problems = validate_collecting(TrainableSweep, raw)
    if spec is not None and not problems:
        problems = trainable_sweep_problems(spec)
    return spec, problems


def refuse_trainable_file(path: str | Path, raw: dict[str, Any]) -> None:
    """A trainable sweep file (``trainable: NAME``) given where the study's is read: refused
    with its own problems, or, when it has none, with where it is read (never with the study's
    keys it does not have)."""
    if "trainable" in raw:
        problems = validate_trainable_dict(raw)[1]
        raise SweepFileError(path, problems or [TRAINABLE_FILE.format(name=raw["trainable"])])


def check_file_shape(path: str | Path, overrides: Sequence[str] = ()) -> None:
    """The file's own problems, which need no registry's code: it exists and is YAML of the
    sweep file's keys and types (with ``overrides`` applied), and the registry names it selects
    exist (``config.names``). Raises ``SweepFileError`` listing every one; a clean file then
    gets the full check (``load_sweep``). Imports neither torch, Ray nor MLflow, so a mistyped
    path, key or name is said at once."""
    original = read_sweep_dict(path)
    raw = apply_overrides(original, overrides, path)
    if "trainable" in raw:  # a trainable's sweep: its own schema (nothing of it is imported)
        problems = validate_trainable_dict(raw)[1]
        if problems:
            raise SweepFileError(path, problems)
        return
    spec, problems = validate_collecting(SweepSpec, raw)
    if spec is not None and not problems:
        problems = name_problems(spec)
    if problems:
        if overrides:
            problems = blame_overrides(problems, _shape_problems(original), overrides)
        raise SweepFileError(path, problems)


def _shape_problems(raw: dict[str, Any]) -> list[str]:
    """``check_file_shape``'s problems of a mapping: its schema's, then its registry names'."""
    spec, problems = validate_collecting(SweepSpec, raw)
    return name_problems(spec) if spec is not None and not problems else problems


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read and fully validate a sweep file, with command-line ``overrides`` (``key=value``)
    applied as edits of the file; raises ``SweepFileError`` listing every problem, a problem
    that only the overrides bring named by the override (``override train.lrr=3: ...``)."""
    original = read_sweep_dict(path)
    raw = apply_overrides(original, overrides, path)
    refuse_trainable_file(path, raw)
    spec, problems = validate_sweep_dict(raw)
    if problems or spec is None:
        if overrides:
            problems = blame_overrides(problems, validate_sweep_dict(original)[1], overrides)
        raise SweepFileError(path, problems)
    return spec


def blame_overrides(
    problems: list[str], the_files: list[str], overrides: Sequence[str]
) -> list[str]:
    """``problems`` with each one the file alone does not have named by the override whose key
    it mentions (``override train.lrr=3: unknown key ...``), and a preset-wide override's
    problem said once rather than once per dataset preset."""
    out: list[str] = []
    for problem in problems:
        if problem in the_files:
            out.append(problem)
            continue
        blamed = _blamed(problem, overrides)
        if blamed is None:
            out.append(problem)
            continue
        override, rest = blamed
        text = f"override {override}: {rest}"
        if text not in out:
            out.append(text)
    return out


def _blamed(problem: str, overrides: Sequence[str]) -> tuple[str, str] | None:
    """(the override, the problem without its location) for the override whose key the
    problem's location ends with (``datasets.short.train.lrr: ...`` for ``train.lrr=3``)."""
    where, sep, rest = problem.partition(": ")
    if not sep:
        return None
    for override in overrides:
        key = override.partition("=")[0]
        if where == key or where.endswith("." + key):
            return override, f"{key}: {rest}"
    return None


#: Sections that a ``data.X=``, ``model.X=`` or ``train.X=`` override sets in every dataset preset.
PRESET_SECTIONS = ("data", "model", "train")


def _override_key_problem(override: str, key: str, sep: str) -> str | None:
    """Why an override's key edits nothing: no ``=``, no dotted key, or ``extends``, which is
    read with the file, before any override applies."""
    if not sep or not _DOTTED_KEY.fullmatch(key):
        return f"override {override!r}: write key=value with a dotted key, e.g. train.epochs=3"
    if key.split(".", 1)[0] == "extends":
        return (
            f"override {shorten(override)}: extends: is read with the file, before any "
            "override applies; write the fragments in the file's extends: list"
        )
    return None


def apply_overrides(
    raw: dict[str, Any], overrides: Sequence[str], path: str | Path
) -> dict[str, Any]:
    """The sweep file's mapping with each ``key=value`` override applied as an edit of the file:
    ``key`` is a dotted path into the file (``seeds=[0,1]``, ``resources.workers=2``,
    ``datasets.short.data.max_length=64``), and ``data.X``, ``model.X``, ``train.X`` set X in
    every dataset's preset (as editing each preset would); ``value`` is read as YAML."""
    out = copy.deepcopy(raw)
    problems = []
    for override in overrides:
        key, sep, text = override.partition("=")
        problem = _override_key_problem(override, key, sep)
        if problem:
            problems.append(problem)
            continue
        try:
            value = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            problems.append(f"override {override!r}: the value is not valid YAML ({exc})")
            continue
        except RecursionError:
            problems.append(f"override {key}=...: the value is nested too deeply")
            continue
        too_big = _size_problem(value)
        if too_big:
            problems.append(f"override {key}=...: {too_big}")
            continue
        section = key.split(".", 1)[0]
        if section in PRESET_SECTIONS and "." in key:
            for preset in (out.get("datasets") or {}).values():
                if isinstance(preset, dict):
                    set_dotted(preset, key, value)
        else:
            set_dotted(out, key, value)
    if problems:
        raise SweepFileError(path, problems)
    return out


_DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


def _drop_invalid(raw: dict[str, Any], exc: ValidationError) -> bool:
    """Remove each invalid value from ``raw`` (its default then applies); False when that cannot help."""
    changed = False
    for err in sorted(exc.errors(), key=lambda e: [str(x) for x in e["loc"]], reverse=True):
        loc = list(err["loc"])
        if err["type"] == "missing" or not loc:
            return False
        if loc == ["seeds"] and isinstance(raw.get("seeds"), list):
            valid = sorted({s for s in raw["seeds"] if isinstance(s, int) and s >= 0})
            raw["seeds"] = valid or [0]
            changed = True
            continue
        container: Any = raw
        for key in loc[:-1]:
            try:
                container = container[key]
            except (KeyError, IndexError, TypeError):
                container = None
                break
        if isinstance(container, dict) and loc[-1] in container:
            del container[loc[-1]]
            changed = True
        elif isinstance(container, list) and isinstance(loc[-1], int) and loc[-1] < len(container):
            del container[loc[-1]]
            changed = True
    return changed
