"""The data stage: read -> split -> fit preprocessing on train -> transform every split."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from rayline.data.preprocess import (
    FEATURES,
    LABEL,
    FeatureInfo,
    FittedPreprocessing,
    LabelInfo,
    column_kind,
    fit_preprocessing,
)
from rayline.data.partials import label_summary
from rayline.data.schema_check import infer_task
from rayline.data.steps import value_key, value_rank
from rayline.data.sources import fingerprint, read_dataset, unwrap_data_error
from rayline.errors import DataError

__all__ = ["PreparedData", "prepare_data", "prepare_variants", "to_training_batch", "PROBE_ROWS"]

# The probe (rayline/train/probe.py): this many raw rows of the test split, which the training loop
# predicts at every checkpoint and registration checks the artifact against. Bounded on purpose.
PROBE_ROWS = 256


@dataclass
class PreparedData:
    """Model-ready splits (columns `features`, `label`) plus what the model artifact carries."""

    train: object  # ray.data.Dataset, materialized
    valid: object
    test: object
    test_frame: pd.DataFrame  # raw test rows, for test metrics through the offline predictor
    preprocessing: FittedPreprocessing
    fingerprint: str
    rows: dict[str, int]
    # The probe (rayline/train/probe.py): the first PROBE_ROWS raw rows of the test split (the
    # valid split when there is none), in split order, and the same rows model-ready, transformed
    # through Ray Data as the training data. Bounded, whatever the size of the data.
    probe: object = None  # ray.data.Dataset, materialized, one block
    probe_frame: pd.DataFrame | None = None

    @property
    def task(self) -> str:
        return self.preprocessing.label.task


class _ToTrainingBatch:
    """Raw pandas batch -> {'features': float32 matrix, 'label': encoded labels}."""

    def __init__(self, preprocessing: FittedPreprocessing):
        self.preprocessing = preprocessing

    def __call__(self, batch: pd.DataFrame) -> dict:
        return to_training_batch(self.preprocessing, batch)


def to_training_batch(preprocessing: FittedPreprocessing, batch: pd.DataFrame) -> dict:
    return {
        FEATURES: preprocessing.transform(batch),
        LABEL: preprocessing.encode_labels(batch[preprocessing.label.name]),
    }


def prepare_data(spec) -> PreparedData:
    """Run the data stage for `spec` on the connected Ray cluster."""
    return prepare_variants(spec, [spec])[0]


def prepare_variants(spec, variants: list) -> list[PreparedData]:
    """The data stage once per preprocessing variant: read and split once, fit and transform each.

    `variants`: specs equal to `spec` but for `data.preprocess` (a whole-pipeline sweep's
    preprocessing configurations). Every variant sees the same rows in the same splits, so
    trials on different preprocessing compare on equal terms.
    """
    source = spec.data.source
    ds = read_dataset(source)
    try:
        schema = ds.schema()
    except Exception as exc:
        raise DataError(f"data.source: cannot read {source.format} data: {exc}") from exc
    columns = list(schema.names)
    label = spec.data.label
    if label not in columns:
        raise DataError(f"data.label: no such column in the data (got {label!r}; allowed: {', '.join(columns[:20])})")
    names = spec.data.features or [c for c in columns if c != label]
    missing = [c for c in names if c not in columns]
    if missing:
        raise DataError(f"data.features: no such columns in the data (got {missing}; allowed: {', '.join(columns[:20])})")
    kinds = dict(zip(schema.names, (column_kind(t) for t in schema.types)))
    try:
        ds = ds.select_columns(names + [label]).materialize()
    except Exception as exc:  # a bad later file or block: Ray's remote traceback -> our one line
        raise unwrap_data_error(exc, source) from exc

    null_labels, classes = label_summary(ds, label)
    if null_labels:
        raise DataError(f"data.label: {null_labels} rows have no label in column {label!r} (allowed: drop them from the data)")
    label_kind = kinds[label]
    task = spec.task or infer_task(label_kind, len(classes))
    if task == "classification":
        if len(classes) < 2:
            raise DataError(f"data.label: classification needs at least 2 classes (got {classes})")
        label_info = LabelInfo(name=label, task=task, classes=sorted({value_key(c) for c in classes}, key=value_rank))
    else:
        if label_kind in ("string", "boolean"):
            raise DataError(f"task: regression needs a numeric label (got {label!r}, a {label_kind} column)")
        label_info = LabelInfo(name=label, task=task)

    split = spec.data.split
    total = ds.count()
    if total < 10:
        raise DataError(f"data.source: too few rows to split into train/valid/test (got {total}; allowed: >= 10)")
    shuffled = ds.random_shuffle(seed=split.seed).materialize()
    fractions = [split.valid, split.test] if split.test > 0 else [split.valid]
    parts = shuffled.split_proportionately(fractions)
    if split.test > 0:
        valid_raw, test_raw, train_raw = parts
    else:
        (valid_raw, train_raw), test_raw = parts, None
    features = [FeatureInfo(name=c, kind=kinds[c]) for c in names]
    test_frame = test_raw.to_pandas() if test_raw is not None else valid_raw.to_pandas()
    probe_frame = (test_raw if test_raw is not None else valid_raw).limit(PROBE_ROWS).to_pandas()
    data_fingerprint = fingerprint(source)
    return [_preprocessed(train_raw, valid_raw, test_raw, test_frame, features, label_info, variant.data.preprocess,
                          data_fingerprint, probe_frame) for variant in variants]


def _preprocessed(train_raw, valid_raw, test_raw, test_frame, features, label_info, steps, data_fingerprint,
                  probe_frame=None) -> PreparedData:
    """Fit `steps` on the train split and turn every split into model-ready rows."""
    fitted = fit_preprocessing(train_raw, features, label_info, steps)

    to_batch = _ToTrainingBatch(fitted)

    def convert(part):
        return part.map_batches(to_batch, batch_format="pandas").materialize()

    try:
        train, valid = convert(train_raw), convert(valid_raw)
        test = convert(test_raw) if test_raw is not None else None
        import ray.data

        # One block: one task transforms it, and the rows keep the probe frame's order.
        probe = None if probe_frame is None else convert(ray.data.from_pandas(probe_frame))
    except Exception as exc:  # surface our DataError from inside Ray Data tasks
        raise _unwrap_data_error(exc) from exc
    return PreparedData(
        train=train,
        valid=valid,
        test=test,
        test_frame=test_frame,
        preprocessing=fitted,
        fingerprint=data_fingerprint,
        rows={"train": train.count(), "valid": valid.count(), "test": test.count() if test is not None else 0},
        probe=probe,
        probe_frame=probe_frame,
    )


def _unwrap_data_error(exc: Exception) -> Exception:
    text = str(exc)
    marker = "rayline.errors.DataError: "
    if marker in text:
        return DataError(text.split(marker, 1)[1].strip().splitlines()[0])
    cause = exc
    while cause is not None:
        if isinstance(cause, DataError):
            return cause
        cause = cause.__cause__
    return DataError(f"data.preprocess: transforming the data failed: {text.splitlines()[0] if text else exc!r}")

