"""Check a spec against its data before any Ray work: columns exist, types fit the steps."""

from __future__ import annotations

from rayline.data.preprocess import column_kind
from rayline.data.sources import feature_columns
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
    """One message per problem; [] when the spec fits its data (or the data is remote).

    Reads little: columns and types from the schema (a Parquet file's footer, else a sample of
    at most `SAMPLE_ROWS` rows), and values only of the columns a check needs (the label, to
    infer the task; one-hot columns with handle_unknown: error), from that bounded sample.
    """
    from rayline.data.sources import sample_table, source_schema

    try:
        schema = source_schema(spec.data.source)
    except DataError as exc:
        return [str(exc)]
    if schema is None:
        return []  # a remote URI: checked when the pipeline reads it
    columns = list(schema.names)
    allowed = ", ".join(map(str, columns[:20])) + (", ..." if len(columns) > 20 else "")
    problems = []
    label = spec.data.label
    if label not in columns:
        problems.append(f"data.label: no such column in the data (got {label!r}; allowed: {allowed})")
    key = spec.data.split.key
    if key is not None and key not in columns:
        problems.append(f"data.split.key: no such column in the data (got {key!r}; allowed: {allowed})")
    features = feature_columns(spec.data, columns)
    for i, col in enumerate(spec.data.features or []):
        if col not in columns:
            problems.append(f"data.features[{i}]: no such column in the data (got {col!r}; allowed: {allowed})")
    known = [c for c in features if c in columns]
    kinds = {c: column_kind(schema.field(c).type) for c in known}
    problems += check_steps(features, kinds, spec.data.preprocess)

    one_hot_error = []  # (i, j, col) of one_hot columns with handle_unknown: error
    for i, step in enumerate(spec.data.preprocess):
        kind, params = next(iter(step.model_dump().items()))
        if kind == "one_hot" and params["handle_unknown"] == "error":
            one_hot_error += [(i, j, col) for j, col in enumerate(params["columns"]) if col in kinds]
    infer = label in columns and spec.train.metric is not None and spec.task is None
    wanted = sorted({col for _, _, col in one_hot_error} | ({label} if infer else set()))
    values = None
    if wanted:
        try:
            values = sample_table(spec.data.source, columns=wanted)
        except DataError as exc:
            return problems + [str(exc)]
    # A one_hot with handle_unknown: error needs categories; a sample with no value at all
    # in that column will not have any in the train split either.
    for i, j, col in one_hot_error:
        if values is not None and values.num_rows and values.column(col).null_count == values.num_rows:
            problems.append(
                f"data.preprocess[{i}].one_hot.columns[{j}]: column {col!r} has no values in the data, so with "
                "handle_unknown: error every request would be rejected (got no categories; allowed: handle_unknown: ignore)"
            )
    if label in columns and spec.task is not None:
        lk = column_kind(schema.field(label).type)
        if spec.task == "regression" and lk in ("string", "boolean"):
            problems.append(f"task: regression needs a numeric label (got {label!r}, a {lk} column; allowed: classification)")
    if infer and values is not None:
        unique = len(values.column(label).drop_null().unique())
        task = infer_task(column_kind(schema.field(label).type), unique)
        from rayline.spec.pipeline_spec import CLASSIFICATION_METRICS, REGRESSION_METRICS

        allowed_metrics = CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS
        if spec.train.metric not in allowed_metrics:
            problems.append(
                f"train.metric: not a {task} metric (the label makes this {task}) "
                f"(got {spec.train.metric!r}; allowed: {', '.join(allowed_metrics)})"
            )
    return problems
