"""The data pipeline: sources (hub, local files, synthetic), tokenizers fitted on train only, an
on-disk cache, length statistics, and seed-paired length-grouped batching. Knows nothing about
models.

    data = prepare_data(DataSpec(source="synthetic", source_kwargs={"regime": "short"}))
    sampler = LengthGroupedSampler(data.train.input_lengths, 64, seed=seed, rank=r, world_size=w)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate(data.train, indices, pad_id=data.pad_id)
"""

TYPE_CHECKING = False
"""False at run time, true for type checkers (which read it by name): the same as
typing.TYPE_CHECKING without importing typing here."""
if TYPE_CHECKING:
    # what type checkers see; at run time __getattr__ below imports each name on first use
    from fusion_ray.data.batching import LengthGroupedSampler, collate
    from fusion_ray.data.prepare import (
        PreparedData,
        TokenizedSplit,
        cache_settings,
        check_data_spec,
        data_rules,
        prepare_data,
    )
    from fusion_ray.data.sources import HUB_DATASETS, SOURCES
    from fusion_ray.data.spec import DataSpec
    from fusion_ray.data.stats import format_stats, length_stats
    from fusion_ray.data.synthetic import REGIMES
    from fusion_ray.data.tokenizer import PAD_ID, TOKENIZERS, UNK_ID

from fusion_ray.lazy import module_getattr  # noqa: E402 (after the type-only names)

_EXPORTS = {
    "LengthGroupedSampler": "fusion_ray.data.batching",
    "collate": "fusion_ray.data.batching",
    "PreparedData": "fusion_ray.data.prepare",
    "TokenizedSplit": "fusion_ray.data.prepare",
    "cache_settings": "fusion_ray.data.prepare",
    "check_data_spec": "fusion_ray.data.prepare",
    "data_rules": "fusion_ray.data.prepare",
    "prepare_data": "fusion_ray.data.prepare",
    "HUB_DATASETS": "fusion_ray.data.sources",
    "SOURCES": "fusion_ray.data.sources",
    "DataSpec": "fusion_ray.data.spec",
    "format_stats": "fusion_ray.data.stats",
    "length_stats": "fusion_ray.data.stats",
    "REGIMES": "fusion_ray.data.synthetic",
    "PAD_ID": "fusion_ray.data.tokenizer",
    "TOKENIZERS": "fusion_ray.data.tokenizer",
    "UNK_ID": "fusion_ray.data.tokenizer",
}
"""Where each name of this package lives: imported on first use, so that importing one
submodule (e.g. the settings, for validation) does not import torch, pandas and the rest."""


__getattr__ = module_getattr(__name__, _EXPORTS)


__all__ = [
    "HUB_DATASETS",
    "PAD_ID",
    "REGIMES",
    "SOURCES",
    "TOKENIZERS",
    "UNK_ID",
    "DataSpec",
    "LengthGroupedSampler",
    "PreparedData",
    "TokenizedSplit",
    "cache_settings",
    "check_data_spec",
    "data_rules",
    "collate",
    "format_stats",
    "length_stats",
    "prepare_data",
]
