"""Tune the shared settings before the paired grid: ``python -m fusion_ray.hpo HPO.yaml``.

Optuna (Ray Tune's ``OptunaSearch``) searches each dataset's shared training settings (learning
rate, dropout, batch size, warm-up, ...), scored on the validation split only. The chosen values
are written as a YAML fragment, ``datasets: {NAME: {train: {...}, model: {...}}}``, that sweep
files list under ``extends:`` after their presets, so every operator of the grid then trains with
the same settings. Trials are MLflow runs of the HPO file's own experiment.

Which operators the settings are chosen on matters:

- ``tune.fusion`` (one operator, ``add`` by default): ASHA stops unpromising trials early and the
  trial with the best validation accuracy wins. Tuning the baseline alone favours the baseline:
  the settings are chosen for it and then reused by the other operators, so in the grid the
  baseline trains with the best of ``num_samples`` settings for it, the others with settings
  picked for another operator.
- ``tune.fusions`` (several operators): every sampled setting is trained once per operator, with
  the same tuning seed, and the setting with the lowest mean validation rank across the operators
  wins (``rank_settings``), so no single operator picks the settings. Grid operators left out of
  the list still train with settings chosen on others. Each operator of a setting is its own Tune
  trial (Ray Tune's ``Repeater``); Optuna is told one number per setting, the mean of its
  operators' best validation accuracies: a rank depends on the other settings and changes as
  trials finish, so it is no objective a sampler can model, and the mean accuracy is the
  per-setting number closest to it. There is no early stopping: ASHA would stop one operator's
  trials by comparing them with another operator's, and a setting is ranked on full runs only.

An HPO file has a sweep file's keys for what is tuned (``datasets``, ``defaults``, ``resources``,
``storage_path``, ``tracking_uri``, ``retries``, ``address``, ``extends``) plus ``tune:`` (which
datasets, the operator or operators, the seed, the search space, the trial budget and ASHA),
``output:`` (the fragment's path) and ``sweeps:`` (the sweep files the fragment is for), both
relative to the HPO file. The tuning seed must be none of those sweeps' seeds. The file is
validated as a whole, with every problem reported at once, before Ray starts.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, TypeAdapter, field_validator, model_validator

from fusion_ray.config import (
    GRID_AXIS_MODEL_FIELDS,
    Named,
    Resources,
    Strict,
    SweepFileError,
    SweepSpec,
    bare_names,
    read_sweep_dict,
    resolve_specs,
    resources_for,
    smoke_version,
    validate_collecting,
    validate_sweep_dict,
)
from fusion_ray.grid import Cell, cell_id, expand
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train.report import TuneReporter
from fusion_ray.train.spec import TrainSpec, TrialConfig

if TYPE_CHECKING:
    from fusion_ray.callbacks import Best, MLflowTuningCallback
    from fusion_ray.tracking import Tracker

log = logging.getLogger("fusion_ray.hpo")

METRIC = "best_val_acc"
"""What Optuna maximises and ASHA compares: the best validation accuracy so far (the grid's test
accuracy is taken at the best validation epoch, so this is the quantity the grid selects on)."""

# Grid axes are what the study compares; tuning them would favour an operator.
_AXIS_FIELDS = GRID_AXIS_MODEL_FIELDS
_SWEEP_ONLY = ("seeds", "grid", "include", "exclude", "baseline")

OPERATOR_INDEX = "__trial_index__"
"""The key Ray Tune's ``Repeater`` adds to each repeat's config (``ray.tune.search.repeater.
TRIAL_INDEX``): when several operators are tuned, repeat i of a sampled setting trains operator i."""


class Distribution(Strict):
    """One searched setting: ``loguniform``/``uniform`` over [low, high], ``int`` in low..high
    (both included), or ``choice`` among ``values``."""

    type: Literal["loguniform", "uniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
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

    def extremes(self) -> list[Any]:
        """The values that bound the search: every choice, or low and high."""
        if self.type == "choice":
            return list(self.values or [])
        if self.type == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]

    def domain(self) -> Any:
        """The Ray Tune search domain (OptunaSearch converts it to an Optuna distribution)."""
        from ray import tune

        if self.type == "loguniform":
            return tune.loguniform(self.low, self.high)
        if self.type == "uniform":
            return tune.uniform(self.low, self.high)
        if self.type == "int":
            return tune.randint(
                int(self.low), int(self.high) + 1
            )  # randint excludes its upper bound
        return tune.choice(list(self.values or []))


class Asha(Strict):
    """ASHA early stopping, in epochs; the longest a trial runs is the dataset's ``train.epochs``."""

    grace_period: int = Field(1, ge=1)
    """Epochs every trial gets before it can be stopped."""
    reduction_factor: int = Field(3, ge=2)
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
    seed: int = Field(ge=0)
    """Seed of every tuning trial and of the Optuna sampler; none of the seeds of the sweeps named
    under ``sweeps:`` (tuning on a seed the grid evaluates would let that seed's runs choose the
    settings the operators are compared with)."""
    num_samples: int = Field(ge=1)
    """Settings Optuna samples per dataset (each one trial per tuned operator)."""
    max_concurrent_trials: int | None = Field(None, ge=1)
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


