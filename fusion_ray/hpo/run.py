"""The tuning itself: one Optuna study through Ray Tune per dataset, each trial trained on the
validation split only, then the fragment written and logged to the HPO file's parent run."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from fusion_ray.config import Resources, resources_for
from fusion_ray.config.grid import Cell, cell_id, expand
from fusion_ray.driver import placement
from fusion_ray.driver.lease import LeaseLostError
from fusion_ray.driver.session import DriverSession, init_ray, tune_output
from fusion_ray.driver.storage import storage_uri
from fusion_ray.driver.trial import trial_resources
from fusion_ray.hpo.fragment import (
    fragment_text,
    refuse_if_tuned,
    stamp,
    summary,
    write_fragment_file,
)
from fusion_ray.hpo.ranking import Ranking, ScoredSetting, rank_settings
from fusion_ray.hpo.spec import METRIC, HpoPlan
from fusion_ray.schema import CPU_REHEARSAL_TAG, OVERRIDES_TAG
from fusion_ray.study.trial import run_direct
from fusion_ray.train.report import TuneReporter
from fusion_ray.train.result import TrialResult
from fusion_ray.train.spec import TrialConfig

if TYPE_CHECKING:
    from fusion_ray.hpo.tracking import Best, MLflowTuningCallback

OPERATOR_INDEX = "__trial_index__"
"""The key Ray Tune's ``Repeater`` adds to each repeat's config (``ray.tune.search.repeater.
TRIAL_INDEX``): when several operators are tuned, repeat i of a sampled setting trains operator i."""


@dataclass
class ValidationReporter(TuneReporter):
    """Reports each epoch's validation metrics with the best so far, and no checkpoints. The shared
    loop still scores the test split at the end; that report is dropped here, so test metrics
    never reach Tune, Optuna or MLflow."""

    best_val_acc: float = -1.0

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
        from ray import tune

        if TrialResult.of(metrics).final:
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

    base = bases[config.get(OPERATOR_INDEX, 0)]
    run_direct(with_overrides(base, sampled_values(config)), resources, ValidationReporter)


def sample_cell(bases: list[Cell], config: dict[str, Any]) -> Cell:
    """The cell of one tuning trial: its operator's cell with the sampled settings (own cell id)."""
    base = bases[config.get(OPERATOR_INDEX, 0)]
    trial = with_overrides(dataclasses.asdict(base.trial), sampled_values(config))
    return dataclasses.replace(base, point_trial=trial, cell_id=cell_id(trial))


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


def tune_dataset(
    plan: HpoPlan, cells: list[Cell], session: DriverSession, verbose: int = 0
) -> Best | Ranking | None:
    """One Optuna study (through Ray Tune) over the shared settings of one dataset; ``cells`` are
    the dataset's cells, one per tuned operator. One operator: ASHA stops trials early and the best
    trial is returned. Several: each sampled setting runs as one trial per operator, and the
    settings that finished on all of them are returned ranked. None when nothing finished."""
    # lazy: ray.tune takes ~1.7 s to import; kept out of --dry-run and --help
    from ray import tune
    from ray.tune import PlacementGroupFactory
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import Repeater
    from ray.tune.search.optuna import OptunaSearch

    # lazy: callbacks import ray.tune and mlflow (~2.9 s); kept out of --dry-run and --help
    from fusion_ray.driver.callbacks import DriverStopper
    from fusion_ray.hpo.tracking import MLflowTuningCallback

    spec, settings = plan.spec, plan.tune
    dataset, operators = cells[0].dataset, [c.fusion for c in cells]
    res = resources_for(spec, dataset)
    epochs = cells[0].trial.train.epochs
    callback = MLflowTuningCallback(
        session.tracker,
        functools.partial(sample_cell, cells),
        session.parent,
        epochs,
        METRIC,
        lease=session.lease,
    )
    trainable = tune.with_parameters(
        tuning_trial,
        bases=[dataclasses.asdict(c.trial) for c in cells],
        resources=res,
    )
    search: Any = OptunaSearch(seed=settings.seed)
    scheduler: ASHAScheduler | None = ASHAScheduler(
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
            reuse_actors=True,  # as a sweep: warm actors, not a process per trial (same resources)
        ),
        run_config=tune.RunConfig(
            name=f"{spec.name}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage,
            stop=DriverStopper(callback, session.stopping),
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            verbose=verbose,
        ),
    )
    try:
        with session.tune_run(lambda: callback.ended), tune_output(verbose):
            tuner.fit()
    finally:
        callback.close_unfinished()  # a stopped driver's tuning runs: KILLED, not RUNNING
    session.after_tune(
        failed=bool(callback.failed), store_lost=callback.store_lost, finished_now=callback.ended
    )
    if len(cells) == 1:
        return callback.best()
    ranked = rank_settings(scored_settings(callback, operators))
    return Ranking(operators, ranked, len(callback.run_ids)) if ranked else None


