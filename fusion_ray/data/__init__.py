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
