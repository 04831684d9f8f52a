"""An HPO file read and validated as a whole before Ray starts: its shared settings as a sweep
file's, its ``tune:`` section as a grid of one cell per tuned dataset and operator at the tuning
seed, built through the sweep's own validation step (``config.semantic_problems``) with messages
naming the ``tune.*`` keys; each bound of the search space is put in the built trials and built
again; the tuning seed checked against the paired seeds of the sweeps the tuning is for."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from fusion_ray.config import (
    GRID_AXIS_MODEL_FIELDS,
    AdaptiveSeeds,
    Grid,
    Named,
    SharedSettings,
    Strict,
    SweepFileError,
    SweepSpec,
    apply_overrides,
    bare_names,
    changed_trial_problems,
    read_sweep_dict,
    read_yaml_mapping,
    resources_for,
    section_builder,
    semantic_problems,
    smoke_version,
    validate_collecting,
)
from fusion_ray.config.spec import MAX_SEED, Number
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train.spec import TrainSpec

METRIC = "best_val_acc"
"""What Optuna maximises and ASHA compares: the best validation accuracy so far (the grid's test
accuracy is taken at the best validation epoch, so this is the quantity the grid selects on)."""

# Grid axes are what the study compares; tuning them would favour an operator.
_AXIS_FIELDS = GRID_AXIS_MODEL_FIELDS
_SWEEP_ONLY = ("seeds", "grid", "include", "exclude", "overrides", "baseline")
_HPO_ONLY = ("tune", "output", "sweeps")


class Distribution(Strict):
    """One searched setting: ``loguniform``/``uniform`` over [low, high], ``int`` in low..high
    (both included), or ``choice`` among ``values``."""

    type: Literal["loguniform", "uniform", "int", "choice"]
    low: Number | None = None
    high: Number | None = None
    values: list[Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        if self.type == "choice":
            if not self.values or self.low is not None or self.high is not None:
                raise ValueError("choice takes a non-empty `values` list and no low/high")
            return self
        if self.values is not None or self.low is None or self.high is None:
            raise ValueError(f"{self.type} takes `low` and `high` and no `values`")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be smaller than high ({self.high})")
        if self.type == "loguniform" and self.low <= 0:
            raise ValueError(f"loguniform needs low > 0 (got {self.low})")
        if self.type == "int" and not (
            float(self.low).is_integer() and float(self.high).is_integer()
        ):
            raise ValueError("int takes whole-number low and high")
        return self

    def _bounds(self) -> tuple[float, float]:
        """low and high, which every type but ``choice`` has (``_consistent``)."""
        assert self.low is not None and self.high is not None, self.type
        return self.low, self.high

    def extremes(self) -> list[Any]:
        """The values that bound the search: every choice, or low and high."""
        if self.type == "choice":
            return list(self.values or [])
        low, high = self._bounds()
        if self.type == "int":
            return [int(low), int(high)]
        return [low, high]

    def domain(self) -> Any:
        """The Ray Tune search domain (OptunaSearch converts it to an Optuna distribution)."""
        # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
        from ray import tune

        if self.type == "choice":
            return tune.choice(list(self.values or []))
        low, high = self._bounds()
        if self.type == "loguniform":
            return tune.loguniform(low, high)
        if self.type == "uniform":
            return tune.uniform(low, high)
        return tune.randint(int(low), int(high) + 1)  # randint excludes its upper bound


class Asha(Strict):
    """ASHA early stopping, in epochs; the longest a trial runs is the dataset's ``train.epochs``."""

    grace_period: StrictInt = Field(1, ge=1, le=100_000)
    """Epochs every trial gets before it can be stopped."""
    reduction_factor: StrictInt = Field(3, ge=2, le=1_000)
    """At each rung only the best 1/reduction_factor of trials continue."""


