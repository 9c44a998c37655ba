"""The model artifact and the offline predictor.

An artifact directory holds everything serving needs and nothing it has to recompute:

    weights/             the backend's saved model (checkpoint `model/` dir)
    preprocessing.json   fitted preprocessing + feature schema + label classes
    rayline.json         name, framework, task, versions, metrics, data fingerprint
    spec.yaml            the resolved spec that produced it

`Predictor` is what `rayline.load_model` returns and what every Serve replica runs, so
offline and online predictions are the same code on the same state.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd
import yaml

from rayline.data.preprocess import FittedPreprocessing
from rayline.errors import DataError

__all__ = ["Predictor", "write_artifact", "WEIGHTS_DIR", "META_FILE", "PREPROCESSING_FILE"]

WEIGHTS_DIR = "weights"
META_FILE = "rayline.json"
PREPROCESSING_FILE = "preprocessing.json"
SPEC_FILE = "spec.yaml"


def write_artifact(dest: str, *, checkpoint_dir: str, preprocessing: FittedPreprocessing, spec, metrics: dict,
                   fingerprint: str, versions: dict) -> str:
    """Assemble an artifact directory at `dest` (written to a temporary name, then renamed)."""
    from rayline import __version__
    from rayline.train.loop import MODEL_DIR

    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".artifact-", dir=parent)
    shutil.copytree(os.path.join(checkpoint_dir, MODEL_DIR), os.path.join(tmp, WEIGHTS_DIR))
    preprocessing.save(os.path.join(tmp, PREPROCESSING_FILE))
    meta = {
        "name": spec.name,
        "framework": spec.model.framework,
        "task": preprocessing.label.task,
        "metric": spec.resolved_metric(preprocessing.label.task),
        "metrics": metrics,
        "data_fingerprint": fingerprint,
        "versions": {"rayline": __version__, **versions},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    with open(os.path.join(tmp, META_FILE), "w") as fh:
        json.dump(meta, fh, indent=1)
    with open(os.path.join(tmp, SPEC_FILE), "w") as fh:
        yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True), fh, sort_keys=False)
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


class Predictor:
    """Raw rows in, predictions in the original label space out."""

    def __init__(self, model_dir: str, version: str | None = None):
        from rayline.train.catalog import load_backend

        self.model_dir = model_dir
        with open(os.path.join(model_dir, META_FILE)) as fh:
            self.meta: dict[str, Any] = json.load(fh)
        self.version = version
        self.preprocessing = FittedPreprocessing.load(os.path.join(model_dir, PREPROCESSING_FILE))
        backend = load_backend(self.meta["framework"])
        for key, value in backend.worker_env().items():
            os.environ.setdefault(key, value)
        self._predict = backend.load(os.path.join(model_dir, WEIGHTS_DIR), self.meta)

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def task(self) -> str:
        return self.meta["task"]

    def predict_frame(self, frame: pd.DataFrame, probabilities: bool = False) -> dict:
        """{'predictions': [...], 'probabilities': [{label: p}, ...] (classification, when asked)}."""
        missing = [f.name for f in self.preprocessing.features if f.name not in frame.columns]
        if missing:
            raise DataError(f"input: missing feature columns {missing}")
        outputs = self._predict(self.preprocessing.transform(frame))
        if self.task == "regression":
            return {"predictions": [float(v) for v in np.asarray(outputs).reshape(-1)]}
        result: dict[str, Any] = {"predictions": _plain_list(self.preprocessing.decode(outputs.argmax(axis=1)))}
        if probabilities:
            labels = [str(c) for c in self.preprocessing.label.classes]
            result["probabilities"] = [dict(zip(labels, map(float, row))) for row in outputs]
        return result

    def evaluate(self, frame: pd.DataFrame) -> dict[str, float]:
        """Metrics of this model on labelled raw rows (the test split)."""
        from rayline.train.metrics import compute_metrics

        outputs = self._predict(self.preprocessing.transform(frame))
        labels = self.preprocessing.encode_labels(frame[self.preprocessing.label.name])
        return compute_metrics(self.task, outputs, labels)

    def predict(self, rows: list[dict] | pd.DataFrame, probabilities: bool = False) -> dict:
        frame = rows if isinstance(rows, pd.DataFrame) else records_to_frame(rows, self.preprocessing)
        return self.predict_frame(frame, probabilities)


def records_to_frame(rows: list[dict], preprocessing: FittedPreprocessing) -> pd.DataFrame:
    """Request rows -> a frame whose column types match training (ints stay ints, nulls are NaN)."""
    columns = {}
    for feature in preprocessing.features:
        values = [row.get(feature.name) for row in rows]
        if feature.kind in ("integer", "number", "boolean") and feature.categories is None:
            columns[feature.name] = pd.Series([np.nan if v is None else v for v in values], dtype="float64")
        else:
            columns[feature.name] = pd.Series(values, dtype=object)
    return pd.DataFrame(columns)


def _plain_list(values) -> list:
    return [v.item() if isinstance(v, np.generic) else v for v in values]
