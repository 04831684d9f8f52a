"""A trainable's own tuning phase: an HPO file that names a trainable (``trainable: NAME``).
Optuna through Ray Tune searches the trainable's shared settings at one seed that none of the
sweeps it is for uses, scored on a metric the file names (one the trainable returns, a
validation metric: never the metric those sweeps decide on), one MLflow run per trial; the best
setting is written as a fragment whose ``defaults:`` the sweep files list under ``extends:``::

    name: digits_tuning
    trainable: digits_mlp
    defaults: {epochs: 8, dropout: 0.1}
    tune:
      at: {label_smoothing: 0.0}           # the tuned trials' settings over the defaults
      seed: 1000                           # none of the sweeps' seeds
      num_samples: 8
      metric: {name: best_val_acc, mode: max}
      space: {lr: {type: loguniform, low: 0.0003, high: 0.03}}
    output: tuned/digits.yaml              # beside this file
    sweeps: [label_smoothing.yaml]

Every problem is said before Ray starts: the schema, the trainable's name, a searched key that
``tune.at`` also sets, and against each listed sweep its trainable, its seeds, its decision
metric and its grid axes (a searched key that the sweep varies would be chosen for one arm).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, StrictInt

from fusion_ray.config import (
    Resources,
    SweepFileError,
    apply_overrides,
    read_sweep_dict,
    read_yaml_mapping,
)
from fusion_ray.config.fields import Address, Description, StoragePath, SweepName, TrackingUri
from fusion_ray.config.files import validate_collecting
from fusion_ray.config.spec import MAX_SEED, Strict
from fusion_ray.config.trainable import (
    Level,
    TrainableCell,
    cell_key,
    name_problems,
    with_levels,
)
from fusion_ray.hpo.fragment import plain_value, short
from fusion_ray.hpo.spec import Distribution, sweep_seeds
from fusion_ray.schema import axis_text


class TuneMetric(Strict):
    """What the tuning is scored on: a metric the trainable returns."""

    name: str = Field(pattern=r"^[A-Za-z0-9_./ -]{1,250}$")
    mode: Literal["max", "min"] = "max"


class TrainableTune(Strict):
    """The ``tune:`` section of a trainable's HPO file."""

    seed: StrictInt = Field(ge=0, le=MAX_SEED)
    """The one seed every tuning trial runs at: none of the sweeps' paired seeds."""
    num_samples: StrictInt = Field(8, ge=1, le=10_000)
    metric: TuneMetric
    space: dict[str, Distribution] = Field(min_length=1)
    """Each searched (dotted) key of the trainable's config and its distribution."""
    at: dict[str, Level] = Field(default_factory=dict)
    """Settings of the tuned trials over ``defaults`` (a sweep's baseline level, say)."""
    max_concurrent_trials: StrictInt | None = Field(None, ge=1)
    """Default: ``resources.max_concurrent_trials``."""


class TrainableHpo(Strict):
    """A trainable's HPO file: what is tuned, how, and for which sweep files."""

    name: SweepName
    """The MLflow experiment of the tuning trials."""
    description: Description = ""
    trainable: str
    defaults: dict[str, Any] = Field(default_factory=dict)
    tune: TrainableTune
    output: str = Field(min_length=1)
    """The fragment written, relative to this file."""
    sweeps: list[str] = Field(default_factory=list)
    """The trainable's sweep files the fragment is for, relative to this file."""
    resources: Resources = Field(default_factory=Resources)
    storage_path: StoragePath = "ray_results"
    tracking_uri: TrackingUri = "sqlite:///mlflow.db"
    retries: StrictInt = Field(1, ge=0, le=100)
    address: Address = None

    def base_config(self) -> dict[str, Any]:
        """The config every tuning trial starts from: the defaults with ``tune.at`` set."""
        return with_levels(self.defaults, self.tune.at)

    def group_resources(self, group: str) -> Resources:
        return self.resources

    def with_resources(self, change: Callable[[Resources], Resources]) -> TrainableHpo:
        return self.model_copy(update={"resources": change(self.resources)})


@dataclasses.dataclass
class TrainablePlan:
    """A validated trainable HPO file: its spec, where it is, the fragment it writes, the seeds
    of the sweeps it is for."""

    spec: TrainableHpo
    path: Path
    output: Path
    sweeps: dict[str, list[Any]]
    overrides: Sequence[str] = ()


def is_trainable_hpo(path: str | Path) -> bool:
    """Whether an HPO file names a trainable (read as YAML only)."""
    return "trainable" in read_sweep_dict(path)


def load_trainable_hpo(path: str | Path, overrides: Sequence[str] = ()) -> TrainablePlan:
    """The file validated; ``SweepFileError`` listing every problem, before Ray starts."""
    path = Path(path).resolve()
    raw = apply_overrides(read_sweep_dict(path), overrides, path)
    spec, problems = validate_collecting(TrainableHpo, raw)
    if spec is None or problems:
        raise SweepFileError(path, problems)
    problems = name_problems(spec)
    problems += [
        f"tune.space.{key}: tune.at sets it too; search it or set it, not both"
        for key in spec.tune.space
        if key in spec.tune.at
    ]
    output = (path.parent / spec.output).resolve()
    seeds: dict[str, list[Any]] = {}
    for name in spec.sweeps:
        found = _sweep_problems(spec, path.parent / name, output)
        if isinstance(found, list):
            problems += [f"sweeps: {name}: {p}" for p in found]
        else:
            seeds[name] = found[1]
    if problems:
        raise SweepFileError(path, problems)
    return TrainablePlan(spec, path, output, seeds, tuple(overrides))


