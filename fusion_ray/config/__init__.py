"""The sweep file: typed schema, loading and validation (every problem at once, before Ray starts).

A sweep file is YAML. Operators, positions, sources and tokenizers are chosen by registry name,
with options as keyword arguments (``{name: gate_cnn, kernel_size: 9}``); nothing in YAML is a
Python import path. ``extends:`` names YAML fragments (e.g. tuned settings written by
``sweeps/hpo.yaml``) merged under the file itself.

The package, lowest first: ``spec`` (the typed schema: pydantic models with a docstring per
field), ``combinations`` (the grid's points and the settings each one gets), ``build`` (every
grid point built into its trial: the one validation step, kept on the spec), ``rules`` (the
rules between fields, ``semantic_problems``) and ``files`` (YAML on disk, overrides,
``load_sweep``, the smoke version). Every public name is importable from ``fusion_ray.config``.
"""

from fusion_ray.config.build import (
    GridPoint,
    build_points,
    build_trial,
    changed_trial_problems,
    section_builder,
    validate_as,
)
from fusion_ray.config.combinations import (
    GRID_AXIS_MODEL_FIELDS,
    AxisNamer,
    Combination,
    combination_settings,
    combinations,
    deep_merge,
    grid_namer,
    resolve_specs,
    set_dotted,
)
from fusion_ray.config.files import (
    MAX_FILE_BYTES,
    MAX_VALUES,
    PRESET_SECTIONS,
    SMOKE_DOCUMENTS,
    SweepFileError,
    apply_overrides,
    load_sweep,
    read_sweep_dict,
    read_yaml_mapping,
    smoke_trial,
    smoke_version,
    validate_collecting,
    validate_sweep_dict,
)
from fusion_ray.config.rules import (
    semantic_problems,
)
from fusion_ray.config.spec import (
    AXES,
    OVERRIDABLE_TRAIN,
    AdaptiveSeeds,
    DatasetPreset,
    Defaults,
    Grid,
    Named,
    Override,
    Resources,
    Rule,
    SharedSettings,
    Strict,
    SubGrid,
    SweepSpec,
    bare_names,
    pydantic_problems,
    resources_for,
)

__all__ = [
    "AXES",
    "AdaptiveSeeds",
    "AxisNamer",
    "Combination",
    "DatasetPreset",
    "Defaults",
    "GRID_AXIS_MODEL_FIELDS",
    "Grid",
    "GridPoint",
    "MAX_FILE_BYTES",
    "MAX_VALUES",
    "Named",
    "OVERRIDABLE_TRAIN",
    "Override",
    "PRESET_SECTIONS",
    "Resources",
    "Rule",
    "SMOKE_DOCUMENTS",
    "SharedSettings",
    "Strict",
    "SubGrid",
    "SweepFileError",
    "SweepSpec",
    "apply_overrides",
    "bare_names",
    "build_points",
    "build_trial",
    "changed_trial_problems",
    "section_builder",
    "combination_settings",
    "combinations",
    "deep_merge",
    "grid_namer",
    "load_sweep",
    "pydantic_problems",
    "read_sweep_dict",
    "read_yaml_mapping",
    "resolve_specs",
    "resources_for",
    "semantic_problems",
    "set_dotted",
    "smoke_trial",
    "smoke_version",
    "validate_as",
    "validate_collecting",
    "validate_sweep_dict",
]
