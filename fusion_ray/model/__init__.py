"""The model: an encoder-only Transformer classifier whose only varying part is ``.fusion``.

Imports torch only (no Ray, MLflow or data code), so it runs anywhere torch does.
"""

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