def _sweep_problems(
    spec: TrainableHpo, sweep: Path, output: Path
) -> list[str] | tuple[None, list[Any]]:
    """A listed sweep against the tuning: its problems, or (None, its seeds)."""
    try:  # as written: the fragment it extends may not exist before the tuning writes it
        raw = read_yaml_mapping(sweep)
        seeds = sweep_seeds(sweep, output)
    except (OSError, ValueError, SweepFileError) as exc:
        return [f"cannot be read ({' '.join(str(exc).split())[:300]})"]
    problems = []
    if raw.get("trainable") != spec.trainable:
        problems.append(
            f"is a sweep of {raw.get('trainable') or 'the study'}, not of {spec.trainable}"
        )
    if spec.tune.seed in (seeds if isinstance(seeds, list) else []):
        problems.append(
            f"runs seed {spec.tune.seed}: tuning on a paired seed lets that seed's own runs "
            "choose the settings the comparison then scores; give tune.seed a seed it never runs"
        )
    decided = (raw.get("metric") or {}).get("name") if isinstance(raw.get("metric"), dict) else None
    if decided is not None and decided == spec.tune.metric.name:
        problems.append(
            f"decides on {decided}, the metric tuned on: tune on a validation metric the trainable "
            "returns (its test metric would then choose its own settings)"
        )
    grid = raw.get("grid")
    axes: dict[str, Any] = grid if isinstance(grid, dict) else {}
    problems += [
        f"varies {key} (grid): a searched key the comparison varies would be tuned for one arm"
        for key in spec.tune.space
        if key in axes
    ]
    return problems or (None, list(seeds) if isinstance(seeds, list) else [])


def print_trainable_plan(plan: TrainablePlan) -> None:
    spec, t = plan.spec, plan.spec.tune
    print(
        f"hpo {spec.name}: {t.num_samples} Optuna settings of trainable {spec.trainable} at seed "
        f"{t.seed}, scored on {t.metric.name} ({t.metric.mode})"
    )
    for key, dist in t.space.items():
        bounds = (
            dist.values if dist.type == "choice" else f"[{short(dist.low)}, {short(dist.high)}]"
        )
        print(f"    {key:<22} {dist.type:<10} {bounds}")
    if t.at:
        print("  at " + ", ".join(f"{k}={axis_text(v)}" for k, v in t.at.items()))
    print(f"  writes {plan.output}")
    for name, seeds in plan.sweeps.items():
        print(f"  for {name} (seeds {seeds}; tuning seed {t.seed} is none of them)")


def tuning_cell(plan: TrainablePlan, config: dict[str, Any]) -> TrainableCell:
    """One tuning trial as a cell (its MLflow run): the sampled values as its axes."""
    spec = plan.spec
    sampled = tuple((key, axis_text(plain_value(config[key]))) for key in spec.tune.space)
    full = with_levels(spec.base_config(), {k: plain_value(v) for k, v in config.items()})
    cid = cell_key(spec.trainable, full, spec.tune.seed)
    return TrainableCell(cid, spec.trainable, spec.tune.seed, "tuning", sampled, sampled, full)


def fragment_text(plan: TrainablePlan, best: tuple[dict[str, Any], float, str], sha: str) -> str:
    """The fragment: the chosen values under ``defaults:``, how they were chosen as comments."""
    config, score, run_id = best
    spec, t = plan.spec, plan.spec.tune
    chosen = with_levels({}, {k: plain_value(v) for k, v in config.items() if k in t.space})
    lines = [
        f"# written by fusion-ray hpo {plan.path.name} (git {sha}): trainable {spec.trainable}, "
        f"{t.num_samples} Optuna settings at seed {t.seed}",
        f"# chosen: {t.metric.name} {score:.6g} ({t.metric.mode}), MLflow experiment "
        f"{spec.name}, run {run_id}",
        "# list it under extends: in the sweep files it is for; keep these keys out of their own",
        "# defaults: (a sweep file's own keys win over what it extends)",
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump({"defaults": chosen}, sort_keys=False)


def spec_group(plan: TrainablePlan) -> str:
    """The one resource group of a tuning (``placement.fit`` checks it): the trainable."""
    return plan.spec.trainable


def found_text(plan: TrainablePlan, best: tuple[dict[str, Any], float, str]) -> str:
    """What was chosen, where the fragment went, and the ``extends:`` line of each sweep."""
    config, score, _ = best
    t = plan.spec.tune
    chosen = json.dumps({k: plain_value(v) for k, v in config.items() if k in t.space})
    lines = [f"\nbest {t.metric.name} {score:.4g} with {chosen}", f"wrote {plan.output}"]
    for name in plan.sweeps:
        folder = (plan.path.parent / name).resolve().parent
        lines.append(f"in {name}: extends: [{os.path.relpath(plan.output, folder)}]")
    lines.append("(keep its keys out of the sweep files' own defaults: they would win)")
    return "\n".join(lines)
