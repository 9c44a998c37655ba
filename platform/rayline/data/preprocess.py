"""Fitted preprocessing: the part of the model that turns raw rows into feature arrays.

Steps (data/steps.py, one class each) are fitted in order on the train split only, each on
the columns as the earlier steps left them, from statistics gathered in one pass (data/profile.py).
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

from rayline.data.compiled import CompiledTransform, lookup_index, category_codes
from rayline.data.steps import Step, STEPS, ColumnPlan, check_steps, step_from_state
from rayline.data.values import value_key
from rayline.data.task_cpus import map_args
from rayline.errors import DataError

__all__ = ["FeatureInfo", "LabelInfo", "FittedPreprocessing", "column_kind", "fit_preprocessing"]

FEATURES = "features"
LABEL = "label"

def column_kind(dtype) -> str:
    """'integer', 'number', 'boolean', 'binary' or 'string' for a pandas or Arrow dtype."""
    text = str(dtype).lower()
    if text.startswith(("binary", "large_binary", "fixed_size_binary")):
        return "binary"
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
    kind: str  # integer | number | boolean | string | binary; image or text once such a step encodes it
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
    def streams_train(self) -> bool:
        """Whether the train split travels to training as read, decoded in the training workers
        (once and held when the decoded rows fit a worker's budget, else per batch at every epoch:
        rayline/train/loop.py's shard_plan), rather than model-ready: decoded pixels are float32,
        tens of times the size of the encoded files they come from."""
        return any(step.kind == "image" for step in self.steps)

    @property
    def output_columns(self) -> list[str]:
        """The model's input columns, in order (one-hot columns named `column=category`, image
        pixels `column[i]`)."""
        return self.compiled.output_columns

    def input_schema(self) -> dict:
        """What a model gets besides the width of its input: where each image's pixels lie in a row
        (start, stop, [height, width, channels], training augmentation), where each text's token
        ids lie (start, stop, length, vocab_size) and which positions hold the other (tabular)
        features. Saved in arch.json; `model.import` callables may take it."""
        compiled = self.compiled
        inside = {i for segment in compiled.segments for i in range(segment["start"], segment["stop"])}
        return {"num_features": len(compiled.output_columns),
                "images": [dict(s) for s in compiled.segments if s["type"] == "image"],
                "texts": [dict(s) for s in compiled.segments if s["type"] == "text"],
                "tabular": [i for i in range(len(compiled.output_columns)) if i not in inside]}

    # ------------------------------------------------------------ transform

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Raw rows as a pandas frame -> float32 feature matrix in `output_columns` order."""
        return self.compiled.transform_frame(frame)

    def encode_records(self, rows: list[dict]) -> np.ndarray:
        """Request rows (feature name -> JSON value) -> float32 feature matrix; no pandas on the way."""
        return self.compiled.transform_records(rows)

    def encode_matrix(self, num: np.ndarray, value=None) -> np.ndarray:
        """Request values as one float64 matrix in feature order -> float32 feature matrix
        (numbers-only models: `compiled.takes_matrix`)."""
        return self.compiled.transform_matrix(num, value)

    def encode_labels(self, values: pd.Series) -> np.ndarray:
        if self.label.task == "regression":
            return values.to_numpy(dtype=np.float32)
        index = {value_key(c): i for i, c in enumerate(self.label.classes)}
        codes = category_codes(values, index, self._class_lookup)
        if (codes < 0).any():
            bad = values.iloc[int(np.flatnonzero(codes < 0)[0])]
            raise DataError(f"data.label: value {bad!r} is not a known class ({self.label.classes})")
        return codes

    @cached_property
    def _class_lookup(self):
        return lookup_index([value_key(c) for c in self.label.classes])

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

    def to_json(self) -> str:
        """What `save` writes (and `from_dict(json.loads(...))` reads back)."""
        return json.dumps(self.to_dict(), indent=1, default=_json_default)

    def save(self, path) -> None:
        with open(path, "w") as fh:
            fh.write(self.to_json())

    @classmethod
    def load(cls, path) -> "FittedPreprocessing":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))

    def __getstate__(self):
        # The compiled transform is rebuilt where it is used (Ray Data workers, replicas).
        state = dict(self.__dict__)
        state.pop("compiled", None)
        state.pop("_class_lookup", None)
        return state


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


# ---------------------------------------------------------------- fitting


def fit_preprocessing(train, features: list[FeatureInfo], label: LabelInfo, steps_spec: list) -> FittedPreprocessing:
    """Fit each step, in order, on the train split only.

    `train`: the train split's statistics from the data stage's one pass (data/profile.py's
    TrainStats), or the rows themselves (a Ray Dataset or a pandas frame), summarised here in
    one pass. Each step is fitted on its columns as the earlier steps leave them: a fitted step
    moves the statistics past itself (`Step.advance_stats`), without another pass over the rows.
    """
    from rayline.data.profile import ProfileRequest, TrainStats, profile_dataset, profile_frame

    fitted = FittedPreprocessing(features=[FeatureInfo(**asdict(f)) for f in features], label=label)
    names = [f.name for f in fitted.features]
    kinds = {f.name: f.kind for f in fitted.features}
    problems = check_steps(names, kinds, steps_spec)
    if problems:
        raise DataError("\n".join(problems))
    plan = ColumnPlan.of(names, kinds, steps_spec)
    by_name = {f.name: f for f in fitted.features}
    if isinstance(train, TrainStats):
        stats = train
    else:
        request = ProfileRequest.for_steps(None, names, kinds, [steps_spec])
        if isinstance(train, pd.DataFrame):
            stats = profile_frame(train[names], request).train_stats()
        else:
            stats = profile_dataset(train.select_columns(names, **map_args()), request).train_stats()

    steps: list[Step] = []
    for index, step_model in enumerate(steps_spec):
        (kind,) = type(step_model).model_fields
        params = getattr(step_model, kind)
        stats.where = f"data.preprocess[{index}].{kind}"
        step = STEPS[kind].fit(stats.where, params, plan.resolve(params.columns), stats)
        stats.apply(step)
        steps.append(step)
        if kind == "impute":
            for col in step.columns:
                by_name[col].nullable = True
        elif kind == "one_hot":
            for col, cats in step.categories.items():
                by_name[col].categories = cats
                by_name[col].unknown = step.handle_unknown
        elif kind in ("image", "text"):
            for col in step.columns:
                by_name[col].kind = kind
    fitted.steps = steps
    fitted.__dict__.pop("compiled", None)
    return fitted
