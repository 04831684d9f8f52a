"""The sweep file: typed schema, loading and validation (every problem at once, before Ray starts).

A sweep file is YAML. Operators, positions, sources and tokenizers are chosen by registry name,
with options as keyword arguments (``{name: gate_cnn, kernel_size: 9}``); nothing in YAML is a
Python import path. ``extends:`` names YAML fragments (e.g. tuned settings written by ``sweeps/hpo.yaml``)
merged under the file itself.
"""

from __future__ import annotations

import collections
import collections.abc
import copy
import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from fusion_ray.checks import error_text, is_int, shorten, shorten_runs
from fusion_ray.data.spec import DataSpec
from fusion_ray.model.spec import ModelSpec
from fusion_ray.schema import axis_text
from fusion_ray.train.spec import TrainSpec, TrialConfig, train_rules

AXES = ("datasets", "positions", "attention_positions", "fusions")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Named(Strict):
    """A registry entry chosen by name, with keyword options (``gate_cnn`` or ``{name: gate_cnn, kernel_size: 9}``)."""

    model_config = ConfigDict(extra="allow")
    name: str

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def label(self) -> str:
        """The name alone, or ``name(k=v,...)`` when options are set (the MLflow ``fusion`` tag)."""
        if not self.kwargs:
            return self.name
        options = ",".join(f"{k}={v}" for k, v in sorted(self.kwargs.items()))
        return f"{self.name}({options})"


def bare_names(value: Any) -> Any:
    """Accept ``add`` as shorthand for ``{name: add}`` in a list of registry entries."""
    if not isinstance(value, list):
        return value
    return [{"name": v} if isinstance(v, str) else v for v in value]


class _Axes(Strict):
    """What the grid and its include sub-grids share: bare names accepted for registry entries,
    and any other key a setting axis."""

    # Any other key is a setting axis: a dotted setting with a list of values, e.g.
    # ``model.scale_embeddings: [true, false]`` (checked by ``_setting_axis_problems``).
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    @field_validator(
        "positions", "attention_positions", "fusions", mode="before", check_fields=False
    )
    @classmethod
    def _accept_bare_names(cls, value: Any) -> Any:
        return bare_names(value)

    @property
    def settings(self) -> dict[str, Any]:
        """The setting axes: dotted key -> list of values, in file order."""
        return dict(self.model_extra or {})


class Grid(_Axes):
    """The crossed factors. Every combination is a cell, repeated for every seed."""

    datasets: list[str] = Field(min_length=1)
    """Names of entries under ``datasets:``."""
    positions: list[Named] = Field(default_factory=lambda: [Named(name="sinusoidal")], min_length=1)
    """Input-level position signals (fusion_ray.model.POSITIONS)."""
    attention_positions: list[Named] = Field(
        default_factory=lambda: [Named(name="none")], min_length=1
    )
    """Attention-level positions (fusion_ray.model.ATTENTION_POSITIONS)."""
    fusions: list[Named] = Field(min_length=1)
    """Fusion operators (fusion_ray.model.FUSIONS); the first is the default baseline."""


class SubGrid(_Axes):
    """Extra cells beyond the grid (e.g. gate_cnn on arxiv only); axes left out take the grid's
    values. Setting axes of the grid may be narrowed too (``model.scale_embeddings: [true]``)."""

    datasets: list[str] | None = None
    positions: list[Named] | None = None
    attention_positions: list[Named] | None = None
    fusions: list[Named] | None = None


class Rule(Strict):
    """Selects cells: a cell matches when, for every axis given, its value is in the list
    (setting axes too: ``{fusions: [add], model.scale_embeddings: [false]}``)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    datasets: list[str] | None = None
    positions: list[str] | None = None
    attention_positions: list[str] | None = None
    fusions: list[str] | None = None
    """Operator names (or labels such as ``gate_cnn(kernel_size=9)``)."""

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


#: Train settings an override may set: how a step is computed, not what it computes (the same
#: batches, the same mean gradient up to round-off), so cells with and without them pair.
OVERRIDABLE_TRAIN = ("micro_batch_size", "eval_batch_size")


class Override(Strict):
    """Settings for the cells a rule selects, e.g. gradient accumulation where a method's memory
    needs it: ``{where: {attention_positions: [t5_bias]}, train: {micro_batch_size: 16}}``. Only
    settings that do not change what is computed (OVERRIDABLE_TRAIN); ``where`` may not name
    fusions, so every operator of a paired block gets the same value."""

    where: Rule
    train: dict[str, Any] = Field(min_length=1)


class Defaults(Strict):
    """Model and training settings shared by every dataset unless a preset overrides them."""

    model: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)


class Resources(Strict):
    """What each trial asks of the cluster."""

    workers: int = Field(1, ge=1)
    """Ray Train workers (DDP ranks) per trial; 1 runs the loop directly in the Tune trial."""
    use_gpu: bool = False
    """Train on GPUs (nccl for DDP); false trains on CPU (gloo)."""
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    """GPUs per worker; a fraction such as 0.25 packs four small trials on one card."""
    max_concurrent_trials: int | None = Field(None, ge=1)
    """Trials running at once; None lets the cluster's resources decide."""
    force_trainer: bool = False
    """Run one-worker trials through TorchTrainer too (normally they run directly in the Tune trial)."""
    driver_resource: str | None = None
    """A custom node resource, e.g. ``fusion_ray_driver`` on the head in cluster.yaml: each trial that
    runs a TorchTrainer takes 1 unit of it, so its Tune trial (which holds no CPU or GPU and runs
    Ray Train's controller) stays on the nodes that offer it. One-worker trials train inside their
    Tune trial and do not use it."""

    @field_validator("driver_resource")
    @classmethod
    def _custom_resource_name(cls, name: str | None) -> str | None:
        if name is not None and (
            name in ("CPU", "GPU", "memory", "object_store_memory")
            or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
        ):
            raise ValueError(
                "must name a custom resource (letters, digits, _), not CPU, GPU or memory; "
                "e.g. fusion_ray_driver, which cluster.yaml gives the head node"
            )
        return name


