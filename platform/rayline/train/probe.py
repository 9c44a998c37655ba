"""The probe: a bounded sample of the test split that the training loop predicts with its LIVE
model at every checkpoint, so that what was registered can be checked against what was trained.

- The data stage takes PROBE_ROWS (rayline/data/pipeline.py) raw rows of the test split (of the valid split when
  there is no test split): those with the smallest split hashes (data/split.py), the same rows
  however the data is laid out in files and blocks, and transforms them through Ray Data as it
  does the training data (rayline/data/pipeline.py: PreparedData.probe, .probe_frame).
- The trainer gets them as the unsplit dataset "probe" (rayline/train/run.py). Each backend
  predicts them in its evaluation step, on every rank (a forward pass may be a collective: FSDP,
  MultiWorkerMirroredStrategy), with the framework's own predict of the model object it trains,
  and rank 0's checkpoint `save` writes PROBE_FILE beside rayline_state.json (`write_probe`).
- At registration the runner loads the artifact as serving does (rayline.inference.predictor.Predictor) and
  checks that it reproduces those outputs on the raw probe rows (`check_probe`): a
  training/serving skew check that fails the run, naming the row and the difference.

Bounded on purpose: PROBE_ROWS rows, whatever the size of the data (the data plane streams).
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["PROBE_DATASET", "PROBE_FILE", "probe_features", "write_probe", "read_probe", "check_probe",
           "RTOL", "ATOL"]

PROBE_DATASET = "probe"
PROBE_FILE = "rayline_probe.json"
# Serving recomputes in float32 what training computed in float32 on the same weights, but with
# another batch split and thread count (BLAS sums in another order): ~1e-7 relative apart.
RTOL, ATOL = 1e-4, 1e-6


def probe_features(num_features: int, config: dict | None = None):
    """This worker's copy of the probe rows' model input (float32 (n, d)), or None when the
    trainer was given no probe (a caller of `train` without one). `config`: the loop config, which
    names the splits the driver handed off as arrays (rayline/train/splits.py)."""
    from rayline.train.loop import shard_arrays
    from rayline.train.splits import dataset_shard

    try:
        shard = dataset_shard(config or {}, PROBE_DATASET)
    except KeyError:
        return None
    features, _ = shard_arrays(shard, num_features, np.float64)
    return features


def write_probe(model_dir: str, outputs, precision: str = "fp32") -> None:
    """Write the live model's `outputs` on the probe rows (class probabilities (n, classes), or
    values (n,)) beside the checkpoint's state file; `model_dir` is the checkpoint's `model/`
    (the directory a backend's `save` is given). Nothing for `outputs` None (no probe)."""
    if outputs is None:
        return
    outputs = np.asarray(outputs, dtype=np.float64)
    record = {"rows": int(len(outputs)), "precision": precision, "outputs": outputs.tolist()}
    if outputs.ndim == 2:
        record["class_ids"] = outputs.argmax(axis=1).tolist()
    path = os.path.join(os.path.dirname(os.path.abspath(model_dir)), PROBE_FILE)
    from rayline.files import atomic_write

    atomic_write(path, json.dumps(record))


def read_probe(directory: str) -> dict | None:
    """The probe record in a checkpoint or artifact directory; None when it has none."""
    try:
        with open(os.path.join(directory, PROBE_FILE)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def check_probe(record: dict | None, outputs, what: str) -> str:
    """Compare the outputs the loaded artifact gives on the raw probe rows with the training-time
    `record`; an error message naming the first row that differs, or '' when they agree.
    `what`: the model, for the message."""
    if record is None:
        return ""
    expected = np.asarray(record["outputs"], dtype=np.float64)
    got = np.asarray(outputs, dtype=np.float64).reshape(expected.shape) if np.size(outputs) == expected.size else None
    if got is None:
        return (f"{what}: the registered model gives {np.shape(outputs)} outputs on the {record['rows']} probe rows "
                f"of the test split; the model being trained gave {expected.shape}: training/serving skew")
    if record.get("precision", "fp32") != "fp32":
        return ""  # trained in bf16/fp16 compute, served in fp32: the outputs differ by design
    close = np.isclose(got, expected, rtol=RTOL, atol=ATOL)
    if close.all():
        return ""
    row = int(np.flatnonzero(~close.reshape(len(close), -1).all(axis=1))[0])
    return (f"{what}: the registered model, loaded as serving loads it, does not reproduce the predictions the model "
            f"being trained made on the probe rows of the test split: row {row} gives {_short(got[row])}, training "
            f"gave {_short(expected[row])} (max difference {float(np.max(np.abs(got - expected))):.3g}; allowed: "
            f"rtol {RTOL:g}, atol {ATOL:g}): training/serving skew (preprocessing or weights differ between the two)")


def _short(values) -> str:
    flat = np.atleast_1d(values)
    text = ", ".join(f"{v:.6g}" for v in flat[:6])
    return f"[{text}{', ...' if len(flat) > 6 else ''}]"
