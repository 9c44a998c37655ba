"""TensorFlow and XGBoost behind the same spec: trained on 2 workers, registered, served, identical offline/online."""

import subprocess
import sys

import httpx
import numpy as np
import pytest

from .conftest import ROOT, run


def _served_and_identical(summary, ws, spec):
    from rayline import load_model
    from rayline.data import prepare_data

    frame = prepare_data(spec).test_frame
    model = load_model(spec.name, summary.version, workspace=str(ws.root))
    rows = frame[[f.name for f in model.preprocessing.features]].to_dict(orient="records")
    online = httpx.post(f"{summary.endpoint}/predict", json={"instances": rows, "probabilities": True}, timeout=120)
    assert online.status_code == 200, online.text
    offline = model.predict(rows, probabilities=True)
    assert online.json()["predictions"] == offline["predictions"]
    assert online.json()["probabilities"] == offline["probabilities"]
    meta = httpx.get(f"{summary.endpoint}/metadata", timeout=30).json()
    assert meta["framework"] == spec.model.framework and len(meta["versions"]) >= 2
    return np.mean(np.array(online.json()["predictions"]) == frame[spec.data.label].to_numpy())


def test_tensorflow_multiworker_end_to_end(ray_session, ws):
    from rayline.spec import apply_overrides, load_spec

    spec = apply_overrides(load_spec(ROOT / "pipelines" / "wine-tensorflow.yaml"), {"train.epochs": 12})
    summary = run(spec, ws)
    assert len(summary.trials[0].result.history) == 12
    accuracy = _served_and_identical(summary, ws, spec)
    assert accuracy >= 0.85, accuracy


@pytest.mark.parametrize("framework, model", [
    ("tensorflow", {"framework": "tensorflow", "kind": "mlp", "params": {"hidden_sizes": [32]}}),
    ("xgboost", {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": 3, "num_boost_round": 20}}),
])
def test_regression_reports_the_torch_metric_names(ray_session, ws, framework, model):
    """Regression works for every framework and reports the same metrics as torch."""
    from rayline import load_model
    from rayline.spec import REGRESSION_METRICS, apply_overrides, load_spec

    spec = apply_overrides(load_spec(ROOT / "pipelines" / "diabetes-torch.yaml"),
                           {"name": f"diabetes-{framework}", "model": model, "train.epochs": 20})
    spec = spec.model_copy(update={"serve": None})
    summary = run(spec, ws)
    assert summary.task == "regression" and summary.metric == "rmse"
    assert set(summary.test_metrics) == set(REGRESSION_METRICS)
    assert set(summary.trials[0].result.history[-1]) == set(REGRESSION_METRICS) | {"epoch", "resumed"}
    # better than predicting the train mean (r2 > 0), and predictions are real numbers
    assert summary.test_metrics["r2"] > 0.1, summary.test_metrics
    model_ = load_model(spec.name, summary.version, workspace=str(ws.root))
    assert model_.meta["framework"] == framework
    # What a Serve replica does: load the model and predict; only its own framework is imported.
    code = (f"import sys; from rayline import load_model; m = load_model({spec.name!r}, {summary.version!r}, workspace={str(ws.root)!r}); "
            "m.predict([{f.name: 0.0 for f in m.preprocessing.features}]); "
            "print(sorted(x for x in ('torch', 'tensorflow', 'xgboost') if x in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == repr([framework])