class DatasetPreset(Strict):
    """One dataset of the sweep with its own model and training preset (the study's per-dataset settings)."""

    data: DataSpec
    model: dict[str, Any] = Field(default_factory=dict)
    """Overrides of ``defaults.model`` for this dataset."""
    train: dict[str, Any] = Field(default_factory=dict)
    """Overrides of ``defaults.train`` for this dataset."""
    resources: Resources | None = None
    """Trial resources for this dataset's cells (e.g. DDP on long documents); None uses the sweep's."""


class AdaptiveSeeds(Strict):
    """Seeds decided by the evidence (``seeds: {adaptive: true, first: 6, max: 20}``): every cell
    runs seeds 0 .. first-1; after that a comparison's operator gets its next seed only while
    that comparison is undecided, up to ``max`` seeds (``fusion_ray.decide.sequential`` decides with the
    chosen rule, anytime-valid over the sweep's comparisons). Seeds are taken in the order 0, 1,
    2, ..., so cell ids and the pairing are those of a fixed list of the same seeds."""

    adaptive: Literal[True]
    """Marks the block (``true``); a fixed list of seeds is written as a list."""
    first: int = Field(6, ge=2)
    """Seeds every cell runs before any decision (the first wave)."""
    max: int = Field(20, ge=2, le=10_000)
    """The most seeds a comparison gets; undecided at this many, it is reported as undecided."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """The error level of every decision the sweep prints, over all its comparisons at every look
    (one budget for better, worse and equivalent with the magnitude rule)."""
    margin: float | None = Field(None, gt=0, le=100)
    """Equivalence margin in accuracy points: a comparison whose effect is shown to lie inside
    (-margin, +margin) is decided "equivalent"; None decides only better / worse / futile."""
    rule: str = "magnitude"
    """The decision rule (``fusion-ray list`` shows them): ``magnitude`` bets on the sizes of
    the paired deltas with one error budget for every decision; ``sign`` counts wins only."""
    rule_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the rule, e.g. ``{theta: 1.5}`` for ``magnitude``."""

    @model_validator(mode="after")
    def _first_within_max(self) -> AdaptiveSeeds:
        if self.first > self.max:
            raise ValueError(
                f"first ({self.first}) is more than max ({self.max}); lower first or raise max"
            )
        from fusion_ray.decide.rules import RULES  # the decision-rule registry (plug-ins included)

        problems = RULES.check(self.rule, self.rule_options)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def decision_rule(self) -> Any:
        """The rule instance with its options (``fusion_ray.decide.rules``)."""
        from fusion_ray.decide.rules import build_rule

        return build_rule(self.rule, **self.rule_options)


class SharedSettings(Strict):
    """What a sweep file and an HPO file share: the experiment, the presets, the resources and
    where results go (the HPO file's trials come from its ``tune:`` section, a sweep's from its
    grid and seeds)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    """The MLflow experiment and the Ray Tune run name: letters, digits, ``_``, ``.``, ``-``,
    starting with a letter or digit (it names folders: ``..`` must not)."""
    description: str = ""
    extends: list[str] = Field(default_factory=list)
    """YAML fragments merged under this file (paths relative to it), e.g. tuned shared settings."""
    datasets: dict[str, DatasetPreset]
    defaults: Defaults = Field(default_factory=Defaults)
    resources: Resources = Field(default_factory=Resources)
    storage_path: str = "ray_results"
    """Checkpoints and Tune state; a local path (relative to the working directory) or a URI such as s3://bucket/prefix."""
    tracking_uri: str = "sqlite:///mlflow.db"
    """The MLflow tracking store or server."""
    retries: int = Field(1, ge=0)
    """Times a crashed trial is retried from its last checkpoint before it is recorded FAILED."""
    address: str | None = None
    """Ray cluster to join ('auto' or host:port); None uses $RAY_ADDRESS, else starts a local Ray."""


