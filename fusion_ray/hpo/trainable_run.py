"""A trainable's tuning run (``fusion_ray.hpo.trainable`` reads its file): each Optuna sample a
Ray Tune trial of the trainable at the tuning seed, one MLflow run per trial logged as a
trainable sweep's runs are, the best written as the fragment and logged to the parent run."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune import PlacementGroupFactory

from fusion_ray.driver import placement
from fusion_ray.driver.callbacks import DriverStopper, TrackingCallback, failure_kind
from fusion_ray.driver.lease import LeaseLostError
from fusion_ray.driver.progress import trial_error_text
from fusion_ray.driver.session import DriverSession, init_ray, tune_output
from fusion_ray.driver.storage import storage_uri
from fusion_ray.driver.tracking import log_report_artifacts
from fusion_ray.driver.trainable_trial import TrainableJob, run_trainable_cell
from fusion_ray.driver.trial import trial_resources
from fusion_ray.driver.workload import TrainableWorkload
from fusion_ray.hpo.fragment import refuse_if_tuned, stamp, values_text, write_fragment_file
from fusion_ray.hpo.searcher import FinalResultSearch
from fusion_ray.hpo.trainable import TrainablePlan, fragment_text, spec_group, tuning_cell
from fusion_ray.train.result import TrialResult
from fusion_ray.version import git_sha


def tuning_trial(config: dict[str, Any], plan: TrainablePlan, tune_run: str, storage: str) -> None:
    """Ray Tune function trainable: the trainable at its sampled settings and the tuning seed."""
    cell = tuning_cell(plan, config)
    spec = plan.spec
    job = TrainableJob(
        cell.cell_id, spec.name, tune_run, spec.trainable, cell.config, spec.tune.seed,
        spec.resources, f"{storage.rstrip('/')}/{spec.name}-train", metric=spec.tune.metric.name,
    )  # fmt: skip
    run_trainable_cell(job)


class TuningCallback(TrackingCallback):
    """One MLflow run per tuning trial (keyed by Tune's trial id), logged as a trainable's
    sweep's runs are (``TrainableWorkload``'s names), and a line per ended trial."""

    noun = "trial"

    def __init__(self, tracker: Any, plan: TrainablePlan, parent_id: str, lease: Any) -> None:
        super().__init__(tracker, lease)
        self.plan, self.parent_id = plan, parent_id
        self.names = TrainableWorkload(plan.spec)
        self.configs: dict[str, dict[str, Any]] = {}
        self.scores: dict[str, float] = {}

    def key(self, trial: Any) -> str:
        return trial.trial_id

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.run_ids or not self._holds():
            return
        self.configs[trial.trial_id] = dict(trial.config)
        cell = tuning_cell(self.plan, trial.config)
        self.run_ids[trial.trial_id] = self.tracker.open_cell_run(
            cell, self.parent_id, None, resume=False
        )

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        run_id = self.run_ids.get(trial.trial_id)
        reported = TrialResult.of(result)
        if run_id is None or reported.error or not self._holds():
            return
        if reported.final:
            self.tracker.log_final(run_id, result, *self.names.final_record(result))
            metric = self.plan.spec.tune.metric.name
            if metric in result:
                self.scores[trial.trial_id] = float(result[metric])
        elif reported.epoch is not None:
            self.tracker.log_epoch(run_id, result, self.names.epoch_metrics(result))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None or trial.trial_id in self.failed or not self._holds():
            return
        last = TrialResult.of(trial.last_result)
        if last.error or trial.trial_id not in self.scores:
            reason = last.error or "the trial ended without returning the tuned metric"
            self.failed[trial.trial_id] = reason
            self.tracker.fail(run_id, reason, kind="trial")
            print(f"  [{len(self.finished) + len(self.failed)}] FAILED: {reason}", flush=True)
            return
        self.tracker.finish(run_id, lease_token=self.lease.token if self.lease else None)
        self.finished.add(trial.trial_id)
        metric = self.plan.spec.tune.metric.name
        print(
            f"  [{len(self.finished) + len(self.failed)}] {values_text(self.configs[trial.trial_id])}"
            f": {metric} {self.scores[trial.trial_id]:.4g}",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._holds():
            return
        if trial.trial_id not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = trial_error_text(trial)
        self.failed[trial.trial_id] = reason
        self.tracker.fail(self.run_ids[trial.trial_id], reason, kind=failure_kind(reason))

    def best(self) -> tuple[dict[str, Any], float, str] | None:
        """The best finished trial's (sampled settings, score, run id); ties to the earlier."""
        done = [t for t in self.configs if t in self.finished]
        if not done:
            return None
        sign = 1.0 if self.plan.spec.tune.metric.mode == "max" else -1.0
        top = max(done, key=lambda t: sign * self.scores[t])
        return self.configs[top], self.scores[top], self.run_ids[top]


