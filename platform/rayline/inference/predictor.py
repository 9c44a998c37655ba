"""The model artifact and the offline predictor.

An artifact directory holds everything serving needs and nothing it has to recompute:

    weights/             the backend's saved model (checkpoint `model/` dir)
    preprocessing.json   fitted preprocessing + feature schema + label classes
    rayline.json         name, framework, task, versions, metrics, data fingerprint
    spec.yaml            the resolved spec that produced it
    rayline_probe.json   the outputs the model being trained gave on the probe rows of the test
                         split (rayline/train/probe.py); absent in checkpoints older than it

`Predictor` is what `rayline.load_model` returns and what every Serve replica runs, so
offline and online predictions are the same code on the same state. It loads the model through
`rayline.inference`, never through training code; `rayline.pipeline.artifact` writes the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd
import yaml

from rayline.data.preprocess import FittedPreprocessing
from rayline.errors import DataError, PredictionError

__all__ = ["Predictor", "artifact_root", "version_spec", "WEIGHTS_DIR", "META_FILE", "PREPROCESSING_FILE",
           "PYFUNC_ARTIFACT"]

WEIGHTS_DIR = "weights"
META_FILE = "rayline.json"
PREPROCESSING_FILE = "preprocessing.json"
SPEC_FILE = "spec.yaml"
# A registered version is an MLflow pyfunc model (rayline/registry/pyfunc.py): its MLmodel names these
# files as the pyfunc artifact `rayline`, which MLflow copies under `artifacts/`.
PYFUNC_ARTIFACT = "rayline"


def version_spec(registry, mv):
    """The PipelineSpec a registered version was trained with (its artifact's spec.yaml)."""
    from rayline.spec import PipelineSpec

    root = artifact_root(registry.download(mv))
    with open(os.path.join(root, SPEC_FILE)) as fh:
        return PipelineSpec.model_validate(yaml.safe_load(fh))


def artifact_root(path: str) -> str:
    """The directory holding rayline's files (rayline.json, weights/, ...) in a model of either layout.

    Versions registered before rayline wrote MLflow pyfunc models hold them at the root of the
    logged `model/` (the layout of write_artifact); a pyfunc model holds them where its
    MLmodel's python_function flavor says (`artifacts/<dir>`). Every reader (load_model,
    Serve replicas, batch scoring) goes through Predictor, which calls this.
    """
    if os.path.isfile(os.path.join(path, META_FILE)):
        return path
    mlmodel = os.path.join(path, "MLmodel")
    relative = None
    if os.path.isfile(mlmodel):
        with open(mlmodel) as fh:
            conf = yaml.safe_load(fh) or {}
        pyfunc = (conf.get("flavors") or {}).get("python_function") or {}
        relative = ((pyfunc.get("artifacts") or {}).get(PYFUNC_ARTIFACT) or {}).get("path")
        if relative and os.path.isfile(os.path.join(path, relative, META_FILE)):
            return os.path.join(path, relative)
    found = f"an MLmodel whose artifact {PYFUNC_ARTIFACT!r} is {relative!r}" if os.path.isfile(mlmodel) else "no MLmodel"
    raise DataError(f"{path}: not a rayline model (no {META_FILE}; {found}; "
                    f"allowed: a model registered by rayline, old layout or MLflow pyfunc)")


class Predictor:
    """Raw rows in, predictions in the original label space out."""

    def __init__(self, model_dir: str, version: str | None = None):
        from rayline.inference import framework_env, load_predict

        self.model_dir = model_dir  # as given: the downloaded version (either layout)
        files = artifact_root(model_dir)
        with open(os.path.join(files, META_FILE)) as fh:
            self.meta: dict[str, Any] = json.load(fh)
        self.version = version
        self.preprocessing = FittedPreprocessing.load(os.path.join(files, PREPROCESSING_FILE))
        from rayline.monitoring.statistics import STATISTICS_FILE, TrainingStatistics

        statistics = os.path.join(files, STATISTICS_FILE)
        # The train split's features summarised, for drift checks; None for versions made before them.
        self.statistics = TrainingStatistics.load(statistics) if os.path.isfile(statistics) else None
        for key, value in framework_env(self.meta["framework"]).items():
            os.environ.setdefault(key, value)
        self._predict = load_predict(self.meta["framework"], os.path.join(files, WEIGHTS_DIR), self.meta)
        classes = self.preprocessing.label.classes or []
        self._labels = _plain_list(classes)  # class id -> original label, as JSON scalars
        self._label_names = [str(c) for c in classes]

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def task(self) -> str:
        return self.meta["task"]

    # The request path: rows -> encode (compiled preprocessing, numpy) -> infer -> respond.
    # Each step is public so the Serve app can batch requests between them.

    def encode(self, rows: list[dict]) -> np.ndarray:
        """Raw rows (feature name -> JSON value) -> float32 model input (n, d).

        Raises DataError naming the feature for a value the model cannot take: an unseen
        category under `handle_unknown: error`, a missing value no impute step fills, or a
        number that overflows the model's float32 input after preprocessing.
        """
        return self.preprocessing.encode_records(rows)

    def encode_matrix(self, values: np.ndarray, value=None) -> np.ndarray:
        """As `encode`, for request values already in one float64 matrix (n, features) in feature
        order, each a finite number within float32's range (the V2 route's numeric tensors);
        only for models whose features are all numbers (`preprocessing.compiled.takes_matrix`).
        `value(row, feature)`: the value sent, for error messages. Works on `values` in place."""
        return self.preprocessing.encode_matrix(values, value)

    def infer(self, features: np.ndarray) -> np.ndarray:
        """Model outputs for a float32 matrix: probabilities (n, classes) or values (n,).

        Raises PredictionError when the model produced a non-finite value, so no NaN or
        infinity ever reaches a response."""
        outputs = np.asarray(self._predict(features))
        if outputs.size and not np.isfinite(outputs).all():
            bad = int(np.flatnonzero(~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=1))[0])
            raise PredictionError(
                f"instances[{bad}]: the model produced a non-finite output for this row "
                "(its inputs are far outside the training data)"
            )
        return outputs

    def respond(self, outputs: np.ndarray, probabilities: bool = False) -> dict:
        """{'predictions': [...], 'probabilities': [{label: p}, ...] (classification, when asked)}."""
        if self.task == "regression":
            return {"predictions": np.asarray(outputs, dtype=np.float64).reshape(-1).tolist()}
        result: dict[str, Any] = {"predictions": [self._labels[i] for i in outputs.argmax(axis=1).tolist()]}
        if probabilities:
            names = self._label_names
            result["probabilities"] = [dict(zip(names, row)) for row in np.asarray(outputs, dtype=np.float64).tolist()]
        return result

    def predict(self, rows: list[dict] | pd.DataFrame, probabilities: bool = False) -> dict:
        """Predictions for raw rows (a list of dicts or a DataFrame), exactly as the endpoint answers."""
        features = self.preprocessing.transform(rows) if isinstance(rows, pd.DataFrame) else self.encode(rows)
        return self.respond(self.infer(features), probabilities)

    def predict_frame(self, frame: pd.DataFrame, probabilities: bool = False) -> dict:
        missing = [f.name for f in self.preprocessing.features if f.name not in frame.columns]
        if missing:
            raise DataError(f"input: missing feature columns {missing}")
        return self.predict(frame, probabilities)

    def evaluate(self, frame: pd.DataFrame) -> dict[str, float]:
        """Metrics of this model on labelled raw rows in one frame (rayline.evaluation.offline
        computes them for a test split of any size, spread over the cluster)."""
        return self.metric_partials(frame).result()

    def metric_partials(self, frame: pd.DataFrame):
        """The mergeable statistics of this model's metrics on labelled raw rows (MetricPartials)."""
        from rayline.evaluation.metrics import MetricPartials

        if not len(frame):  # a block without rows of the split
            return MetricPartials(self.task, len(self.preprocessing.label.classes or []))
        outputs = self._predict(self.preprocessing.transform(frame))
        labels = self.preprocessing.encode_labels(frame[self.preprocessing.label.name])
        return MetricPartials.of(self.task, outputs, labels)


def _plain_list(values) -> list:
    return [v.item() if isinstance(v, np.generic) else v for v in values]