class SweepSpec(SharedSettings):
    """A whole sweep: the grid, its seeds (the blocking factor), presets, resources and where results go."""

    seeds: list[StrictInt] = Field(min_length=1)
    """Every cell runs once per seed; seeds are never sampled. Written as an adaptive block
    (``{adaptive: true, first: 6, max: 20, alpha: 0.05, margin: 1.0}``) it becomes seeds
    0 .. max-1, of which the evidence decides how many each comparison runs (``adaptive``)."""
    adaptive: AdaptiveSeeds | None = None
    """Set from an adaptive ``seeds:`` block; None runs every seed of the list."""
    grid: Grid
    include: list[SubGrid] = Field(default_factory=list)
    """Extra sub-grids crossed with the seeds (e.g. ``{datasets: [arxiv], fusions: [gate_cnn]}``)."""
    exclude: list[Rule] = Field(default_factory=list)
    """Cells matching any of these rules are dropped."""
    overrides: list[Override] = Field(default_factory=list)
    """Settings for the cells a rule selects (applied over the presets, in order)."""
    baseline: str | None = None
    """Operator the report compares against; None takes the first of grid.fusions."""

    _points: tuple[str, list[GridPoint]] | None = PrivateAttr(default=None)

    @property
    def baseline_label(self) -> str:
        """The operator every comparison is against: ``baseline``, else the grid's first."""
        return self.baseline or self.grid.fusions[0].label

    def keep_points(self, points: list[GridPoint] | None) -> None:
        """Remember the grid points validation built for exactly these settings."""
        self._points = None if points is None else (self.model_dump_json(), points)

    def kept_points(self) -> list[GridPoint] | None:
        """The grid points built when these settings were validated; None when they were not,
        or the settings changed since (a copy with other values)."""
        if self._points is None or self._points[0] != self.model_dump_json():
            return None
        return self._points[1]

    @model_validator(mode="before")
    @classmethod
    def _adaptive_block(cls, raw: Any) -> Any:
        """``seeds: {adaptive: true, ...}`` -> the seeds 0 .. max-1 and the ``adaptive`` block."""
        if not isinstance(raw, dict) or not isinstance(raw.get("seeds"), dict):
            return raw
        block = raw["seeds"]
        most = block.get("max", AdaptiveSeeds.model_fields["max"].default)
        seeds = list(range(most)) if is_int(most) and 2 <= most <= 10_000 else [0]
        return {**raw, "seeds": seeds, "adaptive": block}

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        dupes = sorted(s for s, n in collections.Counter(seeds).items() if n > 1)
        if dupes:
            raise ValueError(f"duplicate seeds {dupes}; list each seed once")
        if any(s < 0 for s in seeds):
            raise ValueError("seeds must be >= 0")
        return seeds


# ----------------------------------------------------------------------------- loading

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


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``; nested mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class SweepFileError(ValueError):
    """A sweep file with problems; the message lists every one as ``file: field: problem``."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.path, self.problems = str(path), [shorten_runs(p) for p in problems]
        lines = "\n".join(f"  {self.path}: {p}" for p in self.problems)
        super().__init__(f"{len(problems)} problem(s) in sweep file {self.path}:\n{lines}")


MAX_FILE_BYTES = 1 << 20
"""A sweep file or fragment larger than this is refused (real ones are a few kilobytes)."""
MAX_VALUES = 100_000
"""The most values a file may hold once YAML aliases are expanded (an alias bomb has billions)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML would silently keep
    the last, so an edited value could be overridden by a forgotten one further down)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
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


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one problem, with the fix for the usual causes."""
    text = str(exc)
    if "character '\\t'" in text:
        text += "\n(indent with spaces: YAML does not allow tabs for indentation)"
    return f"not valid YAML: {text}"


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"sweep file {path} does not exist; see sweeps/ for examples")
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
        merged = deep_merge(merged, _read_yaml(fragment_path))
    merged = deep_merge(merged, raw)
    try:
        return _expand_env(merged)
    except ValueError as exc:
        raise SweepFileError(
            path, [f"{exc}; export it or give a default as ${{VAR:-default}}"]
        ) from exc


def pydantic_problems(exc: ValidationError) -> list[str]:
    """Each error of ``exc`` as ``field.path: problem`` for the user."""
    return _error_lines(exc.errors())


def _error_lines(errors: list[Any]) -> list[str]:
    problems = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if where.startswith("adaptive"):  # the adaptive block is written under seeds:
            where = "seeds" + where.removeprefix("adaptive")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            problems.append(f"{where}: unknown key; remove it or check its spelling")
        elif err["type"] == "missing":
            problems.append(f"{where}: required field is missing")
        else:
            problems.append(f"{where}: {error_text(err)}")
    return problems


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
            fresh = [
                e for e in exc.errors() if not (e["type"] == "missing" and e["loc"] in reported)
            ]
            reported |= {e["loc"] for e in exc.errors()}
            problems += [p for p in _error_lines(fresh) if p not in problems]
            if not _drop_invalid(attempt, exc):
                break
    return None, problems


def validate_sweep_dict(raw: dict[str, Any]) -> tuple[SweepSpec | None, list[str]]:
    """Schema, then semantics, of a sweep-shaped mapping: the spec (None if the schema never
    validates) and every problem found."""
    spec, problems = validate_collecting(SweepSpec, raw)
    if spec is not None:
        problems += semantic_problems(spec)
    return spec, problems


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read and fully validate a sweep file, with command-line ``overrides`` (``key=value``)
    applied as edits of the file; raises ``SweepFileError`` listing every problem."""
    raw = apply_overrides(read_sweep_dict(path), overrides, path)
    spec, problems = validate_sweep_dict(raw)
    if problems or spec is None:
        raise SweepFileError(path, problems)
    return spec


#: Sections that a ``data.X=``, ``model.X=`` or ``train.X=`` override sets in every dataset preset.
PRESET_SECTIONS = ("data", "model", "train")


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
        if not sep or not _DOTTED_KEY.fullmatch(key):
            problems.append(
                f"override {override!r}: write key=value with a dotted key, e.g. train.epochs=3"
            )
            continue
        try:
            value = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            problems.append(f"override {override!r}: the value is not valid YAML ({exc})")
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


