"""Deterministic synthetic classification tasks whose label lives in word order, not word counts.

The task ("segment order"): the first ``min(L, window)`` words of a document are cut into ``m``
contiguous segments, one per topic, in an order given by the label (label k is the k-th
permutation of the ``m`` topics). Inside the segment of topic ``t`` each word is one of topic
``t``'s few words with probability ``topic_rate``, otherwise a shared Zipf-distributed filler
word; words after the window are filler only. Segment shares are uniform on a simplex (each at
least ``MIN_SHARE``) and independent of the label, so every class has exactly the same
distribution of word counts: a bag-of-words model is at chance. Recovering the label needs the
relative position of topics about ``window / m`` words apart: what position signals and fusion
operators have to deliver.

Why a window: a prefix of a segment-ordered text reveals its first topic through word counts.
Keeping the label-bearing segments inside the first ``window`` words (``window <= max_length``,
which ``check_data_spec`` enforces) means truncation never leaks the label, while documents keep
their long-tailed lengths (and the clip rate stays meaningful).

The relative variant (``relative=True``), for train short, test long: the segments span each
whole document instead of a window, so the label is the order of the topics at every length and
no absolute position carries it (topic t's segment of a 40-word document and of a 320-word one
cover the same fraction). Trained on short documents and tested on longer ones (the source's
``test_length_scale``), a model that learnt the order rather than the positions it saw keeps
its accuracy; evaluated truncated (``data.eval_lengths``), only the topics inside the truncation
are visible, so short truncations of long documents hide part of the label.

Everything is drawn from uniform doubles of a PCG64 stream seeded by
``SeedSequence([generator_seed, regime, split, index])``, so documents are identical across machines and
NumPy versions, each split is independent of the other splits' sizes (growing ``n_train`` keeps the
test set; the first documents of a split do not change when it grows), and nothing depends on a
trial seed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

SYNTHETIC_VERSION = 1
"""Bump when generation changes: it is part of the cache key."""

MIN_SHARE = 0.12
"""Smallest share of a document any one topic segment gets."""

_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}


@dataclass(frozen=True)
class Regime:
    """A length regime: log-normal word counts, clipped, and a default class count."""

    name: str
    regime_id: int
    median_words: float
    sigma: float
    min_words: int
    max_words: int
    num_classes: int
    window: int
    """Default span of the label-bearing segments, in words (keep max_length >= window)."""
    n_train: int
    n_validation: int
    n_test: int
    like: str


REGIMES: dict[str, Regime] = {
    # AG News: ~38 words per title + description, 4 topics.
    "short": Regime("short", 0, 40.0, 0.30, 16, 128, 4, 96, 2000, 400, 800, "AG News"),
    # IMDB: median ~174 words, mean ~230, a long right tail; 2 classes.
    "medium": Regime("medium", 1, 200.0, 0.45, 64, 1024, 4, 256, 600, 200, 400, "IMDB"),
    # ArXiv: far longer than any max length the study used; scaled down so a CPU quickstart
    # fits, with a heavy tail. Use length_scale to stretch it.
    "long": Regime("long", 2, 440.0, 0.45, 128, 2048, 4, 512, 300, 100, 200, "ArXiv (scaled)"),
}


def _syllable_words(count: int, rng: np.random.Generator, taken: set[str]) -> list[str]:
    """``count`` distinct pronounceable pseudo-words, none in ``taken`` (which grows)."""
    consonants = "bdfgklmnprstvz"
    vowels = "aeiou"
    words: list[str] = []
    while len(words) < count:
        u = rng.random(7)
        n_syll = 2 + int(u[0] * 2)  # 2 or 3 syllables
        word = "".join(
            consonants[int(u[1 + 2 * k] * len(consonants))]
            + vowels[int(u[2 + 2 * k] * len(vowels))]
            for k in range(n_syll)
        )
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def vocabulary(n_filler: int, n_topics: int, topic_words: int) -> tuple[list[str], list[list[str]]]:
    """The fixed filler words and per-topic words (independent of every seed but this one)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x5EED, 1])))
    taken: set[str] = set()
    filler = _syllable_words(n_filler, rng, taken)
    topics = [_syllable_words(topic_words, rng, taken) for _ in range(n_topics)]
    return filler, topics


def n_topics_for(num_classes: int) -> int:
    """Smallest number of topics whose orderings give ``num_classes`` distinct labels."""
    m = 2
    while math.factorial(m) < num_classes:
        m += 1
    return m


