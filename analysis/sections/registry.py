"""The registry of report sections: the built-in ones in the report's order, then the plug-ins
of the entry-point group ``fusion_ray.report_sections`` (through ``fusion_ray.registry.Registry``,
the loader of every registry), then any ``register``ed at run time.

The report computes the sections in this order (a section may read the results of the ones
before it: the scaling check reads the interaction tests) and shows each after the part of
report.md it ``follows``, in this order among the sections that follow the same part. A new
analysis is one module with a ``Section`` and one registration: an entry point for a plug-in,
``register(section)`` at run time.
"""

from __future__ import annotations

from typing import Any

from analysis.sections.base import PARTS, WARNING_PLACES, Section
from analysis.sections.decisions import DECISIONS
from analysis.sections.interaction import INTERACTION
from analysis.sections.study.extrapolation import EXTRAPOLATION
from analysis.sections.study.gates import GATES
from analysis.sections.study.lengths import LENGTHS
from analysis.sections.study.reference import REFERENCE
from analysis.sections.study.reproduction import REPRODUCTION
from analysis.sections.study.scaling import SCALING
from fusion_ray.registry import Registry

PLUGIN_GROUP = "fusion_ray.report_sections"
"""The entry-point group of plug-in sections: ``name = "package.module:SECTION"`` naming a
``Section`` instance (or a class or function of no arguments giving one). Loaded the first
time the registry is read, in every process."""

BUILT_IN = "analysis (built in)"
"""The origin of the built-in sections."""

BUILT_IN_SECTIONS: tuple[Section, ...] = (
    REFERENCE,
    DECISIONS,
    INTERACTION,
    SCALING,
    LENGTHS,
    EXTRAPOLATION,
    GATES,
    REPRODUCTION,
)
"""The built-in sections in the report's order (``Section.study``: the study's own)."""


def section_problem(section: Any) -> str | None:
    """Why ``section`` cannot be a report section (None: it can)."""
    if not isinstance(section, Section):
        return f"gives {type(section).__name__}, not an analysis.sections.base.Section"
    if not section.name or not section.name.isidentifier():
        return f"has the name {section.name!r}: a section's name is a Python identifier"
    if section.follows not in PARTS:
        return f"follows {section.follows!r}, not one of the report's parts {list(PARTS)}"
    if section.warns_with not in WARNING_PLACES:
        return f"warns with {section.warns_with!r}, not one of {list(WARNING_PLACES)}"
    return None


def _as_section(loaded: Any, package: str) -> Section:
    """An entry point's ``Section`` (or the one its class or function of no arguments gives)."""
    section = loaded if isinstance(loaded, Section) else loaded()
    problem = section_problem(section)
    if problem is not None:
        raise TypeError(f"an entry point of {package} ({PLUGIN_GROUP}) {problem}")
    return section


REGISTRY: Registry[Section] = Registry(
    "report section", group=PLUGIN_GROUP, accept=_as_section, named=lambda s: s.name
)
"""Every section by name, in order: built in, plug-ins, ``register``ed."""
for _section in BUILT_IN_SECTIONS:
    REGISTRY.register(_section.name, origin=BUILT_IN)(_section)


def sections() -> list[Section]:
    """The registered sections, in the report's order: the built-in ones, then the plug-ins of
    the ``fusion_ray.report_sections`` entry-point group (loaded on first use), then any
    ``register``ed."""
    return [REGISTRY.get(name) for name in REGISTRY.names()]


def origin(name: str) -> str:
    """Where a section comes from: ``analysis (built in)``, a plug-in package, or ``register()``."""
    return REGISTRY.origin(name)


def register(section: Section) -> Section:
    """Add ``section`` after the registered ones: every report from then on computes and shows
    it. Raises ValueError saying what is wrong with it, or that its name is taken."""
    REGISTRY.load_plugins()
    problem = section_problem(section)
    if problem is not None:
        raise ValueError(f"report section {getattr(section, 'name', section)!r} {problem}")
    return REGISTRY.register(section.name, origin="register()")(section)


def unregister(name: str) -> Section:
    """Remove the section ``name`` from the registry and return it."""
    return REGISTRY.unregister(name)
