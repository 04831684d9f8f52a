"""Tokenizers (the ``TOKENIZERS`` registry), always fitted on the training split only.

Both families reserve ``[PAD] = 0`` and ``[UNK] = 1``; a word (or character) never seen in the
training split maps to ``[UNK]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from fusion_ray.checks import is_int
from fusion_ray.registry import Registry

PAD, UNK = "[PAD]", "[UNK]"
SPECIALS = [PAD, UNK]
PAD_ID, UNK_ID = 0, 1

TOKENIZERS: Registry = Registry("tokenizer", group="fusion_ray.tokenizers")


def _check_specials(tok: Tokenizer) -> Tokenizer:
    assert tok.token_to_id(PAD) == PAD_ID and tok.token_to_id(UNK) == UNK_ID, "specials moved"
    return tok


@TOKENIZERS.register("bpe")
class BPETokenizer:
    """Byte-pair encoding learned with HF ``tokenizers`` on whitespace/punctuation-split words.

    Lowercases by default, like the study's vocabulary, so ``bpe`` and ``word`` differ only in
    how they segment words.
    """

    def __init__(
        self, *, vocab_size: int = 8000, min_frequency: int = 2, lowercase: bool = True
    ) -> None:
        self.vocab_size = vocab_size
        self.min_frequency = min_frequency
        self.lowercase = lowercase

    def problems(self) -> list[str]:
        p = "data.tokenizer_kwargs"
        problems = []
        if not is_int(self.vocab_size) or self.vocab_size < 64:
            problems.append(f"{p}.vocab_size: must be an integer >= 64, got {self.vocab_size!r}")
        if not is_int(self.min_frequency) or self.min_frequency < 1:
            problems.append(
                f"{p}.min_frequency: must be an integer >= 1, got {self.min_frequency!r}"
            )
        if not isinstance(self.lowercase, bool):
            problems.append(f"{p}.lowercase: must be true or false, got {self.lowercase!r}")
        return problems

    def train(self, texts: Sequence[str]) -> Tokenizer:
        tok = Tokenizer(models.BPE(unk_token=UNK))
        norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if self.lowercase else [])
        tok.normalizer = normalizers.Sequence(norms)
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(
            vocab_size=self.vocab_size,
            min_frequency=self.min_frequency,
            special_tokens=SPECIALS,
            limit_alphabet=1000,
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        return _check_specials(tok)


@TOKENIZERS.register("word")
class WordTokenizer:
    """The study's vocabulary: lowercase, split on whitespace, words seen at least ``min_frequency``
    times in train, the ``max_words`` most frequent kept."""

    def __init__(
        self, *, min_frequency: int = 2, max_words: int = 50_000, lowercase: bool = True
    ) -> None:
        self.min_frequency = min_frequency
        self.max_words = max_words
        self.lowercase = lowercase

    def problems(self) -> list[str]:
        p = "data.tokenizer_kwargs"
        problems = []
        if not is_int(self.min_frequency) or self.min_frequency < 1:
            problems.append(
                f"{p}.min_frequency: must be an integer >= 1, got {self.min_frequency!r}"
            )
        if not is_int(self.max_words) or self.max_words < 1:
            problems.append(f"{p}.max_words: must be an integer >= 1, got {self.max_words!r}")
        if not isinstance(self.lowercase, bool):
            problems.append(f"{p}.lowercase: must be true or false, got {self.lowercase!r}")
        return problems

    def train(self, texts: Sequence[str]) -> Tokenizer:
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        if self.lowercase:
            tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordLevelTrainer(
            vocab_size=self.max_words + len(SPECIALS),  # the trainer's size includes specials
            min_frequency=self.min_frequency,
            special_tokens=SPECIALS,
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        return _check_specials(tok)