class HpoFileError(SweepFileError):
    """An HPO file with problems; the message lists every one as ``file: field: problem``."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        super().__init__(path, problems)
        lines = "\n".join(f"  {self.path}: {p}" for p in problems)
        self.args = (f"{len(problems)} problem(s) in HPO file {self.path}:\n{lines}",)


# ----------------------------------------------------------------------------- loading


_FIELDS = {
    "train": {f.name for f in dataclasses.fields(TrainSpec)},
    "model": {f.name for f in dataclasses.fields(ModelSpec)},
}


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


def _space_value_problems(raw_sweep: dict[str, Any], tune: TuneSection) -> list[str]:
    """Each bounding value of the space (low, high, every choice), put in every tuned dataset's
    preset, must pass the sweep's own checks."""
    problems = []
    for key, dist in tune.space.items():
        section, _, name = key.partition(".")
        if name not in _FIELDS.get(section, ()) or (section == "model" and name in _AXIS_FIELDS):
            continue  # reported by _space_key_problems
        for value in dist.extremes():
            attempt = copy.deepcopy(raw_sweep)
            for dataset in tune.datasets:
                attempt["datasets"][dataset].setdefault(section, {})[name] = value
            for p in validate_sweep_dict(attempt)[1]:
                problems.append(f"tune.space.{key} = {value!r}: {p}")
    return problems


def _tune_names(problem: str, several: bool) -> str:
    """A problem about the derived grid, named after the tune.* key the user wrote (``several``:
    the file lists ``tune.fusions``)."""
    for derived, written in (
        ("grid.datasets", "tune.datasets"),
        ("grid.fusions", "tune.fusions") if several else ("grid.fusions[0]", "tune.fusion"),
        ("grid.positions[0]", "tune.position"),
        ("grid.attention_positions[0]", "tune.attention_position"),
        ("seeds", "tune.seed"),
    ):
        if problem.startswith(derived):
            return written + problem[len(derived) :]
    return problem


def _yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping; ValueError saying why it cannot be read."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError("is not a mapping")
    return data


def sweep_seeds(sweep: Path, output: Path | None) -> list[Any]:
    """The paired seeds of a sweep file as its loader merges them: its own ``seeds``, else those of
    the last ``extends:`` fragment that has some. ``output``, the fragment this tuning writes, is
    not read: it may not exist yet, and it holds datasets' settings only. ValueError saying what
    is wrong when the file or a fragment cannot be read or no seeds are found."""
    raw = _yaml_mapping(sweep)
    if "seeds" in raw:
        return raw["seeds"]
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
            return found["seeds"]
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
        sweep = (path.parent / name).resolve()
        if not sweep.is_file():
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


