"""What every section of the spec shares: the strict base model (unknown keys refused), the metric
names and whether each is maximised, the bundled sklearn datasets.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SKLEARN_DATASETS", "CLASSIFICATION_METRICS", "REGRESSION_METRICS", "metric_mode", "Strict"]

SKLEARN_DATASETS = ("iris", "digits", "wine", "breast_cancer", "diabetes")


CLASSIFICATION_METRICS = ("loss", "accuracy", "f1", "precision", "recall", "roc_auc", "log_loss")


REGRESSION_METRICS = ("loss", "rmse", "mae", "r2")


_MAX_METRICS = {"accuracy", "f1", "precision", "recall", "roc_auc", "r2"}


def metric_mode(metric: str) -> str:
    """'max' for scores, 'min' for losses and errors."""
    return "max" if metric in _MAX_METRICS else "min"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
