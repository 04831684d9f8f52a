"""How settings tuned on several operators are chosen: by mean validation rank (a pure function
of the scores, no Ray, no MLflow)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any


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
