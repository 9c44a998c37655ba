"""Validation and test metrics with sklearn-like short names; the mode follows from the name."""

from __future__ import annotations

import numpy as np

__all__ = ["compute_metrics", "softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def compute_metrics(task: str, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Metrics of predictions `outputs` (class probabilities, or values) against `labels`.

    Classification: loss (= log_loss), accuracy, and macro-averaged f1, precision, recall;
    roc_auc when every class appears in `labels`. Regression: loss (= MSE), rmse, mae, r2.
    """
    from sklearn import metrics as skm

    if task == "regression":
        values = np.asarray(outputs, dtype=np.float64).reshape(-1)
        truth = np.asarray(labels, dtype=np.float64).reshape(-1)
        mse = float(np.mean((values - truth) ** 2))
        return {
            "loss": mse,
            "rmse": float(np.sqrt(mse)),
            "mae": float(np.mean(np.abs(values - truth))),
            "r2": float(skm.r2_score(truth, values)) if len(truth) > 1 else 0.0,
        }
    probs = np.clip(np.asarray(outputs, dtype=np.float64), 1e-12, 1.0)
    probs = probs / probs.sum(axis=1, keepdims=True)
    truth = np.asarray(labels, dtype=np.int64).reshape(-1)
    classes = np.arange(probs.shape[1])
    predicted = probs.argmax(axis=1)
    log_loss = float(skm.log_loss(truth, probs, labels=classes))
    out = {
        "loss": log_loss,
        "log_loss": log_loss,
        "accuracy": float(np.mean(predicted == truth)),
        "f1": float(skm.f1_score(truth, predicted, labels=classes, average="macro", zero_division=0)),
        "precision": float(skm.precision_score(truth, predicted, labels=classes, average="macro", zero_division=0)),
        "recall": float(skm.recall_score(truth, predicted, labels=classes, average="macro", zero_division=0)),
    }
    if len(np.unique(truth)) == probs.shape[1]:
        if probs.shape[1] == 2:
            out["roc_auc"] = float(skm.roc_auc_score(truth, probs[:, 1]))
        else:
            out["roc_auc"] = float(skm.roc_auc_score(truth, probs, multi_class="ovr", labels=classes))
    return out
