"""train.precision and train.grad_accumulation through real Ray Train runs (2 DDP / MWMS workers).

The exact properties (the update of N micro-batches equals one batch N times larger, one
all-reduce per step) are in tests/unit/test_torch_steps.py with real gloo DDP; here the whole
pipeline trains with them, a sweep tunes precision, and the registered model, trained in
bf16, loads and predicts in fp32 as served. (tensorflow in bf16 with accumulation: the
tensorflow case of test_frameworks.py's regression test.)
"""

from __future__ import annotations

import numpy as np

from tests.integration.conftest import run

CANCER = {"format": "sklearn", "name": "breast_cancer"}


def _raw(name: str, framework: str, **train) -> dict:
    return {
        "name": name,
        "data": {"source": CANCER, "label": "target", "split": {"valid": 0.2, "test": 0.2, "seed": 0},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": framework, "kind": "mlp", "params": {"hidden_sizes": [32]}},
        "train": {"workers": 2, "epochs": 5, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.01}, **train},
    }


def _predicts_like_its_metric(summary, ws) -> None:
    """The registered model loads (fp32, as serving does) and its test accuracy is the recorded one."""
    from sklearn.datasets import load_breast_cancer

    from rayline import load_model

    model = load_model(summary.name, summary.version, workspace=str(ws.root))
    frame = load_breast_cancer(as_frame=True).frame
    rows = frame.drop(columns=["target"]).to_dict(orient="records")
    got = model.predict(rows)["predictions"]
    assert np.mean(np.asarray(got) == frame["target"].to_numpy()) >= 0.9


def test_torch_sweep_over_precision_bf16_trains_as_well_as_fp32_with_accumulation_and_powersgd(ray_session, ws):
    from rayline.spec import parse_spec

    raw = _raw("tech-torch", "torch", grad_accumulation=2, grad_compression={"powersgd": {"rank": 2, "start_iter": 4}})
    raw["tune"] = {"search": "grid", "scheduler": "fifo", "max_concurrent": 1,
                   "space": {"train.precision": {"grid": ["fp32", "bf16"]}}}
    summary = run(parse_spec(raw), ws, deploy=False)
    start = next(detail for stage, event, detail in summary.events if stage == "train" and event == "start")
    assert "effective batch 64 (32 x 2 micro-batches), powersgd rank 2 gradient compression" in start, start
    accuracy = {t.overrides["train.precision"]: t.result.metrics["accuracy"] for t in summary.trials}
    assert set(accuracy) == {"fp32", "bf16"} and min(accuracy.values()) >= 0.9, accuracy
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.05, accuracy  # the stated tolerance
    _predicts_like_its_metric(summary, ws)