def run_hpo(
    plan: HpoPlan,
    *,
    address: str | None = None,
    verbose: int = 0,
    take_over: bool = False,
    overwrite: bool = False,
) -> dict[str, Best | Ranking]:
    """Tune every dataset of the plan, write the fragment, and log it to the HPO parent run.

    Inside one ``DriverSession``, as a sweep: one driver per HPO file (``LeaseHeldError`` for a
    second; one paused past the lease's TTL stops with ``LeaseLostError`` and writes nothing
    more), the parent run KILLED or FAILED with the reason, a lost Ray head and a full storage
    path each one message. Before any run is created, the cluster must be able to place the
    trials (``placement.PlacementError`` otherwise: never an endless wait); a smoke plan on a Ray
    without GPUs rehearses GPU trials on CPUs. Once the lease is held, the fragment is looked at
    again (``FragmentExistsError``: it exists without ``overwrite``, or another driver wrote it
    while this one waited), so two drivers never tune one file twice; it is written only by the
    lease's holder, and never over a file without ``overwrite``."""

    seen = stamp(plan.output)  # the fragment as this command found it
    # every trial of an HPO file is known before it starts: placement is checked before the
    # session creates anything in the tracking store
    init_ray(address or plan.spec.address)
    placed = placement.fit(plan.spec, plan.tune.datasets, smoke=plan.smoke)
    spec, rehearsed = placed.spec, placed.rehearsed_on_cpus
    plan = dataclasses.replace(plan, spec=spec)
    with DriverSession(
        "HPO",
        spec.name,
        spec.tracking_uri,
        spec.storage_path,
        take_over=take_over,
        resume="it tunes from the start",
    ) as session:
        refuse_if_tuned(plan.output, spec.name, seen, overwrite=overwrite)
        session.open_parent(str(plan.path), _parent_params(plan, rehearsed))
        with session.driving():
            best = {
                dataset: _tune_one(plan, dataset, session, verbose)
                for dataset in plan.tune.datasets
            }
            _write_fragment(plan, best, session, overwrite)
        return best


def _parent_params(plan: HpoPlan, rehearsed: bool) -> dict[str, str]:
    t = plan.tune
    params = {
        "datasets": ",".join(t.datasets),
        "num_samples": str(t.num_samples),
        "fusion": ",".join(op.label for op in t.operators),
        "seed": str(t.seed),
    }
    if plan.overrides:
        params[OVERRIDES_TAG] = json.dumps(list(plan.overrides))
    if rehearsed:
        params[CPU_REHEARSAL_TAG] = "true"
    return params


def _tune_one(plan: HpoPlan, dataset: str, session: DriverSession, verbose: int) -> Best | Ranking:
    """One dataset's study; raises ``RuntimeError`` (the parent run FAILED) when nothing
    finished."""
    t = plan.tune
    mine = [c for c in expand(plan.spec) if c.dataset == dataset]  # one per operator, tune order
    print(
        f"tuning {dataset}: {t.num_samples} settings x {', '.join(op.label for op in t.operators)}, "
        f"seed {t.seed}, up to {mine[0].trial.train.epochs} epochs",
        flush=True,
    )
    found = tune_dataset(plan, mine, session, verbose)
    if found is None:
        what = (
            f"tuning trial of dataset {dataset} finished"
            if len(mine) == 1
            else f"sampled setting of dataset {dataset} finished on every operator"
        )
        raise RuntimeError(
            f"no {what}; see the FAILED runs of MLflow experiment {plan.spec.name} for why"
        )
    return found


def _write_fragment(
    plan: HpoPlan, best: dict[str, Best | Ranking], session: DriverSession, overwrite: bool
) -> None:
    """The fragment written to its path by the lease's holder (``LeaseLostError`` when another
    driver took the lease over) and logged to the parent run, which then ends."""

    # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.tracking import log_report_artifacts
    from fusion_ray.version import git_sha

    text = fragment_text(plan, best, git_sha())
    if not session.lease.holds():
        raise LeaseLostError(session.lease.lost_message())
    write_fragment_file(plan.output, text, overwrite=overwrite)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, plan.output.name).write_text(text)
        log_report_artifacts(session.tracker, session.parent, tmp)
    session.end({k: v for d, b in best.items() for k, v in summary(d, b).items()})
