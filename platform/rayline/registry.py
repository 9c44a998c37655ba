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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rayline.errors import RegistryError
from rayline.files import atomic_write
from rayline.redact import redact_text, redact_uri
from rayline.workspace import Workspace, owned_tempdir, sweep_orphans, user_cache_dir

__all__ = ["ModelVersion", "Registry", "STORE_LOCK_TIMEOUT_S", "SQLITE_BUSY_TIMEOUT_S", "PREFLIGHT_TIMEOUT_S",
           "DEPLOYMENTS_TAG", "deployments_of"]

# Creating a new SQLite store runs ~50 schema migrations: 1-3 s alone on a 2-core machine,
# 5-10 s for each of 4 processes starting at once (measured); a minute is generous, and a
# process that still waits after it says so instead of hanging.
STORE_LOCK_TIMEOUT_S = 60.0
# SQLite allows one writer at a time; MLflow's sessions wait this long for the write lock
# (PRAGMA busy_timeout = 20000 in mlflow/store/db/utils.py) before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 20.0
_PARTIAL = ".partial-"
# MLflow draws a progress bar for every artifact download (the pyfunc model's files when a
# version registers): dozens of carriage-return frames in `rayline run`'s output and in job
# logs, between rayline's own stage lines. A user's explicit setting wins.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


# A version's deployments (`rayline models show`), oldest first: a JSON list of {at, action, role,
# percent, route, app, ...} that rayline/serve appends to each time the version is given traffic.
DEPLOYMENTS_TAG = "rayline.deployments"
# Newest entries that fit in this many characters are kept: MLflow 2+ takes 100,000 per model
# version tag, MLflow 1.x servers 5,000 (about 30 entries of ~150 characters).
DEPLOYMENTS_TAG_CHARS = 5000


def deployments_of(tags: dict) -> list[dict]:
    """The deployment record in a version's tags, oldest first; [] when there is none (a version
    registered or deployed before rayline kept it) or it is not a JSON list."""
    try:
        items = json.loads((tags or {}).get(DEPLOYMENTS_TAG) or "[]")
    except ValueError:
        return []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


@dataclass
class ModelVersion:
    name: str
    version: str
    run_id: str
    source: str
    metrics: dict
    created: str = ""
    framework: str = ""


