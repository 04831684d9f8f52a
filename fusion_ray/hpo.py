"""Tune the shared settings before the paired grid: ``python -m fusion_ray.hpo HPO.yaml``.

Optuna (Ray Tune's ``OptunaSearch``) with ASHA early stopping searches each dataset's shared
training settings (learning rate, dropout, batch size, warm-up, ...) on the baseline operator
only, scored on the validation split only. The best values are written as a YAML fragment,
``datasets: {NAME: {train: {...}, model: {...}}}``, that sweep files list under ``extends:``
after their presets, so every operator of the grid then trains with the same settings and no
operator is favoured by the tuning. Trials are MLflow runs of the HPO file's own experiment.

An HPO file has a sweep file's keys for what is tuned (``datasets``, ``defaults``, ``resources``,
``storage_path``, ``tracking_uri``, ``retries``, ``address``, ``extends``) plus ``tune:`` (which
datasets, the baseline operator, the seed, the search space, the trial budget and ASHA) and
``output:`` (the fragment's path, relative to the HPO file). It is validated as a whole, with
every problem reported at once, before Ray starts.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, TypeAdapter, field_validator, model_validator

from fusion_ray.config import (
    GRID_AXIS_MODEL_FIELDS,
    Named,
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
    from fusion_ray.tracking import Best, Tracker

log = logging.getLogger("fusion_ray.hpo")

METRIC = "best_val_acc"
"""What Optuna maximises and ASHA compares: the best validation accuracy so far (the grid's test
accuracy is taken at the best validation epoch, so this is the quantity the grid selects on)."""

# Grid axes are what the study compares; tuning them would favour an operator.
_AXIS_FIELDS = GRID_AXIS_MODEL_FIELDS
_SWEEP_ONLY = ("seeds", "grid", "include", "exclude", "baseline")


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
    """The baseline operator: the only one tuned, so no operator is favoured."""
    position: Named = Field(default_factory=lambda: Named(name="sinusoidal"))
    attention_position: Named = Field(default_factory=lambda: Named(name="none"))
    seed: int = Field(ge=0)
    """Seed of every tuning trial and of the Optuna sampler; best kept out of the grid's paired seeds."""
    num_samples: int = Field(ge=1)
    """Optuna trials per dataset."""
    max_concurrent_trials: int | None = Field(None, ge=1)
    """Trials running at once; None uses resources.max_concurrent_trials, else the cluster decides."""
    asha: Asha = Field(default_factory=Asha)
    space: dict[str, Distribution] = Field(min_length=1)
    """``train.FIELD`` or ``model.FIELD`` -> distribution, e.g. ``train.lr: {type: loguniform, low: 1e-4, high: 1e-3}``."""

    @field_validator("fusion", "position", "attention_position", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return bare_names([value])[0]


@dataclass
class HpoPlan:
    """A validated HPO file: the sweep-shaped spec of its trials, the tune section and the output."""

    path: Path
    spec: SweepSpec
    """One cell per tuned dataset: the baseline operator, the tuning seed."""
    tune: TuneSection
    output: Path


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


def _tune_names(problem: str) -> str:
    """A problem about the derived grid, named after the tune.* key the user wrote."""
    for derived, written in (
        ("grid.datasets", "tune.datasets"),
        ("grid.fusions[0]", "tune.fusion"),
        ("grid.positions[0]", "tune.position"),
        ("grid.attention_positions[0]", "tune.attention_position"),
        ("seeds", "tune.seed"),
    ):
        if problem.startswith(derived):
            return written + problem[len(derived) :]
    return problem


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
                f"{key}: not used by an HPO file (its trials are one cell per dataset in tune.datasets, "
                "with tune.fusion and tune.seed); remove it"
            )
    output = raw.pop("output", None)
    if not isinstance(output, str) or not output.endswith((".yaml", ".yml")):
        problems.append(
            f"output: the tuned fragment's path, ending in .yaml, relative to this file (got {output!r})"
        )
    raw_tune = raw.pop("tune", None)
    tune = None
    if not isinstance(raw_tune, dict):
        problems.append("tune: required mapping with datasets, seed, num_samples and space")
    else:
        tune, found = validate_collecting(TuneSection, raw_tune)
        problems += [f"tune.{p}" for p in found]

    # The trials as a sweep: one cell per tuned dataset (baseline operator, tuning seed), validated
    # by the sweep's own checks; problems about that derived grid are named after tune.* keys.
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
        "fusions": [tuned.fusion.model_dump()],
        "positions": [tuned.position.model_dump()],
        "attention_positions": [tuned.attention_position.model_dump()],
    }
    spec, sweep_problems = validate_sweep_dict(raw_sweep)
    for p in map(_tune_names, sweep_problems):
        if p not in problems and (tune or not p.startswith("tune.")):
            problems.append(p)
    if tune:
        problems += _space_key_problems(tune)
    if tune and spec is not None and not sweep_problems:
        # Only on an otherwise valid file: each bound is checked by re-validating the whole file.
        problems += _space_value_problems(raw_sweep, tune)
        for dataset in tune.datasets:
            res = resources_for(spec, dataset)
            if res.workers != 1 or res.force_trainer:
                where = (
                    f"datasets.{dataset}.resources"
                    if spec.datasets[dataset].resources
                    else "resources"
                )
                problems.append(
                    f"{where}.workers: tuning trials run on one worker (got {res.workers}); set workers: 1 and force_trainer: false in the HPO file"
                )
            epochs = TypeAdapter(TrainSpec).validate_python(resolve_specs(spec, dataset)[2]).epochs
            if tune.asha.grace_period > epochs:
                problems.append(
                    f"tune.asha.grace_period: {tune.asha.grace_period} is more than datasets.{dataset} train.epochs {epochs}; lower it"
                )
    if problems:
        raise HpoFileError(path, problems)
    assert spec is not None and tune is not None and isinstance(output, str)
    return HpoPlan(path=path, spec=spec, tune=tune, output=(path.parent / output).resolve())


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
    return HpoPlan(plan.path, smoke_version(plan.spec), tune, output)


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


