"""Every registered version as a real MLflow pyfunc model (models-from-code).

`package` turns a rayline artifact (rayline.pipeline.artifact.write_artifact: weights/, preprocessing.json,
rayline.json, spec.yaml) into an MLflow pyfunc model directory:

    MLmodel                 python_function flavor, loader: MLflow's code-model loader
    pyfunc_model.py         the model code (a copy of rayline/registry/pyfunc_model.py): imports
                            rayline and calls mlflow.models.set_model(...)
    artifacts/rayline/      the rayline artifact itself, as `artifacts={"rayline": ...}`
    requirements.txt, python_env.yaml, conda.yaml, input_example.json, serving_input_example.json

Nothing of rayline is pickled: loading runs the code file, whose `load_context` builds
rayline's own `Predictor` from `artifacts/rayline`, so offline, pyfunc and served
predictions are the same code on the same files. The model needs rayline installed where it
loads (`mlflow models serve --env-manager local`, or an environment with rayline).

Signature (from the fitted preprocessing's features), following the training columns' types
as pandas reads the training file, because MLflow enforces it before the model runs:

    integer column, no impute step   `long`     pd.read_csv gives int64 (rayline refuses nulls
                                                no impute step fills, so the column has none)
    integer column, imputed          `double`   a CSV integer column with gaps reads as float64,
                                                and a null cannot be a `long` (MLflow's server
                                                fails casting it; its docs say: declare double)
    number column                    `double`
    boolean column                   `boolean`  one-hot encoded or not
    string column                    `string`   one-hot encoded or not

What MLflow 3.17 lets through (models/utils.py `_enforce_mlflow_datatype`,
utils/proto_json_utils.py `cast_df_types_according_to_schema`): `model.predict(frame)`
accepts int8-int64 for `long` but no float, and float16-float64 and int8-int32 for `double`
but int64 only when every value is 0 or 1; `mlflow models serve` first casts JSON and CSV
columns to the declared type, so JSON and CSV integers pass for `double` columns and whole
JSON numbers (3.0) for `long` ones (MLflow's cast truncates 3.5 to 3, where the endpoint
would take 3.5: send integers). So the training file read by pd.read_csv passes
`model.predict` as it is, and `mlflow models serve` takes JSON and CSV bodies of its rows,
gaps or not. What `model.predict` refuses is an int64 column where the signature says
`double` (an imputed integer column with no gap in that frame, a number column whose values
there are all whole): cast it with `.astype(float)`. A feature an impute step fills is
optional (`required: false`) and may hold nulls. Output: a DataFrame with `prediction` (the
original label, exactly the endpoint's "predictions") and, for classification, one
`probability_<label>` column per class (the endpoint's "probabilities" values).

The column names are rayline.Client's (one definition, in rayline/client.py): a DataFrame
from the pyfunc model and one from the client have the same columns. mlflow is imported
inside the functions, so importing this module costs no MLflow import (~1.2 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any

import numpy as np
import pandas as pd

from rayline.client import PREDICTION_COLUMN, probability_column
from rayline.errors import DataError

__all__ = [
    "PREDICTION_COLUMN",
    "PROBABILITY_PREFIX",
    "MODEL_CODE",
    "probability_column",
    "output_columns",
    "predict_frame",
    "model_signature",
    "example_frame",
    "package",
    "is_pyfunc",
]

PROBABILITY_PREFIX = probability_column("")
# The models-from-code file MLflow copies into every model and runs when loading it.
MODEL_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyfunc_model.py")
EXAMPLE_ROWS = 3
_NUMPY = {"long": np.int64, "double": np.float64}
_ALLOWED = {"long": "a number", "double": "a number", "boolean": "true or false", "string": "a string"}


def output_columns(preprocessing) -> list[str]:
    """The output DataFrame's columns, in order."""
    if preprocessing.label.task != "classification":
        return [PREDICTION_COLUMN]
    return [PREDICTION_COLUMN] + [probability_column(c) for c in preprocessing.label.classes or []]