SMOKE_DOCUMENTS = 64
"""Training documents, and at most validation and test documents, per dataset in a smoke run."""


def smoke_trial(trial: TrialConfig) -> TrialConfig:
    """A built trial shrunk as ``smoke_version`` shrinks its settings: one epoch, no early
    stopping, at most ``SMOKE_DOCUMENTS`` documents per split."""
    data = trial.data
    return dataclasses.replace(
        trial,
        data=dataclasses.replace(
            data,
            max_train_samples=min(data.max_train_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS),
            max_eval_samples=min(data.max_eval_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS),
        ),
        train=dataclasses.replace(trial.train, epochs=1, patience=None),
    )


def smoke_version(spec: SweepSpec) -> SweepSpec:
    """The same sweep shrunk to a minutes-long check of its whole path: one seed, one epoch,
    64 training and at most 64 validation and 64 test documents per dataset, its own
    experiment name. A new value made from the validated one: its grid points are the built
    ones shrunk (``smoke_trial``), not built and validated again."""
    smoke = _smoke_settings(spec)
    kept = spec.kept_points()
    if kept is not None:
        smoke.keep_points([dataclasses.replace(p, trial=smoke_trial(p.trial)) for p in kept])
    return smoke


def _smoke_settings(spec: SweepSpec) -> SweepSpec:
    datasets = {}
    for name, preset in spec.datasets.items():
        data = copy.deepcopy(preset.data)
        data.max_train_samples = min(data.max_train_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS)
        data.max_eval_samples = min(data.max_eval_samples or SMOKE_DOCUMENTS, SMOKE_DOCUMENTS)
        train = {**preset.train, "epochs": 1, "patience": None}
        datasets[name] = preset.model_copy(update={"data": data, "train": train})
    defaults = spec.defaults.model_copy(
        update={"train": {**spec.defaults.train, "epochs": 1, "patience": None}}
    )
    return spec.model_copy(
        update={
            "name": f"{spec.name}-smoke",
            "seeds": spec.seeds[:1],
            "adaptive": None,
            "datasets": datasets,
            "defaults": defaults,
        }
    )


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


# ----------------------------------------------------------------------------- semantic checks


def resolve_specs(spec: SweepSpec, dataset: str) -> tuple[DataSpec, dict[str, Any], dict[str, Any]]:
    """A dataset's data spec and its merged (defaults + preset) model and train settings."""
    preset = spec.datasets[dataset]
    model = deep_merge(spec.defaults.model, preset.model)
    train = deep_merge(spec.defaults.train, preset.train)
    return preset.data, model, train


#: ModelSpec fields that the grid axes set; presets, defaults and tuning must leave them alone.
GRID_AXIS_MODEL_FIELDS = frozenset(
    {
        "fusion",
        "fusion_kwargs",
        "position",
        "position_kwargs",
        "attention_position",
        "attention_position_kwargs",
    }
)


class Combination(NamedTuple):
    """One point of the crossed grid: its registry entries and its setting-axis values."""

    dataset: str
    position: Named
    attention: Named
    fusion: Named
    settings: tuple[tuple[str, Any], ...] = ()
    """(dotted key, value) of every setting axis of the grid, in the grid's order."""

    @property
    def where(self) -> str:
        """How error messages name this grid point."""
        parts = [self.dataset, self.position.label, self.attention.label, self.fusion.label]
        parts += [f"{key}={axis_text(value)}" for key, value in self.settings]
        return "grid point " + "/".join(parts)


def _setting_values(grid: Grid | SubGrid, spec: SweepSpec) -> list[list[tuple[str, Any]]]:
    """Per setting axis of the sweep's grid, the (key, value) pairs this (sub-)grid crosses."""
    own = grid.settings
    return [
        [(key, value) for value in own.get(key, values)]
        for key, values in spec.grid.settings.items()
    ]


def combinations(spec: SweepSpec) -> list[Combination]:
    """The distinct grid points of the sweep (grid and includes, minus excludes), in file order."""
    grids: list[Grid | SubGrid] = [spec.grid, *spec.include]
    combos: dict[tuple, Combination] = {}
    for grid in grids:
        for dataset, position, attention, fusion, *settings in itertools.product(
            grid.datasets or spec.grid.datasets,
            grid.positions or spec.grid.positions,
            grid.attention_positions or spec.grid.attention_positions,
            grid.fusions or spec.grid.fusions,
            *_setting_values(grid, spec),
        ):
            combo = Combination(dataset, position, attention, fusion, tuple(settings))
            if any(_matches(rule, combo) for rule in spec.exclude):
                continue
            key = (dataset, position.label, attention.label, fusion.label)
            key += tuple(axis_text(value) for _, value in settings)
            combos.setdefault(key, combo)
    return list(combos.values())


def set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    """``target["a"]["b"] = value`` for ``dotted`` "a.b", creating inner mappings on the way."""
    *path, last = dotted.split(".")
    for key in path:
        inner = target.get(key)
        target[key] = inner = dict(inner) if isinstance(inner, dict) else {}
        target = inner
    target[last] = value