def _tune_section(raw_tune: Any) -> tuple[TuneSection | None, list[str]]:
    """The ``tune:`` mapping validated, with the rules between its keys."""
    if not isinstance(raw_tune, dict):
        return None, ["tune: required mapping with datasets, seed, num_samples and space"]
    tune, found = validate_collecting(TuneSection, raw_tune)
    problems = [f"tune.{p}" for p in found]
    if "fusions" in raw_tune and "fusion" in raw_tune:
        problems.append(
            "tune.fusions: give either fusion (one operator) or fusions (several), not both"
        )
    if "fusions" in raw_tune and "asha" in raw_tune:
        problems.append(
            "tune.asha: not used when several operators are tuned (every setting trains every "
            "operator in full, so that each is ranked on complete runs); remove it"
        )
    return tune, problems


def _trial_shape_problems(spec: SweepSpec, tune: TuneSection, several: bool) -> list[str]:
    """Tuning trials run on one worker, and ASHA's grace period fits in the epochs."""
    problems = []
    for dataset in tune.datasets:
        res = resources_for(spec, dataset)
        if res.workers != 1 or res.force_trainer:
            where = (
                f"datasets.{dataset}.resources" if spec.datasets[dataset].resources else "resources"
            )
            problems.append(
                f"{where}.workers: tuning trials run on one worker (got {res.workers}); set workers: 1 and force_trainer: false in the HPO file"
            )
        epochs = TypeAdapter(TrainSpec).validate_python(resolve_specs(spec, dataset)[2]).epochs
        if not several and tune.asha.grace_period > epochs:
            problems.append(
                f"tune.asha.grace_period: {tune.asha.grace_period} is more than datasets.{dataset} train.epochs {epochs}; lower it"
            )
    return problems


def load_hpo(path: str | Path) -> HpoPlan:
    """Read and fully validate an HPO file; raises ``HpoFileError`` listing every problem."""
    path = Path(path)
    try:
        raw = read_sweep_dict(path)
    except SweepFileError as exc:
        raise HpoFileError(path, exc.problems) from exc
    problems: list[str] = []
    for key in _SWEEP_ONLY:
        if key in raw:
            problems.append(
                f"{key}: not used by an HPO file (its trials are one cell per dataset in tune.datasets "
                "and operator in tune.fusion or tune.fusions, at tune.seed); remove it (name the "
                "sweep files the tuning is for under sweeps:, do not extend them)"
            )
    output = raw.pop("output", None)
    output_path = None
    if not isinstance(output, str) or not output.endswith((".yaml", ".yml")):
        problems.append(
            f"output: the tuned fragment's path, ending in .yaml, relative to this file (got {output!r})"
        )
    else:
        output_path = (path.parent / output).resolve()
    sweeps, found = _sweeps_problems(path, raw.pop("sweeps", None), output_path)
    problems += found
    raw_tune = raw.pop("tune", None)
    tune, found = _tune_section(raw_tune)
    problems += found
    several = "fusions" in (raw_tune if isinstance(raw_tune, dict) else {})

    # The trials as a sweep: one cell per tuned dataset and operator (tuning seed), validated by
    # the sweep's own checks; problems about that derived grid are named after tune.* keys.
    raw_sweep = {k: v for k, v in raw.items() if k not in _SWEEP_ONLY}
    presets = raw_sweep.get("datasets")
    fallback = [d for d in presets if isinstance(d, str)] if isinstance(presets, dict) else []
    tuned = tune or TuneSection.model_construct(
        datasets=fallback or ["?"],
        fusion=Named(name="add"),
        position=Named(name="sinusoidal"),
        attention_position=Named(name="none"),
        seed=0,
    )
    raw_sweep["seeds"] = [tuned.seed]
    raw_sweep["grid"] = {
        "datasets": tuned.datasets,
        "fusions": [op.model_dump() for op in tuned.operators],
        "positions": [tuned.position.model_dump()],
        "attention_positions": [tuned.attention_position.model_dump()],
    }
    spec, sweep_problems = validate_sweep_dict(raw_sweep)
    for p in (_tune_names(p, several) for p in sweep_problems):
        if p not in problems and (tune or not p.startswith("tune.")):
            problems.append(p)
    if tune:
        problems += _space_key_problems(tune)
        problems += _seed_problems(tune.seed, sweeps)
    if tune and spec is not None and not sweep_problems:
        # Only on an otherwise valid file: each bound is checked by re-validating the whole file.
        problems += _space_value_problems(raw_sweep, tune)
        problems += _trial_shape_problems(spec, tune, several)
    if problems:
        raise HpoFileError(path, problems)
    assert spec is not None and tune is not None and output_path is not None
    return HpoPlan(path=path, spec=spec, tune=tune, output=output_path, sweeps=sweeps)


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
    return dataclasses.replace(plan, spec=smoke_version(plan.spec), tune=tune, output=output)


