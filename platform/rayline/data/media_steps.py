"""The preprocessing steps for images and text: `image` (decode, convert, resize, normalise per
channel; training-only augmentation recorded for the model) and `text` (a tokenizer trained on the
train split). Registered with the others in rayline/data/steps.py.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from rayline.data.step_base import NUMERIC_KINDS, Step, StepParams

__all__ = ["AugmentParams", "ImageParams", "Image", "TextParams", "Text"]

class AugmentParams(StepParams):
    flip: bool = Field(False, description="Training only: mirror each image left to right with probability 0.5.")
    crop: int = Field(0, ge=0, le=64, description="Training only: pad each side by this many pixels (zeros) and crop "
                                                  "back to the size at a random offset.")


class ImageParams(StepParams):
    columns: Optional[list[str]] = Field(
        None, min_length=1, description="Image columns: encoded image files (PNG, JPEG, ...) as bytes (an image folder, "
                                        "a Parquet binary column) or base64 text. Default: the data's only image column "
                                        "(binary, or stated image in data.feature_types).")
    size: tuple[Annotated[int, Field(ge=1, le=1024)], Annotated[int, Field(ge=1, le=1024)]] = Field(
        description="[height, width] in pixels every image is resized to (bilinear).")
    channels: Literal[1, 3] = Field(3, description="1: grayscale, 3: RGB.")
    normalize: Literal["per_channel", "none"] = Field(
        "per_channel", description="per_channel: subtract each channel's mean and divide by its standard deviation, "
                                   "both over the train split's pixels; none: pixels stay in [0, 1].")
    augment: AugmentParams = Field(default_factory=AugmentParams,
                                   description="Random changes to training images only (never to validation, test or "
                                               "requests).")


class Image(Step):
    """Decode each image, convert it to the channels, resize it and normalise it: one block of
    height x width x channels pixel columns (row-major, channels last) per image column."""

    kind = "image"
    Params = ImageParams
    encodes = True

    def __init__(self, columns: list[str], size: list[int], channels: int, mean: list[float], std: list[float],
                 augment: dict):
        self.image_columns = list(columns)
        self.size, self.channels = [int(size[0]), int(size[1])], int(channels)
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self.augment = dict(augment)

    @classmethod
    def check_column(cls, at, col, params, plan, index):
        kind = plan.kinds.get(col)
        if kind in NUMERIC_KINDS:
            return (f"{at}: needs an image column, encoded files as bytes or base64 text (got {col!r}, a {kind} column; "
                    "allowed: binary or string columns)")
        if col in plan.categorical:
            return f"{at}: {col!r} is one-hot encoded by data.preprocess[{plan.categorical[col]}] (allowed: an image column)"
        return None

    @classmethod
    def fit(cls, where, params, columns, stats):
        channels, size = params.channels, list(params.size)
        if params.normalize == "none":
            mean, std = [0.0] * channels, [1.0] * channels
        else:
            # One mean and deviation per channel over every image column's train pixels.
            mean, std = stats.image_moments(columns, size, channels)
        return cls(columns, size, channels, mean, std, params.augment.model_dump())

    def state(self):
        return {"columns": self.image_columns, "size": self.size, "channels": self.channels, "mean": self.mean,
                "std": self.std, "augment": self.augment}

    @classmethod
    def from_state(cls, state):
        return cls(state["columns"], state["size"], state["channels"], state["mean"], state["std"], state["augment"])

    @property
    def columns(self):
        return list(self.image_columns)

    def output_names(self, col):
        return [f"{col}[{i}]" for i in range(self.size[0] * self.size[1] * self.channels)]

    def segment(self, col):
        return {"type": "image", "shape": [self.size[0], self.size[1], self.channels], "augment": self.augment}

    def compile(self, layout):
        from rayline.data.compiled import ImageOp

        return [ImageOp(col, tuple(self.size), self.channels, self.mean, self.std) for col in self.image_columns]


# ---------------------------------------------------------------- text


class TextParams(StepParams):
    columns: Optional[list[str]] = Field(
        None, min_length=1, description="Free-text columns. Default: the data's only text column (stated text in "
                                        "data.feature_types, or else the only string column no other step names).")
    tokenizer: Literal["word", "bpe"] = Field("word", description="word: the most frequent words of the train split; "
                                                                  "bpe: byte-pair subwords learnt on it (Hugging Face "
                                                                  "tokenizers).")
    vocab_size: int = Field(5000, ge=3, le=1_000_000, description="Tokens in the vocabulary, [PAD] and [UNK] included.")
    max_length: int = Field(64, ge=1, le=4096, description="Tokens per text: longer texts are cut, shorter ones padded.")
    lowercase: bool = Field(True, description="Lowercase before tokenizing (training and requests alike).")


class Text(Step):
    """Tokenize each text with a tokenizer trained on the train split: one block of max_length
    token ids per text column (0 pads, 1 is an unknown token)."""

    kind = "text"
    Params = TextParams
    encodes = True

    def __init__(self, tokenizers: dict[str, str], max_length: int, vocab_sizes: dict[str, int], lowercase: bool):
        self.tokenizers = dict(tokenizers)  # column -> the fitted tokenizer's JSON
        self.max_length, self.vocab_sizes, self.lowercase = int(max_length), dict(vocab_sizes), bool(lowercase)

    @classmethod
    def check_column(cls, at, col, params, plan, index):
        kind = plan.kinds.get(col)
        if kind is not None and kind != "string":
            return f"{at}: needs a text column (got {col!r}, a {kind} column; allowed: string columns)"
        if col in plan.categorical:
            return f"{at}: {col!r} is one-hot encoded by data.preprocess[{plan.categorical[col]}] (allowed: a text column)"
        return None

    @classmethod
    def fit(cls, where, params, columns, stats):
        import json

        from rayline.data.text import train_tokenizer

        tokenizers, sizes = {}, {}
        for col in columns:
            counts = stats.word_counts(col, params.lowercase)
            if not counts:
                from rayline.errors import DataError

                raise DataError(f"{where}: column {col!r} has no words in the train split")
            tokenizers[col] = train_tokenizer(counts, params.tokenizer, params.vocab_size, params.lowercase)
            sizes[col] = len(json.loads(tokenizers[col])["model"]["vocab"])
        return cls(tokenizers, params.max_length, sizes, params.lowercase)

    def state(self):
        return {"tokenizers": self.tokenizers, "max_length": self.max_length, "vocab_sizes": self.vocab_sizes,
                "lowercase": self.lowercase}

    @classmethod
    def from_state(cls, state):
        return cls(state["tokenizers"], state["max_length"], state["vocab_sizes"], state["lowercase"])

    @property
    def columns(self):
        return list(self.tokenizers)

    def output_names(self, col):
        return [f"{col}[{i}]" for i in range(self.max_length)]

    def segment(self, col):
        return {"type": "text", "length": self.max_length, "vocab_size": self.vocab_sizes[col]}

    def compile(self, layout):
        from rayline.data.compiled import TextOp

        return [TextOp(col, tokenizer, self.max_length) for col, tokenizer in self.tokenizers.items()]


