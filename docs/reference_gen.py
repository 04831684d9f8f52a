"""The generated parts of the documentation, from the code's public names.

``docs/hooks.py`` (an MkDocs hook) replaces each ``<!-- generated: NAME -->`` line of a page with
``GENERATORS[NAME]()``, so the reference pages say what the code says on every build:

- ``sweep-file``, ``model-settings``, ``data-settings``, ``train-settings``, ``hpo-file``: the
  typed config's fields (``fusion_ray.config.SweepSpec`` and the models it nests,
  ``fusion_ray.model.ModelSpec``, ``fusion_ray.data.DataSpec``, ``fusion_ray.train.TrainSpec``,
  ``fusion_ray.hpo.TuneSection``), walked through pydantic's JSON schema: type, default,
  constraints and the field's docstring;
- ``mlflow-schema``: every name of ``fusion_ray.schema`` with the comment or docstring beside it;
- ``cli``: ``--help`` of every ``fusion-ray`` command;
- ``registries``: ``fusion_ray.cli.list_entries()``, and per registry entry its options (the
  launch targets: their command-line options).

Only public names are imported (never file paths), so the generator does not depend on how a
package is split into modules. ``tests/docs/test_docs_reference.py`` checks that every field, schema
name, command and registry entry reaches the output.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import typing
from collections.abc import Callable
from typing import Any

CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} item(s)",
    "maxItems": "at most {} item(s)",
    "pattern": "matches `{}`",
}


def _cell(text: Any) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type_text(s) for s in schema["anyOf"])
    if "const" in schema:
        return f"`{_yaml(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{_yaml(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type_text(schema.get('items', {}))}"
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"mapping of name to {_type_text(values)}"
        return "mapping (extra keys allowed)" if values is True else "mapping"
    return {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}.get(
        kind, kind or "any"
    )


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (dict, list, tuple)):  # YAML flow style (JSON is valid YAML)
        return json.dumps(value, default=str)
    return repr(value)


def _constraints(schema: dict[str, Any]) -> str:
    parts = [text.format(schema[key]) for key, text in CONSTRAINTS.items() if key in schema]
    for option in schema.get("anyOf", []):
        parts += [text.format(option[key]) for key, text in CONSTRAINTS.items() if key in option]
    return "; ".join(parts)


def _defaults(cls: type) -> dict[str, Any]:
    """Each field's default as the file would write it (factories called); required: absent."""
    out: dict[str, Any] = {}
    if hasattr(cls, "model_fields"):
        for name, info in cls.model_fields.items():
            if not info.is_required():
                out[name] = info.get_default(call_default_factory=True)
    elif dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out


def nested_classes(cls: type, seen: dict[str, type]) -> dict[str, type]:
    """``cls`` and every model or dataclass its fields' annotations name, by class name."""
    if cls.__name__ in seen:
        return seen
    seen[cls.__name__] = cls
    hints = typing.get_type_hints(cls, include_extras=True)
    names = cls.model_fields if hasattr(cls, "model_fields") else hints
    for name in names:
        stack = [hints.get(name)]
        while stack:
            hint = stack.pop()
            if inspect.isclass(hint) and (
                hasattr(hint, "model_fields") or dataclasses.is_dataclass(hint)
            ):
                nested_classes(hint, seen)
            stack += list(typing.get_args(hint))
    return seen


def _default_text(defaults: dict[str, Any], name: str, required: bool) -> str:
    if required:
        return "**required**"
    value = defaults.get(name)
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    return f"`{_yaml(value)}`"


def _description(field: dict[str, Any], classes: dict[str, type]) -> str:
    """The field's docstring; for a field without one that holds a model, the model's."""
    if field.get("description"):
        return field["description"]
    refs = [field, *field.get("anyOf", []), field.get("items", {})]
    for ref in (r["$ref"].rsplit("/", 1)[-1] for r in refs if "$ref" in r):
        if ref in classes:
            return _first_paragraph(classes[ref])
    return ""


