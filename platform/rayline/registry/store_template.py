"""A new workspace's SQLite tracking store, copied from an empty one built once per machine and MLflow version.

MLflow creates a new SQLite store by running its ~50 Alembic migrations, one after another: 3.6 s of
a 35-s `rayline run` of iris on the 2-core box, 5.3 s with MLflow's import (2026-11-29), paid by
every first run in a new workspace, and by every test that makes one. The schema those migrations
leave is the same for every store of one MLflow version, so the first store made on a machine is
kept, empty, in the user cache (`<user cache>/mlflow-stores/empty-<MLflow version>.db`) and every
later new store starts as a copy of it: MLflow opens a store whose tables all exist without
migrating it, and checks that its Alembic revision is its own.

What the migrations put in rows is made this store's own after the copy: the Default experiment
(id 0) gets the artifact location and creation time MLflow would have given it here (its location
is relative to the working directory of the process that made the store). Anything unexpected
(no cache directory, an MLflow that lays the store out differently) falls back to MLflow's own
creation: this module only ever saves time.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import time
from pathlib import Path

from rayline.files import atomic_path

__all__ = ["seed_new_store", "template_path"]

_log = logging.getLogger(__name__)


def template_path() -> Path:
    """Where the empty store of the installed MLflow version is kept."""
    import mlflow

    from rayline.workspace import user_cache_dir

    return user_cache_dir() / "mlflow-stores" / f"empty-{mlflow.__version__}.db"


def seed_new_store(db: Path, lock_timeout_s: float) -> bool:
    """Make the new SQLite store `db` (which must not exist yet) a copy of the empty template,
    building the template first if this machine has none, waiting at most `lock_timeout_s` for
    another process building it. True when `db` was seeded; False when MLflow is left to create it
    (any error here, logged at debug level)."""
    if db.exists():
        return False
    try:
        template = _template(lock_timeout_s)
        with atomic_path(db) as partial:
            shutil.copyfile(template, partial)
            _make_own(partial)
        return True
    except Exception as exc:  # noqa: BLE001 - a faster path only: MLflow creates the store as before
        _log.debug("no template for the new tracking store %s: %s", db, exc)
        return False


def _template(lock_timeout_s: float) -> Path:
    """The empty store, built under a file lock by the first process that needs it."""
    import filelock

    path = template_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path) + ".lock", timeout=lock_timeout_s):
        if path.exists():
            return path
        with atomic_path(path) as building:
            building.unlink(missing_ok=True)  # a killed build's leftover under this pid: MLflow would migrate it
            _create_with_mlflow(building)
    return path


def _create_with_mlflow(db: Path) -> None:
    """An empty store as MLflow makes one: tracking and model registry tables, all migrations run."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client._get_registry_client().store  # noqa: B018  (MLflow opens the registry store lazily)
    with contextlib.closing(sqlite3.connect(db)) as con:
        # Only the rows the migrations make are allowed in a template: the Default experiment and
        # the default workspace. Anything else would be copied into every store.
        experiments = con.execute("SELECT experiment_id FROM experiments").fetchall()
        if experiments != [(0,)]:
            raise RuntimeError(f"a new store holds experiments {experiments}, not only Default")


def _make_own(db: Path) -> None:
    """The Default experiment's artifact location and times as MLflow would have set them in this process."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH), "0")
    now = int(time.time() * 1000)
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        updated = con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                              "WHERE experiment_id = 0", (location, now, now)).rowcount
    if updated != 1:
        raise RuntimeError("the template has no Default experiment")
