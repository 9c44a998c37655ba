"""Preprocessing steps: one class per step, registered in `STEPS`.

A step class owns everything about its kind of step:
  - `Params`, its spec model (what users write under `- <kind>: {...}` in data.preprocess);
  - `check`, its static rules against the column plan (step order, column kinds), run by
    `rayline validate` and again before fitting, so both report the same messages;
  - `fit`, its typed fitted state from per-block statistics of the train split;
  - `state`/`from_state`, its JSON form in the model artifact;
  - `compile`, a vectorised numpy operation on whole batches (data/compiled.py).

Adding a step is one class (here, or in media_steps.py for images and text) plus one line in
`STEPS`; spec.py, the data stage, the artifact and the request path all read the registry. The
base class and the column plan are in step_base.py.

Column rules every step follows (checked by `check_steps`): a column that one `one_hot`
encodes is categorical for the whole pipeline — only `impute` may come before its
`one_hot`, and no step may name it afterwards; every other column is numeric. `numeric` in
a step's `columns` means every numeric feature that no step one-hot encodes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, Field, create_model, model_validator

from rayline.data.media_steps import Image, Text
from rayline.data.step_base import (ENCODED_KINDS, NUMERIC_KINDS, ColumnPlan, Columns, Step, StepParams, kind_and_params,
                                    numeric_only)
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
    "ENCODED_KINDS",
]


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
            f"{strings}}}` for free text, their types in data.feature_types (categorical, text, or image for image "
            "file paths), or leave them out of data.features)"
        )
    return problems




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
        if (col in plan.decoded and plan.decoded[col][0] == "image") or plan.kinds.get(col) == "binary":
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
        return numeric_only(at, col, plan, cls.kind)

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

