"""The sweep file: typed schema, loading and validation (every problem at once, before Ray starts).

A sweep file is YAML. Operators, positions, sources and tokenizers are chosen by registry name,
with options as keyword arguments (``{name: gate_cnn, kernel_size: 9}``); nothing in YAML is a
Python import path. ``extends:`` names YAML fragments (e.g. tuned settings written by
``sweeps/hpo.yaml``) merged under the file itself.

The package, lowest first: ``spec`` (the typed schema: pydantic models with a docstring per
field), ``combinations`` (the grid's points and the settings each one gets), ``build`` (every
grid point built into its trial: the one validation step, kept on the spec), ``rules`` (the
rules between fields, ``semantic_problems``) and ``files`` (YAML on disk, overrides,
``load_sweep``, the smoke version). Every public name is importable from ``fusion_ray.config``, on first use: reading a file
(``files``, ``spec``) does not import the model registries (torch), which only the checks
against them need."""

TYPE_CHECKING = False
if TYPE_CHECKING:
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
        SweepFileError,
        apply_overrides,
        load_sweep,
        read_sweep_dict,
        read_yaml_mapping,
        validate_collecting,
        validate_sweep_dict,
    )
    from fusion_ray.config.rules import (
        semantic_problems,
    )
    from fusion_ray.config.smoke import SMOKE_DOCUMENTS, smoke_trial, smoke_version
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

from fusion_ray.lazy import module_getattr  # noqa: E402 (after the type-only names)

_EXPORTS = {
    "GridPoint": "fusion_ray.config.build",
    "build_points": "fusion_ray.config.build",
    "build_trial": "fusion_ray.config.build",
    "changed_trial_problems": "fusion_ray.config.build",
    "section_builder": "fusion_ray.config.build",
    "validate_as": "fusion_ray.config.build",
    "AxisNamer": "fusion_ray.config.combinations",
    "Combination": "fusion_ray.config.combinations",
    "GRID_AXIS_MODEL_FIELDS": "fusion_ray.config.combinations",
    "combination_settings": "fusion_ray.config.combinations",
    "combinations": "fusion_ray.config.combinations",
    "deep_merge": "fusion_ray.config.combinations",
    "grid_namer": "fusion_ray.config.combinations",
    "resolve_specs": "fusion_ray.config.combinations",
    "set_dotted": "fusion_ray.config.combinations",
    "MAX_FILE_BYTES": "fusion_ray.config.files",
    "MAX_VALUES": "fusion_ray.config.files",
    "PRESET_SECTIONS": "fusion_ray.config.files",
    "SMOKE_DOCUMENTS": "fusion_ray.config.smoke",
    "SweepFileError": "fusion_ray.config.files",
    "apply_overrides": "fusion_ray.config.files",
    "load_sweep": "fusion_ray.config.files",
    "read_sweep_dict": "fusion_ray.config.files",
    "read_yaml_mapping": "fusion_ray.config.files",
    "smoke_trial": "fusion_ray.config.smoke",
    "smoke_version": "fusion_ray.config.smoke",
    "validate_collecting": "fusion_ray.config.files",
    "validate_sweep_dict": "fusion_ray.config.files",
    "semantic_problems": "fusion_ray.config.rules",
    "AXES": "fusion_ray.config.spec",
    "AdaptiveSeeds": "fusion_ray.config.spec",
    "DatasetPreset": "fusion_ray.config.spec",
    "Defaults": "fusion_ray.config.spec",
    "Grid": "fusion_ray.config.spec",
    "Named": "fusion_ray.config.spec",
    "OVERRIDABLE_TRAIN": "fusion_ray.config.spec",
    "Override": "fusion_ray.config.spec",
    "Resources": "fusion_ray.config.spec",
    "Rule": "fusion_ray.config.spec",
    "SharedSettings": "fusion_ray.config.spec",
    "Strict": "fusion_ray.config.spec",
    "SubGrid": "fusion_ray.config.spec",
    "SweepSpec": "fusion_ray.config.spec",
    "bare_names": "fusion_ray.config.spec",
    "pydantic_problems": "fusion_ray.config.spec",
    "resources_for": "fusion_ray.config.spec",
}
"""Where each name of this package lives: imported on first use."""


__getattr__ = module_getattr(__name__, _EXPORTS)


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
    "section_builder",
    "semantic_problems",
    "set_dotted",
    "smoke_trial",
    "smoke_version",
    "validate_as",
    "validate_collecting",
    "validate_sweep_dict",
]