def _input_frame(preprocessing, frame: pd.DataFrame) -> pd.DataFrame:
    """The feature columns of `frame`, missing optional ones as nulls, missing values as None
    in non-numeric columns (pandas spells them NaN, None or pd.NA; the compiled transform
    takes None and NaN)."""
    missing = [f.name for f in preprocessing.features if f.name not in frame.columns and not f.nullable]
    if missing:
        allowed = [f.name for f in preprocessing.features]
        raise DataError(f"input: missing feature columns {missing} (got columns {list(frame.columns)}; "
                        f"allowed: {allowed}, the imputed ones optional)")
    out = {}
    for f in preprocessing.features:
        column = frame[f.name] if f.name in frame.columns else pd.Series([None] * len(frame), index=frame.index, dtype=object)
        nulls = column.isna().to_numpy()
        if not f.nullable and nulls.any():  # the endpoint's schema rejects these before the model (422)
            row = int(np.flatnonzero(nulls)[0])
            raise DataError(f"input[{row}].{f.name}: missing, and no impute step fills this feature "
                            f"(got null; allowed: {_ALLOWED[_feature_type(f)]})")
        if f.kind in ("integer", "number") and f.categories is None:
            out[f.name] = column
        else:
            values = column.to_numpy(dtype=object, copy=True)
            values[nulls] = None
            out[f.name] = pd.Series(values, index=frame.index, dtype=object)  # not pandas 3's inferred str (None -> NaN)
    return pd.DataFrame(out, index=frame.index)


def predict_frame(predictor, frame: pd.DataFrame) -> pd.DataFrame:
    """Raw rows -> the output DataFrame (see module doc), by the Predictor the endpoint runs.

    Predictions and probabilities are the float64 values `Predictor.respond` gives the
    endpoint, so the pyfunc model and /predict answer the same numbers for the same rows."""
    preprocessing = predictor.preprocessing
    outputs = predictor.infer(preprocessing.transform(_input_frame(preprocessing, frame)))
    result = predictor.respond(outputs, probabilities=False)
    out = pd.DataFrame({PREDICTION_COLUMN: result["predictions"]})
    if predictor.task == "classification":
        probabilities = np.asarray(outputs, dtype=np.float64).reshape(len(out), -1)
        for i, label in enumerate(preprocessing.label.classes or []):
            out[probability_column(label)] = probabilities[:, i]
    return out


# ---------------------------------------------------------------- signature and example


def _feature_type(feature) -> str:
    """The MLflow column type of a feature (see the module doc for why these)."""
    if feature.kind == "boolean":
        return "boolean"  # pd.read_csv gives bool; one-hot categories True/False are the same values
    if feature.kind == "integer":
        # An integer-valued category matches 1 and 1.0 alike (data.values.value_key), so the one-hot
        # encoded ones follow the same rule.
        return "double" if feature.nullable else "long"
    if feature.kind == "number":
        return "double"
    return "string"


def _label_type(preprocessing) -> str:
    if preprocessing.label.task != "classification":
        return "double"
    classes = preprocessing.label.classes or []
    if classes and all(isinstance(c, bool) for c in classes):
        return "boolean"
    if classes and all(isinstance(c, int) and not isinstance(c, bool) for c in classes):
        return "long"
    if classes and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in classes):
        return "double"
    return "string"


