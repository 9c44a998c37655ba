"""Check a spec against its data before any Ray work: columns exist, types fit the steps."""

from __future__ import annotations

from rayline.data.preprocess import column_kind
from rayline.data.steps import check_steps
from rayline.errors import DataError

__all__ = ["check_spec_against_data", "infer_task"]

_MAX_CLASSES_FOR_INTEGER_LABEL = 50


def infer_task(kind: str, unique_count: int) -> str:
    """classification for string/boolean labels and integers with few values; else regression."""
    if kind in ("string", "boolean"):
        return "classification"
    if kind == "integer" and unique_count <= _MAX_CLASSES_FOR_INTEGER_LABEL:
        return "classification"
    return "regression"


def check_spec_against_data(spec) -> list[str]:
    """One message per problem; [] when the spec fits its data (or the data is remote)."""
    from rayline.data.sources import sample_frame

    try:
        frame = sample_frame(spec.data.source)
    except DataError as exc:
        return [str(exc)]
    if frame is None:
        return []  # a remote URI: checked when the pipeline reads it
    columns = list(frame.columns)
    allowed = ", ".join(map(str, columns[:20])) + (", ..." if len(columns) > 20 else "")
    problems = []
    label = spec.data.label
    if label not in columns:
        problems.append(f"data.label: no such column in the data (got {label!r}; allowed: {allowed})")
    features = spec.data.features or [c for c in columns if c != label]
    for i, col in enumerate(spec.data.features or []):
        if col not in columns:
            problems.append(f"data.features[{i}]: no such column in the data (got {col!r}; allowed: {allowed})")
    known = [c for c in features if c in columns]
    kinds = {c: column_kind(frame[c].dtype) for c in known}
    problems += check_steps(features, kinds, spec.data.preprocess)
    # A one_hot with handle_unknown: error needs categories; a sample with no value at all
    # in that column will not have any in the train split either.
    for i, step in enumerate(spec.data.preprocess):
        kind, params = next(iter(step.model_dump().items()))
        if kind == "one_hot" and params["handle_unknown"] == "error":
            for j, col in enumerate(params["columns"]):
                if col in kinds and frame[col].notna().sum() == 0:
                    problems.append(
                        f"data.preprocess[{i}].one_hot.columns[{j}]: column {col!r} has no values in the data, so with "
                        "handle_unknown: error every request would be rejected (got no categories; allowed: handle_unknown: ignore)"
                    )
    if label in columns and spec.task is not None:
        lk = column_kind(frame[label].dtype)
        if spec.task == "regression" and lk in ("string", "boolean"):
            problems.append(f"task: regression needs a numeric label (got {label!r}, a {lk} column; allowed: classification)")
    if label in columns and spec.train.metric is not None and spec.task is None:
        task = infer_task(column_kind(frame[label].dtype), frame[label].nunique())
        from rayline.spec import CLASSIFICATION_METRICS, REGRESSION_METRICS

        allowed_metrics = CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS
        if spec.train.metric not in allowed_metrics:
            problems.append(
                f"train.metric: not a {task} metric (the label makes this {task}) "
                f"(got {spec.train.metric!r}; allowed: {', '.join(allowed_metrics)})"
            )
    return problems