# ----------------------------------------------------------------------------- the trial


@dataclass
class ValidationReporter(TuneReporter):
    """Reports each epoch's validation metrics with the best so far, and no checkpoints. The shared
    loop still scores the test split at the end; that report is dropped here, so test metrics
    never reach Tune, Optuna or MLflow."""

    best_val_acc: float = -1.0

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        from ray import tune

        if metrics.get("final"):
            return
        self.best_val_acc = max(self.best_val_acc, metrics["val_acc"])
        tune.report({**metrics, METRIC: self.best_val_acc, "epochs_run": metrics["epoch"] + 1})


def with_overrides(base: dict[str, Any], sampled: dict[str, Any]) -> TrialConfig:
    """The base trial with the sampled ``train.X`` / ``model.X`` values put in."""
    trial = copy.deepcopy(base)
    for key, value in sampled.items():
        section, _, name = key.partition(".")
        trial[section][name] = value
    return TypeAdapter(TrialConfig).validate_python(trial)


def sampled_values(config: dict[str, Any]) -> dict[str, Any]:
    """A tuning trial's sampled ``train.X`` / ``model.X`` values, without the operator index."""
    return {k: v for k, v in config.items() if k != OPERATOR_INDEX}


def tuning_trial(config: dict[str, Any], bases: list[dict[str, Any]], resources: Resources) -> None:
    """Ray Tune function trainable: one Optuna sample on one operator (``bases[i]`` is operator i's
    trial), trained directly in the Tune trial."""
    from fusion_ray.orchestrate import run_direct

    base = bases[config.get(OPERATOR_INDEX, 0)]
    run_direct(with_overrides(base, sampled_values(config)), resources, ValidationReporter)


def sample_cell(bases: list[Cell], config: dict[str, Any]) -> Cell:
    """The cell of one tuning trial: its operator's cell with the sampled settings (own cell id)."""
    base = bases[config.get(OPERATOR_INDEX, 0)]
    trial = with_overrides(dataclasses.asdict(base.trial), sampled_values(config))
    return dataclasses.replace(base, trial=trial, cell_id=cell_id(trial))


# ----------------------------------------------------------------------------- ranking


@dataclass
class ScoredSetting:
    """One sampled setting with its best validation accuracy on every tuned operator."""

    config: dict[str, Any]
    """The sampled ``train.X`` / ``model.X`` values."""
    scores: dict[str, float]
    """Operator label -> best validation accuracy of the setting's trial on it."""
    run_ids: dict[str, str] = field(default_factory=dict)
    """Operator label -> the MLflow run of that trial."""
    ranks: dict[str, float] = field(default_factory=dict)
    """Operator label -> the setting's rank among all settings on it (1 = best); filled by
    ``rank_settings``."""

    @property
    def mean_rank(self) -> float:
        return sum(self.ranks.values()) / len(self.ranks)

    @property
    def mean_score(self) -> float:
        return sum(self.scores.values()) / len(self.scores)