def combination_settings(
    spec: SweepSpec, combination: Combination
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The data, model and train settings of one grid point: the dataset's preset (defaults
    merged in), the overrides whose rule it matches, the registry axes, then the setting axes."""
    data, model, train = resolve_specs(spec, combination.dataset)
    for override in spec.overrides:
        if _matches(override.where, combination):
            train = {**train, **override.train}
    sections = {
        "data": dataclasses.asdict(data),
        "model": {
            **model,
            "fusion": combination.fusion.name,
            "fusion_kwargs": combination.fusion.kwargs,
            "position": combination.position.name,
            "position_kwargs": combination.position.kwargs,
            "attention_position": combination.attention.name,
            "attention_position_kwargs": combination.attention.kwargs,
        },
        "train": copy.deepcopy(train),
    }
    for dotted, value in combination.settings:
        section, rest = dotted.split(".", 1)
        set_dotted(sections[section], rest, value)
    return sections["data"], sections["model"], sections["train"]


def _matches(rule: Rule, combo: Combination) -> bool:
    values = {
        "datasets": {combo.dataset},
        "positions": {combo.position.name, combo.position.label},
        "attention_positions": {combo.attention.name, combo.attention.label},
        "fusions": {combo.fusion.name, combo.fusion.label},
    }
    for axis in AXES:
        allowed = getattr(rule, axis)
        if allowed is not None and not values[axis] & set(allowed):
            return False
    settings = {key: axis_text(value) for key, value in combo.settings}
    for key, allowed in rule.settings.items():
        if settings.get(key) not in {axis_text(v) for v in allowed}:
            return False
    return True


AxisNamer = Callable[[str, "int | None"], str]
"""How a message names a registry axis of the grid (``"fusions"``), or one of its entries when
given the entry's index: ``grid.fusions``, ``grid.fusions[1]``."""


def grid_namer(where: str) -> AxisNamer:
    """Axes named as a sweep file writes them: ``grid.fusions[1]``, ``include[0].datasets``."""
    return lambda axis, i: f"{where}.{axis}" + ("" if i is None else f"[{i}]")


def semantic_problems(spec: SweepSpec, name_axis: AxisNamer | None = None) -> list[str]:
    """Problems the schema cannot see: unknown registry names and options, rules that name no
    grid value, resources; then, when the file holds together, every grid point built as the
    trial its cells run (``build_points``). ``name_axis`` names the grid's axes in messages when
    the grid was written otherwise than under ``grid:`` (an HPO file's ``tune:`` section)."""
    problems, known = _axis_problems(spec, name_axis or grid_namer("grid"))
    axis_problems = _setting_axis_problems(spec)
    problems += axis_problems
    problems += _exclude_problems(spec, known)
    problems += _override_problems(spec, known)
    problems += _grid_owned_problems(spec)
    problems += _preset_resource_problems(spec)
    if spec.baseline is not None and spec.baseline not in known["fusions"]:
        problems.append(
            f"baseline: {spec.baseline!r} is not one of the sweep's fusions; allowed: {', '.join(sorted(known['fusions']))}"
        )
    problems += _resource_problems(spec)
    if axis_problems:
        return problems  # the setting axes are in doubt: the points are built once they are fixed
    points, found = build_points(spec)
    if not points and not found and not problems:
        found = ["grid/include/exclude: the sweep expands to no cells; loosen the exclude rules"]
    spec.keep_points(points if not (problems or found) else None)
    return problems + found


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One grid point built: its registry entries and setting-axis values, and the trial its
    cells run (at seed 0; a cell differs from it only by its seed)."""

    combination: Combination
    trial: TrialConfig
    axes: tuple[tuple[str, str], ...]
    """(dotted key, value as text) of every setting axis of the grid."""


def build_points(spec: SweepSpec) -> tuple[list[GridPoint], list[str]]:
    """The one validation step of a sweep's settings: every grid point's data, model and train
    settings built as the trial will use them, each distinct problem once, named by the preset
    that caused it (``datasets.<name>.train.lr: ...``) or, when a setting axis, an override or
    a registry option of the grid point is involved, by the first grid point that has it.
    Settings that grid points share are built once."""
    builder = _PointBuilder(spec)
    buildable = [c for c in combinations(spec) if _buildable(spec, c)]
    points = [p for p in map(builder.build, buildable) if p is not None]
    return (points if not builder.problems else []), list(builder.problems.values())


def _buildable(spec: SweepSpec, combo: Combination) -> bool:
    """Whether a grid point can be built: its dataset has a preset and its registry entries
    exist with valid options (otherwise the file-level checks said why)."""
    from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS

    entries = ((FUSIONS, combo.fusion), (POSITIONS, combo.position))
    entries += ((ATTENTION_POSITIONS, combo.attention),)
    return combo.dataset in spec.datasets and not any(
        registry.check(entry.name, entry.kwargs) for registry, entry in entries
    )


class _PointBuilder:
    """Builds grid points, caching each distinct section's settings and collecting problems."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.built: dict[str, tuple[Any, list[str]]] = {}
        self.problems: dict[tuple[str, str], str] = {}

    def section(self, name: str, settings: dict[str, Any], workers: int) -> tuple[Any, list[str]]:
        key = f"{name}:{workers}:{settings!r}"
        if key not in self.built:
            self.built[key] = _build_section(name, settings, workers)
        return self.built[key]

    def build(self, combo: Combination) -> GridPoint | None:
        workers = resources_for(self.spec, combo.dataset).workers
        sections = dict(zip(_SECTIONS, combination_settings(self.spec, combo), strict=True))
        trial, found = build_trial(combo.dataset, sections, workers, self.section)
        for problem in found:
            self.report(combo, problem)
        if trial is None:
            return None
        return GridPoint(combo, trial, tuple((k, axis_text(v)) for k, v in combo.settings))

    def report(self, combo: Combination, problem: str) -> None:
        """Name the preset when the problem involves nothing the grid point sets itself."""
        own = [key for key, _ in combo.settings] + [
            "model.fusion",
            "model.position",
            "model.attention_position",
        ]
        own += [
            f"train.{k}" for o in self.spec.overrides if _matches(o.where, combo) for k in o.train
        ]
        if any(key in problem for key in own):
            self.problems.setdefault(("", problem), f"{combo.where}: {problem}")
        else:
            where = f"datasets.{combo.dataset}.{problem}"
            self.problems.setdefault((combo.dataset, problem), where)