def class_orders(num_classes: int) -> list[tuple[int, ...]]:
    """Label k -> the k-th permutation (lexicographic) of the topics."""
    m = n_topics_for(num_classes)
    return list(itertools.permutations(range(m)))[:num_classes]


def _normal(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Box-Muller from uniforms, so the stream does not depend on NumPy's normal sampler."""
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def document_length_bounds(regime: Regime, length_scale: float) -> tuple[int, int]:
    """Shortest and longest document of a regime, in words."""
    lo = max(4, int(round(regime.min_words * length_scale)))
    return lo, max(lo, int(round(regime.max_words * length_scale)))


def document_lengths(
    regime: Regime, n: int, rng: np.random.Generator, length_scale: float
) -> np.ndarray:
    u = rng.random((n, 2))
    words = regime.median_words * length_scale * np.exp(regime.sigma * _normal(u[:, 0], u[:, 1]))
    lo, hi = document_length_bounds(regime, length_scale)
    return np.clip(np.rint(words), lo, hi).astype(np.int64)


def generate_split(
    regime: Regime,
    split: str,
    n: int,
    *,
    num_classes: int,
    generator_seed: int,
    window: int | None = None,
    length_scale: float = 1.0,
    topic_rate: float = 0.5,
    n_filler: int = 2000,
    topic_words: int = 4,
    relative: bool = False,
) -> tuple[list[str], np.ndarray]:
    """``n`` documents and labels of one split; deterministic in all arguments.

    ``window`` None takes the regime's; a window longer than a document spans the whole document.
    ``relative`` makes the segments span every whole document (the window is not used).
    """
    window = regime.window if window is None else int(window)
    orders = class_orders(num_classes)
    m = len(orders[0])
    filler, topics = vocabulary(n_filler, m, topic_words)
    filler_arr = np.array(filler, dtype=object)
    topic_arr = np.array(topics, dtype=object)  # [m, topic_words]
    # Zipf(1) over filler ranks, through its inverse CDF.
    zipf_cdf = np.cumsum(1.0 / np.arange(1, n_filler + 1))
    zipf_cdf /= zipf_cdf[-1]

    labels = np.empty(n, dtype=np.int64)
    texts: list[str] = []
    for i in range(n):
        # Document i has its own stream: it does not change when the split grows or shrinks.
        seq = np.random.SeedSequence([generator_seed, regime.regime_id, _SPLIT_IDS[split], i])
        rng = np.random.Generator(np.random.PCG64(seq))
        length = int(document_lengths(regime, 1, rng, length_scale)[0])
        label = min(int(rng.random() * num_classes), num_classes - 1)
        labels[i] = label
        # Segment shares: uniform on the simplex above MIN_SHARE each.
        cuts = np.sort(rng.random(m - 1))
        spacings = np.diff(np.concatenate([[0.0], cuts, [1.0]]))
        shares = MIN_SHARE + (1.0 - m * MIN_SHARE) * spacings
        span = length if relative else min(length, window)
        bounds = np.rint(np.cumsum(shares) * span).astype(np.int64)
        bounds[-1] = span
        seg_of_pos = np.searchsorted(bounds, np.arange(span), side="right")  # segment index
        topic_of_pos = np.asarray(orders[label])[seg_of_pos]
        topic_of_pos = np.concatenate([topic_of_pos, np.zeros(length - span, dtype=np.int64)])

        u = rng.random((length, 2))
        is_topic = u[:, 0] < topic_rate
        is_topic[span:] = False  # after the window: filler only
        filler_idx = np.minimum(np.searchsorted(zipf_cdf, u[:, 1]), n_filler - 1)
        topic_idx = np.minimum((u[:, 1] * topic_words).astype(np.int64), topic_words - 1)
        words = np.where(is_topic, topic_arr[topic_of_pos, topic_idx], filler_arr[filler_idx])
        texts.append(" ".join(words.tolist()))
    return texts, labels


def regime_summary() -> dict[str, dict[str, float]]:
    """Nominal word-count quantiles of each regime at length_scale 1 (for docs and tests)."""
    out = {}
    for name, r in REGIMES.items():
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0, r.regime_id, 0])))
        lengths = document_lengths(r, 20000, rng, 1.0)
        out[name] = {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "p90": float(np.percentile(lengths, 90)),
            "p99": float(np.percentile(lengths, 99)),
        }
    return out
