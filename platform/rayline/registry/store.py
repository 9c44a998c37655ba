"""The MLflow boundary: opening the store (a new SQLite store under a file lock, a server checked
reachable first), and `_guard`, which turns every MLflow, OS, SQLite and SQLAlchemy error into a
one-line RegistryError naming what was being done, the tracking URI redacted.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from rayline.errors import RegistryError
from rayline.files import atomic_write
from rayline.redact import redact_text, redact_uri
from rayline.workspace import Workspace

__all__ = ["STORE_LOCK_TIMEOUT_S", "SQLITE_BUSY_TIMEOUT_S", "PREFLIGHT_TIMEOUT_S", "sqlite_path", "one_line",
           "is_locked", "Store"]

# MLflow draws a progress bar for every artifact download (the pyfunc model's files when a
# version registers): dozens of carriage-return frames in `rayline run`'s output and in job
# logs, between rayline's own stage lines. A user's explicit setting wins.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


# Creating a new SQLite store runs ~50 schema migrations: 1-3 s alone on a 2-core machine,
# 5-10 s for each of 4 processes starting at once (measured); a minute is generous, and a
# process that still waits after it says so instead of hanging.
STORE_LOCK_TIMEOUT_S = 60.0


# SQLite allows one writer at a time; MLflow's sessions wait this long for the write lock
# (PRAGMA busy_timeout = 20000 in mlflow/store/db/utils.py) before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 20.0


def one_line(text: str, limit: int = 400) -> str:
    """The first meaningful line of a dependency's message (SQLAlchemy appends [SQL: ...] and links)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def is_locked(exc: BaseException) -> bool:
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


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
            safe, record.exc_info, record.exc_text = one_line(safe), None, None
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


class Store:
    """Opening the MLflow store (once, under a lock for a new SQLite file) and `_guard`, the MLflow boundary."""

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
            from rayline.registry.store_template import seed_new_store

            seed_new_store(db, STORE_LOCK_TIMEOUT_S)  # a copy of an empty store, not MLflow's ~50 migrations run again
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
                f"({redact_text(one_line(exc), self.tracking_uri)}; allowed: install the driver for this database)"
            ) from exc
        except OSError as exc:
            what = exc.strerror or one_line(exc)
            where = f" ({exc.filename})" if exc.filename else ""
            raise RegistryError(redact_text(f"MLflow ({shown}): cannot {action}: {what}{where}", self.tracking_uri)) from exc
        except Exception as exc:
            raise RegistryError(f"MLflow ({shown}): cannot {action}: {self._describe(exc)}") from exc

    def _describe(self, exc: BaseException) -> str:
        text = getattr(exc, "message", None) or str(exc)
        if is_locked(exc):
            return (f"the store is locked by another process (waited {SQLITE_BUSY_TIMEOUT_S:g}s; "
                    "allowed: let the other run finish, or use a database server for concurrent runs)")
        if "readonly database" in str(exc) or "unable to open database file" in str(exc):
            return f"the store is not writable: {one_line(text)} (allowed: a writable workspace directory)"
        return redact_text(one_line(text), self.tracking_uri)

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