def _flatten(prefix: str, value, out: dict) -> dict:
    """Nested mappings as MLflow params: dotted keys; a list item's `[i]` (tuned preprocessing
    paths such as data.preprocess[0].impute.strategy) as `.i`, since MLflow keys take only
    alphanumerics, `_-. :/`."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        key = re.sub(r"[^\w\-. :/]", "_", re.sub(r"\[(\d+)\]", r".\1", prefix))
        out[key] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def _one_line(text: str, limit: int = 400) -> str:
    """The first meaningful line of a dependency's message (SQLAlchemy appends [SQL: ...] and links)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _choices(values: list[str], limit: int = 20) -> str:
    """`a, b, c`; a long list's first `limit` and how many more."""
    shown = ", ".join(values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _is_locked(exc: BaseException) -> bool:
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def _name_filter(name: str) -> tuple[str, bool]:
    """An MLflow filter selecting model `name`, and whether results need an exact-name check.

    MLflow's filter parser strips the quotes around a value without unescaping anything
    (measured: `name='a\\'b'` matches the model named `a\\'b`), so a name is quoted with a quote
    character it does not contain. A name with both kinds is matched with LIKE, each quote
    and wildcard as `_`, and the results are filtered to the exact name.
    """
    if "'" not in name:
        return f"name = '{name}'", False
    if '"' not in name:
        return f'name = "{name}"', False
    return "name LIKE '" + re.sub(r"['\"%_]", "_", name) + "'", True


class _RedactMlflowLogs(logging.Filter):
    """MLflow logs store errors with their text, and a traceback (`_logger.exception` on every
    SQLAlchemy OperationalError, e.g. "database is locked"): mask the URIs in them, and keep
    MLflow's records to their first line unless RAYLINE_DEBUG=1, since rayline reports the
    error itself in one line."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri = uri

    # The libraries that talk to the store on MLflow's behalf; other loggers' records are left alone.
    SOURCES = ("mlflow", "sqlalchemy", "alembic", "urllib3", "requests")

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.SOURCES):
            return True
        try:
            message = record.getMessage()
        except Exception:
            return True
        safe = redact_text(message, self.uri)
        if record.name.startswith("mlflow") and not os.environ.get("RAYLINE_DEBUG"):
            safe, record.exc_info, record.exc_text = _one_line(safe), None, None
        if safe != message:
            record.msg, record.args = safe, None
        return True


def _install_log_redaction(uri: str) -> None:
    for handler in logging.getLogger("mlflow").handlers + logging.getLogger().handlers:
        if not any(isinstance(f, _RedactMlflowLogs) and f.uri == uri for f in handler.filters):
            handler.addFilter(_RedactMlflowLogs(uri))


_DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}
PREFLIGHT_TIMEOUT_S = 5.0


def _unreachable(uri: str) -> str | None:
    """Why the server of a network tracking URI does not answer a TCP connect, or None (answers,
    or not a network URI, or reached through a proxy this check cannot see).

    MLflow itself retries for minutes before it gives up on a server that is not there
    (measured: 4 min 09 s for https://127.0.0.1:1, 7 HTTP retries with backoff; about 100 s of
    engine retries for a database URI when its driver is installed), which looks like a hang.
    This check makes a wrong or unreachable URI a one-line error in seconds, and leaves MLflow's
    retries for what they are for: a server that blinks during a run.
    """
    import socket
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    try:
        parts = urlsplit(uri)
        scheme = parts.scheme.split("+", 1)[0].lower()
        host, port = parts.hostname, parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None  # MLflow reports a malformed URI itself
    if scheme not in _DEFAULT_PORTS or not host or not port:
        return None
    if scheme in ("http", "https") and scheme in getproxies() and not proxy_bypass(host):
        return None
    try:
        socket.create_connection((host, port), timeout=PREFLIGHT_TIMEOUT_S).close()
        return None
    except OSError as exc:
        return f"{host}:{port} does not answer ({exc.strerror or exc or type(exc).__name__})"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI, else None (in-memory stores have none)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


class Registry:
    """MLflow tracking + registry for one workspace."""

    def __init__(self, ws: Workspace):
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
        self.ws = ws
        self.tracking_uri = ws.tracking_uri
        self.shown_uri = redact_uri(self.tracking_uri)
        problem = _unreachable(self.tracking_uri)
        if problem:
            raise RegistryError(f"MLflow ({self.shown_uri}): cannot open the MLflow store: {problem} "
                                "(allowed: a reachable tracking server; set RAYLINE_TRACKING_URI or MLFLOW_TRACKING_URI)")
        with self._guard("open the MLflow store"):
            import mlflow  # noqa: F401  (configures MLflow's log handlers, which the filter goes on)
        _install_log_redaction(self.tracking_uri)
        with self._guard("open the MLflow store"), self._store_init_lock():
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
            # Both stores now, under the lock: each creates a new SQLite database's schema on
            # first open, and two processes doing that at once fail (measured: 3 of 4
            # concurrent first starts died with "table ... already exists" or "Online
            # migration expected to match one row").
            self.client._get_registry_client().store  # noqa: B018  (MLflow opens the registry store lazily)

    # ------------------------------------------------------------ the MLflow boundary

    @contextlib.contextmanager
    def _store_init_lock(self):
        """A file lock next to a new SQLite store while it is created; no-op for servers and ready stores.

        Opening an existing store needs no lock (MLflow never migrates an existing database on
        open), and under load an open takes seconds (4.5 s measured at load 25 on 2 cores), so
        only the first, creating open is serialised. A store counts as created once a locked
        open succeeded on this very file (the marker holds its inode: a deleted and recreated
        mlflow.db is created under the lock again).
        """
        db = sqlite_path(self.tracking_uri)
        if db is None:
            yield
            return
        marker = db.parent / f".{db.name}.ready"

        def ready() -> bool:
            with contextlib.suppress(OSError):
                st = os.stat(db)
                return marker.read_text() == f"{st.st_dev}:{st.st_ino}"
            return False

        if ready():
            yield
            return
        import filelock

        lock_path = db.parent / f".{db.name}.init.lock"
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(str(lock_path), timeout=STORE_LOCK_TIMEOUT_S)
            lock.acquire()
        except filelock.Timeout as exc:
            raise RegistryError(
                f"MLflow ({self.shown_uri}): another process has been creating the store for more than "
                f"{STORE_LOCK_TIMEOUT_S:g}s (lock {lock_path}); wait for it to finish, or stop it"
            ) from exc
        except OSError as exc:
            if db.exists():  # a read-only workspace: nothing will be created, reading needs no lock
                yield
                return
            raise RegistryError(f"MLflow ({self.shown_uri}): cannot create the store: "
                                f"{exc.strerror or exc} ({exc.filename or db.parent})") from exc
        if ready():  # created by the process we waited for: open without holding others up
            lock.release()
            yield
            return
        try:
            yield
            with contextlib.suppress(OSError):
                st = os.stat(db)
                atomic_write(marker, f"{st.st_dev}:{st.st_ino}")
        finally:
            lock.release()

    @contextlib.contextmanager
    def _guard(self, action: str):
        """Run MLflow calls; map whatever they raise to a one-line RegistryError about `action`."""
        shown = getattr(self, "shown_uri", None) or redact_uri(self.tracking_uri)
        try:
            yield
        except RegistryError:
            raise
        except ImportError as exc:  # a database driver the URI needs (psycopg, pymysql, ...)
            raise RegistryError(
                f"MLflow ({shown}): cannot {action}: the Python package {exc.name or '(unknown)'} is missing "
                f"({redact_text(_one_line(exc), self.tracking_uri)}; allowed: install the driver for this database)"
            ) from exc
        except OSError as exc:
            what = exc.strerror or _one_line(exc)
            where = f" ({exc.filename})" if exc.filename else ""
            raise RegistryError(redact_text(f"MLflow ({shown}): cannot {action}: {what}{where}", self.tracking_uri)) from exc
        except Exception as exc:
            raise RegistryError(f"MLflow ({shown}): cannot {action}: {self._describe(exc)}") from exc

    def _describe(self, exc: BaseException) -> str:
        text = getattr(exc, "message", None) or str(exc)
        if _is_locked(exc):
            return (f"the store is locked by another process (waited {SQLITE_BUSY_TIMEOUT_S:g}s; "
                    "allowed: let the other run finish, or use a database server for concurrent runs)")
        if "readonly database" in str(exc) or "unable to open database file" in str(exc):
            return f"the store is not writable: {_one_line(text)} (allowed: a writable workspace directory)"
        return redact_text(_one_line(text), self.tracking_uri)

    # ------------------------------------------------------------ tracking

    def _experiment_id(self, name: str) -> str:
        """Get or create experiment `rayline/<name>`, tolerating a concurrent creator."""
        from mlflow.exceptions import MlflowException

        exp_name = f"rayline/{name}"
        for _ in range(2):
            exp = self.client.get_experiment_by_name(exp_name)
            if exp is not None:
                if exp.lifecycle_stage == "deleted":
                    raise RegistryError(
                        f"MLflow ({self.shown_uri}): experiment {exp_name!r} is deleted (id {exp.experiment_id}); "
                        f"allowed: restore it (mlflow experiments restore --experiment-id {exp.experiment_id}) "
                        "or delete it for good (mlflow gc)")
                return exp.experiment_id
            # A URI workspace holds the artifacts even with a tracking server (the user named where
            # they go); a local one only with its own SQLite store (a server keeps its own artifact store).
            location = self.ws.artifact_location if (self.ws.remote or not self.ws.tracking_uri_override) else None
            try:
                return self.client.create_experiment(exp_name, artifact_location=location)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                # Another process created it between our read and our create: read it again.
        raise RegistryError(f"MLflow ({self.shown_uri}): experiment {exp_name!r} exists but cannot be read")

    def start_pipeline_run(self, spec, spec_path: str | None) -> str:
        with self._guard(f"start a run for pipeline {spec.name!r}"):
            run = self.client.create_run(
                self._experiment_id(spec.name),
                run_name=f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                tags={"rayline.kind": "pipeline", "rayline.spec_path": spec_path or ""},
            )
            from rayline.spec.pipeline_space import model_families

            # A sweep over model families has no one `model`: the trials' runs and the registered
            # version say which family each trained.
            families = spec.tune is not None and model_families(spec.tune.space)
            params = _flatten("", spec.model_dump(mode="json", by_alias=True, exclude_none=True,
                                                  exclude={"tune", "model"} if families else {"tune"}), {})
            self._log(run.info.run_id, params=params)
            return run.info.run_id

    def log_trial(self, parent_run_id: str, spec_name: str, trial_id: str, overrides: dict, status: str,
                  history: list[dict], winner: bool, *, stop_reason: str | None = None,
                  units_trained: int | None = None, events: list[dict] | None = None,
                  family: str | None = None) -> str:
        """One trial as a child run of the pipeline run: its overrides as params, its per-epoch
        validation metrics (step = epoch), and tags the sweep report reads back:
        rayline.stop_reason, rayline.units_trained, rayline.trial_events (JSON) and rayline.family."""
        import json

        tags = {"mlflow.parentRunId": parent_run_id, "rayline.kind": "trial", "rayline.trial_status": status,
                "rayline.winner": str(winner).lower()}
        if stop_reason:
            tags["rayline.stop_reason"] = stop_reason
        if units_trained is not None:
            tags["rayline.units_trained"] = str(units_trained)
        if events:
            tags["rayline.trial_events"] = json.dumps(events, default=str)[:5000]  # MLflow's tag value limit is 8000
        if family:
            tags["rayline.family"] = family
        with self._guard(f"log trial {trial_id}"):
            run = self.client.create_run(
                self._experiment_id(spec_name),
                run_name=f"trial-{trial_id}",
                tags=tags,
            )
            metrics = [(k, v, row["epoch"]) for row in history for k, v in row.items() if k != "epoch"]
            self._log(run.info.run_id, params=_flatten("", overrides, {}), metrics=metrics)
            self.client.set_terminated(run.info.run_id,
                       status="FINISHED" if status != "error" else "FAILED")
            return run.info.run_id

    def log_leaderboard(self, run_id: str, metric: str, rows: list) -> None:
        """The sweep's best trial per model family on the pipeline run: a metric per family
        (`best_valid_<metric>/<family>`) for MLflow's charts and comparisons, and the table as
        `leaderboard.json` (family, trial, value, trials, overrides), best first."""
        from dataclasses import asdict

        with self._guard("log the model-family leaderboard"):
            self._log(run_id, metrics=[(f"best_valid_{metric}/{row.family}", row.value, 0) for row in rows])
            self.client.log_dict(run_id, {"metric": metric, "families": [asdict(row) for row in rows]},
                                 "leaderboard.json")

    def _log(self, run_id: str, params: dict | None = None, metrics: list | None = None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
        metrics = [Metric(k, float(v), now, int(step)) for k, v, step in (metrics or [])]
        for i in range(0, max(len(params), len(metrics), 1), 100):  # MLflow's batch limits
            self.client.log_batch(run_id, metrics=metrics[i:i + 100], params=params[i:i + 100])

    # ------------------------------------------------------------ registry

    def register(self, run_id: str, name: str, artifact_dir: str, metrics: dict, tags: dict,
                 input_example=None) -> ModelVersion:
        """Log the artifact under the pipeline run as an MLflow pyfunc model and register it as a
        new version of `name`. `input_example`: raw rows (a DataFrame, e.g. the test split) whose
        first rows become the pyfunc model's input example."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"register model {name!r}"):
            self._log(run_id, metrics=[(k, v, 0) for k, v in metrics.items()])
            pyfunc = self._log_model(run_id, artifact_dir, input_example)
            try:
                self.client.create_registered_model(name, description="Registered by rayline.")
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            source = f"{self.client.get_run(run_id).info.artifact_uri}/model"
            # `rayline.pyfunc`: versions registered before rayline wrote pyfunc models lack it.
            mv = self.client.create_model_version(name, source=source, run_id=run_id,
                            tags={k: str(v) for k, v in {**tags, **({"rayline.pyfunc": "true"} if pyfunc else {})}.items()})
            self.client.set_terminated(run_id, status="FINISHED")
        return ModelVersion(name=name, version=str(mv.version), run_id=run_id, source=source, metrics=metrics)

    def _log_model(self, run_id: str, artifact_dir: str, input_example) -> bool:
        """The run's `model/`: the MLflow pyfunc model of a rayline artifact (rayline/pyfunc.py),
        built in the workspace's tmp and logged whole, so a failure logs nothing. Measured on a
        2-core machine: +0.03 s for digits (64 features), +0.3 s the first time in a process
        (MLflow's pyfunc modules load). A directory that is not a rayline artifact (no
        preprocessing.json: stand-ins in tests) is logged as it is. True when a pyfunc model was logged."""
        from rayline.model import META_FILE, PREPROCESSING_FILE

        if not all(os.path.isfile(os.path.join(artifact_dir, f)) for f in (META_FILE, PREPROCESSING_FILE)):
            self.client.log_artifacts(run_id, artifact_dir, artifact_path="model")
            return False
        from rayline.pyfunc import package

        staging = self.ws.temp_dir("pyfunc")
        try:
            model_dir = package(artifact_dir, os.path.join(staging, "model"), run_id=run_id, artifact_path="model",
                                input_example=input_example)
            self.client.log_artifacts(run_id, model_dir, artifact_path="model")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def fail_run(self, run_id: str, status: str = "FAILED") -> None:
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception:
            pass  # best effort on the way out of a failure

    def _versions(self, name: str) -> list:
        """Every version of model `name` (all pages), whatever characters the name holds."""
        filter_string, exact = _name_filter(name)
        out, token = [], None
        while True:
            page = self.client.search_model_versions(filter_string, page_token=token)
            out.extend(v for v in page if not exact or v.name == name)
            token = getattr(page, "token", None)
            if not token:
                return out

    def resolve(self, name: str, version: str | None = None) -> ModelVersion:
        """A registered version (default: the newest)."""
        from mlflow.exceptions import MlflowException

        label = f"model {name!r} version {version or 'latest'}"
        with self._guard(f"look up {label}"):
            if version in (None, "latest"):
                versions = self._versions(name)
                if not versions:
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                mv = max(versions, key=lambda v: int(v.version))
            else:
                try:
                    mv = self.client.get_model_version(name, str(version))
                except MlflowException as exc:
                    if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                        raise
                    raise RegistryError(f"{label}: not found in {self.shown_uri} "
                                        f"({redact_text(_one_line(exc.message), self.tracking_uri)})") from exc
            metrics = self.client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        return ModelVersion(
            name=name, version=str(mv.version), run_id=mv.run_id, source=mv.source, metrics=metrics,
            created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mv.creation_timestamp / 1000)),
            framework=(mv.tags or {}).get("framework", ""),
        )

    def _model_names(self) -> list[str]:
        """Every registered model's name (all pages), sorted."""
        names, token = [], None
        while True:
            page = self.client.search_registered_models(page_token=token)
            names.extend(m.name for m in page)
            token = getattr(page, "token", None)
            if not token:
                return sorted(names)

    def list_models(self, name: str | None = None) -> list[ModelVersion]:
        with self._guard("list registered models" if name is None else f"list versions of model {name!r}"):
            names = [name] if name is not None else self._model_names()
            out = []
            for n in names:
                versions = self._versions(n)
                if name is not None and not versions:
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                for mv in sorted(versions, key=lambda v: int(v.version)):
                    out.append(self.resolve(n, mv.version))
        return out

    def version_details(self, name: str, version: str | None = None):
        """(MLflow's ModelVersion, its run or None when the run is gone) of version `version` of
        `name` (default or "latest": the newest). An unknown model names the registered ones, an
        unknown version the model's versions."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"look up model {name!r} version {version or 'latest'}"):
            versions = self._versions(name)
            if not versions:
                names = self._model_names()
                if name in names:  # registered, its versions all deleted
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                known = _choices(names) if names else "none registered yet: run `rayline run SPEC`"
                raise RegistryError(f"model {name!r}: not registered in {self.shown_uri} (got {name!r}; allowed: {known})")
            numbers = sorted((str(v.version) for v in versions), key=int)
            if version in (None, "latest"):
                mv = max(versions, key=lambda v: int(v.version))
            else:
                found = [v for v in versions if str(v.version) == str(version).strip()]
                if not found:
                    raise RegistryError(f"model {name!r} version {version}: not registered (got {version!r}; "
                                        f"allowed: {_choices(numbers)} or latest)")
                mv = found[0]
            mv = self.client.get_model_version(name, str(mv.version))  # a search's versions lack their aliases
            try:
                run = self.client.get_run(mv.run_id) if mv.run_id else None
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None  # deleted for good (mlflow gc): the version outlives it
        return mv, run

    def record_deployment(self, name: str, version: str, entry: dict) -> None:
        """Append `entry` to version `version`'s deployment record (DEPLOYMENTS_TAG)."""
        with self._guard(f"record a deployment of model {name!r} version {version}"):
            tags = self.client.get_model_version(name, str(version)).tags or {}
            record = [*deployments_of(tags), entry]
            while len(record) > 1 and len(json.dumps(record)) > DEPLOYMENTS_TAG_CHARS:
                record.pop(0)
            self.client.set_model_version_tag(name, str(version), DEPLOYMENTS_TAG, json.dumps(record))

    # ------------------------------------------------------------ aliases (rollouts: champion, canary)

    def alias_version(self, name: str, alias: str) -> str | None:
        """The version `alias` points at on model `name`, or None when the alias is not set."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"read alias {alias!r} of model {name!r}"):
            try:
                return str(self.client.get_model_version_by_alias(name, alias).version)
            except MlflowException as exc:
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise
                return None

    def set_alias(self, name: str, alias: str, version: str) -> None:
        with self._guard(f"set alias {alias!r} of model {name!r} to version {version}"):
            self.client.set_registered_model_alias(name, alias, str(version))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove `alias` from model `name`; nothing to do when it is not set."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"delete alias {alias!r} of model {name!r}"):
            try:
                self.client.delete_registered_model_alias(name, alias)
            except MlflowException as exc:
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        with self._guard(f"tag model {name!r}"):
            self.client.set_registered_model_tag(name, key, value)

    # ------------------------------------------------------------ local copies of versions

    def cache_root(self) -> Path:
        """Where downloaded versions are kept on this node.

        The workspace's `cache/models` when the workspace is on this node: always so with the
        default SQLite store (the store is a file in it), and so for a workspace on a shared
        filesystem. A Serve replica on another node of a cluster with a remote tracking URI
        gets a workspace path that may not exist there (or not be writable): it uses this
        node's user cache (RAYLINE_CACHE_DIR, else ~/.cache/rayline), never creating the
        driver's workspace path on a node it does not belong to. Entries are keyed by run id
        and source, so one cache serves several stores without mixing their versions.
        """
        root = self.ws.root
        if root.is_dir() and os.access(root, os.W_OK | os.X_OK):
            return self.ws.cache_dir / "models"
        return user_cache_dir() / "models"

    def download(self, mv: ModelVersion) -> str:
        """A local directory with the artifact of `mv`: this node's cached copy, downloaded once.

        The copy is written to a `.partial-` sibling and renamed into place, so a concurrent
        reader (another replica on this node) sees either no entry or a complete one; the
        loser of a download race drops its copy and uses the winner's.
        """
        import mlflow.artifacts

        safe = re.sub(r"[^A-Za-z0-9._-]", "_", mv.name).lstrip(".") or "_"
        key = hashlib.sha256(f"{mv.run_id}\n{mv.source}".encode()).hexdigest()[:12]
        with self._guard(f"download model {mv.name!r} version {mv.version} ({redact_uri(mv.source)})"):
            parent = self.cache_root() / safe
            final = parent / f"{mv.version}-{key}"
            if final.is_dir():
                return str(final)
            parent.mkdir(parents=True, exist_ok=True)
            sweep_orphans(parent, _PARTIAL)
            partial = owned_tempdir(parent, _PARTIAL)
            try:
                got = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=partial,
                                 tracking_uri=self.tracking_uri)
                try:
                    os.rename(got, final)
                except OSError:
                    if not final.is_dir():  # not another process's complete copy: a real failure
                        raise
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            return str(final)