def tuning_trial(config: dict[str, Any], base: dict[str, Any], resources: dict[str, Any]) -> None:
    """Ray Tune function trainable: one Optuna sample, trained directly in the Tune trial."""
    from fusion_ray.orchestrate import run_direct

    run_direct(with_overrides(base, config), resources, ValidationReporter)


def sample_cell(base: Cell, sample: dict[str, Any]) -> Cell:
    """The cell of one tuning trial: the base cell with the sampled settings (its own cell id)."""
    trial = with_overrides(dataclasses.asdict(base.trial), sample)
    return dataclasses.replace(base, trial=trial, cell_id=cell_id(trial))


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- running


def tune_dataset(
    plan: HpoPlan, cell: Cell, tracker: Tracker, parent_id: str, verbose: int = 0
) -> Best | None:
    """One Optuna study (through Ray Tune, with ASHA) over the shared settings of one dataset."""
    import functools

    from ray import tune
    from ray.tune import PlacementGroupFactory
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from fusion_ray.orchestrate import storage_uri, trial_resources
    from fusion_ray.tracking import MLflowTuningCallback

    spec, settings = plan.spec, plan.tune
    res = resources_for(spec, cell.dataset)
    epochs = cell.trial.train.epochs
    callback = MLflowTuningCallback(
        tracker, functools.partial(sample_cell, cell), parent_id, epochs, METRIC
    )
    trainable = tune.with_parameters(
        tuning_trial, base=dataclasses.asdict(cell.trial), resources=res.model_dump()
    )
    storage = storage_uri(spec.storage_path)
    tuner = tune.Tuner(
        tune.with_resources(trainable, PlacementGroupFactory([trial_resources(res)])),
        param_space={key: dist.domain() for key, dist in settings.space.items()},
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="max",
            search_alg=OptunaSearch(seed=settings.seed),
            scheduler=ASHAScheduler(
                time_attr="training_iteration",  # one report per epoch
                max_t=epochs,
                grace_period=min(settings.asha.grace_period, epochs),
                reduction_factor=settings.asha.reduction_factor,
            ),
            num_samples=settings.num_samples,
            max_concurrent_trials=settings.max_concurrent_trials or res.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=f"{spec.name}-{cell.dataset}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            verbose=verbose,
        ),
    )
    tuner.fit()
    return callback.best()