def model_signature(preprocessing):
    """The MLflow ModelSignature of a model with this fitted preprocessing."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec(_feature_type(f), f.name, required=not f.nullable) for f in preprocessing.features])
    columns = output_columns(preprocessing)
    outputs = Schema([ColSpec(_label_type(preprocessing), columns[0])] + [ColSpec("double", c) for c in columns[1:]])
    return ModelSignature(inputs=inputs, outputs=outputs)


def example_frame(preprocessing, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """A few input rows for MLflow's input example: the first rows of `frame` (real data, e.g.
    the test split) when given, else one row built from the schema (a seen category, 0.0)."""
    names = [f.name for f in preprocessing.features]
    if frame is not None and len(frame) and all(n in frame.columns for n in names):
        rows = _input_frame(preprocessing, frame[names].head(EXAMPLE_ROWS).reset_index(drop=True))
        for f in preprocessing.features:  # each numeric column as the signature's dtype
            if _feature_type(f) in _NUMPY:
                rows[f.name] = rows[f.name].astype(_NUMPY[_feature_type(f)])  # a long feature holds no nulls
        return rows
    row: dict[str, Any] = {}
    for f in preprocessing.features:
        if f.categories:
            value = f.categories[0]
            kind = _feature_type(f)
            row[f.name] = _NUMPY[kind](value).item() if kind in _NUMPY else value if kind == "boolean" else str(value)
        else:
            row[f.name] = {"long": 0, "double": 0.0, "boolean": False, "string": ""}[_feature_type(f)]
    return pd.DataFrame([row], columns=names)


# ---------------------------------------------------------------- packaging


def is_pyfunc(path: str) -> bool:
    """Whether the model directory `path` is an MLflow pyfunc model (has an MLmodel file)."""
    return os.path.isfile(os.path.join(path, "MLmodel"))


def _requirements(meta: dict) -> list[str]:
    """requirements.txt: rayline, MLflow and the framework at the versions that wrote the model.

    Given explicitly, so MLflow does not infer them: its inference loads the model in a
    subprocess to watch its imports (seconds, and it would import torch/TensorFlow again)."""
    import mlflow

    versions = dict(meta.get("versions") or {})
    pins = [f"rayline=={versions.pop('rayline')}"] if versions.get("rayline") else ["rayline"]
    pins.append(f"mlflow=={mlflow.__version__}")
    names = {"tf_keras": "tf-keras"}
    pins += [f"{names.get(k, k)}=={v}" for k, v in sorted(versions.items()) if v]
    return pins


@contextlib.contextmanager
def _no_environment_check():
    """MLflow's save_model checks that this environment satisfies the model's requirements
    (`warn_dependency_requirement_mismatches`): ours are this environment's own versions
    (`_requirements`), so it always does, and the check maps every installed distribution to its
    modules first: 1.4 s idle, 3.1 s during a run, of a registration's 3.5 s (2-core box). Skipped
    while saving; a MLflow that moved the function saves as before, with its check."""
    from mlflow.utils import environment

    original = getattr(environment, "warn_dependency_requirement_mismatches", None)
    if original is None:
        yield
        return
    environment.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        environment.warn_dependency_requirement_mismatches = original


def package(artifact_dir: str, dest: str, *, run_id: str | None = None, artifact_path: str = "model",
            input_example: pd.DataFrame | None = None) -> str:
    """Write the pyfunc model of the rayline artifact `artifact_dir` to the new directory `dest`.

    `artifact_dir` is copied (MLflow copies `artifacts=` into the model), so it is left as is.
    Raises MlflowException/OSError as MLflow does: callers map them (Registry._guard)."""
    import mlflow.pyfunc
    from mlflow.models import Model

    from rayline.data.preprocess import FittedPreprocessing
    from rayline.inference.predictor import META_FILE, PREPROCESSING_FILE, PYFUNC_ARTIFACT

    with open(os.path.join(artifact_dir, META_FILE)) as fh:
        meta = json.load(fh)
    preprocessing = FittedPreprocessing.load(os.path.join(artifact_dir, PREPROCESSING_FILE))
    # MLflow names the copy after the source directory (artifacts/<basename>): stage the
    # artifact as `rayline` so the layout reads artifacts/rayline whatever the caller's name.
    staging = dest + ".src"
    source = os.path.join(staging, PYFUNC_ARTIFACT)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        shutil.copytree(artifact_dir, source)
        with _no_environment_check():
            mlflow.pyfunc.save_model(
                dest,
                python_model=MODEL_CODE,
                artifacts={PYFUNC_ARTIFACT: source},
                signature=model_signature(preprocessing),
                input_example=example_frame(preprocessing, input_example),
                pip_requirements=_requirements(meta),
                mlflow_model=Model(run_id=run_id, artifact_path=artifact_path),
                metadata={"rayline": {k: meta.get(k) for k in ("name", "framework", "task", "metric")}},
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
