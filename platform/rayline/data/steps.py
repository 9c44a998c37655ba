"""Preprocessing steps: one class per step, registered in `STEPS`.

A step class owns everything about its kind of step:
  - `Params`, its spec model (what users write under `- <kind>: {...}` in data.preprocess);
  - `check`, its static rules against the column plan (step order, column kinds), run by
    `rayline validate` and again before fitting, so both report the same messages;
  - `fit`, its typed fitted state from per-block statistics of the train split;
  - `state`/`from_state`, its JSON form in the model artifact;
  - `compile`, a vectorised numpy operation on whole batches (data/compiled.py).

Adding a step is one class here plus one line in `STEPS`; spec.py, the data stage, the
artifact and the request path all read the registry.

Column rules every step follows (checked by `check_steps`): a column that one `one_hot`
encodes is categorical for the whole pipeline — only `impute` may come before its
`one_hot`, and no step may name it afterwards; every other column is numeric. `numeric` in
a step's `columns` means every numeric feature that no step one-hot encodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from rayline.data.values import value_key, value_rank

__all__ = [
    "STEPS",
    "Step",
    "StepParams",
    "ColumnPlan",
    "Impute",
    "OneHot",
    "StandardScale",
    "MinMaxScale",
    "Image",
    "Text",
    "check_steps",
    "kind_and_params",
    "step_from_state",
    "NUMERIC_KINDS",
]

NUMERIC_KINDS = ("integer", "number", "boolean")
ENCODED_KINDS = ("string", "binary")  # columns that need an encoding step (one_hot, image) to reach the model


class StepParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


Columns = Union[list[str], Literal["numeric"]]


# ---------------------------------------------------------------- the static column plan


@dataclass
class ColumnPlan:
    """What the steps, in order, do to each column — known before any data is read."""

    features: list[str]
    kinds: dict[str, str]  # feature -> integer | number | boolean | string (absent: unknown yet)
    categorical: dict[str, int] = field(default_factory=dict)  # column -> index of the one_hot step encoding it
    decoded: dict[str, tuple] = field(default_factory=dict)  # column -> (kind, index) of the image or text step encoding it
    done: set = field(default_factory=set)  # columns already encoded (one_hot, image) by an earlier step

    @classmethod
    def of(cls, features: list[str], kinds: dict[str, str], steps_spec: list) -> "ColumnPlan":
        plan = cls(features=list(features), kinds=dict(kinds))
        for index, (kind, params) in enumerate(kind_and_params(s) for s in steps_spec):
            if kind == OneHot.kind:
                for col in params.columns:
                    plan.categorical.setdefault(col, index)
            elif kind in (Image.kind, Text.kind):
                for col in params.columns:
                    plan.decoded.setdefault(col, (kind, index))
        return plan

    def numeric(self) -> list[str]:
        """Every numeric feature no step encodes (what `columns: numeric` means)."""
        return [c for c in self.features if self.kinds.get(c) in NUMERIC_KINDS
                and c not in self.categorical and c not in self.decoded]

    def resolve(self, columns) -> list[str]:
        return self.numeric() if columns == "numeric" else list(columns)


def kind_and_params(step_model) -> tuple[str, StepParams]:
    """('impute', ImputeParams(...)) from a validated spec step such as ImputeStep(impute=...)."""
    (kind,) = type(step_model).model_fields
    return kind, getattr(step_model, kind)


def check_steps(features: list[str], kinds: dict[str, str], steps_spec: list) -> list[str]:
    """Every problem with the steps' order and columns, one message each, naming the step."""
    plan = ColumnPlan.of(features, kinds, steps_spec)
    problems: list[str] = []
    allowed = ", ".join(map(str, features[:20])) + (", ..." if len(features) > 20 else "")
    for index, step_model in enumerate(steps_spec):
        kind, params = kind_and_params(step_model)
        cls = STEPS[kind]
        where = f"data.preprocess[{index}].{kind}"
        columns = plan.resolve(params.columns)
        seen = set()
        for j, col in enumerate(columns):
            at = f"{where}.columns[{j}]" if params.columns != "numeric" else f"{where}.columns"
            if col not in plan.features:
                problems.append(f"{at}: not a feature (got {col!r}; allowed: {allowed})")
                continue
            if col in seen:
                problems.append(f"{at}: column named twice in one step (got {col!r}; allowed: each column once)")
                continue
            seen.add(col)
            if col in plan.done:
                if col in plan.decoded and plan.decoded[col][1] < index:
                    by, at_index = plan.decoded[col]
                    problems.append(f"{at}: column {col!r} was encoded by the {by} step data.preprocess[{at_index}], "
                                    f"so no later step can use it (got {kind} after {by}; allowed: one {by} step per column)")
                    continue
                encoder = plan.categorical[col]
                problems.append(
                    f"{at}: column {col!r} was one-hot encoded by data.preprocess[{encoder}], so no later step "
                    f"can use it (got {kind} after one_hot; allowed: impute before one_hot, scaling only on numeric columns)"
                )
                continue
            problem = cls.check_column(at, col, params, plan, index)
            if problem:
                problems.append(problem)
        cls.advance(plan, params, columns, index)
    binary = [c for c in features if plan.kinds.get(c) == "binary" and c not in plan.decoded]
    if binary:
        problems.append(
            f"data.features: binary columns {binary} need decoding (allowed: add `- image: {{columns: {binary}, "
            "size: [32, 32]}` to data.preprocess for encoded images, or leave them out of data.features)"
        )
    strings = [c for c in features if plan.kinds.get(c) == "string" and c not in plan.categorical and c not in plan.decoded]
    if strings:
        problems.append(
            f"data.features: string columns {strings} need encoding "
            f"(allowed: add `- one_hot: {{columns: {strings}}}` to data.preprocess for categories, `- text: {{columns: "
            f"{strings}}}` for free text, or leave them out of data.features)"
        )
    return problems


