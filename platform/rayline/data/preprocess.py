"""Fitted preprocessing: the part of the model that turns raw rows into feature arrays.

Steps are fitted in order on the train split only (each on the output of the ones before
it), with Ray Data aggregations, and the fitted state is plain JSON. `transform` is pure
pandas/numpy and runs unchanged in Ray Data during training, in `Predictor.predict`
offline, and in a Serve replica online: offline and online predictions are identical
because they are the same code on the same state.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rayline.data import partials
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
    steps: list[dict] = field(default_factory=list)
    output_columns: list[str] = field(default_factory=list)

    # ------------------------------------------------------------ transform

    def transform_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Apply every fitted step to a frame of raw feature columns."""
        out = frame[[f.name for f in self.features]].copy()
        for step in self.steps:
            out = _APPLY[step["kind"]](out, step)
        return out

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Raw rows -> float32 feature matrix in `output_columns` order."""
        out = self.transform_frame(frame)
        matrix = out[self.output_columns].astype("float64").to_numpy(dtype=np.float32, na_value=np.nan)
        if np.isnan(matrix).any():
            bad = [c for c in self.output_columns if out[c].isna().any()]
            raise DataError(
                f"data.preprocess: columns {bad} hold nulls that no impute step fills "
                f"(allowed: add `- impute: {{columns: {bad}}}` to data.preprocess)"
            )
        return matrix

    def encode_labels(self, values: pd.Series) -> np.ndarray:
        if self.label.task == "regression":
            return values.to_numpy(dtype=np.float32)
        index = {_key(c): i for i, c in enumerate(self.label.classes)}
        try:
            return np.array([index[_key(v)] for v in values], dtype=np.int64)
        except KeyError as exc:
            raise DataError(f"data.label: value {exc.args[0]!r} is not a known class ({self.label.classes})") from None

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
            "steps": self.steps,
            "output_columns": self.output_columns,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "FittedPreprocessing":
        return cls(
            features=[FeatureInfo(**f) for f in data["features"]],
            label=LabelInfo(**data["label"]),
            steps=data["steps"],
            output_columns=data["output_columns"],
        )

    def save(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=1, default=_json_default)

    @classmethod
    def load(cls, path) -> "FittedPreprocessing":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))


def _key(value):
    """Hashable, type-tolerant key: 1 and 1.0 and np.int64(1) name the same class."""
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


# ---------------------------------------------------------------- step application (pure pandas)


def _apply_impute(frame: pd.DataFrame, step: dict) -> pd.DataFrame:
    for col, value in step["fill"].items():
        if frame[col].isna().any():
            filled = frame[col].astype(object).where(frame[col].notna(), value)
            frame[col] = filled.infer_objects() if not isinstance(value, str) else filled
    return frame


def _apply_one_hot(frame: pd.DataFrame, step: dict) -> pd.DataFrame:
    for col, categories in step["categories"].items():
        values = frame[col]
        keys = values.map(_key)
        if step["handle_unknown"] == "error":
            # Nulls encode as all zeros; the request schema rejects them unless imputed.
            known = keys.isin([_key(c) for c in categories]) | values.isna()
            unseen = sorted({str(v) for v, ok in zip(values, known) if not ok})
            if unseen:
                raise DataError(
                    f"{col}: category not seen in training (got {unseen[0]!r}; allowed: {', '.join(map(str, categories))})"
                )
        position = frame.columns.get_loc(col)
        encoded = {f"{col}={c}": (keys == _key(c)).astype(np.float32).to_numpy() for c in categories}
        frame = frame.drop(columns=[col])
        for offset, (name, column) in enumerate(encoded.items()):
            frame.insert(position + offset, name, column)
    return frame


def _apply_standard(frame: pd.DataFrame, step: dict) -> pd.DataFrame:
    for col, (mean, std) in step["stats"].items():
        frame[col] = (frame[col].astype("float64") - mean) / (std if std > 0 else 1.0)
    return frame


def _apply_min_max(frame: pd.DataFrame, step: dict) -> pd.DataFrame:
    for col, (low, high) in step["stats"].items():
        span = high - low
        frame[col] = (frame[col].astype("float64") - low) / (span if span > 0 else 1.0)
    return frame


_APPLY = {
    "impute": _apply_impute,
    "one_hot": _apply_one_hot,
    "standard_scale": _apply_standard,
    "min_max_scale": _apply_min_max,
}


# ---------------------------------------------------------------- fitting


class _DatasetStats:
    """Statistics of a Ray Dataset, from per-block partials (data/partials.py): one task-pool
    pass per step instead of one hash-shuffle aggregation per column and statistic."""

    def __init__(self, ds):
        self.ds = ds.materialize()

    def numeric(self, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
        return partials.numeric_stats(self.ds, names, cols)

    def unique(self, col):
        return partials.distinct_values(self.ds, col)

    def value_counts(self, col):
        return partials.value_counts(self.ds, col)

    def apply(self, step):
        return _DatasetStats(self.ds.map_batches(_StepApplier(step), batch_format="pandas"))


class _FrameStats:
    """The same statistics of a pandas frame (unit tests, small local data)."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame

    def numeric(self, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
        def num(value):
            return None if value is None or _isnan(float(value)) else float(value)

        compute = {
            "mean": lambda c: self.frame[c].mean(),
            "median": lambda c: self.frame[c].median(),
            "std": lambda c: self.frame[c].std(ddof=0),
            "min": lambda c: self.frame[c].min(),
            "max": lambda c: self.frame[c].max(),
        }
        return {name: {col: num(compute[name](col)) for col in cols} for name in names}

    def unique(self, col):
        return list(self.frame[col].dropna().unique())

    def value_counts(self, col):
        return list(self.frame[col].dropna().value_counts().items())

    def apply(self, step):
        return _FrameStats(_APPLY[step["kind"]](self.frame.copy(), step))


def fit_preprocessing(train, features: list[FeatureInfo], label: LabelInfo, steps_spec: list) -> FittedPreprocessing:
    """Fit each step, in order, on the train split only (a Ray Dataset or a pandas frame)."""
    fitted = FittedPreprocessing(features=[FeatureInfo(**asdict(f)) for f in features], label=label)
    by_name = {f.name: f for f in fitted.features}
    numeric = [f.name for f in fitted.features if f.kind in ("integer", "number", "boolean")]
    names = [f.name for f in fitted.features]
    stats = _FrameStats(train[names].copy()) if isinstance(train, pd.DataFrame) else _DatasetStats(train.select_columns(names))

    for index, step_model in enumerate(steps_spec):
        kind, params = next(iter(step_model.model_dump().items()))
        where = f"data.preprocess[{index}].{kind}"
        columns = list(numeric) if params["columns"] == "numeric" else params["columns"]
        needs_numeric = kind in ("standard_scale", "min_max_scale") or (
            kind == "impute" and params["strategy"] in ("mean", "median"))
        _check_columns(where, columns, by_name, numeric if needs_numeric else None)
        step: dict[str, Any] = {"kind": kind}
        if kind == "impute":
            strategy = params["strategy"]
            fill = {}
            centre = stats.numeric((strategy,), columns)[strategy] if strategy in ("mean", "median") else {}
            for col in columns:
                if strategy == "constant":
                    value = params["value"]
                elif strategy == "most_frequent":
                    counts = stats.value_counts(col)
                    value = _key(min(counts, key=lambda kv: (-kv[1], _rank(_key(kv[0]))))[0]) if counts else None
                else:
                    value = centre[col]
                if value is None:
                    raise DataError(f"{where}: column {col!r} has no values in the train split to impute from")
                fill[col] = value
                by_name[col].nullable = True
            step["fill"] = fill
        elif kind == "one_hot":
            step["handle_unknown"] = params["handle_unknown"]
            step["categories"] = {}
            for col in columns:
                cats = sorted({_key(c) for c in stats.unique(col)}, key=_rank)
                step["categories"][col] = cats
                by_name[col].categories = cats
                by_name[col].unknown = params["handle_unknown"]
                if col in numeric:
                    numeric.remove(col)
        else:
            pairs = {}
            first, second = ("mean", "std") if kind == "standard_scale" else ("min", "max")
            values = stats.numeric((first, second), columns)
            for col in columns:
                a, b = values[first][col], values[second][col]
                if a is None or b is None:
                    raise DataError(f"{where}: column {col!r} has no values in the train split")
                pairs[col] = [a, b]
            step["stats"] = pairs
        fitted.steps.append(step)
        stats = stats.apply(step)

    strings = [f.name for f in fitted.features if f.kind == "string" and f.categories is None]
    if strings:
        raise DataError(
            f"data.features: string columns {strings} need encoding "
            f"(allowed: add `- one_hot: {{columns: {strings}}}` to data.preprocess, or leave them out of data.features)"
        )
    probe = fitted.transform_frame(pd.DataFrame({f.name: pd.Series([], dtype=object) for f in fitted.features}))
    fitted.output_columns = list(probe.columns)
    return fitted


class _StepApplier:
    """A picklable callable applying one fitted step to a pandas batch."""

    def __init__(self, step: dict):
        self.step = step

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return _APPLY[self.step["kind"]](batch, self.step)


def _check_columns(where, columns, by_name, must_be_in=None):
    for col in columns:
        if col not in by_name:
            raise DataError(f"{where}.columns: not a feature (got {col!r}; allowed: {', '.join(by_name)})")
        if must_be_in is not None and col not in must_be_in:
            raise DataError(
                f"{where}.columns: needs a numeric column (got {col!r}, a {by_name[col].kind} column; "
                f"allowed: {', '.join(must_be_in) or 'none'})"
            )


def _isnan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _rank(value):
    """Sort key that orders mixed numbers and strings deterministically."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))
