"""The model: an encoder-only Transformer classifier whose only varying part is ``.fusion``.

Imports torch only (no Ray, MLflow or data code), so it runs anywhere torch does. Each name is
imported on first use, so that the settings (``fusion_ray.model.spec``) load without torch.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fusion_ray.model.attention import ATTENTION_POSITIONS
    from fusion_ray.model.classifier import (
        FusionClassifier,
        build_classifier,
        check_model_spec,
        count_parameters,
        derive_seed,
        flops_per_token,
        model_rules,
    )
    from fusion_ray.model.fusion import FUSIONS
    from fusion_ray.model.positions import POSITIONS
    from fusion_ray.model.spec import ModelSpec

from fusion_ray.lazy import module_getattr  # noqa: E402 (after the type-only names)

_EXPORTS = {
    "ATTENTION_POSITIONS": "fusion_ray.model.attention",
    "FusionClassifier": "fusion_ray.model.classifier",
    "build_classifier": "fusion_ray.model.classifier",
    "check_model_spec": "fusion_ray.model.classifier",
    "count_parameters": "fusion_ray.model.classifier",
    "derive_seed": "fusion_ray.model.classifier",
    "flops_per_token": "fusion_ray.model.classifier",
    "model_rules": "fusion_ray.model.classifier",
    "FUSIONS": "fusion_ray.model.fusion",
    "POSITIONS": "fusion_ray.model.positions",
    "ModelSpec": "fusion_ray.model.spec",
}
"""Where each name of this package lives: imported on first use."""


__getattr__ = module_getattr(__name__, _EXPORTS)


__all__ = [
    "ATTENTION_POSITIONS",
    "FUSIONS",
    "POSITIONS",
    "FusionClassifier",
    "ModelSpec",
    "build_classifier",
    "check_model_spec",
    "model_rules",
    "count_parameters",
    "derive_seed",
    "flops_per_token",
]