def rank_settings(settings: list[ScoredSetting]) -> list[ScoredSetting]:
    """The settings ordered by mean validation rank across operators, best first, ranks filled in.

    Within each operator the settings are ranked by validation accuracy, 1 for the highest;
    settings with equal accuracy share the mean of the places they take (two tied for first are
    both 1.5). A setting's score is the mean of its ranks over the operators, and the lowest
    wins. Ranks, unlike accuracies, weigh every operator alike however widely its accuracies
    spread. Equal mean ranks go to the higher mean validation accuracy across operators, then to
    the setting that comes first in ``settings`` (the earlier sampled). Every setting must have a
    score on the same operators.
    """
    if not settings:
        return []
    operators = list(settings[0].scores)
    assert all(set(s.scores) == set(operators) for s in settings), "a setting lacks an operator"
    ranks: list[dict[str, float]] = [{} for _ in settings]
    for op in operators:
        order = sorted(range(len(settings)), key=lambda i: -settings[i].scores[op])
        place = 0
        for _, tied in itertools.groupby(order, key=lambda i: settings[i].scores[op]):
            members = list(tied)
            shared = place + (len(members) + 1) / 2  # the mean of places place+1 .. place+n
            for i in members:
                ranks[i][op] = shared
            place += len(members)
    ranked = [dataclasses.replace(s, ranks=r) for s, r in zip(settings, ranks, strict=True)]
    # sorted() is stable: a full tie keeps the order of ``settings``.
    return sorted(ranked, key=lambda s: (s.mean_rank, -s.mean_score))


@dataclass
class Ranking:
    """How the settings of one dataset were chosen when several operators were tuned."""

    operators: list[str]
    settings: list[ScoredSetting]
    """Every setting that finished on every operator, ranked (``rank_settings``), chosen first."""
    trials: int
    """Tune trials run: settings x operators, failed ones included."""

    @property
    def config(self) -> dict[str, Any]:
        """The chosen setting's values."""
        return self.settings[0].config


def scored_settings(callback: MLflowTuningCallback, operators: list[str]) -> list[ScoredSetting]:
    """Every sampled setting whose trials finished on all ``operators``, in the order their first
    trials started. Each trial's config carries its operator's index (``OPERATOR_INDEX``); a
    setting Optuna samples twice counts twice (its n-th trial on an operator joins its n-th copy)."""
    settings: dict[tuple[str, int], ScoredSetting] = {}
    copies: Counter[tuple[str, int]] = Counter()
    for trial_id, config in callback.configs.items():
        index, values = config[OPERATOR_INDEX], sampled_values(config)
        text = json.dumps(values, sort_keys=True, default=str)
        copy_number = copies[(text, index)]
        copies[(text, index)] += 1
        setting = settings.setdefault((text, copy_number), ScoredSetting(values, {}))
        result = callback.last.get(trial_id, {})
        if trial_id not in callback.failed and METRIC in result:
            setting.scores[operators[index]] = float(result[METRIC])
            setting.run_ids[operators[index]] = callback.run_ids[trial_id]
    return [s for s in settings.values() if len(s.scores) == len(operators)]


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- running