def fragment_text(plan: HpoPlan, best: dict[str, Best], sha: str) -> str:
    """The tuned fragment: best values per dataset, with where they came from as comments."""
    body: dict[str, Any] = {"datasets": {}}
    for dataset, b in best.items():
        entry: dict[str, dict[str, Any]] = {}
        for key, value in b.config.items():
            section, _, name = key.partition(".")
            entry.setdefault(section, {})[name] = value.item() if hasattr(value, "item") else value
        body["datasets"][dataset] = entry
    t = plan.tune
    lines = [
        f"# Tuned shared settings, written by `python -m fusion_ray.hpo {plan.path.name}` (git {sha}).",
        f"# Baseline operator {t.fusion.label}, position {t.position.label}, attention position "
        f"{t.attention_position.label}, seed {t.seed}; Optuna + ASHA, scored on validation accuracy only.",
    ]
    for dataset, b in best.items():
        lines.append(
            f"# {dataset}: best val_acc {b.value:.4f} of {b.trials} trials "
            f"(MLflow experiment {plan.spec.name}, run {b.run_id})"
        )
    lines.append(
        "# List this file in a sweep's `extends:` after the presets: every operator then trains with it."
    )
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False)


def run_hpo(plan: HpoPlan, *, address: str | None = None, verbose: int = 0) -> dict[str, Best]:
    """Tune every dataset of the plan, write the fragment, and log it to the HPO parent run."""
    import tempfile

    from fusion_ray.orchestrate import init_ray
    from fusion_ray.tracking import Tracker, git_sha, log_report_artifacts

    spec = plan.spec
    tracker = Tracker(spec.tracking_uri, spec.name)
    parent_id = tracker.parent_run(
        str(plan.path),
        params={
            "datasets": ",".join(plan.tune.datasets),
            "num_samples": str(plan.tune.num_samples),
            "fusion": plan.tune.fusion.label,
            "seed": str(plan.tune.seed),
        },
    )
    init_ray(address or spec.address)
    best: dict[str, Best] = {}
    for cell in expand(spec):
        print(
            f"tuning {cell.dataset}: {plan.tune.num_samples} trials of {cell.fusion}, seed {cell.seed}, "
            f"up to {cell.trial.train.epochs} epochs",
            flush=True,
        )
        found = tune_dataset(plan, cell, tracker, parent_id, verbose)
        if found is None:
            tracker.fail(parent_id, f"no tuning trial of dataset {cell.dataset} finished")
            raise RuntimeError(
                f"no tuning trial of dataset {cell.dataset} finished; see the FAILED runs "
                f"of MLflow experiment {spec.name} for why"
            )
        best[cell.dataset] = found
    text = fragment_text(plan, best, git_sha())
    plan.output.parent.mkdir(parents=True, exist_ok=True)
    plan.output.write_text(text)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, plan.output.name).write_text(text)
        log_report_artifacts(tracker, parent_id, tmp)
    tracker.end_parent(parent_id, {f"{d}.{METRIC}": b.value for d, b in best.items()})
    return best


# ----------------------------------------------------------------------------- CLI


def print_plan(plan: HpoPlan) -> None:
    t = plan.tune
    print(
        f"hpo {plan.spec.name}: {len(t.datasets)} dataset(s) x {t.num_samples} Optuna trials of "
        f"{t.fusion.label} (seed {t.seed}); ASHA grace {t.asha.grace_period}, reduction {t.asha.reduction_factor}; "
        f"metric {METRIC} (validation only); MLflow at {plan.spec.tracking_uri}"
    )
    for cell in expand(plan.spec):
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
    for dataset, b in best.items():
        print(
            f"{dataset}: best val_acc {100 * b.value:.2f}% with "
            + ", ".join(f"{k}={v}" for k, v in b.config.items())
        )
    print(
        f"\nwrote {plan.output}\nadd it to a sweep file's extends: after the presets, e.g. "
        f"extends: [_study_datasets.yaml, tuned/{plan.output.name}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