def build_trial(
    dataset: str,
    sections: dict[str, dict[str, Any]],
    workers: int,
    build_section: Callable[[str, dict[str, Any], int], tuple[Any, list[str]]] | None = None,
) -> tuple[TrialConfig | None, list[str]]:
    """A trial (at seed 0) built from its ``data``, ``model`` and ``train`` settings: each section
    through its fields' constraints and its own rules, then the rules between sections. (The
    trial or None, the problems.)"""
    build_section = build_section or _build_section
    built, found = {}, []
    for name in _SECTIONS:
        built[name], problems = build_section(name, sections[name], workers)
        found += problems
    if built["data"] is not None and built["model"] is not None:
        found += _max_len_problems(built["model"].max_len, built["data"], "model.max_len")
        found += _extrapolation_problems(built["model"], built["data"])
    if found:
        return None, found
    return TrialConfig(dataset, built["data"], built["model"], built["train"], seed=0), []


def changed_trial_problems(spec: SweepSpec, point: GridPoint, changes: dict[str, Any]) -> list[str]:
    """The problems of a grid point's trial with dotted ``section.field`` values put in (a tuned
    setting at a bound of its search space), found by the same build step as the point's."""
    sections = {name: dataclasses.asdict(getattr(point.trial, name)) for name in _SECTIONS}
    for key, value in changes.items():
        set_dotted(sections, key, value)
    workers = resources_for(spec, point.combination.dataset).workers
    return build_trial(point.combination.dataset, sections, workers)[1]


def _extrapolation_problems(model: ModelSpec, data: DataSpec) -> list[str]:
    """An attention position that, trained at data.max_length, would read untrained parameters
    at the longest of data.eval_lengths (``AttentionPosition.length_problems``)."""
    from fusion_ray.model import ATTENTION_POSITIONS

    if not data.eval_lengths:
        return []
    entry = ATTENTION_POSITIONS.get(model.attention_position)
    problems = entry.length_problems(
        model.attention_position_kwargs, data.max_length, max(data.eval_lengths)
    )
    return [f"model.attention_position_kwargs: {p}" for p in problems]


def _max_len_problems(max_len: int, data: DataSpec, where: str) -> list[str]:
    """The model's position tables must cover every length a document is fed at: data.max_length
    and each of data.eval_lengths (positions never trained keep their initial values)."""
    from fusion_ray.data.prepare import longest_input_length

    longest = longest_input_length(data)
    if max_len >= longest:
        return []
    what = (
        f"data.max_length {data.max_length}"
        if longest == data.max_length
        else f"the longest of data.eval_lengths ({longest}), which the position tables must cover"
    )
    return [f"{where}: {max_len} is shorter than {what}; set model.max_len >= {longest}"]


def _build_section(name: str, settings: dict[str, Any], workers: int) -> tuple[Any, list[str]]:
    """One trial's data, model or train settings built (pydantic checks each field's type and
    range), then the rules between its fields: (the settings or None, the problems)."""
    from fusion_ray.data import data_rules
    from fusion_ray.model import model_rules

    value, problems = validate_as(_SECTIONS[name], settings, name)
    problems = [p.replace(f"{name}: ", f"{name}.", 1) for p in problems]
    if value is None:
        return None, problems
    if name == "data":
        problems += data_rules(value)  # its messages name data.<field> already
    elif name == "model":
        problems += [f"model: {p}" for p in model_rules(value)]
    else:
        problems += [f"train.{p}" for p in train_rules(value, workers)]
    return (value if not problems else None), problems


