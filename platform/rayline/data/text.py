"""Text values -> token ids: the `text` preprocessing step's tokenizer, trained on the train split
with Hugging Face `tokenizers` (never downloaded) and saved, as its own JSON, with the model.

Training reads no text twice: the data stage's one pass counts each column's words (the
tokenizer's own normaliser and pre-tokeniser split them, so the counts are the words the tokenizer
will see), per block, merged in the driver. A word-level vocabulary is the `vocab_size - 2` most
frequent words; a BPE vocabulary is learnt from the same counts (each word given to the trainer as
often as it occurs). Ids 0 and 1 are `[PAD]` and `[UNK]`.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np

from rayline.errors import DataError

__all__ = ["PAD", "UNK", "MAX_TEXT_CHARS", "MAX_WORDS", "word_counts", "merge_word_counts", "train_tokenizer",
           "load_tokenizer", "encode_texts"]

PAD, UNK = "[PAD]", "[UNK]"
MAX_TEXT_CHARS = 100_000  # one text value; longer is an error naming the row (a request: 422)
MAX_WORDS = 200_000  # distinct words kept per column while counting; rarer ones are dropped beyond it


def _normalizer(lowercase: bool):
    from tokenizers import normalizers

    return normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()] if lowercase else [normalizers.NFKC()])


def _pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Whitespace()


def word_counts(values, lowercase: bool, column: str) -> Counter:
    """How often each word occurs in `values` (missing values skipped), split as the tokenizer splits."""
    from rayline.data.values import is_missing

    normalizer, pre = _normalizer(lowercase), _pre_tokenizer()
    counts: Counter = Counter()
    for i, value in enumerate(values):
        if is_missing(value):
            continue
        if not isinstance(value, str):
            raise DataError(f"row {i} of {column}: text expected (got {type(value).__name__})")
        counts.update(word for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(value[:MAX_TEXT_CHARS])))
    return _capped(counts)


def merge_word_counts(a: Counter, b: Counter) -> Counter:
    merged = a + b
    return _capped(merged)


def _capped(counts: Counter) -> Counter:
    if len(counts) <= MAX_WORDS:
        return counts
    return Counter(dict(counts.most_common(MAX_WORDS)))


def train_tokenizer(counts: Counter, kind: str, vocab_size: int, lowercase: bool) -> str:
    """The fitted tokenizer as JSON (`Tokenizer.to_str`)."""
    from tokenizers import Tokenizer, models, trainers

    if kind == "word":
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(0, vocab_size - 2)]
        vocab = {PAD: 0, UNK: 1, **{word: i + 2 for i, (word, _) in enumerate(ranked)}}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = _normalizer(lowercase)
    tokenizer.pre_tokenizer = _pre_tokenizer()
    if kind == "bpe":
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK], show_progress=False)

        def words():
            for word, count in sorted(counts.items()):
                for start in range(0, count, 1000):  # each occurrence counted, in bounded strings
                    yield " ".join([word] * min(1000, count - start))

        tokenizer.train_from_iterator(words(), trainer=trainer)
    return tokenizer.to_str()


def load_tokenizer(text: str, max_length: int):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(text)
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(length=max_length, pad_id=0, pad_token=PAD)
    return tokenizer


def encode_texts(tokenizer, values, column: str, where: Callable[[int], str], max_length: int) -> np.ndarray:
    """(n, max_length) float32 token ids of a text column; a value that is not text, or is longer
    than MAX_TEXT_CHARS, is a DataError naming the row."""
    from rayline.data.values import is_missing

    values = values.to_numpy(dtype=object) if hasattr(values, "to_numpy") else values
    texts = []
    for i, value in enumerate(values):
        if is_missing(value):
            raise DataError(f"{where(i) or f'row {i} of '}{column}: missing (allowed: text, or an impute step "
                            "that fills it)")
        if not isinstance(value, str):
            raise DataError(f"{where(i) or f'row {i} of '}{column}: text expected (got {type(value).__name__})")
        if len(value) > MAX_TEXT_CHARS:
            raise DataError(f"{where(i) or f'row {i} of '}{column}: text of {len(value):,} characters (allowed: at "
                            f"most {MAX_TEXT_CHARS:,})")
        texts.append(value)
    if not texts:
        return np.zeros((0, max_length), np.float32)
    return np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.float32).reshape(len(texts), max_length)
