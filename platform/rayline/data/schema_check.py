"""Check a spec against its data before any Ray work: columns exist, types fit the steps."""

from __future__ import annotations

from rayline.data.preprocess import column_kind
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
    numeric = [c for c in known if kinds[c] != "string"]
    encoded = set()
    for i, step in enumerate(spec.data.preprocess):
        kind, params = next(iter(step.model_dump().items()))
        cols = params["columns"]
        if cols == "numeric":
            continue
        for j, col in enumerate(cols):
            where = f"data.preprocess[{i}].{kind}.columns[{j}]"
            if col not in features:
                problems.append(f"{where}: not a feature (got {col!r}; allowed: {', '.join(map(str, features[:20]))})")
            elif col in kinds and kind in ("standard_scale", "min_max_scale") and kinds[col] == "string":
                problems.append(f"{where}: needs a numeric column (got {col!r}, a string column; allowed: {', '.join(numeric[:20])})")
            elif col in kinds and kind == "impute" and params["strategy"] in ("mean", "median") and kinds[col] == "string":
                problems.append(
                    f"{where}: strategy {params['strategy']} needs a numeric column (got {col!r}, a string column; "
                    "allowed: strategy most_frequent or constant)"
                )
        if kind == "one_hot":
            encoded.update(cols)
    unencoded = [c for c in known if kinds[c] == "string" and c not in encoded]
    if unencoded:
        problems.append(
            f"data.features: string columns {unencoded} need encoding "
            f"(allowed: add `- one_hot: {{columns: {unencoded}}}` to data.preprocess, or leave them out of data.features)"
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