_SECTIONS: dict[str, type] = {"data": DataSpec, "model": ModelSpec, "train": TrainSpec}
#: Settings a setting axis may not vary: the registry axes own the model's entries, and where
#: the cache lives is not an experimental factor.
_NOT_AXES = {f"model.{f}" for f in GRID_AXIS_MODEL_FIELDS} | {"data.cache_dir"}
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _setting_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a setting axis, or None."""
    hint = (
        "a grid axis is datasets, positions, attention_positions, fusions, or a dotted setting "
        "under data., model. or train. with a list of values (e.g. model.scale_embeddings: [true, false])"
    )
    if not _DOTTED.fullmatch(key) or key.split(".")[0] not in _SECTIONS:
        return f"unknown key; {hint}"
    section, field, *inner = key.split(".")
    fields = {f.name for f in dataclasses.fields(_SECTIONS[section])}
    if field not in fields:
        allowed = sorted(f for f in fields if f"{section}.{f}" not in _NOT_AXES)
        return f"{section}.{field} is not a {section} setting; allowed: {', '.join(allowed)}"
    if key in _NOT_AXES or f"{section}.{field}" in _NOT_AXES:
        owner = {
            "fusion": "fusions",
            "position": "positions",
            "attention_position": "attention_positions",
        }
        axis = owner.get(field.removesuffix("_kwargs"))
        if axis:
            return f"set by grid.{axis}, not a setting axis; list the entries (with options) there"
        return "not an experimental setting; it cannot be a grid axis"
    if inner and not field.endswith("_kwargs"):
        return f"{section}.{field} has no inner settings; use {section}.{field} itself"
    return None


def _override_problems(spec: SweepSpec, known: dict[str, set[str]]) -> list[str]:
    """Overrides select cells like exclude rules, never by operator, and set only settings that
    leave what is computed unchanged, and none that a grid axis varies."""
    problems = []
    for i, override in enumerate(spec.overrides):
        where = f"overrides[{i}]"
        if override.where.fusions is not None:
            problems.append(
                f"{where}.where.fusions: an override may not select operators (the operators of a "
                "paired block must train alike); select datasets, positions or attention_positions"
            )
        problems += _rule_problems(f"{where}.where", override.where, known, spec)
        for key in override.train:
            if key not in OVERRIDABLE_TRAIN:
                problems.append(
                    f"{where}.train.{key}: an override may set only {', '.join(OVERRIDABLE_TRAIN)} "
                    "(settings that change what is computed belong in the presets or a grid axis)"
                )
            elif f"train.{key}" in spec.grid.settings:
                problems.append(
                    f"{where}.train.{key}: varied by the grid axis train.{key}; remove it here"
                )
    return problems


def _rule_problems(
    where: str, rule: Rule, known: dict[str, set[str]], spec: SweepSpec
) -> list[str]:
    """Values a rule names that no grid has (registry axes and setting axes)."""
    problems = []
    for axis in AXES:
        for value in getattr(rule, axis) or []:
            if value not in known[axis]:
                problems.append(
                    f"{where}.{axis}: {value!r} is in no grid; allowed: {', '.join(sorted(known[axis]))}"
                )
    for key, values in rule.settings.items():
        if key not in spec.grid.settings:
            problems.append(f"{where}.{key}: not a setting axis of grid:")
            continue
        allowed = {axis_text(v) for v in spec.grid.settings[key]}
        for value in values if isinstance(values, list) else [values]:
            if axis_text(value) not in allowed:
                problems.append(
                    f"{where}.{key}: {axis_text(value)!r} is not a value of the axis; allowed: {', '.join(sorted(allowed))}"
                )
    return problems


def _setting_axis_problems(spec: SweepSpec) -> list[str]:
    """Setting axes: known dotted settings with distinct values, not pinned elsewhere; include
    sub-grids and exclude rules may name only the grid's setting axes."""
    problems = []
    axes = spec.grid.settings
    for key, values in axes.items():
        where = f"grid.{key}"
        problem = _setting_key_problem(key)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        problems += _values_problems(where, values)
        problems += [
            f"{p}: varied by the grid axis {key}; remove it here" for p in _pins(spec, key)
        ]
    owners: list[tuple[str, dict[str, Any]]] = [
        (f"include[{i}]", sub.settings) for i, sub in enumerate(spec.include)
    ]
    owners += [(f"exclude[{i}]", rule.settings) for i, rule in enumerate(spec.exclude)]
    for where, settings in owners:
        for key, values in settings.items():
            if key not in axes:
                known = ", ".join(axes) or "none"
                problems.append(
                    f"{where}.{key}: not a setting axis of grid:; add it to grid: first (setting axes: {known})"
                )
            elif where.startswith("include"):
                problems += _values_problems(f"{where}.{key}", values)
            else:
                allowed = (
                    {axis_text(v) for v in axes[key]} if isinstance(axes[key], list) else set()
                )
                for value in values if isinstance(values, list) else [values]:
                    if axis_text(value) not in allowed:
                        problems.append(
                            f"{where}.{key}: {axis_text(value)!r} is not a value of the axis; "
                            f"allowed: {', '.join(sorted(allowed))}"
                        )
    return problems


def _values_problems(where: str, values: Any) -> list[str]:
    if not isinstance(values, list) or not values:
        return [f"{where}: must be a non-empty list of values (e.g. [true, false])"]
    texts = [axis_text(v) for v in values]
    dupes = sorted({t for t in texts if texts.count(t) > 1})
    return [f"{where}: {d!r} is listed twice" for d in dupes]


def _pins(spec: SweepSpec, key: str) -> list[str]:
    """Places other than the grid that fix the setting ``key`` (they would be silently overridden)."""
    section, rest = key.split(".", 1)
    places: list[tuple[str, Any]] = []
    if section in ("model", "train"):
        places.append((f"defaults.{section}", getattr(spec.defaults, section)))
        places += [
            (f"datasets.{n}.{section}", getattr(p, section)) for n, p in spec.datasets.items()
        ]
    else:  # a data spec is a whole value: a setting differing from its default is pinned
        default = dataclasses.asdict(DataSpec())
        places += [
            (f"datasets.{n}.data", dataclasses.asdict(p.data))
            for n, p in spec.datasets.items()
            if _dotted_get(dataclasses.asdict(p.data), rest) != _dotted_get(default, rest)
        ]
    return [
        f"{where}.{rest}"
        for where, settings in places
        if _dotted_get(settings, rest) is not _MISSING
    ]


