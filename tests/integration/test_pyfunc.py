"""Every registered version is a real MLflow pyfunc model: plain MLflow loads and serves it and
answers exactly what the live endpoint answers; versions registered before (the old artifact
layout) still load in rayline and in Serve replicas."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from .. import loopback
from .conftest import deploy_registered, run, serve_digits

# Queries the session's served digits endpoint, kept up from module to module (conftest.DIGITS_ENDPOINT).
pytestmark = pytest.mark.digits_endpoint

N_ROWS = 40


@pytest.fixture(scope="module")
def served_digits(digits, ws):
    return serve_digits(digits, ws)


@pytest.fixture(scope="module")
def digit_rows():
    """Real digits rows (sklearn's, as the pipeline reads them), pixels as JSON numbers."""
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame.drop(columns=["target"])
    return frame.sample(N_ROWS, random_state=1).astype(float).reset_index(drop=True)


@pytest.fixture
def mlflow_store(ws, monkeypatch):
    """Plain MLflow pointed at the test workspace's store, as a user would: MLFLOW_TRACKING_URI."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", ws.tracking_uri)
    return ws.tracking_uri


def _endpoint(url, rows, probabilities=True):
    response = loopback.post(f"{url}/predict", json={"instances": rows, "probabilities": probabilities}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _as_endpoint(frame: pd.DataFrame) -> dict:
    """The pyfunc output DataFrame in the endpoint's shape: predictions, probabilities {label: p}."""
    labels = [c[len("probability_"):] for c in frame.columns if c.startswith("probability_")]
    out = {"predictions": frame["prediction"].tolist()}
    if labels:
        out["probabilities"] = [dict(zip(labels, row)) for row in frame[[f"probability_{c}" for c in labels]].to_numpy().tolist()]
    return out


def _records(frame: pd.DataFrame) -> list[dict]:
    """DataFrame rows as JSON request rows: NaN and None as null."""
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def test_registered_version_is_a_models_from_code_pyfunc_with_the_feature_signature(digits, ws):
    from mlflow.models import Model

    from rayline.registry import Registry

    registry = Registry(ws)
    local = registry.download(registry.resolve("digits", digits.version))
    model = Model.load(os.path.join(local, "MLmodel"))
    flavor = model.flavors["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"  # models-from-code: nothing pickled
    assert not any(name.endswith(".pkl") for _, _, files in os.walk(local) for name in files)
    assert flavor["artifacts"]["rayline"]["path"] == "artifacts/rayline"
    assert model.run_id == digits.run_id
    inputs = model.signature.inputs.to_dict()
    assert len(inputs) == 64 and {(c["type"], c["required"]) for c in inputs} == {("double", True)}
    assert [c["name"] for c in inputs][:2] == ["pixel_0_0", "pixel_0_1"]
    assert model.signature.outputs.to_dict() == (
        [{"type": "long", "name": "prediction", "required": True}]
        + [{"type": "double", "name": f"probability_{i}", "required": True} for i in range(10)])
    example = model.load_input_example(local)
    assert list(example.columns) == [c["name"] for c in inputs] and len(example) == 3  # real rows of the test split
    requirements = open(os.path.join(local, "requirements.txt")).read().split()
    assert "rayline==0.1.0" in requirements and any(r.startswith("torch==") for r in requirements)


def test_mlflow_pyfunc_predictions_equal_the_endpoint(digits, served_digits, digit_rows, mlflow_store):
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(f"models:/digits/{digits.version}")
    got = model.predict(digit_rows)
    assert list(got.columns) == ["prediction"] + [f"probability_{i}" for i in range(10)]
    online = _endpoint(served_digits, _records(digit_rows))
    assert _as_endpoint(got) == {"predictions": online["predictions"], "probabilities": online["probabilities"]}
    # Columns the signature does not name are dropped by MLflow's schema enforcement.
    again = model.predict(digit_rows.assign(note="x"))
    pd.testing.assert_frame_equal(again, got)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (the mlflow CLI and its uvicorn), SIGKILL what outlives 15 s."""
    try:
        group = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        group = []
    with_signal = lambda sig: os.killpg(proc.pid, sig)  # noqa: E731
    try:
        with_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with_signal(signal.SIGKILL)
        proc.wait(5)
    _, alive = psutil.wait_procs(group, timeout=15)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)


def _alive(procs) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


# ------------------------------------------------------------------ a model with imputed features


def _gappy_frame(n=240, seed=3):
    """Churn rows with genuine integer columns: `tenure_months` never missing, `support_calls`
    with gaps (written as integers and empty cells, as an integer column with gaps is in a CSV)."""
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "pro"], n).astype(object)
    tenure_months = rng.integers(1, 60, n)
    support_calls = rng.integers(0, 8, n).astype(float)
    fee = rng.normal(50, 15, n).round(2)
    score = (plan == "basic") * 1.5 - tenure_months / 20 + (fee - 50) / 15 + support_calls / 4 + rng.normal(0, 0.3, n)
    support_calls[rng.random(n) < 0.1] = np.nan
    plan[rng.random(n) < 0.1] = None
    return pd.DataFrame({"plan": plan, "tenure_months": tenure_months, "support_calls": pd.array(support_calls, dtype="Int64"),
                         "fee": fee, "churn": np.where(score > 0, "yes", "no")})


@pytest.fixture(scope="module")
def gappy(ray_session, ws, tmp_path_factory):
    """A small xgboost model, served, trained on a CSV whose `tenure_months` is an integer column,
    `support_calls` an integer column with gaps (imputed) and `plan` a string column with gaps (imputed)."""
    from rayline.spec import load_spec

    folder = tmp_path_factory.mktemp("gappy")
    _gappy_frame().to_csv(folder / "gappy.csv", index=False)
    (folder / "gappy.yaml").write_text(yaml.safe_dump({
        "name": "pyfuncgaps",
        "data": {"source": {"format": "csv", "path": "gappy.csv"}, "label": "churn",
                 "preprocess": [{"impute": {"columns": ["support_calls"], "strategy": "median"}},
                                {"impute": {"columns": ["plan"], "strategy": "most_frequent"}},
                                {"one_hot": {"columns": ["plan"]}}]},
        "model": {"framework": "xgboost", "kind": "gbdt"},
        "train": {"workers": 1, "epochs": 5},
        "serve": {"route": "/pyfuncgaps"},
    }))
    summary = run(load_spec(folder / "gappy.yaml"), ws, spec_path=str(folder / "gappy.yaml"))
    summary.csv = folder / "gappy.csv"
    return summary


def _same_as_endpoint(got: pd.DataFrame, url: str, rows: list[dict], version: str) -> None:
    online = _endpoint(url, rows)
    assert online["version"] == version  # the same registered version answers on both sides
    assert _as_endpoint(got) == {"predictions": online["predictions"], "probabilities": online["probabilities"]}


def test_pyfunc_predicts_on_the_training_csv_as_pandas_reads_it(gappy, mlflow_store):
    """The signature follows the training columns' types: pd.read_csv of the training file itself
    (int64 `tenure_months`, float64 `support_calls` with gaps) and JSON records of its rows predict
    as they are, and answer what the endpoint answers for the same rows."""
    import json

    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(f"models:/pyfuncgaps/{gappy.version}")
    frame = pd.read_csv(gappy.csv)  # the label column too: MLflow drops what the signature does not name
    assert (frame["tenure_months"].dtype, frame["support_calls"].dtype) == (np.int64, np.float64)
    assert frame["support_calls"].isna().any() and frame["plan"].isna().any()
    got = model.predict(frame)  # was "Can not safely convert int64 to float64" for tenure_months
    assert len(got) == len(frame)
    signature = {c["name"]: (c["type"], c["required"]) for c in model.metadata.signature.inputs.to_dict()}
    assert signature == {"plan": ("string", False), "tenure_months": ("long", True), "support_calls": ("double", False),
                         "fee": ("double", True)}
    rows = _records(frame.drop(columns=["churn"]))
    _same_as_endpoint(got, gappy.endpoint, rows, gappy.version)
    records = json.loads(frame.to_json(orient="records"))  # JSON integers and nulls, as a client sends them
    assert isinstance(records[0]["tenure_months"], int)
    pd.testing.assert_frame_equal(model.predict(pd.DataFrame(records)), got)


def test_pyfunc_takes_nulls_where_features_are_imputed_as_the_endpoint_does(gappy, mlflow_store):
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    model = mlflow.pyfunc.load_model(f"models:/pyfuncgaps/{gappy.version}")
    rows = [{"plan": "pro", "tenure_months": 30, "support_calls": 2.0, "fee": 45.5},
            {"plan": None, "tenure_months": 4, "support_calls": None, "fee": 61.0},
            {"plan": "basic", "tenure_months": 12, "support_calls": None, "fee": 20.0},
            {"plan": "enterprise", "tenure_months": 3, "support_calls": 7.0, "fee": 50.0},
            {"plan": None, "tenure_months": 55, "support_calls": 0.0, "fee": 35.25}]
    _same_as_endpoint(model.predict(pd.DataFrame(rows)), gappy.endpoint, rows, gappy.version)
    # Imputed columns may be left out altogether (the endpoint takes rows without them too).
    rows = [{"tenure_months": 30, "fee": 45.5}, {"tenure_months": 2, "fee": 61.0}]
    _same_as_endpoint(model.predict(pd.DataFrame(rows)), gappy.endpoint, rows, gappy.version)
    # A null where nothing imputes is refused, naming the row and feature.
    with pytest.raises(MlflowException, match=r"input\[1\]\.fee: missing, and no impute step fills this feature"):
        model.predict(pd.DataFrame([rows[0], {**rows[0], "fee": None}]))
    assert Model.load(f"models:/pyfuncgaps/{gappy.version}").metadata["rayline"]["framework"] == "xgboost"


def test_mlflow_models_serve_answers_csv_and_json_like_the_endpoint(gappy, mlflow_store, tmp_path):
    """`mlflow models serve` (a real subprocess, --env-manager local) of the registered version
    answers the training file's rows sent as text/csv, dataframe_records (JSON integers and nulls)
    and dataframe_split with the endpoint's predictions, and a row it cannot take with a 400."""
    from rayline.ports import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "mlflow-serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/pyfuncgaps/{gappy.version}",
                             "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ))
    group = []
    try:
        text = gappy.csv.read_text()
        frame = pd.read_csv(gappy.csv)
        rows = _records(frame.drop(columns=["churn"]))
        online = _endpoint(gappy.endpoint, rows)
        assert online["version"] == gappy.version
        expected = {"predictions": online["predictions"], "probabilities": online["probabilities"]}
        # JSON as a client writes the file's rows: integers as integers (support_calls too, where present), nulls as null
        records = [{k: int(v) if isinstance(v, float) and v.is_integer() and k != "fee" else v for k, v in row.items()} for row in rows]
        assert isinstance(records[0]["tenure_months"], int) and any(r["support_calls"] is None for r in records)
        split = json.loads(frame.to_json(orient="split", index=False))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "mlflow-serve.log").read_text()[-3000:]
            try:
                if loopback.get(f"{url}/ping", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError("mlflow models serve did not answer /ping within 90 s")
        group = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        bodies = [("text/csv", text.encode()), ("application/json", json.dumps({"dataframe_records": records}).encode()),
                  ("application/json", json.dumps({"dataframe_split": split}).encode())]
        for content_type, body in bodies:
            response = loopback.post(f"{url}/invocations", content=body, headers={"Content-Type": content_type}, timeout=60)
            assert response.status_code == 200, (content_type, body[:80], response.text[:2000])
            got = pd.DataFrame(response.json()["predictions"])
            assert _as_endpoint(got) == expected, (content_type, body[:80])
        # A row the model cannot take: 400 with rayline's one-line reason, as the endpoint's 422 names it.
        bad = loopback.post(f"{url}/invocations", json={"dataframe_records": [{**records[0], "fee": None}]}, timeout=60)
        assert bad.status_code == 400 and "input[0].fee: missing" in bad.json()["message"], bad.text
    finally:
        _stop_group(proc)
        log.close()
    assert _alive(group) == [], [p.cmdline() for p in _alive(group)]


# ------------------------------------------------------------------ versions registered before pyfunc


@pytest.fixture(scope="module")
def old_layout(digits, ws):
    """The digits model registered the way rayline did before pyfunc models: its files (weights/,
    preprocessing.json, rayline.json, spec.yaml) at the root of `model/`, no MLmodel."""
    from rayline.inference.predictor import artifact_root
    from rayline.registry import Registry

    registry = Registry(ws)
    files = artifact_root(registry.download(registry.resolve("digits", digits.version)))
    assert {"preprocessing.json", "rayline.json", "spec.yaml", "weights"} <= set(os.listdir(files))
    client, name = registry.client, "pyfunc-old-layout"
    run = client.create_run(registry._experiment_id("digits"), run_name="old-layout")
    client.log_artifacts(run.info.run_id, files, artifact_path="model")  # the pre-pyfunc Registry.register
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    client.set_terminated(run.info.run_id)
    return SimpleNamespace(name=name, version=str(mv.version))


def test_old_layout_versions_still_load_in_rayline_and_serve(old_layout, served_digits, digit_rows, ws):
    from rayline import load_model
    from rayline.registry import Registry

    registry = Registry(ws)
    local = registry.download(registry.resolve(old_layout.name, old_layout.version))
    assert os.path.isfile(os.path.join(local, "rayline.json")) and not os.path.exists(os.path.join(local, "MLmodel"))
    rows = _records(digit_rows)
    online = _endpoint(served_digits, rows)
    offline = load_model(old_layout.name, old_layout.version, workspace=str(ws.root)).predict(rows, probabilities=True)
    assert offline == {"predictions": online["predictions"], "probabilities": online["probabilities"]}
    url = deploy_registered("pyfuncold", old_layout, ws)  # a Serve replica: registry.download + Predictor
    replica = _endpoint(url, rows)
    assert replica["version"] == old_layout.version
    assert {k: replica[k] for k in ("predictions", "probabilities")} == offline
