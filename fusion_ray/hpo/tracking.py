"""The HPO phase's Ray Tune callback: one MLflow run per tuning trial (keyed by Tune's trial id),
the best by the phase's metric kept, with the sweep callback's one error policy
(``fusion_ray.driver.callbacks.TrackingCallback``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusion_ray.driver.callbacks import TrackingCallback, failure_kind
from fusion_ray.driver.progress import trial_error_text
from fusion_ray.driver.tracking import Tracker
from fusion_ray.schema import EPOCH_METRICS
from fusion_ray.study.workload import final_metric_names
from fusion_ray.train.result import TrialResult

if TYPE_CHECKING:
    from fusion_ray.config.grid import Cell
    from fusion_ray.driver.lease import SweepLease


@dataclass
class Best:
    """The best tuning trial of a study: its sampled settings, score, MLflow run, trials run."""

    config: dict[str, Any]
    value: float
    run_id: str
    trials: int


class MLflowTuningCallback(TrackingCallback):
    """Writes every tuning trial to MLflow (one run each, keyed by Tune's trial id) and keeps the
    best by ``metric``; a sample's run carries the config ``cell_for(sample)`` builds."""

    def __init__(
        self,
        tracker: Tracker,
        cell_for: Callable[[dict[str, Any]], Cell],
        parent_id: str,
        epochs: int,
        metric: str,
        lease: SweepLease | None = None,
    ) -> None:
        super().__init__(tracker, lease)
        self.cell_for, self.parent_id, self.epochs, self.metric = (
            cell_for,
            parent_id,
            epochs,
            metric,
        )
        self.last: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.ended = 0

    noun = "trial"

    def key(self, trial: Any) -> str:
        return trial.trial_id

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.run_ids or not self._holds():  # a retry, or fenced off
            return
        self.configs[trial.trial_id] = dict(trial.config)
        cell = self.cell_for(self.configs[trial.trial_id])
        self.run_ids[trial.trial_id] = self.tracker.open_cell_run(
            cell, self.parent_id, None, resume=False
        )

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.last[trial.trial_id] = result
        if trial.trial_id in self.run_ids and self._holds():
            reported = TrialResult.of(result)
            if reported.set_aside is not None:
                self.checkpoint_set_aside(trial.trial_id, reported.set_aside)
            self.tracker.log_epoch(self.run_ids[trial.trial_id], result, EPOCH_METRICS)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id not in self.run_ids or not self._holds():
            return  # fenced off: the driver that took over tunes again
        run_id, result = self.run_ids[trial.trial_id], self.last.get(trial.trial_id, {})
        self.tracker.log_final(run_id, result, final_metric_names(result))
        self.tracker.finish(run_id, lease_token=self.lease.token if self.lease else None)
        self.finished.add(trial.trial_id)
        self.ended += 1
        config, cell = self.configs[trial.trial_id], self.cell_for(self.configs[trial.trial_id])
        stopped = "" if result.get("epochs_run", 0) >= self.epochs else ", stopped early"
        settings = ", ".join(  # without Tune's own keys (a Repeater's __trial_index__)
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in config.items()
            if not k.startswith("__")
        )
        print(
            f"  [{cell.dataset} {cell.fusion} {self.ended}] {settings}: best val_acc "
            f"{100 * result.get(self.metric, 0):.2f}% after {result.get('epochs_run', 0)} epoch(s){stopped}",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._holds():
            return
        if trial.trial_id not in self.run_ids:
            self.on_trial_start(iteration, trials, trial)
        reason = trial_error_text(trial)
        self.failed[trial.trial_id] = reason
        self.ended += 1
        self.tracker.fail(self.run_ids[trial.trial_id], reason, kind=failure_kind(reason))

    def best(self) -> Best | None:
        done = [t for t in self.last if t not in self.failed and self.metric in self.last[t]]
        if not done:
            return None
        # Highest score; ties go to the lower validation loss, then the earlier trial.
        top = max(
            done, key=lambda t: (self.last[t][self.metric], -self.last[t].get("val_loss", math.inf))
        )
        return Best(
            self.configs[top],
            float(self.last[top][self.metric]),
            self.run_ids[top],
            len(self.run_ids),
        )