def run_trainable_hpo(
    plan: TrainablePlan,
    *,
    address: str | None = None,
    verbose: int = 0,
    take_over: bool = False,
    overwrite: bool = False,
) -> tuple[dict[str, Any], float, str]:
    """Tune, write the fragment and log it to the parent run, in one ``DriverSession`` as the
    study's HPO phase (one driver per file, placement checked first, the fragment never written
    over a file without ``overwrite``). ``RuntimeError`` when no trial finished."""
    seen = stamp(plan.output)
    init_ray(address or plan.spec.address)
    spec = placement.fit(plan.spec, [spec_group(plan)], smoke=False).spec
    plan = dataclasses.replace(plan, spec=spec)
    t = spec.tune
    with DriverSession(
        "HPO", spec.name, spec.tracking_uri, spec.storage_path,
        take_over=take_over, resume="it tunes from the start",
    ) as session:  # fmt: skip
        refuse_if_tuned(plan.output, spec.name, seen, overwrite=overwrite)
        params = {"trainable": spec.trainable, "num_samples": str(t.num_samples)}
        params |= {"seed": str(t.seed), "tuned_metric": t.metric.name}
        session.open_parent(str(plan.path), params)
        with session.driving():
            callback = TuningCallback(session.tracker, plan, session.parent, session.lease)
            with session.tune_run(lambda: len(callback.finished)), tune_output(verbose):
                tuner(plan, callback, session.stopping, verbose).fit()
            session.after_tune(
                failed=bool(callback.failed),
                store_lost=callback.store_lost,
                finished_now=len(callback.finished),
            )
            best = callback.best()
            if best is None:
                raise RuntimeError(
                    f"no tuning trial finished; see the FAILED runs of MLflow experiment "
                    f"{spec.name} for why"
                )
            text = fragment_text(plan, best, git_sha())
            if not session.lease.holds():
                raise LeaseLostError(session.lease.lost_message())
            write_fragment_file(plan.output, text, overwrite=overwrite)
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, plan.output.name).write_text(text)
                log_report_artifacts(session.tracker, session.parent, tmp)
            session.end({"best": best[1], "trials": float(len(callback.run_ids))})
        return best


def tuner(
    plan: TrainablePlan, callback: TuningCallback, stopping: Callable[[], bool], verbose: int
) -> tune.Tuner:
    """The tuning's Ray Tune run: ``num_samples`` trials of the trainable, each on the sweep's
    resources, sampled by Optuna from the space and scored on their final results."""
    spec, t = plan.spec, plan.spec.tune
    tune_run = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = storage_uri(spec.storage_path)
    trainable = tune.with_parameters(tuning_trial, plan=plan, tune_run=tune_run, storage=storage)
    return tune.Tuner(
        tune.with_resources(trainable, PlacementGroupFactory([trial_resources(spec.resources)])),
        param_space={key: dist.domain() for key, dist in t.space.items()},
        tune_config=tune.TuneConfig(
            search_alg=FinalResultSearch(t.metric.name, t.metric.mode, t.seed),
            num_samples=t.num_samples,
            max_concurrent_trials=t.max_concurrent_trials or spec.resources.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=tune_run,
            storage_path=storage,
            stop=DriverStopper(callback, stopping),
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            verbose=verbose,
        ),  # fmt: skip
    )
