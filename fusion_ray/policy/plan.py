"""A sweep's cells against what its MLflow experiment already holds.

A sweep is its cells: a run belongs to it only while its config matches a cell of the sweep
file. Runs of the experiment that match no cell (the file changed under the same name: another
number of epochs, another learning rate) are never counted, summarised or analysed as part of the
sweep; ``Plan.other_settings`` says what differs, so the user can separate them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusion_ray.config.workload import AnySweep, cells_of, decision_metric
from fusion_ray.other_settings import describe_differences, param_differences

# MLflow keeps at most this many characters of a param value (the tracker truncates to it).
PARAM_CHARS = 6000


@dataclass
class Plan:
    """What is left to do for a sweep, and what in its experiment is not part of it."""

    cells: list[Any]
    """The sweep's cells (``config.workload.cells_of``)."""
    existing: dict[str, Any] = field(default_factory=dict)
    """The best run (``tracking.CellRun``) of each of this sweep's cells that has one."""
    done: set[str] = field(default_factory=set)
    """This sweep's cells with a FINISHED run."""
    other_runs: int = 0
    """FINISHED trial runs of the experiment that match no cell of this sweep."""
    other_settings: list[str] = field(default_factory=list)
    """What those runs differ in, most common first (``train.epochs 2 in 9 runs vs 1 here``)."""

    @property
    def pending(self) -> list[Any]:
        return [c for c in self.cells if c.cell_id not in self.done]

    def other_settings_note(self, sweep: str) -> str | None:
        """One paragraph about the runs of other settings, or None when there are none."""
        if not self.other_runs:
            return None
        differ = "; ".join(self.other_settings) or "their configs differ from every cell"
        return (
            f"{self.other_runs} FINISHED run(s) in experiment {sweep!r} belong to other settings "
            f"({differ}); they are not counted, summarised or analysed with this sweep. To keep "
            f"both, give the changed file a new name, or make the setting a grid axis."
        )


def plan(spec: AnySweep, tracker: Any | None) -> Plan:
    """The sweep's cells against the runs ``tracker`` sees (None: an experiment not made yet),
    each run scored by the sweep's decision metric (``config.workload.decision_metric``)."""
    cells = cells_of(spec)
    if tracker is None:
        return Plan(cells)
    ids = {c.cell_id for c in cells}
    runs = tracker.trial_runs()
    best = tracker.best_runs(runs, *decision_metric(spec))
    existing = {cid: run for cid, run in best.items() if cid in ids}
    done = {cid for cid, run in existing.items() if run.status == "FINISHED"}
    foreign = [
        r for r in runs if r.info.status == "FINISHED" and r.data.tags.get("cell_id") not in ids
    ]
    return Plan(cells, existing, done, len(foreign), other_settings_lines(cells, foreign))


def other_settings_lines(cells: list[Any], runs: list[Any]) -> list[str]:
    """What ``runs`` (matching no cell) differ in from the cells with their grid point and seed
    (``Cell.identity``: a study cell's dataset, positions, operator and seed), worded as the
    report words it (``fusion_ray.other_settings``)."""
    names = list(cells[0].identity()) if cells else []
    by_key = {tuple(c.identity().values()): c for c in cells}
    pairs, unmatched = [], 0
    for run in runs:
        cell = by_key.get(tuple(run.data.tags.get(t, "") for t in names))
        if cell is None:
            unmatched += 1
            continue
        mine = {k: v[:PARAM_CHARS] for k, v in cell.params().items()}
        pairs.append((run.data.params, mine))
    lines = describe_differences(param_differences(pairs))
    if unmatched:
        lines.append(f"{unmatched} run(s) of a {'/'.join(names)} this file does not have")
    return lines