def tune_dataset(
    plan: HpoPlan, cells: list[Cell], tracker: Tracker, parent_id: str, verbose: int = 0
) -> Best | Ranking | None:
    """One Optuna study (through Ray Tune) over the shared settings of one dataset; ``cells`` are
    the dataset's cells, one per tuned operator. One operator: ASHA stops trials early and the best
    trial is returned. Several: each sampled setting runs as one trial per operator, and the
    settings that finished on all of them are returned ranked. None when nothing finished."""
    import functools

    from ray import tune
    from ray.tune import PlacementGroupFactory
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import Repeater
    from ray.tune.search.optuna import OptunaSearch

    from fusion_ray.callbacks import MLflowTuningCallback
    from fusion_ray.orchestrate import storage_uri, trial_resources

    spec, settings = plan.spec, plan.tune
    dataset, operators = cells[0].dataset, [c.fusion for c in cells]
    res = resources_for(spec, dataset)
    epochs = cells[0].trial.train.epochs
    callback = MLflowTuningCallback(
        tracker, functools.partial(sample_cell, cells), parent_id, epochs, METRIC
    )
    trainable = tune.with_parameters(
        tuning_trial,
        bases=[dataclasses.asdict(c.trial) for c in cells],
        resources=res,
    )
    search: Any = OptunaSearch(seed=settings.seed)
    scheduler = ASHAScheduler(
        time_attr="training_iteration",  # one report per epoch
        max_t=epochs,
        grace_period=min(settings.asha.grace_period, epochs),
        reduction_factor=settings.asha.reduction_factor,
    )
    if len(cells) > 1:
        # Repeat i of each sample trains operator i; Optuna is told the repeats' mean METRIC.
        # No early stopping: ASHA would compare one operator's trials with another's.
        search, scheduler = Repeater(search, repeat=len(cells), set_index=True), None
    storage = storage_uri(spec.storage_path)
    tuner = tune.Tuner(
        tune.with_resources(trainable, PlacementGroupFactory([trial_resources(res)])),
        param_space={key: dist.domain() for key, dist in settings.space.items()},
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="max",
            search_alg=search,
            scheduler=scheduler,
            num_samples=settings.num_samples * len(cells),
            max_concurrent_trials=settings.max_concurrent_trials or res.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=f"{spec.name}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            verbose=verbose,
        ),
    )
    tuner.fit()
    if len(cells) == 1:
        return callback.best()
    ranked = rank_settings(scored_settings(callback, operators))
    return Ranking(operators, ranked, len(callback.run_ids)) if ranked else None


def _plain(value: Any) -> Any:
    """A sampled value as a plain Python value (Optuna may hand numpy scalars)."""
    return value.item() if hasattr(value, "item") else value


def _values_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(_plain(v))}" for k, v in config.items())


def _ranking_lines(dataset: str, ranking: Ranking, experiment: str) -> list[str]:
    """The fragment's record of a ranked choice: every setting's ranks, the chosen one's runs."""
    chosen = ranking.settings[0]
    lines = [
        f"# {dataset}: {len(ranking.settings)} settings finished on every operator "
        f"({ranking.trials} trials, MLflow experiment {experiment}); "
        "mean rank, then rank (val_acc) per operator:"
    ]
    for n, s in enumerate(ranking.settings):
        per_op = ", ".join(f"{op} {s.ranks[op]:g} ({s.scores[op]:.4f})" for op in ranking.operators)
        mark = "chosen" if n == 0 else "      "
        lines.append(f"#   {mark} {s.mean_rank:.2f}: {per_op}; {_values_text(s.config)}")
    runs = ", ".join(f"{op} {chosen.run_ids[op]}" for op in ranking.operators)
    lines.append(f"#   chosen setting's runs: {runs}")
    return lines


