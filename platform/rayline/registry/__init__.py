"""The register stage: MLflow tracking (one run per trial) and the model registry.

Every pipeline run is an MLflow run in experiment `rayline/<name>`; each trial is a child
run with its overrides as params and its per-epoch validation metrics. The winner's
artifact is logged under `model/` of the pipeline run and registered as a new version of
model `<name>`.

This module is the MLflow boundary: every MLflow call runs inside `_guard`, which turns
MlflowException, OSError (disk full, permissions), SQLite "database is locked" and
SQLAlchemy errors into one-line `RegistryError`s naming what was being done, with the
tracking URI redacted (`rayline.redact`). Two processes may open one workspace at once:
a new SQLite store is created under a file lock, the experiment is created if missing in a
way that tolerates a concurrent creator, and a store another writer keeps locked past
MLflow's own wait is reported as such.

One module a job: `store` (opening the store, the MLflow boundary), `tracking` (runs and trials),
`registered` (versions, aliases, tags, deployments), `downloads` (the cache of downloaded
versions). `Registry` is all four for one workspace. Beside them: `pyfunc` (each version as an MLflow
pyfunc model; `pyfunc_model.py` is the code file copied into it) and `lineage` (what a version came
from).
"""

from __future__ import annotations

from rayline.registry.downloads import Downloads
from rayline.registry.registered import (JUDGEMENT_TAG, RETRAIN_TAG, RETRAIN_LOOP_TAG, DEPLOYMENTS_TAG, DEPLOYMENTS_TAG_CHARS, ModelVersion, RegisteredModels,
                                         deployments_of)
from rayline.registry.store import PREFLIGHT_TIMEOUT_S, SQLITE_BUSY_TIMEOUT_S, STORE_LOCK_TIMEOUT_S, Store, sqlite_path
from rayline.registry.tracking import Tracking

__all__ = ["ModelVersion", "Registry", "STORE_LOCK_TIMEOUT_S", "SQLITE_BUSY_TIMEOUT_S", "PREFLIGHT_TIMEOUT_S",
           "DEPLOYMENTS_TAG", "DEPLOYMENTS_TAG_CHARS", "JUDGEMENT_TAG", "RETRAIN_TAG", "RETRAIN_LOOP_TAG", "deployments_of", "sqlite_path"]


class Registry(Store, Tracking, RegisteredModels, Downloads):
    """MLflow tracking + registry for one workspace."""
