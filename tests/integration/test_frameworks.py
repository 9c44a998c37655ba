"""TensorFlow and XGBoost behind the same spec: trained on 2 workers, registered, served, identical offline/online."""

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


def test_xgboost_sweep_picks_best_trial_and_serves_it(ray_session, ws):
    from rayline.spec import apply_overrides, load_spec

    spec = apply_overrides(load_spec(ROOT / "pipelines" / "breast-cancer-xgboost.yaml"),
                           {"tune.num_samples": 2, "model.params.num_boost_round": 30})
    summary = run(spec, ws)
    assert len(summary.trials) == 2
    best = max(t.result.metrics["roc_auc"] for t in summary.trials)
    assert summary.valid_metrics["roc_auc"] == best
    winner = next(t for t in summary.trials if t.result.metrics["roc_auc"] == best)
    meta = httpx.get(f"{summary.endpoint}/metadata", timeout=30).json()
    assert meta["metrics"]["roc_auc"] == pytest.approx(best)
    assert set(winner.overrides) == {"model.params.max_depth", "model.params.eta"}
    accuracy = _served_and_identical(summary, ws, spec)
    assert accuracy >= 0.9, accuracy