def fragment_text(plan: HpoPlan, best: dict[str, Best | Ranking], sha: str) -> str:
    """The tuned fragment: the chosen values per dataset, with how they were chosen as comments."""
    body: dict[str, Any] = {"datasets": {}}
    for dataset, found in best.items():
        entry: dict[str, dict[str, Any]] = {}
        for key, value in found.config.items():
            section, _, name = key.partition(".")
            entry.setdefault(section, {})[name] = _plain(value)
        body["datasets"][dataset] = entry
    t = plan.tune
    lines = [
        f"# Tuned shared settings, written by `python -m fusion_ray.hpo {plan.path.name}` (git {sha})."
    ]
    where = (
        f"position {t.position.label}, attention position {t.attention_position.label}, "
        f"seed {t.seed}"
    )
    if t.fusions:
        lines += [
            f"# Operators {', '.join(op.label for op in t.operators)}, each sampled setting trained "
            f"on every one; {where}; Optuna (told each setting's mean val_acc over the operators), "
            "no early stopping, scored on validation accuracy only.",
            "# Chosen by mean validation rank: on each operator the settings are ranked by best "
            "val_acc (1 = best, ties share their mean place); the lowest mean rank over the "
            "operators wins, ties to the higher mean val_acc, then to the earlier sampled setting.",
        ]
    else:
        lines.append(
            f"# Operator {t.fusion.label} alone (the settings suit it, and the other operators reuse "
            f"them); {where}; Optuna + ASHA, scored on validation accuracy only."
        )
    for dataset, found in best.items():
        if isinstance(found, Ranking):
            lines += _ranking_lines(dataset, found, plan.spec.name)
        else:
            lines.append(
                f"# {dataset}: best val_acc {found.value:.4f} of {found.trials} trials "
                f"(MLflow experiment {plan.spec.name}, run {found.run_id})"
            )
    lines.append(
        "# List this file in a sweep's `extends:` after the presets: every operator then trains with it."
    )
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False)


def _summary(dataset: str, found: Best | Ranking) -> dict[str, float]:
    """The parent run's metrics for one dataset."""
    if isinstance(found, Ranking):
        chosen = found.settings[0]
        return {
            f"{dataset}.mean_rank": chosen.mean_rank,
            f"{dataset}.mean_{METRIC}": chosen.mean_score,
        }
    return {f"{dataset}.{METRIC}": found.value}


def run_hpo(
    plan: HpoPlan, *, address: str | None = None, verbose: int = 0
) -> dict[str, Best | Ranking]:
    """Tune every dataset of the plan, write the fragment, and log it to the HPO parent run."""
    import tempfile

    from fusion_ray.orchestrate import init_ray
    from fusion_ray.tracking import Tracker, git_sha, log_report_artifacts

    spec, t = plan.spec, plan.tune
    operators = [op.label for op in t.operators]
    tracker = Tracker(spec.tracking_uri, spec.name)
    parent_id = tracker.parent_run(
        str(plan.path),
        params={
            "datasets": ",".join(t.datasets),
            "num_samples": str(t.num_samples),
            "fusion": ",".join(operators),
            "seed": str(t.seed),
        },
    )
    init_ray(address or spec.address)
    cells = expand(spec)
    best: dict[str, Best | Ranking] = {}
    for dataset in t.datasets:
        mine = [c for c in cells if c.dataset == dataset]  # one per operator, in tune order
        print(
            f"tuning {dataset}: {t.num_samples} settings x {', '.join(operators)}, seed {t.seed}, "
            f"up to {mine[0].trial.train.epochs} epochs",
            flush=True,
        )
        found = tune_dataset(plan, mine, tracker, parent_id, verbose)
        if found is None:
            what = (
                f"tuning trial of dataset {dataset} finished"
                if len(mine) == 1
                else f"sampled setting of dataset {dataset} finished on every operator"
            )
            tracker.fail(parent_id, f"no {what}")
            raise RuntimeError(
                f"no {what}; see the FAILED runs of MLflow experiment {spec.name} for why"
            )
        best[dataset] = found
    text = fragment_text(plan, best, git_sha())
    plan.output.parent.mkdir(parents=True, exist_ok=True)
    plan.output.write_text(text)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, plan.output.name).write_text(text)
        log_report_artifacts(tracker, parent_id, tmp)
    tracker.end_parent(
        parent_id, {k: v for d, b in best.items() for k, v in _summary(d, b).items()}
    )
    return best


# ----------------------------------------------------------------------------- CLI