# ---------------------------------------------------------------- the step base class


class Step(ABC):
    """One fitted preprocessing step: typed state, JSON form, and a compiled batch operation."""

    kind: ClassVar[str]
    Params: ClassVar[type[StepParams]]
    encodes: ClassVar[bool] = False  # True: each of its columns becomes a block of output columns (one_hot, image)

    def output_names(self, col: str) -> list[str]:
        """An encoding step's output columns for `col`, in order."""
        raise NotImplementedError

    def segment(self, col: str) -> dict | None:
        """What a model needs to know of `col`'s block beyond its width (an image's shape), or None."""
        return None

    @classmethod
    def check_column(cls, at: str, col: str, params: StepParams, plan: ColumnPlan, index: int) -> str | None:
        """The problem with this step using `col` at this point of the plan, or None."""
        return None

    @classmethod
    def advance(cls, plan: ColumnPlan, params: StepParams, columns: list[str], index: int) -> None:
        """Record what this step does to its columns in the plan: an encoded column is used up."""
        if cls.encodes:
            plan.done.update(columns)

    @classmethod
    @abstractmethod
    def fit(cls, where: str, params: StepParams, columns: list[str], stats) -> "Step":
        """Fit on the train split; `stats` gives statistics of the columns as the earlier steps left them."""

    @abstractmethod
    def state(self) -> dict:
        """JSON-ready fitted state (without the `kind` key)."""

    @classmethod
    @abstractmethod
    def from_state(cls, state: dict) -> "Step":
        ...

    @property
    @abstractmethod
    def columns(self) -> list[str]:
        ...

    @abstractmethod
    def compile(self, layout) -> list:
        """Vectorised operations (data/compiled.py) applying this step to a `Batch` laid out as `layout`."""

    def advance_stats(self, stats) -> None:
        """Tell the train split's statistics (data/profile.py's TrainStats) what this fitted step
        does to its columns, so the next step is fitted on them as this one leaves them."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, **self.state()}

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state()!r})"


def _numeric_only(at: str, col: str, plan: ColumnPlan, what: str) -> str | None:
    kind = plan.kinds.get(col)
    if col in plan.categorical:
        return (f"{at}: needs a numeric column, and {col!r} is one-hot encoded by "
                f"data.preprocess[{plan.categorical[col]}] (got {col!r}; allowed: {', '.join(plan.numeric()[:20]) or 'none'})")
    if kind in ENCODED_KINDS:
        return f"{at}: needs a numeric column (got {col!r}, a {kind} column; allowed: {', '.join(plan.numeric()[:20]) or 'none'})"
    if col in plan.decoded:
        return (f"{at}: needs a numeric column (got {col!r}, a {plan.decoded[col][0]} column; allowed: "
                f"{', '.join(plan.numeric()[:20]) or 'none'})")
    return None


# ---------------------------------------------------------------- impute


class ImputeParams(StepParams):
    columns: Columns = Field(description="Columns to fill, or `numeric` for every numeric feature.")
    strategy: Literal["mean", "median", "most_frequent", "constant"] = "mean"
    value: Optional[Union[bool, int, float, str]] = Field(None, description="Fill value for strategy constant.")

    @model_validator(mode="after")
    def _value(self):
        if self.strategy == "constant" and self.value is None:
            raise ValueError("value: required with strategy constant (got None; allowed: a number or string)")
        if self.strategy != "constant" and self.value is not None:
            raise ValueError(f"value: only used with strategy constant (got {self.value!r}; allowed: omit it)")
        return self


class Impute(Step):
    """Fill missing values with a statistic of the train split or a constant."""

    kind = "impute"
    Params = ImputeParams

    def __init__(self, fill: dict[str, Any]):
        self.fill = fill

    @classmethod
    def check_column(cls, at, col, params, plan, index):
        if (col in plan.decoded and plan.decoded[col][0] == Image.kind) or plan.kinds.get(col) == "binary":
            return f"{at}: cannot fill {col!r}, an image column (got impute; allowed: numeric, categorical and text columns)"
        if params.strategy in ("mean", "median"):
            if plan.kinds.get(col) == "string":
                return (f"{at}: strategy {params.strategy} needs a numeric column (got {col!r}, a string column; "
                        "allowed: strategy most_frequent or constant)")
            if col in plan.categorical:
                return (f"{at}: strategy {params.strategy} on {col!r}, a column one-hot encoded by "
                        f"data.preprocess[{plan.categorical[col]}], would invent a category (got {params.strategy}; "
                        "allowed: strategy most_frequent or constant)")
        if params.strategy == "constant":
            value, kind = params.value, plan.kinds.get(col)
            categorical = col in plan.categorical
            if kind == "string" and not isinstance(value, str):
                return f"{at}: constant value for string column {col!r} must be a string (got {value!r}; allowed: a string)"
            if kind in NUMERIC_KINDS and not categorical and isinstance(value, str):
                return f"{at}: constant value for {kind} column {col!r} must be a number (got {value!r}; allowed: a number)"
            if kind == "integer" and categorical and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
                return (f"{at}: constant value for integer column {col!r} must be an integer, or it would be a category "
                        f"no training row has (got {value!r}; allowed: an integer)")
        return None

    @classmethod
    def fit(cls, where, params, columns, stats):
        strategy = params.strategy
        centre = stats.numeric((strategy,), columns)[strategy] if strategy in ("mean", "median") else {}
        fill = {}
        for col in columns:
            if strategy == "constant":
                value = params.value
            elif strategy == "most_frequent":
                counts = stats.value_counts(col)
                value = value_key(min(counts, key=lambda kv: (-kv[1], value_rank(value_key(kv[0]))))[0]) if counts else None
            else:
                value = centre[col]
            if value is None:
                from rayline.errors import DataError

                raise DataError(f"{where}: column {col!r} has no values in the train split to impute from")
            fill[col] = value
        return cls(fill)

    def state(self):
        return {"fill": self.fill}

    def advance_stats(self, stats):
        for col, value in self.fill.items():
            if col in stats.columns:  # a text column has word counts instead (its fill's words are not counted)
                stats.columns[col].fill(value)

    @classmethod
    def from_state(cls, state):
        return cls(dict(state["fill"]))

    @property
    def columns(self):
        return list(self.fill)

    def compile(self, layout):
        import numpy as np

        from rayline.data.compiled import FillCategoryOp, FillNumericOp

        ops: list = [FillCategoryOp(col, value) for col, value in self.fill.items() if col not in layout.index]
        numeric = {layout.index[col]: float(value) for col, value in self.fill.items() if col in layout.index}
        if numeric:
            fill, mask = np.full(layout.width, np.nan), np.zeros(layout.width, bool)
            fill[list(numeric)] = list(numeric.values())
            mask[list(numeric)] = True
            ops.append(FillNumericOp(fill, mask))
        return ops


# ---------------------------------------------------------------- one-hot


class OneHotParams(StepParams):
    columns: list[str] = Field(min_length=1, description="Categorical columns to expand.")
    handle_unknown: Literal["ignore", "error"] = Field(
        "ignore", description="A category unseen in training: all-zero row (ignore) or 422 (error)."
    )


class OneHot(Step):
    """Expand each categorical column into one 0/1 column per category seen in training."""

    kind = "one_hot"
    Params = OneHotParams
    encodes = True

    def output_names(self, col):
        return [f"{col}={c}" for c in self.categories[col]]

    def __init__(self, categories: dict[str, list], handle_unknown: str):
        self.categories = categories
        self.handle_unknown = handle_unknown

    @classmethod
    def fit(cls, where, params, columns, stats):
        categories = {}
        for col in columns:
            cats = sorted({value_key(c) for c in stats.unique(col)}, key=value_rank)
            if not cats and params.handle_unknown == "error":
                from rayline.errors import DataError

                raise DataError(
                    f"{where}: column {col!r} has no values in the train split, so with handle_unknown: error "
                    "every request would be rejected (allowed: handle_unknown: ignore, or data with values)"
                )
            categories[col] = cats
        return cls(categories, params.handle_unknown)

    def state(self):
        return {"handle_unknown": self.handle_unknown, "categories": self.categories}

    @classmethod
    def from_state(cls, state):
        return cls({k: list(v) for k, v in state["categories"].items()}, state["handle_unknown"])

    @property
    def columns(self):
        return list(self.categories)

    def compile(self, layout):
        from rayline.data.compiled import OneHotOp

        return [OneHotOp(col, cats, self.handle_unknown == "error") for col, cats in self.categories.items()]


# ---------------------------------------------------------------- scaling (affine, fused at compile time)


class ScaleParams(StepParams):
    columns: Columns = Field(description="Columns to scale, or `numeric` for every numeric feature.")


class _Affine(Step):
    """x -> (x - offset) / span per column; consecutive affine steps fuse into one at compile time."""

    stat_names: ClassVar[tuple[str, str]]
    Params = ScaleParams

    def __init__(self, stats: dict[str, list[float]]):
        self.stats = stats

    @classmethod
    def check_column(cls, at, col, params, plan, index):
        return _numeric_only(at, col, plan, cls.kind)

    @classmethod
    def fit(cls, where, params, columns, stats):
        first, second = cls.stat_names
        values = stats.numeric((first, second), columns)
        pairs = {}
        for col in columns:
            a, b = values[first][col], values[second][col]
            if a is None or b is None:
                from rayline.errors import DataError

                raise DataError(f"{where}: column {col!r} has no values in the train split")
            pairs[col] = [a, b]
        return cls(pairs)

    def offset_and_span(self, col: str) -> tuple[float, float]:
        raise NotImplementedError

    def advance_stats(self, stats):
        for col in self.stats:
            offset, span = self.offset_and_span(col)
            stats.columns[col].affine(1.0 / span, -offset / span)

    def state(self):
        return {"stats": self.stats}

    @classmethod
    def from_state(cls, state):
        return cls({k: list(v) for k, v in state["stats"].items()})

    @property
    def columns(self):
        return list(self.stats)

    def compile(self, layout):
        import numpy as np

        from rayline.data.compiled import AffineOp

        scale, shift = np.ones(layout.width), np.zeros(layout.width)
        for col in self.stats:
            offset, span = self.offset_and_span(col)
            scale[layout.index[col]] = 1.0 / span
            shift[layout.index[col]] = -offset / span
        return [AffineOp(scale, shift)]


class StandardScale(_Affine):
    """Zero mean and unit variance on the train split (a constant column is only centred)."""

    kind = "standard_scale"
    stat_names = ("mean", "std")

    def offset_and_span(self, col):
        mean, std = self.stats[col]
        return mean, (std if std > 0 else 1.0)


class MinMaxScale(_Affine):
    """The train split's range onto [0, 1] (a constant column is only shifted)."""

    kind = "min_max_scale"
    stat_names = ("min", "max")

    def offset_and_span(self, col):
        low, high = self.stats[col]
        return low, (high - low if high > low else 1.0)