def model_table(schema: dict[str, Any], cls: type | None, classes: dict[str, type]) -> str:
    """One Markdown table: field, type, default, constraints, description."""
    defaults = _defaults(cls) if cls is not None else {}
    required = set(schema.get("required", []))
    rows = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, field in schema.get("properties", {}).items():
        rows.append(
            "| "
            + " | ".join(
                [
                    f"`{name}`",
                    _cell(_type_text(field)),
                    _cell(_default_text(defaults, name, name in required)),
                    _cell(_constraints(field)),
                    _cell(_description(field, classes)),
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def _schema(cls: type) -> dict[str, Any]:
    if hasattr(cls, "model_json_schema"):
        return cls.model_json_schema()
    from pydantic import TypeAdapter

    return TypeAdapter(cls).json_schema()


def models_reference(root: type, where: str, skip: tuple[str, ...] = ()) -> str:
    """``root``'s fields, then one section per model it nests (in order of first mention);
    each section's heading is the class name, so ``[Name](#name)`` links to it."""
    schema = _schema(root)
    classes = nested_classes(root, {})
    intro = f"{where}. {_first_paragraph(root)}"
    parts = [f"### {root.__name__}", "", intro, "", model_table(schema, root, classes)]
    for name, sub in schema.get("$defs", {}).items():
        if name in skip:
            continue
        cls = classes.get(name)
        doc = _first_paragraph(cls) if cls is not None else sub.get("description", "")
        parts += ["", f"### {name}", "", doc, "", model_table(sub, cls, classes)]
    return "\n".join(parts) + "\n"


def _first_paragraph(cls: type) -> str:
    return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())


def sweep_file() -> str:
    from fusion_ray.config import SweepSpec

    return models_reference(SweepSpec, "The whole file", skip=("DataSpec",))


def _settings(module: str, name: str, where: str, skip=()) -> Callable[[], str]:
    def generate() -> str:
        return models_reference(getattr(importlib.import_module(module), name), where, skip)

    return generate


def _module_comments(module: Any) -> dict[str, str]:
    """name -> the ``#:`` comment above it or the docstring below it, for each constant."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    body = ast.parse(source).body
    out: dict[str, str] = {}
    for i, node in enumerate(body):
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        comment, j = [], node.lineno - 2
        while j >= 0 and lines[j].lstrip().startswith("#:"):
            comment.insert(0, lines[j].lstrip()[2:].strip())
            j -= 1
        following = body[i + 1] if i + 1 < len(body) else None
        if not comment and isinstance(following, ast.Expr):
            value = following.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                comment = [value.value]
        out[node.targets[0].id] = " ".join(" ".join(comment).split())
    return out


def mlflow_schema() -> str:
    """Every public name of ``fusion_ray.schema``: its value and what it means."""
    from fusion_ray import schema

    comments = _module_comments(schema)
    rows = ["| name | value | meaning |", "|---|---|---|"]
    for name, value in vars(schema).items():
        if name.startswith("_") or not name.isupper():
            continue
        shown = ", ".join(f"`{v}`" for v in value) if isinstance(value, tuple) else f"`{value}`"
        if isinstance(value, dict):
            shown = ", ".join(f"`{k}`: {v}" for k, v in value.items())
        rows.append(f"| `{name}` | {_cell(shown)} | {_cell(comments.get(name, ''))} |")
    doc = inspect.getdoc(schema.axis_text) or ""
    rows += ["", f"`axis_text(value)`: {' '.join(doc.split())}"]
    return "\n".join(rows) + "\n"


def _help(module: str, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        importlib.import_module(module).main(argv)
    return out.getvalue().rstrip()


def cli() -> str:
    """``--help`` of every ``fusion-ray`` command (argparse at 100 columns)."""
    from fusion_ray.cli import COMMANDS

    os.environ["COLUMNS"] = "100"
    parts = []
    for name, (module, summary) in COMMANDS.items():
        parts += [f"### `fusion-ray {name}`", "", f"{summary[0].upper()}{summary[1:]}.", ""]
        if name == "list":
            parts += ["No options: see [Registry entries](registries.md) for its output.", ""]
            continue
        argvs = [["--help"]]
        if name == "cluster":
            from fusion_ray.launch import LAUNCHERS

            argvs += [[target, "--help"] for target in LAUNCHERS.names()]
        for argv in argvs:
            parts += ["```text", _help(module, argv), "```", ""]
    return "\n".join(parts)


def launch_targets() -> list[str]:
    """The launch targets' table: name, origin, what the file is, its options."""
    from fusion_ray.launch import LAUNCHERS, options

    parts = ["### Launch targets", "", f"Entry-point group `{LAUNCHERS.group}`; "]
    parts[-1] += "`fusion-ray cluster NAME --help` shows a target's options with their help."
    parts += ["", "| name | from | what it prints | options |", "|---|---|---|---|"]
    for name in LAUNCHERS.names():
        flags = ", ".join(f"`{action.option_strings[0]}`" for action in options(name))
        row = [f"`{name}`", LAUNCHERS.origin(name), _first_paragraph(LAUNCHERS.get(name))]
        parts.append("| " + " | ".join(_cell(c) for c in [*row, flags or "none"]) + " |")
    return [*parts, ""]


def registries() -> str:
    """Each registry's entries: name, origin, options with their defaults, and the first line
    of the entry's docstring; then ``fusion-ray list`` verbatim."""
    from analysis.stats import PLUGIN_GROUP, origin, statistics
    from fusion_ray.cli import list_entries
    from fusion_ray.cli import registries as named
    from fusion_ray.decide.rules import RULES

    parts = []
    for title, registry in {**named(), "decision rules": RULES}.items():
        heading = title.replace("_", " ").capitalize()
        parts += [f"### {heading}", "", f"Entry-point group `{registry.group}`.", ""]
        parts += ["| name | from | options | what it is |", "|---|---|---|---|"]
        for name in registry.names():
            options = ", ".join(
                f"`{p.name}`" + ("" if p.default is p.empty else f" = `{_yaml(p.default)}`")
                for p in registry.user_kwargs(name).values()
            )
            doc = _first_paragraph(registry.get(name))
            alias = registry.same_as(name)
            doc = f"the same model as `{alias}`. {doc}" if alias else doc
            row = [f"`{name}`", registry.origin(name), options or "none", doc]
            parts.append("| " + " | ".join(_cell(c) for c in row) + " |")
        parts.append("")
    parts += ["### Report statistics", "", f"Entry-point group `{PLUGIN_GROUP}`.", ""]
    parts += ["| name | from | stats.csv columns |", "|---|---|---|"]
    for stat in statistics():
        columns = ", ".join(f"`{c}`" for c in (*stat.columns, *stat.family_columns))
        parts.append(f"| `{stat.name}` | {origin(stat.name)} | {columns} |")
    parts += ["", *launch_targets()]
    parts += ["### `fusion-ray list`", "", "```text", list_entries(), "```", ""]
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "sweep-file": sweep_file,
    "model-settings": _settings(
        "fusion_ray.model", "ModelSpec", "`model:` under `defaults:` or a dataset preset"
    ),
    "data-settings": _settings("fusion_ray.data", "DataSpec", "`data:` of a dataset preset"),
    "train-settings": _settings(
        "fusion_ray.train", "TrainSpec", "`train:` under `defaults:` or a dataset preset"
    ),
    "hpo-file": _settings(
        "fusion_ray.hpo", "TuneSection", "`tune:` of an HPO file", skip=("Named",)
    ),
    "mlflow-schema": mlflow_schema,
    "cli": cli,
    "registries": registries,
}