def print_plan(plan: HpoPlan) -> None:
    t = plan.tune
    if t.fusions:
        how = (
            f"{t.num_samples} Optuna settings, each trained on {len(t.fusions)} operators "
            f"({', '.join(op.label for op in t.fusions)}) with seed {t.seed}, no early stopping; "
            "chosen by mean validation rank"
        )
    else:
        how = (
            f"{t.num_samples} Optuna trials of {t.fusion.label} alone (seed {t.seed}; the other "
            f"operators reuse its settings); ASHA grace {t.asha.grace_period}, reduction "
            f"{t.asha.reduction_factor}"
        )
    print(
        f"hpo {plan.spec.name}: {len(t.datasets)} dataset(s) x {how}; "
        f"metric {METRIC} (validation only); MLflow at {plan.spec.tracking_uri}"
    )
    first: dict[str, Cell] = {}
    for cell in expand(plan.spec):
        first.setdefault(cell.dataset, cell)
    for cell in first.values():
        res = resources_for(plan.spec, cell.dataset)
        print(
            f"  {cell.dataset}: up to {cell.trial.train.epochs} epochs; {res.cpus_per_worker:g} CPU"
            + (f", {res.gpus_per_worker:g} GPU" if res.use_gpu else "")
            + " per trial"
        )
        for key, dist in t.space.items():
            section, _, name = key.partition(".")
            now = getattr(getattr(cell.trial, section), name)
            bounds = (
                dist.values
                if dist.type == "choice"
                else f"[{_short(dist.low)}, {_short(dist.high)}]"
            )
            print(f"    {key:<22} {dist.type:<10} {bounds}   (preset: {now})")
    print(f"  writes {plan.output}")
    for name, seeds in plan.sweeps.items():
        print(f"  for {name} (seeds {seeds}; tuning seed {t.seed} is none of them)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fusion_ray.hpo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("hpo_file", help="an HPO YAML, e.g. sweeps/hpo/fusion_matters.yaml")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be tuned; start nothing"
    )
    parser.add_argument(
        "--output", default=None, help="write the fragment here instead of the file's output:"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing fragment")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="two trials of one epoch on 64 documents, experiment NAME-smoke, fragment NAME-smoke.yaml",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (default: the file's address, $RAY_ADDRESS, else local)",
    )
    parser.add_argument(
        "--verbose", type=int, default=0, choices=[0, 1, 2], help="Ray Tune's own progress output"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    try:
        plan = load_hpo(args.hpo_file)
    except (HpoFileError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.smoke:
        plan = smoke_plan(plan)
    if args.output:
        plan.output = Path(args.output).resolve()
    from fusion_ray.orchestrate import preflight

    problems = preflight(plan.spec.storage_path, plan.spec.tracking_uri, remote=not args.dry_run)
    if problems:
        print(HpoFileError(plan.path, problems), file=sys.stderr)
        return 2
    if args.dry_run:
        print_plan(plan)
        return 0
    if plan.output.exists() and not args.overwrite:
        print(
            f"{plan.output} exists; pass --overwrite to replace it (new values give new cell ids, "
            f"so a sweep that extends it then runs its cells again)",
            file=sys.stderr,
        )
        return 2

    print_plan(plan)
    try:
        best = run_hpo(plan, address=args.address, verbose=args.verbose)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    print()
    for dataset, found in best.items():
        if isinstance(found, Ranking):
            chosen = found.settings[0]
            scores = ", ".join(f"{op} {100 * chosen.scores[op]:.2f}%" for op in found.operators)
            score = f"mean validation rank {chosen.mean_rank:.2f} of {len(found.settings)} settings (val_acc {scores})"
        else:
            score = f"best val_acc {100 * found.value:.2f}%"
        print(f"{dataset}: {score} with " + ", ".join(f"{k}={v}" for k, v in found.config.items()))
    print(
        f"\nwrote {plan.output}\nadd it to a sweep file's extends: after the presets, e.g. "
        f"extends: [_study_datasets.yaml, tuned/{plan.output.name}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