class TuneSection(Strict):
    """What is tuned, on what, and with which budget."""

    datasets: list[str] = Field(min_length=1)
    """Datasets to tune, each on its own (its best values go under ``datasets.NAME`` of the fragment)."""
    fusion: Named = Field(default_factory=lambda: Named(name="add"))
    """The one operator tuned when ``fusions`` is not given. The settings are then chosen for it
    and reused by every operator of the grid, which favours it: tuning the baseline alone
    favours the baseline."""
    fusions: list[Named] | None = Field(None, min_length=2)
    """Several operators to choose shared settings on (instead of ``fusion``): each sampled
    setting is trained on every one, with the same seed, and the lowest mean validation rank
    across them wins; no early stopping."""
    position: Named = Field(default_factory=lambda: Named(name="sinusoidal"))
    attention_position: Named = Field(default_factory=lambda: Named(name="none"))
    seed: StrictInt = Field(ge=0, le=MAX_SEED)
    """Seed of every tuning trial and of the Optuna sampler; none of the seeds of the sweeps named
    under ``sweeps:`` (tuning on a seed the grid evaluates would let that seed's runs choose the
    settings the operators are compared with)."""
    num_samples: StrictInt = Field(ge=1, le=100_000)
    """Settings Optuna samples per dataset (each one trial per tuned operator)."""
    max_concurrent_trials: StrictInt | None = Field(None, ge=1, le=1_000_000)
    """Trials running at once; None uses resources.max_concurrent_trials, else the cluster decides."""
    asha: Asha = Field(default_factory=Asha)
    """Early stopping when one operator is tuned; not used (and refused) with ``fusions``."""
    space: dict[str, Distribution] = Field(min_length=1)
    """``train.FIELD`` or ``model.FIELD`` -> distribution, e.g. ``train.lr: {type: loguniform, low: 1e-4, high: 1e-3}``."""

    @field_validator("fusion", "position", "attention_position", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return bare_names([value])[0]

    @field_validator("fusions", mode="before")
    @classmethod
    def _bare_names(cls, value: Any) -> Any:
        return bare_names(value)

    @property
    def operators(self) -> list[Named]:
        """The tuned operators: ``fusions`` when given, else ``fusion`` alone."""
        return self.fusions or [self.fusion]

    def grid(self) -> Grid:
        """The tuning trials as a grid: the tuned datasets x operators, at one position and one
        attention position."""
        return Grid(
            datasets=self.datasets,
            positions=[self.position],
            attention_positions=[self.attention_position],
            fusions=self.operators,
        )

    def name_axis(self, axis: str, index: int | None) -> str:
        """Messages about the grid name the tune.* key it came from (``tune.fusions[1]``,
        ``tune.position``)."""
        if axis == "fusions" and self.fusions:
            return "tune.fusions" + ("" if index is None else f"[{index}]")
        return {
            "datasets": "tune.datasets",
            "fusions": "tune.fusion",
            "positions": "tune.position",
            "attention_positions": "tune.attention_position",
        }[axis]


@dataclass
class HpoPlan:
    """A validated HPO file: the sweep-shaped spec of its trials, the tune section and the output."""

    path: Path
    spec: SweepSpec
    """One cell per tuned dataset and operator, at the tuning seed."""
    tune: TuneSection
    output: Path
    sweeps: dict[str, list[int]] = field(default_factory=dict)
    """The sweep files the fragment is for (as the HPO file names them) and their paired seeds."""
    overrides: tuple[str, ...] = ()
    """The command line's ``key=value`` edits of the file (applied before validation)."""
    smoke: bool = False
    """A shrunk rehearsal (``smoke_plan``): on a Ray without GPUs its GPU trials run on CPUs."""


class HpoFileError(SweepFileError):
    """An HPO file with problems; the message lists every one as ``file: field: problem``."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        super().__init__(path, problems)
        lines = "\n".join(f"  {self.path}: {p}" for p in self.problems)
        self.args = (f"{len(problems)} problem(s) in HPO file {self.path}:\n{lines}",)


# ----------------------------------------------------------------------------- loading


_FIELDS = {
    "train": {f.name for f in dataclasses.fields(TrainSpec)},
    "model": {f.name for f in dataclasses.fields(ModelSpec)},
}


def _yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, read as a sweep file is (size and alias limits, unique
    keys); ValueError saying why it cannot be read."""
    try:
        return read_yaml_mapping(path)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from exc
    except SweepFileError as exc:
        raise ValueError(f"cannot be read ({'; '.join(exc.problems)})") from exc


def _seed_list(seeds: Any) -> Any:
    """A sweep's seeds as written: a list, or an adaptive block's 0 .. max-1 (the most it runs)."""
    if isinstance(seeds, dict) and seeds.get("adaptive"):
        most = seeds.get("max", AdaptiveSeeds.model_fields["max"].default)
        return list(range(most)) if isinstance(most, int) else most
    return seeds


def sweep_seeds(sweep: Path, output: Path | None) -> list[Any]:
    """The paired seeds of a sweep file as its loader merges them: its own ``seeds``, else those of
    the last ``extends:`` fragment that has some. ``output``, the fragment this tuning writes, is
    not read: it may not exist yet, and it holds datasets' settings only. ValueError saying what
    is wrong when the file or a fragment cannot be read or no seeds are found."""
    raw = _yaml_mapping(sweep)
    if "seeds" in raw:
        return _seed_list(raw["seeds"])
    extends = raw.get("extends") or []
    for fragment in reversed(extends if isinstance(extends, list) else []):
        fragment_path = (sweep.parent / str(fragment)).resolve()
        if fragment_path == output:
            continue
        try:
            found = _yaml_mapping(fragment_path)
        except ValueError as exc:
            raise ValueError(f"extends fragment {fragment!r} {exc}") from exc
        if "seeds" in found:
            return _seed_list(found["seeds"])
    raise ValueError("has no seeds, neither its own nor from its extends: fragments")


def _sweeps_problems(
    path: Path, raw_sweeps: Any, output: Path | None
) -> tuple[dict[str, list[int]], list[str]]:
    """The paired seeds of every sweep file ``sweeps:`` names (paths relative to the HPO file),
    and the problems found reading them."""
    if isinstance(raw_sweeps, str):
        raw_sweeps = [raw_sweeps]
    if (
        not isinstance(raw_sweeps, list)
        or not raw_sweeps
        or not all(isinstance(s, str) for s in raw_sweeps)
    ):
        return {}, [
            "sweeps: the sweep files that extend this file's output (paths relative to this "
            f"file), so that tune.seed is checked against their seeds (got {raw_sweeps!r}); "
            "e.g. sweeps: [../full_grid.yaml]"
        ]
    found: dict[str, list[int]] = {}
    problems = []
    for name in raw_sweeps:
        try:
            sweep = (path.parent / name).resolve()
            found_file = sweep.is_file()
        except (OSError, ValueError, RuntimeError) as exc:  # a NUL, a name too long, a link loop
            sweep, found_file = Path(name[:80]), False
            name = f"{name[:80]!r} ({exc})"
        if not found_file:
            problems.append(f"sweeps: {name!r} not found at {sweep}; fix the path")
            continue
        try:
            seeds = sweep_seeds(sweep, output)
        except ValueError as exc:
            problems.append(f"sweeps: {name} {exc}; name a sweep file with seeds:")
            continue
        if not isinstance(seeds, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds
        ):
            problems.append(
                f"sweeps: {name} has seeds {seeds!r}, not a list of whole numbers; fix that sweep file"
            )
            continue
        found[name] = seeds
    return found, problems


def _seed_problems(seed: int, sweeps: dict[str, list[int]]) -> list[str]:
    """The tuning seed must be none of the grid's paired seeds."""
    clashing = [name for name, seeds in sweeps.items() if seed in seeds]
    if not clashing:
        return []
    taken = {s for seeds in sweeps.values() for s in seeds}
    free = next(s for s in itertools.count(1000) if s not in taken)
    listed = "; ".join(f"{name} {sweeps[name]}" for name in clashing)
    return [
        f"tune.seed: {seed} is one of the paired seeds of the sweeps this tuning is for ({listed}); "
        "tuning on a seed the grid evaluates lets that seed's runs choose the settings the "
        "operators are then compared with (same seed, same initialisation and batch order), "
        f"which leaks the selection into the comparison; pick a seed none of them uses, e.g. {free}"
    ]


def _tune_key_problems(raw_tune: dict[str, Any]) -> list[str]:
    """Rules between the keys of ``tune:`` as written."""
    problems = []
    if "fusions" in raw_tune and "fusion" in raw_tune:
        problems.append(
            "tune.fusions: give either fusion (one operator) or fusions (several), not both"
        )
    if "fusions" in raw_tune and "asha" in raw_tune:
        problems.append(
            "tune.asha: not used when several operators are tuned (every setting trains every "
            "operator in full, so that each is ranked on complete runs); remove it"
        )
    return problems


def _space_key_problems(tune: TuneSection) -> list[str]:
    """Each searched key must name a shared setting of the trial (never a grid axis)."""
    problems = []
    for key in tune.space:
        section, _, name = key.partition(".")
        if section not in _FIELDS or name not in _FIELDS[section]:
            allowed = ", ".join(
                f"{s}.{f}" for s in _FIELDS for f in sorted(_FIELDS[s] - _AXIS_FIELDS)
            )
            problems.append(f"tune.space.{key}: not a setting of the trial; allowed: {allowed}")
        elif section == "model" and name in _AXIS_FIELDS:
            problems.append(
                f"tune.space.{key}: is a grid axis; tuning it would favour an operator, so only shared settings are searched"
            )
    return problems


def _space_value_problems(spec: SweepSpec, tune: TuneSection) -> list[str]:
    """Each bounding value of the space (low, high, every choice), put in each tuned dataset's
    built trial, must build (the grid points were built once, with the presets' values)."""
    problems = []
    firsts: dict[str, Any] = {}
    for point in spec.kept_points() or []:
        firsts.setdefault(point.combination.dataset, point)
    build = section_builder(spec)  # a bound changes one section: the others are built once
    for key, dist in tune.space.items():
        section, _, name = key.partition(".")
        if name not in _FIELDS.get(section, ()) or name in _AXIS_FIELDS:
            continue  # reported by _space_key_problems
        for value in dist.extremes():
            for dataset, point in firsts.items():
                for p in changed_trial_problems(spec, point, {key: value}, build):
                    problem = f"tune.space.{key} = {value!r}: datasets.{dataset}.{p}"
                    if problem not in problems:
                        problems.append(problem)
    return problems


def _trial_shape_problems(spec: SweepSpec, tune: TuneSection) -> list[str]:
    """Tuning trials run on one worker, and ASHA's grace period fits in the epochs."""
    problems = []
    epochs = {p.combination.dataset: p.trial.train.epochs for p in spec.kept_points() or []}
    for dataset in tune.datasets:
        res = resources_for(spec, dataset)
        if res.workers != 1 or res.force_trainer:
            where = (
                f"datasets.{dataset}.resources" if spec.datasets[dataset].resources else "resources"
            )
            problems.append(
                f"{where}.workers: tuning trials run on one worker (got {res.workers}); set workers: 1 and force_trainer: false in the HPO file"
            )
        if not tune.fusions and tune.asha.grace_period > epochs.get(
            dataset, tune.asha.grace_period
        ):
            problems.append(
                f"tune.asha.grace_period: {tune.asha.grace_period} is more than datasets.{dataset} "
                f"train.epochs {epochs[dataset]}; lower it"
            )
    return problems


def _hpo_file_problems(path: Path, raw: dict[str, Any]) -> tuple[Path | None, list[str]]:
    """Keys a sweep file has and an HPO file does not, and the fragment's path."""
    problems = [
        f"{key}: not used by an HPO file (its trials are one cell per dataset in tune.datasets "
        "and operator in tune.fusion or tune.fusions, at tune.seed); remove it (name the "
        "sweep files the tuning is for under sweeps:, do not extend them)"
        for key in _SWEEP_ONLY
        if key in raw
    ]
    output = raw.get("output")
    if not isinstance(output, str) or not output.endswith((".yaml", ".yml")):
        problems.append(
            f"output: the tuned fragment's path, ending in .yaml, relative to this file (got {output!r})"
        )
        return None, problems
    return (path.parent / output).resolve(), problems


def load_hpo(path: str | Path, overrides: Sequence[str] = ()) -> HpoPlan:
    """Read and fully validate an HPO file, with command-line ``overrides`` (``key=value``, as
    for a sweep file: ``data.X``/``model.X``/``train.X`` set X in every preset) applied as edits
    of the file; raises ``HpoFileError`` listing every problem."""
    path = Path(path)
    try:
        raw = apply_overrides(read_sweep_dict(path), overrides, path)
    except SweepFileError as exc:
        raise HpoFileError(path, exc.problems) from exc
    output, problems = _hpo_file_problems(path, raw)
    sweeps, found = _sweeps_problems(path, raw.get("sweeps"), output)
    problems += found
    raw_tune = raw.get("tune")
    tune: TuneSection | None = None
    if isinstance(raw_tune, dict):
        tune, found = validate_collecting(TuneSection, raw_tune)
        problems += [f"tune.{p}" for p in found] + _tune_key_problems(raw_tune)
    else:
        problems.append("tune: required mapping with datasets, seed, num_samples and space")
    shared_raw = {k: v for k, v in raw.items() if k not in _SWEEP_ONLY + _HPO_ONLY}
    shared, found = validate_collecting(SharedSettings, shared_raw)
    problems += found
    spec = None
    if shared is not None:
        # The trials as a grid, built by the sweep's own validation step; without a valid tune
        # section, every preset at the default operator, so the presets are still checked.
        grid = (
            tune.grid()
            if tune
            else Grid(datasets=list(shared.datasets), fusions=[Named(name="add")])
        )
        spec = SweepSpec(**dict(shared), seeds=[tune.seed if tune else 0], grid=grid)
        found = semantic_problems(spec, tune.name_axis if tune else None)
        problems += [p for p in found if p not in problems]
    if tune:
        problems += _space_key_problems(tune)
        problems += _seed_problems(tune.seed, sweeps)
    if tune and spec is not None and spec.kept_points() is not None:
        problems += _space_value_problems(spec, tune)
        problems += _trial_shape_problems(spec, tune)
    if problems:
        raise HpoFileError(path, problems)
    assert spec is not None and tune is not None and output is not None
    return HpoPlan(
        path=path, spec=spec, tune=tune, output=output, sweeps=sweeps, overrides=tuple(overrides)
    )


def smoke_plan(plan: HpoPlan) -> HpoPlan:
    """The same tuning shrunk to a minutes-long check of its whole path: two trials of one epoch on
    64 training documents, experiment NAME-smoke, fragment NAME-smoke.yaml beside the real one."""
    tune = plan.tune.model_copy(
        update={
            "num_samples": min(2, plan.tune.num_samples),
            "asha": Asha(grace_period=1, reduction_factor=plan.tune.asha.reduction_factor),
        }
    )
    output = plan.output.with_name(plan.output.stem + "-smoke.yaml")
    return dataclasses.replace(
        plan, spec=smoke_version(plan.spec), tune=tune, output=output, smoke=True
    )
