"""The data pipeline's typed settings: where documents come from and how they become ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le, Lt


@dataclass
class DataSpec:
    """One dataset: its source, its splits and its tokenizer. Independent of trial seed and model."""

    __pydantic_config__ = {"extra": "forbid", "use_attribute_docstrings": True}

    source: str = "synthetic"
    """Where documents come from, a name in fusion_ray.data.SOURCES (hub, local, synthetic)."""
    source_kwargs: dict[str, Any] = field(default_factory=lambda: {"regime": "short"})
    """Keyword options of the source (hub: dataset; local: train/validation/test paths, columns;
    synthetic: regime and sizes)."""
    num_classes: Annotated[int, Ge(2), Le(10**6)] | None = None
    """Number of labels; None takes the source's own count. Labels outside 0..num_classes-1 fail."""
    validation_fraction: Annotated[float, Gt(0), Lt(1)] = 0.1
    """Share of train carved out as validation when the source has no validation split."""
    split_seed: Annotated[int, Ge(0), Le(2**63 - 1)] = 1234
    """Seed of the validation carve-out and of subsampling; never the trial seed."""
    max_train_samples: Annotated[int, Ge(1), Le(10**9)] | None = None
    """Keep at most this many training documents (a seeded subsample), for quick runs."""
    max_eval_samples: Annotated[int, Ge(1), Le(10**9)] | None = None
    """Keep at most this many validation and, separately, test documents (seeded subsamples of
    each), for quick runs such as --smoke; None keeps every one. The reported accuracies are
    then those of the subsample."""
    tokenizer: str = "bpe"
    """Tokenizer family, a name in fusion_ray.data.TOKENIZERS (bpe, word)."""
    tokenizer_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the tokenizer (vocab_size, min_frequency, ...)."""
    max_length: Annotated[int, Ge(1), Le(10**7)] = 512
    """Documents are truncated to this many tokens."""
    eval_lengths: list[int] = field(default_factory=list)
    """Train short, test long: after training, at the best validation epoch, every test document
    is also evaluated truncated at each of these lengths (positive, distinct, increasing; longer
    than max_length allowed, model.max_len must cover the longest). The test split is then kept
    up to the longest of them; training, validation and the usual test metrics stay at
    max_length. Empty: no per-length evaluation."""
    cache_dir: str | None = None
    """Where tokenised splits are cached; None uses $FUSION_RAY_CACHE or ~/.cache/fusion_ray."""
