"""The sweep file's typed schema: what each key means, its type and its allowed values.

Pydantic models with a docstring on every field (the reference pages are generated from them):
the grid's axes, the presets, resources, the adaptive seeds block, and ``SweepSpec``, the whole
file. Single-field ranges live here as field constraints; rules between fields and grid points
are ``config.rules``; building every grid point's trial is ``config.build``.
"""

from __future__ import annotations

import collections
import collections.abc
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from fusion_ray.checks import error_text, is_int, not_bool
from fusion_ray.config.fields import Address, Description, StoragePath, TrackingUri
from fusion_ray.config.messages import keys_at, unknown_key_text
from fusion_ray.data.spec import DataSpec
from fusion_ray.schema import axis_text

AXES = ("datasets", "positions", "attention_positions", "fusions")

Number = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(not_bool)]
"""A finite number, written as one (true and false are not 1 and 0)."""

MAX_SEED = 2**63 - 1
"""The largest seed: a 64-bit integer (seeds are hashed into each generator's own seed)."""


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
    # ``model.scale_embeddings: [true, false]`` (checked by ``setting_axis_problems``).
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

    workers: StrictInt = Field(1, ge=1, le=10_000)
    """Ray Train workers (DDP ranks) per trial; 1 runs the loop directly in the Tune trial."""
    use_gpu: bool = False
    """Train on GPUs (nccl for DDP); false trains on CPU (gloo)."""
    cpus_per_worker: Number = Field(1.0, gt=0, le=10_000)
    """CPUs per worker; a fraction such as 0.5 packs two small trials on one core."""
    gpus_per_worker: Number = Field(0.0, ge=0, le=64)
    """GPUs per worker; a fraction such as 0.25 packs four small trials on one card."""
    max_concurrent_trials: StrictInt | None = Field(None, ge=1, le=1_000_000)
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
    first: StrictInt = Field(6, ge=2, le=10_000)
    """Seeds every cell runs before any decision (the first wave)."""
    max: StrictInt = Field(20, ge=2, le=10_000)
    """The most seeds a comparison gets; undecided at this many, it is reported as undecided."""
    alpha: Number = Field(0.05, gt=0, lt=1)
    """The error level of every decision the sweep prints, over all its comparisons at every look
    (one budget for better, worse and equivalent with the magnitude rule)."""
    margin: Number | None = Field(None, gt=0, le=100)
    """Equivalence margin in accuracy points: a comparison whose effect is shown to lie inside
    (-margin, +margin) is decided "equivalent"; None decides only better / worse / futile."""
    rule: str = "magnitude"
    """The decision rule (``fusion-ray list`` shows them): ``magnitude`` bets on the sizes of
    the paired deltas with one error budget for every decision; ``sign`` counts wins only."""
    rule_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the rule, e.g. ``{theta: 1.5}`` for ``magnitude``."""
    decide: list[Literal["operator", "length", "length_within", "interaction"]] | None = Field(
        None, min_length=1
    )
    """The questions decided in the one family (``fusion_ray.decide.questions``): ``operator``
    (each operator against the baseline per group), ``length`` (per operator and setting arm,
    its delta on the longest regime of ``grid.datasets`` minus the shortest), ``length_within``
    (per operator and group, its delta on the longest quarter of the dataset's test documents
    minus the shortest quarter) and ``interaction`` (per operator and group, its delta at each
    level of a setting axis minus at the axis's first level). None: ``operator``, ``length``
    with two regimes or more (else ``length_within``), and ``interaction`` with a setting axis
    of two levels or more."""

    @model_validator(mode="after")
    def _first_within_max(self) -> AdaptiveSeeds:
        if self.first > self.max:
            raise ValueError(
                f"first ({self.first}) is more than max ({self.max}); lower first or raise max"
            )
        # lazy: the decision rules import scipy (~0.2 s); only an adaptive sweep needs them
        from fusion_ray.decide.rules import RULES  # the decision-rule registry (plug-ins included)

        problems = RULES.check(self.rule, self.rule_options)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def decision_rule(self) -> Any:
        """The rule instance with its options (``fusion_ray.decide.rules``)."""
        # lazy: the decision rules import scipy (~0.2 s); only an adaptive sweep needs them
        from fusion_ray.decide.rules import build_rule

        return build_rule(self.rule, **self.rule_options)


def unique_seeds(seeds: list[int]) -> list[int]:
    """``seeds`` when each is listed once and within 0 .. MAX_SEED; a ValueError saying which not."""
    dupes = sorted(s for s, n in collections.Counter(seeds).items() if n > 1)
    if dupes:
        raise ValueError(f"duplicate seeds {dupes}; list each seed once")
    if any(s < 0 or s > MAX_SEED for s in seeds):
        raise ValueError(f"each seed must be in 0..{MAX_SEED} (2**63 - 1)")
    return seeds


SeedList = Annotated[list[StrictInt], Field(min_length=1), AfterValidator(unique_seeds)]
"""A list of seeds, each once, each in 0 .. MAX_SEED (a fixed ``seeds:`` list, or the seeds an
adaptive block becomes)."""


class SharedSettings(Strict):
    """What a sweep file and an HPO file share: the experiment, the presets, the resources and
    where results go (the HPO file's trials come from its ``tune:`` section, a sweep's from its
    grid and seeds)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    """The MLflow experiment and the Ray Tune run name: letters, digits, ``_``, ``.``, ``-``,
    starting with a letter or digit (it names folders: ``..`` must not)."""
    description: Description = ""
    """Free text shown as the MLflow experiment's and parent run's note (line breaks and tabs
    allowed; no other control or invisible characters)."""
    extends: list[str] = Field(default_factory=list)
    """YAML fragments merged under this file (paths relative to it), e.g. tuned shared settings."""
    datasets: dict[str, DatasetPreset]
    defaults: Defaults = Field(default_factory=Defaults)
    resources: Resources = Field(default_factory=Resources)
    storage_path: StoragePath = "ray_results"
    """Checkpoints and Tune state; a local path (relative to the working directory) or a URI such as s3://bucket/prefix. Never empty."""
    tracking_uri: TrackingUri = "sqlite:///mlflow.db"
    """The MLflow tracking store: ``sqlite:///PATH`` (a file; ``sqlite:////abs/path.db`` for an
    absolute path), ``http(s)://HOST:PORT`` (an MLflow server), or a database URI MLflow takes
    (``postgresql://...``, ``mysql://...``, ``mssql://...``). Not MLflow's file store
    (``file://`` or a bare folder), which MLflow 3 keeps only in maintenance mode."""
    retries: StrictInt = Field(1, ge=0, le=100)
    """Times a crashed trial is retried from its last checkpoint before it is recorded FAILED."""
    address: Address = None
    """Ray cluster to join ('auto' or host:port); None uses $RAY_ADDRESS, else starts a local Ray."""


class SweepSpec(SharedSettings):
    """A whole sweep: the grid, its seeds (the blocking factor), presets, resources and where results go."""

    seeds: SeedList
    """Every cell runs once per seed (each in 0 .. 2**63 - 1); seeds are never sampled. Written as an adaptive block
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

    _points: tuple[str, list[Any]] | None = PrivateAttr(default=None)
    """The grid points (``config.build.GridPoint``, which this module sits below) built when
    these settings were validated, with the settings they were built for."""

    @property
    def baseline_label(self) -> str:
        """The operator every comparison is against: ``baseline``, else the grid's first."""
        return self.baseline or self.grid.fusions[0].label

    @property
    def regimes(self) -> list[str]:
        """The regimes a trend runs along, in the order of length: the datasets as listed."""
        return list(self.grid.datasets)

    @property
    def regime_key(self) -> str:
        """The group axis the regimes are levels of."""
        return "dataset"

    @property
    def workload(self) -> str:
        """The kind of sweep the driver runs it as (``fusion_ray.driver.workload``)."""
        return "study"

    def with_resources(self, change: collections.abc.Callable[[Resources], Resources]) -> SweepSpec:
        """A copy with ``change`` applied to every resources block (the sweep's and each
        dataset preset's), keeping the grid points validation built (a trial's settings do not
        depend on where it runs)."""
        datasets = {
            name: preset.model_copy(update={"resources": change(preset.resources)})
            if preset.resources is not None
            else preset
            for name, preset in self.datasets.items()
        }
        moved = self.model_copy(update={"resources": change(self.resources), "datasets": datasets})
        moved.keep_points(self.kept_points())
        return moved

    def grid_levels(self) -> dict[str, list[str]]:
        """Each setting axis's levels as text, in the file's order (``grid_axes``)."""
        return {key: [axis_text(v) for v in values] for key, values in self.grid.settings.items()}

    def group_resources(self, group: str) -> Resources:
        """The trial resources of a resource group of cells (a dataset): ``resources_for``."""
        return resources_for(self, group)

    def keep_points(self, points: list[Any] | None) -> None:
        """Remember the grid points validation built for exactly these settings."""
        self._points = None if points is None else (self.model_dump_json(), points)

    def kept_points(self) -> list[Any] | None:
        """The grid points built when these settings were validated; None when they were not,
        or the settings changed since (a copy with other values)."""
        if self._points is None or self._points[0] != self.model_dump_json():
            return None
        return self._points[1]

    @model_validator(mode="before")
    @classmethod
    def _adaptive_block(cls, raw: Any) -> Any:
        return adaptive_block(raw)


def adaptive_block(raw: Any) -> Any:
    """``seeds: {adaptive: true, ...}`` -> the seeds 0 .. max-1 and the ``adaptive`` block."""
    if not isinstance(raw, dict) or not isinstance(raw.get("seeds"), dict):
        return raw
    block = raw["seeds"]
    most = block.get("max", AdaptiveSeeds.model_fields["max"].default)
    seeds = list(range(most)) if is_int(most) and 2 <= most <= 10_000 else [0]
    return {**raw, "seeds": seeds, "adaptive": block}


def pydantic_problems(exc: ValidationError, root: Any = None) -> list[str]:
    """Each error of ``exc`` as ``field.path: problem`` for the user (``root``: the type that
    was validated, for the keys an unknown one may be a misspelling of)."""
    return error_lines(exc.errors(), root)


def error_lines(errors: list[Any], root: Any = None) -> list[str]:
    problems = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if where.startswith("adaptive"):  # the adaptive block is written under seeds:
            where = "seeds" + where.removeprefix("adaptive")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            loc = err["loc"]
            known = keys_at(root, loc) if root is not None and loc else []
            problems.append(f"{where}: {unknown_key_text(str(loc[-1]) if loc else '', known)}")
        elif err["type"] == "missing":
            problems.append(f"{where}: required field is missing")
        else:
            problems.append(f"{where}: {error_text(err)}")
    return problems


def resources_for(spec: SweepSpec, dataset: str) -> Resources:
    """A dataset's trial resources: its own when given, else the sweep's."""
    return spec.datasets[dataset].resources or spec.resources
