"""Registry.register logs a pyfunc model (no Ray: a real SQLite MLflow store in tmp), and a version
that cannot be packaged is a one-line RegistryError that leaves nothing registered or logged."""

import json

import pandas as pd
import pytest

from rayline.data.preprocess import FeatureInfo, LabelInfo, fit_preprocessing
from rayline.errors import RegistryError


def _artifact(folder):
    """A rayline artifact's files (rayline.pipeline.artifact.write_artifact's layout); the weights are not read here."""
    frame = pd.DataFrame({"x": [1.0, None, 3.0], "c": ["a", "b", "a"], "n": [4, 5, 6]})
    steps = _steps([{"impute": {"columns": ["x"], "strategy": "mean"}}, {"one_hot": {"columns": ["c"]}}])
    fitted = fit_preprocessing(frame, [FeatureInfo("x", "number"), FeatureInfo("c", "string"), FeatureInfo("n", "integer")],
                               LabelInfo("y", "classification", ["no", "yes"]), steps)
    (folder / "weights").mkdir(parents=True)
    fitted.save(folder / "preprocessing.json")
    (folder / "rayline.json").write_text(json.dumps({"name": "tiny", "framework": "xgboost", "task": "classification",
                                                     "metric": "accuracy", "versions": {"rayline": "0.1.0", "xgboost": "3.2.0"}}))
    (folder / "spec.yaml").write_text("name: tiny\n")
    return folder


def _steps(raw):
    from rayline.spec.pipeline_spec import PipelineSpec

    return PipelineSpec.model_validate({"name": "x", "data": {"source": {"format": "csv", "path": "x.csv"}, "label": "y",
                                                               "preprocess": raw},
                                        "model": {"framework": "xgboost", "kind": "gbdt"}}).data.preprocess


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """One store for the module: creating a SQLite store runs ~50 migrations (1-3 s, more under load)."""
    from rayline.registry import Registry
    from rayline.workspace import workspace

    return Registry(workspace(tmp_path_factory.mktemp("pyfunc-register") / "ws").ensure())


def _run(registry):
    return registry.client.create_run(registry._experiment_id("tiny")).info.run_id


def test_register_logs_an_mlflow_pyfunc_model_with_rayline_files_under_artifacts(registry, tmp_path):
    from mlflow.models import Model
    from mlflow.models.utils import _enforce_schema

    from rayline.inference.predictor import artifact_root

    run_id = _run(registry)
    example = pd.DataFrame({"y": ["no", "yes"], "x": [None, 2.0], "c": ["b", "a"], "n": [7, 12]})  # as the test split reads
    mv = registry.register(run_id, "tiny", str(_artifact(tmp_path / "model")), {"valid_accuracy": 1.0}, {}, input_example=example)
    local = registry.download(mv)
    model = Model.load(f"{local}/MLmodel")
    assert model.run_id == run_id and model.metadata["rayline"] == {"name": "tiny", "framework": "xgboost",
                                                                       "task": "classification", "metric": "accuracy"}
    assert [(c["name"], c["type"], c["required"]) for c in model.signature.inputs.to_dict()] == [
        ("x", "double", False), ("c", "string", True), ("n", "long", True)]  # the integer column as long
    example = model.load_input_example(local)
    assert example["x"].isna().tolist() == [True, False] and example["c"].tolist() == ["b", "a"]
    assert example["n"].tolist() == [7, 12] and example["n"].dtype == "int64"
    _enforce_schema(example, model.signature.inputs)  # the logged example passes the logged signature
    assert artifact_root(local) == f"{local}/artifacts/rayline"
    assert registry.client.get_model_version("tiny", mv.version).tags["rayline.pyfunc"] == "true"
    assert list(registry.ws.tmp_dir.iterdir()) == []  # the staging copy is gone


def test_a_version_that_cannot_be_packaged_is_one_line_and_registers_nothing(registry, tmp_path):
    artifact = _artifact(tmp_path / "model")
    (artifact / "preprocessing.json").write_text('{"features": [')  # cut off: a corrupt artifact
    run_id = _run(registry)
    with pytest.raises(RegistryError) as info:
        registry.register(run_id, "broken", str(artifact), {"valid_accuracy": 1.0}, {})
    message = str(info.value)
    assert message.startswith("MLflow (sqlite:///") and "cannot register model 'broken': Expecting value" in message
    assert "\n" not in message
    assert registry.client.list_artifacts(run_id) == []  # nothing half-logged
    assert registry.client.search_model_versions("name = 'broken'") == []
