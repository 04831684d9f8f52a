"""The Ray Tune searcher of an adaptive sweep: it suggests the cells the evidence still needs
(``schedule.SeedSchedule``) as results arrive, so no trial slot waits for a round to end; Tune's
``max_concurrent_trials`` bounds how many run at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.tune.search import Searcher

from fusion_ray.policy.schedule import SeedSchedule
from fusion_ray.train.result import TrialResult


class AdaptiveSeedSearcher(Searcher):
    """Suggests ``{"cell_id": ...}`` for each needed cell once; waits (None) while results that
    could change what is needed are in flight; FINISHED when nothing is needed or running."""

    def __init__(
        self, schedule: SeedSchedule, on_change: Callable[[SeedSchedule], None] | None = None
    ) -> None:
        super().__init__()  # no metric: it reads each trial's final result itself
        self.schedule = schedule
        self.on_change = on_change
        """Called with the schedule after each result (the driver logs the evidence as it forms)."""
        self.started: set[str] = set()
        self.running: dict[str, str] = {}  # Tune trial id -> cell id

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        for cell in self.schedule.needed():
            if cell.cell_id not in self.started:
                self.started.add(cell.cell_id)
                self.running[trial_id] = cell.cell_id
                return {"cell_id": cell.cell_id}
        # Ray's Searcher.suggest is typed dict | None, but its protocol ends the search with
        # the string Searcher.FINISHED
        return None if self.running else Searcher.FINISHED  # type: ignore[return-value]

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        cid = self.running.pop(trial_id, None)
        if cid is None:
            return
        reported = TrialResult.of(result)
        self.schedule.results[cid] = reported.scores if reported.final and not error else None
        if self.on_change is not None:
            self.on_change(self.schedule)

    def lost(self, cell_id: str) -> None:
        """A cell whose trial's process or node was lost: not scored (its hypotheses wait at
        its seed) and not suggested again in this run; the next invocation runs it again."""
        if self.schedule.results.pop(cell_id, "unknown") is None and self.on_change is not None:
            self.on_change(self.schedule)

    def save(self, checkpoint_path: str) -> None:
        """Nothing to keep: a restarted driver rebuilds the schedule from the tracking store."""

    def restore(self, checkpoint_path: str) -> None:
        """See ``save``: the schedule is a function of the finished runs, not of this object."""
