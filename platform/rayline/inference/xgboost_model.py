"""An xgboost booster loaded for prediction (`inplace_predict` on float32 rows)."""

from __future__ import annotations

import os

import numpy as np

from rayline.inference.arch import read_arch

__all__ = ["MODEL_FILE", "outputs", "load"]

MODEL_FILE = "model.ubj"


def outputs(raw: np.ndarray, task: str, num_outputs: int) -> np.ndarray:
    """Booster predictions as rayline outputs: probabilities (n, classes) or values (n,)."""
    raw = np.asarray(raw)
    if task == "regression":
        return raw.reshape(-1)
    if num_outputs == 2:
        p = raw.reshape(-1)
        return np.stack([1.0 - p, p], axis=1)
    return raw.reshape(len(raw), num_outputs)


def load(model_dir: str, meta: dict):
    import xgboost as xgb

    arch = read_arch(model_dir)
    booster = xgb.Booster(model_file=os.path.join(model_dir, MODEL_FILE))
    task = meta["task"]
    num_outputs = arch["num_outputs"]
    num_features = arch["num_features"]

    def predict(features: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(features, dtype=np.float32).reshape(len(features), num_features)
        if not len(x):
            return outputs(np.zeros((0, num_outputs if num_outputs > 2 else 1)), task, num_outputs)
        return outputs(booster.inplace_predict(x), task, num_outputs)

    return predict