# ---------------------------------------------------------------- images


class AugmentParams(StepParams):
    flip: bool = Field(False, description="Training only: mirror each image left to right with probability 0.5.")
    crop: int = Field(0, ge=0, le=64, description="Training only: pad each side by this many pixels (zeros) and crop "
                                                  "back to the size at a random offset.")


class ImageParams(StepParams):
    columns: list[str] = Field(min_length=1, description="Image columns: encoded image files (PNG, JPEG, ...) as bytes "
                                                         "(an image folder, a Parquet binary column) or base64 text.")
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
    columns: list[str] = Field(min_length=1, description="Free-text columns.")
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


# ---------------------------------------------------------------- the registry

STEPS: dict[str, type[Step]] = {cls.kind: cls for cls in (Impute, OneHot, StandardScale, MinMaxScale, Image, Text)}


def step_from_state(data: dict) -> Step:
    kind = data["kind"]
    if kind not in STEPS:
        from rayline.errors import DataError

        raise DataError(f"preprocessing.json: unknown step kind (got {kind!r}; allowed: {', '.join(STEPS)})")
    return STEPS[kind].from_state(data)


def _camel(kind: str) -> str:
    return "".join(part.title() for part in kind.split("_"))


# The spec model of each step, `{<kind>: <Params>}`, named `<Kind>Step` (spec.py's error
# formatting drops those names from error paths).
STEP_SPEC_MODELS: dict[str, type[BaseModel]] = {
    kind: create_model(f"{_camel(kind)}Step", __base__=StepParams, **{kind: (cls.Params, ...)})
    for kind, cls in STEPS.items()
}
