"""Assemble a model artifact (the layout `rayline.inference.predictor` reads) from a training checkpoint.

The registration side of the artifact: it reads the training checkpoint's layout
(`rayline.train.loop.MODEL_DIR`, the probe file), which the serving side never needs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime, timezone

import yaml

from rayline.data.preprocess import FittedPreprocessing
from rayline.inference.predictor import META_FILE, PREPROCESSING_FILE, SPEC_FILE, WEIGHTS_DIR

__all__ = ["write_artifact"]


def write_artifact(dest: str, *, checkpoint_dir: str, preprocessing: FittedPreprocessing, spec, metrics: dict,
                   fingerprint: str, versions: dict, statistics=None) -> str:
    """Assemble an artifact directory at `dest` (written to a temporary name, then renamed)."""
    from rayline.version import __version__
    from rayline.train.loop import MODEL_DIR

    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".artifact-", dir=parent)
    shutil.copytree(os.path.join(checkpoint_dir, MODEL_DIR), os.path.join(tmp, WEIGHTS_DIR))
    from rayline.train.probe import PROBE_FILE

    if os.path.isfile(os.path.join(checkpoint_dir, PROBE_FILE)):  # the training-time probe (rayline/train/probe.py)
        shutil.copyfile(os.path.join(checkpoint_dir, PROBE_FILE), os.path.join(tmp, PROBE_FILE))
    preprocessing.save(os.path.join(tmp, PREPROCESSING_FILE))
    if statistics is not None:  # the train split's features summarised (rayline/monitoring/statistics.py)
        from rayline.monitoring.statistics import STATISTICS_FILE

        statistics.save(os.path.join(tmp, STATISTICS_FILE))
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
