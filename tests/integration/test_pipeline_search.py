"""Whole-pipeline search: preprocessing variants and model families in one sweep, the winner served."""

import json

import pytest

from tests.integration.conftest import ROOT, run
from .. import loopback


def _spec():
    from rayline.spec import parse_spec

    return parse_spec({
        "name": "bc-families",
        "data": {"source": {"format": "sklearn", "name": "breast_cancer"}, "label": "target",
                 "split": {"valid": 0.25, "test": 0.15, "seed": 0},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        # No `model:`: the first family stands in until a trial picks its own. The MLP's learning
        # rate is too small to learn in 3 epochs, so boosted trees win: the test knows which
        # family must be registered and served (and covers an xgboost sweep end to end).
        "train": {"workers": 1, "epochs": 3, "batch_size": 64, "metric": "roc_auc",
                  "optimizer": {"name": "adam", "lr": 1.0e-6}},
        "tune": {"search": "grid", "scheduler": "fifo", "max_concurrent": 2, "space": {
            "data.preprocess[0]": {"grid": [{"standard_scale": {"columns": "numeric"}},
                                            {"min_max_scale": {"columns": "numeric"}}]},
            "model": {"grid": [
                {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [16]}},
                {"framework": "xgboost", "kind": "gbdt", "params": {"num_boost_round": 15, "max_depth": 3}},
            ]},
        }},
        "serve": {"route": "/bc-families"},
    })


def test_sweep_over_preprocessing_and_families_serves_the_winner_with_its_own_preprocessing(ray_session, ws, monkeypatch):
    from rayline import load_model
    from rayline.data import pipeline

    fits = []
    real_fit = pipeline.fit_preprocessing

    def counting_fit(train, features, label, steps):
        fits.append([next(iter(s.model_dump(exclude_none=True))) if hasattr(s, "model_dump") else s for s in steps])
        return real_fit(train, features, label, steps)

    monkeypatch.setattr(pipeline, "fit_preprocessing", counting_fit)
    spec = _spec()
    summary = run(spec, ws)

    # 2 preprocessing variants x 2 families = 4 trials; the data stage fitted each variant once.
    assert len(summary.trials) == 4 and summary.data_variants == 2
    assert len(fits) == 2, fits
    seen = {(t.family, json.dumps(t.overrides["data.preprocess[0]"], sort_keys=True)) for t in summary.trials}
    assert len(seen) == 4, seen
    assert {t.family for t in summary.trials} == {"torch/mlp", "xgboost/gbdt"}

    # The winner is the best trial by the metric, and what was registered is its framework and its preprocessing.
    scored = [t for t in summary.trials if t.result is not None]
    best = max(scored, key=lambda t: t.result.metrics["roc_auc"])
    assert summary.valid_metrics["roc_auc"] == best.result.metrics["roc_auc"]
    assert best.family == "xgboost/gbdt", [(t.family, t.result.metrics["roc_auc"]) for t in scored]
    model = load_model(spec.name, summary.version, workspace=str(ws.root))
    framework = best.family.split("/")[0]
    assert model.meta["framework"] == framework
    (want_step,) = best.overrides["data.preprocess[0]"]
    fitted_kinds = [step["kind"] for step in model.preprocessing.to_dict()["steps"]]
    assert fitted_kinds == [want_step], (fitted_kinds, want_step)

    # The leaderboard: the best of each family, best first, in the summary and on the MLflow run.
    assert [row.family for row in summary.leaderboard][0] == best.family
    assert {row.family for row in summary.leaderboard} == {"torch/mlp", "xgboost/gbdt"}
    for row in summary.leaderboard:
        family_scores = [t.result.metrics["roc_auc"] for t in scored if t.family == row.family]
        assert row.value == max(family_scores) and row.trials == len(family_scores)
    from mlflow import MlflowClient

    client = MlflowClient(ws.tracking_uri)
    run_data = client.get_run(summary.run_id).data
    for row in summary.leaderboard:
        assert run_data.metrics[f"best_valid_roc_auc/{row.family}"] == pytest.approx(row.value)
    mv = client.get_model_version(spec.name, summary.version)
    assert mv.tags["framework"] == framework

    # Served: the endpoint answers with the offline model's predictions (its own preprocessing inside).
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer(as_frame=True).frame
    instances = json.loads(data.drop(columns=["target"]).to_json(orient="records"))
    served = loopback.post(f"{summary.endpoint}/predict", json={"instances": instances, "probabilities": True}, timeout=120)
    assert served.status_code == 200, served.text
    offline = model.predict(instances, probabilities=True)
    assert served.json()["predictions"] == offline["predictions"]
    assert served.json()["probabilities"] == offline["probabilities"]
    accuracy = sum(p == t for p, t in zip(served.json()["predictions"], data["target"])) / len(data)
    assert accuracy >= 0.9, accuracy
    meta = loopback.get(f"{summary.endpoint}/metadata", timeout=30).json()
    assert meta["framework"] == "xgboost"