_MISSING = object()


def _dotted_get(mapping: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(mapping, dict) or key not in mapping:
            return _MISSING
        mapping = mapping[key]
    return mapping


def _axis_problems(spec: SweepSpec, name_grid: AxisNamer) -> tuple[list[str], dict[str, set[str]]]:
    """Datasets without a preset, unknown registry entries or options, entries listed twice; and
    every value each axis knows (names and labels), for the exclude rules and the baseline."""
    from fusion_ray.model import ATTENTION_POSITIONS, FUSIONS, POSITIONS

    problems: list[str] = []
    registries = {
        "fusions": FUSIONS,
        "positions": POSITIONS,
        "attention_positions": ATTENTION_POSITIONS,
    }
    grids: list[tuple[AxisNamer, Grid | SubGrid]] = [(name_grid, spec.grid)]
    grids += [(grid_namer(f"include[{i}]"), sub) for i, sub in enumerate(spec.include)]
    known: dict[str, set[str]] = {axis: set() for axis in AXES}
    for name_axis, grid in grids:
        for name in grid.datasets or []:
            known["datasets"].add(name)
            if name not in spec.datasets:
                problems.append(
                    f"{name_axis('datasets', None)}: {name!r} has no entry under datasets:; defined: {', '.join(spec.datasets) or 'none'}"
                )
        for axis, registry in registries.items():
            entries: list[Named] = getattr(grid, axis) or []
            labels = [e.label for e in entries]
            for dup in sorted({x for x in labels if labels.count(x) > 1}):
                problems.append(f"{name_axis(axis, None)}: {dup!r} is listed twice")
            for i, entry in enumerate(entries):
                known[axis] |= {entry.name, entry.label}
                problems += [
                    f"{name_axis(axis, i)}: {p}" for p in registry.check(entry.name, entry.kwargs)
                ]
    return problems, known


def _exclude_problems(spec: SweepSpec, known: dict[str, set[str]]) -> list[str]:
    problems = []
    for i, rule in enumerate(spec.exclude):
        for axis in AXES:
            for value in getattr(rule, axis) or []:
                if value not in known[axis]:
                    problems.append(
                        f"exclude[{i}].{axis}: {value!r} is in no grid; allowed: {', '.join(sorted(known[axis]))}"
                    )
    return problems


def _grid_owned_problems(spec: SweepSpec) -> list[str]:
    places = [("defaults.model", spec.defaults.model)]
    places += [(f"datasets.{n}.model", p.model) for n, p in spec.datasets.items()]
    return [
        f"{where}.{key}: set by the grid axes, not here; list it under grid: instead"
        for where, settings in places
        for key in sorted(set(settings) & GRID_AXIS_MODEL_FIELDS)
    ]


def _preset_resource_problems(spec: SweepSpec) -> list[str]:
    """A preset's resources may not set what applies to the whole sweep."""
    return [
        f"datasets.{name}.resources.max_concurrent_trials: applies to the whole sweep; set it under resources:"
        for name, preset in spec.datasets.items()
        if preset.resources is not None
        and "max_concurrent_trials" in preset.resources.model_fields_set
    ]


def _resource_problems(spec: SweepSpec) -> list[str]:
    problems = []
    resource_sets = [("resources", spec.resources)]
    resource_sets += [
        (f"datasets.{n}.resources", p.resources) for n, p in spec.datasets.items() if p.resources
    ]
    for where, res in resource_sets:
        if res.use_gpu and res.gpus_per_worker == 0:
            problems.append(
                f"{where}.gpus_per_worker: must be > 0 when use_gpu is true (e.g. 1, or 0.25 to pack trials)"
            )
        if not res.use_gpu and res.gpus_per_worker > 0:
            problems.append(f"{where}.use_gpu: set it to true when gpus_per_worker > 0")
        if res.gpus_per_worker > 1 and res.gpus_per_worker != int(res.gpus_per_worker):
            problems.append(f"{where}.gpus_per_worker: above 1 it must be a whole number of GPUs")
        if res.workers > 1 and 0 < res.gpus_per_worker < 1:
            problems.append(
                f"{where}.gpus_per_worker: DDP workers (workers > 1) need whole GPUs; use 1"
            )
    return problems


@functools.cache
def _adapter(cls: Any) -> TypeAdapter:
    return TypeAdapter(cls)


def validate_as(cls: Any, raw: Any, where: str) -> tuple[Any, list[str]]:
    """``raw`` validated as ``cls`` (a pydantic-validatable type): (the value, []) or (None,
    every problem prefixed with ``where``)."""
    try:
        return _adapter(cls).validate_python(raw), []
    except ValidationError as exc:
        return None, [f"{where}: {p}" for p in pydantic_problems(exc)]


def resources_for(spec: SweepSpec, dataset: str) -> Resources:
    """A dataset's trial resources: its own when given, else the sweep's."""
    return spec.datasets[dataset].resources or spec.resources
