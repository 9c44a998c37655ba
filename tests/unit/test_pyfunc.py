"""The pyfunc model's schema and layout, without Ray: signature from the fitted features, the
input example, requirements, and finding rayline's files in both artifact layouts."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import yaml

from rayline.data.preprocess import FeatureInfo, LabelInfo, fit_preprocessing
from rayline.errors import DataError


def _fitted(label=LabelInfo("churn", "classification", ["no", "yes"])):
    frame = pd.DataFrame({"plan": ["basic", None, "pro", "plus"], "tenure": [1.0, np.nan, 3.0, 4.0],
                          "fee": [10.0, 20.0, 30.0, 40.0], "member": [True, False, True, False],
                          "seats": [1, 2, 3, 4], "months": [5, 6, 7, 8], "calls": [0.0, np.nan, 2.0, 9.0],
                          "trial": [True, False, False, True]})
    features = [FeatureInfo("plan", "string"), FeatureInfo("tenure", "number"), FeatureInfo("fee", "number"),
                FeatureInfo("member", "boolean"), FeatureInfo("seats", "integer"), FeatureInfo("months", "integer"),
                FeatureInfo("calls", "integer"), FeatureInfo("trial", "boolean")]
    steps = [{"impute": {"columns": ["tenure", "calls"], "strategy": "median"}},
             {"impute": {"columns": ["plan"], "strategy": "most_frequent"}},
             {"one_hot": {"columns": ["plan", "seats", "trial"]}}]
    from rayline.spec.pipeline_spec import PipelineSpec

    steps = PipelineSpec.model_validate({"name": "x", "data": {"source": {"format": "csv", "path": "x.csv"}, "label": "churn",
                                                                "preprocess": steps},
                                         "model": {"framework": "xgboost", "kind": "gbdt"}}).data.preprocess
    return fit_preprocessing(frame, features, label, steps)


def test_signature_types_and_optional_imputed_features():
    from rayline.registry.pyfunc import model_signature

    sig = model_signature(_fitted())
    assert [(c["name"], c["type"], c["required"]) for c in sig.inputs.to_dict()] == [
        ("plan", "string", False), ("tenure", "double", False), ("fee", "double", True),
        ("member", "boolean", True),
        ("seats", "long", True), ("months", "long", True),  # integer columns, one-hot encoded or not
        ("calls", "double", False),  # an imputed integer column: gaps read as float64, and a null is no long
        ("trial", "boolean", True)]  # a one-hot boolean column is still boolean
    assert sig.outputs.to_dict() == [{"type": "string", "name": "prediction", "required": True},
                                     {"type": "double", "name": "probability_no", "required": True},
                                     {"type": "double", "name": "probability_yes", "required": True}]


@pytest.mark.parametrize("label, expected", [
    (LabelInfo("y", "classification", [0, 1, 2]), ("long", ["prediction", "probability_0", "probability_1", "probability_2"])),
    (LabelInfo("y", "classification", [False, True]), ("boolean", ["prediction", "probability_False", "probability_True"])),
    (LabelInfo("y", "classification", [0.5, 1.5]), ("double", ["prediction", "probability_0.5", "probability_1.5"])),
    (LabelInfo("y", "regression"), ("double", ["prediction"])),
])
def test_output_columns_follow_the_labels_as_the_endpoint_spells_them(label, expected):
    from rayline.registry.pyfunc import model_signature, output_columns

    fitted = _fitted(label)
    sig = model_signature(fitted)
    assert (sig.outputs.to_dict()[0]["type"], output_columns(fitted)) == expected
    assert [c["name"] for c in sig.outputs.to_dict()] == expected[1]


def test_input_examples_pass_the_signature():
    from mlflow.models.utils import _enforce_schema

    from rayline.registry.pyfunc import example_frame, model_signature

    fitted = _fitted()
    schema = model_signature(fitted).inputs
    synthetic = example_frame(fitted)
    assert synthetic.to_dict(orient="records") == [{"plan": "basic", "tenure": 0.0, "fee": 0.0, "member": False, "seats": 1,
                                                    "months": 0, "calls": 0.0, "trial": False}]
    real = pd.DataFrame({"churn": ["no"] * 5, "plan": ["pro", None, "basic", "plus", "pro"], "tenure": [1, None, 2, 3, 4],
                         "fee": [1, 2, 3, 4, 5], "member": [True] * 5, "seats": [1, 2, 3, 4, 1], "months": [1, 2, 3, 4, 5],
                         "calls": [1, 2, 3, 4, 5], "trial": [True] * 5})
    example = example_frame(fitted, real)
    assert list(example.columns) == ["plan", "tenure", "fee", "member", "seats", "months", "calls", "trial"] and len(example) == 3
    assert example["plan"].tolist() == ["pro", None, "basic"]
    assert {c: str(example[c].dtype) for c in ("fee", "calls", "seats", "months")} == {
        "fee": "float64", "calls": "float64", "seats": "int64", "months": "int64"}
    for frame in (synthetic, example):
        _enforce_schema(frame, schema)  # raises when a column does not match


def test_the_training_csv_and_json_records_pass_the_signature(tmp_path):
    """What a user reads from the training file passes MLflow's schema enforcement as it is:
    pd.read_csv gives int64 for a gapless integer column (declared long) and float64 for an
    integer column with gaps (imputed, declared double); so do JSON records of those rows."""
    import json

    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _enforce_schema

    from rayline.registry.pyfunc import model_signature

    schema = model_signature(_fitted()).inputs
    path = tmp_path / "train.csv"
    path.write_text("churn,plan,tenure,fee,member,seats,months,calls,trial\n"
                    "no,pro,12,10.5,True,2,14,,False\n"
                    "yes,,,20.25,False,3,7,4,True\n"
                    "no,basic,3,30.0,True,1,60,0,True\n")
    frame = pd.read_csv(path)
    assert {c: str(frame[c].dtype) for c in ("seats", "months", "calls", "tenure")} == {
        "seats": "int64", "months": "int64", "calls": "float64", "tenure": "float64"}
    enforced = _enforce_schema(frame, schema)  # raised "Can not safely convert int64 to float64" when integers were double
    assert enforced["months"].tolist() == [14, 7, 60] and enforced["calls"].isna().tolist() == [True, False, False]
    records = json.loads(frame.to_json(orient="records"))  # JSON numbers and nulls, as a client sends them
    assert records[1]["plan"] is None and records[0]["months"] == 14
    _enforce_schema(pd.DataFrame(records), schema)
    # The one refusal the module doc names: MLflow takes int64 for a double column only when every
    # value is 0 or 1, so a frame whose imputed integer column has no gap is cast to float first.
    gapless = frame.assign(calls=[1, 4, 2])
    with pytest.raises(MlflowException, match="column calls. Can not safely convert int64 to float64"):
        _enforce_schema(gapless, schema)
    _enforce_schema(gapless.astype({"calls": float}), schema)


def test_requirements_pin_rayline_mlflow_and_the_framework():
    import mlflow

    from rayline.registry.pyfunc import _requirements

    assert _requirements({"versions": {"rayline": "0.1.0", "tensorflow": "2.21.0", "tf_keras": "2.21.0"}}) == [
        "rayline==0.1.0", f"mlflow=={mlflow.__version__}", "tensorflow==2.21.0", "tf-keras==2.21.0"]


def test_artifact_root_finds_rayline_files_in_both_layouts(tmp_path):
    from rayline.inference.predictor import artifact_root

    old = tmp_path / "old"
    old.mkdir()
    (old / "rayline.json").write_text("{}")
    assert artifact_root(str(old)) == str(old)

    new = tmp_path / "new"
    (new / "artifacts" / "rayline").mkdir(parents=True)
    (new / "artifacts" / "rayline" / "rayline.json").write_text("{}")
    (new / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": {
        "artifacts": {"rayline": {"path": "artifacts/rayline", "uri": "/elsewhere/rayline"}}}}}))
    assert artifact_root(str(new)) == os.path.join(str(new), "artifacts/rayline")


def test_a_directory_that_is_not_a_rayline_model_is_one_clear_error(tmp_path):
    from rayline.inference.predictor import artifact_root

    with pytest.raises(DataError) as info:
        artifact_root(str(tmp_path))
    assert str(info.value) == (f"{tmp_path}: not a rayline model (no rayline.json; no MLmodel; "
                               "allowed: a model registered by rayline, old layout or MLflow pyfunc)")
    (tmp_path / "MLmodel").write_text(yaml.safe_dump({"flavors": {"sklearn": {}}}))
    with pytest.raises(DataError, match="an MLmodel whose artifact 'rayline' is None"):
        artifact_root(str(tmp_path))


def test_input_frame_fills_left_out_imputed_columns_and_refuses_other_nulls():
    from rayline.registry.pyfunc import _input_frame

    fitted = _fitted()
    rest = {"months": [3], "trial": [True]}
    frame = _input_frame(fitted, pd.DataFrame({"fee": [1.0], "member": [True], "seats": [2], "extra": ["x"], **rest}))
    assert frame.to_dict(orient="records") == [{"plan": None, "tenure": None, "fee": 1.0, "member": True, "seats": 2,
                                                "months": 3, "calls": None, "trial": True}]
    assert np.isfinite(fitted.transform(frame)).all()  # imputed
    with pytest.raises(DataError, match=r"^input: missing feature columns \['fee'\]"):
        _input_frame(fitted, pd.DataFrame({"member": [True], "seats": [2], **rest}))
    with pytest.raises(DataError, match=r"^input\[1\]\.member: missing, .* \(got null; allowed: true or false\)$"):
        _input_frame(fitted, pd.DataFrame({"fee": [1.0, 2.0], "member": [True, None], "seats": [2, 3], "months": [3, 4], "trial": [True] * 2}))
    strings = pd.DataFrame({"plan": pd.array(["pro", pd.NA], dtype="string"), "fee": [1.0, 2.0], "member": [True, True], "seats": [2, 3],
                            "months": [3, 4], "trial": [True] * 2})
    assert _input_frame(fitted, strings)["plan"].tolist() == ["pro", None]  # pandas' NA as the transform's None


def test_pyfunc_columns_are_the_clients():
    import rayline.client
    import rayline.registry.pyfunc

    assert rayline.registry.pyfunc.PREDICTION_COLUMN == rayline.client.PREDICTION_COLUMN == "prediction"
    assert rayline.registry.pyfunc.probability_column(7) == rayline.client.probability_column(7) == "probability_7"


def test_pyfunc_module_imports_no_mlflow():
    """Importing rayline.registry.pyfunc (the column names, the frame helpers) costs no 1.2 s MLflow import."""
    import subprocess
    import sys

    code = "import sys, rayline.registry.pyfunc; print('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
