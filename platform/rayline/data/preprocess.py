"""Fitted preprocessing: the part of the model that turns raw rows into feature arrays.

Steps (data/steps.py, one class each) are fitted in order on the train split only, each on
the columns as the earlier steps left them, from per-block statistics (data/partials.py).
The fitted state is plain JSON in the model artifact. `transform` (pandas frames: Ray Data
batches in training, the test split) and `encode_records` (request rows in serving) run the
same compiled numpy transform (data/compiled.py), so offline and online predictions are
identical by construction.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from rayline.data import partials
from rayline.data.compiled import CompiledTransform
from rayline.data.steps import value_key, Step, STEPS, ColumnPlan, check_steps, step_from_state
from rayline.errors import DataError

__all__ = ["FeatureInfo", "LabelInfo", "FittedPreprocessing", "column_kind", "fit_preprocessing"]

FEATURES = "features"
LABEL = "label"

def column_kind(dtype) -> str:
    """'integer', 'number', 'boolean' or 'string' for a pandas or Arrow dtype."""
    text = str(dtype).lower()
    if text.startswith("bool"):
        return "boolean"
    if text.startswith(("int", "uint")):
        return "integer"
    if text.startswith(("float", "double", "halffloat", "decimal")):
        return "number"
    return "string"


@dataclass
class FeatureInfo:
    """One input column as requests must send it."""

    name: str
    kind: str  # integer | number | boolean | string
    nullable: bool = False  # True when an impute step fills it
    categories: list | None = None  # one-hot categories seen in training
    unknown: str = "ignore"  # ignore | error, for one-hot columns


@dataclass
class LabelInfo:
    name: str
    task: str  # classification | regression
    classes: list | None = None  # original label values, index = class id


@dataclass
class FittedPreprocessing:
    features: list[FeatureInfo]
    label: LabelInfo
    steps: list[Step] = field(default_factory=list)

    @cached_property
    def compiled(self) -> CompiledTransform:
        return CompiledTransform(self.features, self.steps)

    @property
    def output_columns(self) -> list[str]:
        """The model's input columns, in order (one-hot columns named `column=category`)."""
        return self.compiled.output_columns

    # ------------------------------------------------------------ transform

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Raw rows as a pandas frame -> float32 feature matrix in `output_columns` order."""
        return self.compiled.transform_frame(frame)

    def encode_records(self, rows: list[dict]) -> np.ndarray:
        """Request rows (feature name -> JSON value) -> float32 feature matrix; no pandas on the way."""
        return self.compiled.transform_records(rows)

    def encode_labels(self, values: pd.Series) -> np.ndarray:
        if self.label.task == "regression":
            return values.to_numpy(dtype=np.float32)
        index = {value_key(c): i for i, c in enumerate(self.label.classes)}
        try:
            return np.array([index[value_key(v)] for v in values], dtype=np.int64)
        except KeyError as exc:
            raise DataError(f"data.label: value {exc.args[0]!r} is not a known class ({self.label.classes})") from exc

    def decode(self, class_ids) -> list:
        return [self.label.classes[int(i)] for i in class_ids]

    @property
    def num_outputs(self) -> int:
        return len(self.label.classes) if self.label.task == "classification" else 1

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        return {
            "features": [asdict(f) for f in self.features],
            "label": asdict(self.label),
            "steps": [step.to_dict() for step in self.steps],
            "output_columns": self.output_columns,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "FittedPreprocessing":
        return cls(
            features=[FeatureInfo(**f) for f in data["features"]],
            label=LabelInfo(**data["label"]),
            steps=[step_from_state(s) for s in data["steps"]],
        )

    def save(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=1, default=_json_default)

    @classmethod
    def load(cls, path) -> "FittedPreprocessing":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))

    def __getstate__(self):
        # The compiled transform is rebuilt where it is used (Ray Data workers, replicas).
        state = dict(self.__dict__)
        state.pop("compiled", None)
        return state


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


# ---------------------------------------------------------------- fitting


class _Intermediate:
    """A picklable map_batches callable: raw batch -> the columns as the fitted steps so far leave them."""

    def __init__(self, compiled: CompiledTransform):
        self.compiled = compiled

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return self.compiled.intermediate_frame(batch)


class _DatasetStats:
    """Statistics of a Ray Dataset, from per-block partials (data/partials.py): one task-pool
    pass per step instead of one hash-shuffle aggregation per column and statistic."""

    def __init__(self, ds):
        self.raw = ds.materialize()
        self.view = self.raw

    def numeric(self, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
        return partials.numeric_stats(self.view, names, cols)

    def unique(self, col):
        return partials.distinct_values(self.view, col)

    def value_counts(self, col):
        return partials.value_counts(self.view, col)

    def after(self, compiled: CompiledTransform) -> None:
        self.view = self.raw.map_batches(_Intermediate(compiled), batch_format="pandas").materialize()


class _FrameStats:
    """The same statistics of a pandas frame (unit tests, small local data)."""

    def __init__(self, frame: pd.DataFrame):
        self.raw = frame
        self.frame = frame

    def numeric(self, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
        return partials.combine_numeric([partials.moments_of(cols, keep_values="median" in names)(self.frame)], names, cols)

    def unique(self, col):
        return [v for v in self.frame[col].dropna().unique()]

    def value_counts(self, col):
        return list(self.frame[col].dropna().value_counts().items())

    def after(self, compiled: CompiledTransform) -> None:
        self.frame = compiled.intermediate_frame(self.raw)


def fit_preprocessing(train, features: list[FeatureInfo], label: LabelInfo, steps_spec: list) -> FittedPreprocessing:
    """Fit each step, in order, on the train split only (a Ray Dataset or a pandas frame)."""
    fitted = FittedPreprocessing(features=[FeatureInfo(**asdict(f)) for f in features], label=label)
    names = [f.name for f in fitted.features]
    kinds = {f.name: f.kind for f in fitted.features}
    problems = check_steps(names, kinds, steps_spec)
    if problems:
        raise DataError("\n".join(problems))
    plan = ColumnPlan.of(names, kinds, steps_spec)
    by_name = {f.name: f for f in fitted.features}
    stats = _FrameStats(train[names].copy()) if isinstance(train, pd.DataFrame) else _DatasetStats(train.select_columns(names))

    steps: list[Step] = []
    for index, step_model in enumerate(steps_spec):
        (kind,) = type(step_model).model_fields
        params = getattr(step_model, kind)
        if steps:
            stats.after(CompiledTransform(fitted.features, steps, categorical=set(plan.categorical)))
        step = STEPS[kind].fit(f"data.preprocess[{index}].{kind}", params, plan.resolve(params.columns), stats)
        steps.append(step)
        if kind == "impute":
            for col in step.columns:
                by_name[col].nullable = True
        elif kind == "one_hot":
            for col, cats in step.categories.items():
                by_name[col].categories = cats
                by_name[col].unknown = step.handle_unknown
    fitted.steps = steps
    fitted.__dict__.pop("compiled", None)
    return fitted
