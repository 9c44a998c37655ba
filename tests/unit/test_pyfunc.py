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
                          "seats": [1, 2, 3, 4]})
    features = [FeatureInfo("plan", "string"), FeatureInfo("tenure", "number"), FeatureInfo("fee", "number"),
                FeatureInfo("member", "boolean"), FeatureInfo("seats", "integer")]
    steps = [{"impute": {"columns": ["tenure"], "strategy": "median"}},
             {"impute": {"columns": ["plan"], "strategy": "most_frequent"}},
             {"one_hot": {"columns": ["plan", "seats"]}}]
    from rayline.spec.models import PipelineSpec

    steps = PipelineSpec.model_validate({"name": "x", "data": {"source": {"format": "csv", "path": "x.csv"}, "label": "churn",
                                                                "preprocess": steps},
                                         "model": {"framework": "xgboost", "kind": "gbdt"}}).data.preprocess
    return fit_preprocessing(frame, features, label, steps)


def test_signature_types_and_optional_imputed_features():
    from rayline.pyfunc import model_signature

    sig = model_signature(_fitted())
    assert [(c["name"], c["type"], c["required"]) for c in sig.inputs.to_dict()] == [
        ("plan", "string", False), ("tenure", "double", False), ("fee", "double", True),
        ("member", "boolean", True), ("seats", "double", True)]  # a one-hot integer column stays a number
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
    from rayline.pyfunc import model_signature, output_columns

    fitted = _fitted(label)
    sig = model_signature(fitted)
    assert (sig.outputs.to_dict()[0]["type"], output_columns(fitted)) == expected
    assert [c["name"] for c in sig.outputs.to_dict()] == expected[1]


def test_input_examples_pass_the_signature():
    from mlflow.models.utils import _enforce_schema

    from rayline.pyfunc import example_frame, model_signature

    fitted = _fitted()
    schema = model_signature(fitted).inputs
    synthetic = example_frame(fitted)
    assert synthetic.to_dict(orient="records") == [{"plan": "basic", "tenure": 0.0, "fee": 0.0, "member": False, "seats": 1.0}]
    real = pd.DataFrame({"churn": ["no"] * 5, "plan": ["pro", None, "basic", "plus", "pro"], "tenure": [1, None, 2, 3, 4],
                         "fee": [1, 2, 3, 4, 5], "member": [True] * 5, "seats": [1, 2, 3, 4, 1]})
    example = example_frame(fitted, real)
    assert list(example.columns) == ["plan", "tenure", "fee", "member", "seats"] and len(example) == 3
    assert example["fee"].dtype == np.float64 and example["plan"].tolist() == ["pro", None, "basic"]
    for frame in (synthetic, example):
        _enforce_schema(frame, schema)  # raises when a column does not match


def test_requirements_pin_rayline_mlflow_and_the_framework():
    import mlflow

    from rayline.pyfunc import _requirements

    assert _requirements({"versions": {"rayline": "0.1.0", "tensorflow": "2.21.0", "tf_keras": "2.21.0"}}) == [
        "rayline==0.1.0", f"mlflow=={mlflow.__version__}", "tensorflow==2.21.0", "tf-keras==2.21.0"]


def test_artifact_root_finds_rayline_files_in_both_layouts(tmp_path):
    from rayline.model import artifact_root

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
    from rayline.model import artifact_root

    with pytest.raises(DataError) as info:
        artifact_root(str(tmp_path))
    assert str(info.value) == (f"{tmp_path}: not a rayline model (no rayline.json; no MLmodel; "
                               "allowed: a model registered by rayline, old layout or MLflow pyfunc)")
    (tmp_path / "MLmodel").write_text(yaml.safe_dump({"flavors": {"sklearn": {}}}))
    with pytest.raises(DataError, match="an MLmodel whose artifact 'rayline' is None"):
        artifact_root(str(tmp_path))


def test_input_frame_fills_left_out_imputed_columns_and_refuses_other_nulls():
    from rayline.pyfunc import _input_frame

    fitted = _fitted()
    frame = _input_frame(fitted, pd.DataFrame({"fee": [1.0], "member": [True], "seats": [2], "extra": ["x"]}))
    assert frame.to_dict(orient="records") == [{"plan": None, "tenure": None, "fee": 1.0, "member": True, "seats": 2}]
    assert np.isfinite(fitted.transform(frame)).all()  # imputed
    with pytest.raises(DataError, match=r"^input: missing feature columns \['fee'\]"):
        _input_frame(fitted, pd.DataFrame({"member": [True], "seats": [2]}))
    with pytest.raises(DataError, match=r"^input\[1\]\.member: missing, .* \(got null; allowed: true or false\)$"):
        _input_frame(fitted, pd.DataFrame({"fee": [1.0, 2.0], "member": [True, None], "seats": [2, 3]}))
    strings = pd.DataFrame({"plan": pd.array(["pro", pd.NA], dtype="string"), "fee": [1.0, 2.0], "member": [True, True], "seats": [2, 3]})
    assert _input_frame(fitted, strings)["plan"].tolist() == ["pro", None]  # pandas' NA as the transform's None


def test_pyfunc_columns_are_the_clients():
    import rayline.client
    import rayline.pyfunc

    assert rayline.pyfunc.PREDICTION_COLUMN == rayline.client.PREDICTION_COLUMN == "prediction"
    assert rayline.pyfunc.probability_column(7) == rayline.client.probability_column(7) == "probability_7"


def test_pyfunc_module_imports_no_mlflow():
    """Importing rayline.pyfunc (the column names, the frame helpers) costs no 1.2 s MLflow import."""
    import subprocess
    import sys

    code = "import sys, rayline.pyfunc; print('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
