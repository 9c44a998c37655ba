"""Check a spec against its data before any Ray work: columns exist, types fit the steps."""

from __future__ import annotations

from rayline.data.feature_types import image_columns, with_default_steps, with_step_columns
from rayline.data.image_paths import ReadImageFiles, base_of, path_columns
from rayline.data.preprocess import column_kind
from rayline.data.sources import feature_columns
from rayline.data.steps import check_steps
from rayline.errors import DataError

__all__ = ["check_spec_against_data", "infer_task"]

_MAX_CLASSES_FOR_INTEGER_LABEL = 50
_IMAGES_CHECKED = 8  # sampled images per image column decoded before any Ray work


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
    data, fill_problems = with_step_columns(spec.data, known, kinds)  # image/text steps' default columns
    if fill_problems:
        return problems + fill_problems
    spec = spec.model_copy(update={"data": data})
    try:
        images, paths = _image_sample(spec, known, kinds)  # path columns' kinds become binary
    except DataError as exc:
        return problems + [str(exc)]
    undecodable = _undecodable(images, paths)
    if undecodable:
        return problems + undecodable
    try:
        steps, type_problems = with_default_steps(spec.data, known, kinds, lambda col: _first(images, col))
    except DataError as exc:
        return problems + [str(exc)]
    problems += type_problems or check_steps(features, kinds, steps)

    one_hot_error = []  # (i, j, col) of one_hot columns with handle_unknown: error
    for i, step in enumerate(steps):
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


def _image_sample(spec, features: list[str], kinds: dict[str, str]):
    """(the first `_IMAGES_CHECKED` rows of the image columns as an Arrow table, with file paths
    read into the files' bytes and those columns' kinds set to binary; {path column: its paths}),
    or (None, {}) without image columns or for remote data."""
    from rayline.data.sources import sample_table

    columns = image_columns(spec.data, features)
    table = sample_table(spec.data.source, columns=columns, rows=_IMAGES_CHECKED) if columns else None
    if table is None:
        return None, {}
    paths = {c: table.column(c).to_pylist() for c in path_columns(table, columns, "data.source")}
    if paths:
        try:
            table = ReadImageFiles(list(paths), base_of(spec.data.source.path))(table)
        except DataError as exc:
            raise DataError(f"data.source: {exc}") from None
        kinds.update({c: "binary" for c in paths})
    return table, paths


def _undecodable(table, paths: dict) -> list[str]:
    """One problem per image column whose sampled images do not all decode, naming row and file."""
    from rayline.data.images import decode_image
    from rayline.data.values import is_missing

    problems = []
    for col in table.column_names if table is not None else []:
        for i, value in enumerate(table.column(col).to_pylist()):
            if is_missing(value):
                continue
            try:
                decode_image(value, (1, 1), 1)
            except ValueError as exc:
                file = f" ({paths[col][i]})" if col in paths else ""
                problems.append(f"data.source: column {col!r} row {i}{file}: not a usable image: {exc}")
                break
    return problems


def _first(table, col: str):
    values = [v for v in table.column(col).to_pylist() if v is not None] if table is not None else []
    if not values:
        raise DataError(f"data.feature_types.{col}: no image in the sampled rows to infer the size from (allowed: an "
                        "image step with a size)")
    return values[0]
