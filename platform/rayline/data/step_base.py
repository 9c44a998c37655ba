"""The base of the preprocessing steps: a step's spec model (`StepParams`), the static column plan
(what the steps, in order, do to each column, known before any data is read) and the `Step`
class every step (rayline/data/steps.py, media_steps.py) derives from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict

__all__ = ["NUMERIC_KINDS", "ENCODED_KINDS", "StepParams", "Columns", "ColumnPlan", "kind_and_params", "Step",
           "numeric_only"]

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
            if kind == "one_hot":
                for col in params.columns:
                    plan.categorical.setdefault(col, index)
            elif kind in ("image", "text"):
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


def numeric_only(at: str, col: str, plan: ColumnPlan, what: str) -> str | None:
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


