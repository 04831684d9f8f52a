"""The searcher of a trainable's tuning: Optuna told each trial's final result only. A trainable
reports its own metrics as it trains, and the tuned one (a metric it returns) comes with its
final result; Ray's ``OptunaSearch`` reads the metric from every intermediate result, and Tune
refuses results without a searcher's metric, so the wrapper keeps the metric to itself and
forwards only the completions."""

from __future__ import annotations

from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch


class FinalResultSearch(Searcher):
    """``OptunaSearch`` on ``metric`` and ``mode``, seeded, scored on final results only."""

    def __init__(self, metric: str, mode: str, seed: int) -> None:
        super().__init__(metric=None, mode=None)
        self.inner = OptunaSearch(metric=metric, mode=mode, seed=seed)

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return self.inner.set_search_properties(None, None, config, **spec)

    def suggest(self, trial_id: str) -> dict | None:
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        return None  # an intermediate report: not the tuned metric

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self.inner.on_trial_complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)
