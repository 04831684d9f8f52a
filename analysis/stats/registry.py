"""The registry of statistics: the built-in ones, then the plug-ins of the entry-point group
``fusion_ray.statistics`` (through ``fusion_ray.registry.Registry``, the loader of every
registry), then any ``register``ed at run time.
"""

from __future__ import annotations

from typing import Any

from analysis.stats.builtin import STATISTICS
from analysis.stats.statistic import Statistic
from fusion_ray.registry import Registry

PLUGIN_GROUP = "fusion_ray.statistics"
"""The entry-point group of plug-in statistics: ``name = "package.module:STATISTIC"`` naming a
``Statistic`` (or a function of no arguments returning one). Loaded the first time the registry
is read, in every process."""

BUILT_IN = "analysis (built in)"
"""The origin of the built-in statistics."""


def _as_statistic(loaded: Any, package: str) -> Statistic:
    """An entry point's ``Statistic`` (or the one its function of no arguments returns)."""
    statistic = loaded if isinstance(loaded, Statistic) else loaded()
    if not isinstance(statistic, Statistic):
        raise TypeError(
            f"an entry point of {package} ({PLUGIN_GROUP}) gives {type(statistic).__name__}, "
            "not an analysis.stats.Statistic"
        )
    _check_columns(statistic)
    return statistic


REGISTRY: Registry[Statistic] = Registry(
    "statistic", group=PLUGIN_GROUP, accept=_as_statistic, named=lambda s: s.name
)
"""Every statistic by name, in order: built in, plug-ins, ``register``ed."""
for _statistic in STATISTICS:
    REGISTRY.register(_statistic.name, origin=BUILT_IN)(_statistic)


def statistics() -> list[Statistic]:
    """The registered statistics, in order: the built-in ones, then the plug-ins of the
    ``fusion_ray.statistics`` entry-point group (loaded on first use), then any ``register``ed."""
    return [REGISTRY.get(name) for name in REGISTRY.names()]


def origin(name: str) -> str:
    """Where a statistic comes from: ``analysis (built in)``, a plug-in package, or ``register()``."""
    return REGISTRY.origin(name)


def register(statistic: Statistic) -> None:
    """Add a statistic after the registered ones; it is computed for every comparison from then
    on (main comparisons and length buckets) and written to stats.csv and report.md."""
    REGISTRY.load_plugins()
    _check_columns(statistic)
    REGISTRY.register(statistic.name, origin="register()")(statistic)


def _check_columns(statistic: Statistic) -> None:
    taken = {c for s in statistics() for c in (*s.columns, *s.family_columns)}
    clash = sorted(taken & {*statistic.columns, *statistic.family_columns})
    if clash:
        raise ValueError(
            f"statistic {statistic.name!r}: columns {clash} already belong to another statistic; "
            "rename them"
        )


def unregister(name: str) -> Statistic:
    """Remove the statistic ``name`` from the registry and return it."""
    return REGISTRY.unregister(name)


def headline_columns() -> list[str]:
    """The statistics' columns that lead stats.csv, in registry order."""
    return [c for s in statistics() for c in s.headline]
