"""Where rayline keeps state: one workspace (MLflow store, artifacts, Ray results).

Default `./.rayline`; override with `--workspace` or RAYLINE_WORKSPACE: a directory (local,
or a path every node mounts), or an `s3://bucket/prefix` / `gs://bucket/prefix` URI. The
MLflow tracking URI defaults to a SQLite store in the workspace's local directory;
RAYLINE_TRACKING_URI (or MLFLOW_TRACKING_URI) points at any MLflow server instead.

A URI workspace keeps on the URI what must outlive a node or be seen by every node: Ray
Train/Tune results and checkpoints, rayline's run records (`runs/`) and MLflow artifacts
(`mlartifacts/`). What cannot live on object storage stays in a local directory tied to
that URI, `<user cache>/workspaces/<scheme>-<bucket>-<hash of the URI>` (user cache:
RAYLINE_CACHE_DIR, else ~/.cache/rayline): the SQLite tracking store, the cache of
downloaded model versions, rayline's temporary files and `cluster.json`. The same URI on the
same machine always finds the same local directory, from any working directory.

Temporary directories rayline makes (artifact staging, partial model downloads, worker
checkpoints) are named after the process that owns them (`owned_tempdir`), so the next
rayline process on the same node removes those of processes that died without cleaning
up (`sweep_orphans`): a SIGKILLed run or a Ray worker killed mid-report leaks nothing for long.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Workspace", "workspace", "local_state_dir", "owned_tempdir", "sweep_orphans", "user_cache_dir"]


@dataclass(frozen=True)
class Workspace:
    root: Path  # the local directory: tracking store, model cache, tmp, cluster.json (and runs, artifacts for a path)
    tracking_uri_override: str | None = None
    storage_uri: str | None = None  # s3:// or gs:// URI holding runs and artifacts; None: they are under `root`

    @property
    def location(self) -> str:
        """The workspace as the user names it (`--workspace`): its URI, or its directory."""
        return self.storage_uri or str(self.root)

    @property
    def remote(self) -> bool:
        return self.storage_uri is not None

    @property
    def tracking_uri(self) -> str:
        return self.tracking_uri_override or f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifact_location(self) -> str:
        if self.storage_uri:
            return f"{self.storage_uri}/mlartifacts"
        return (self.root / "mlartifacts").as_uri()

    @property
    def runs_dir(self) -> str:
        """Ray Train/Tune storage and rayline's run records: a local path, or a URI."""
        return f"{self.storage_uri}/runs" if self.storage_uri else str(self.root / "runs")

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def cache_dir(self) -> Path:
        """Downloaded model versions (`<cache>/models/<name>/<version>-<key>`), reused across loads."""
        return self.root / "cache"

    @property
    def tmp_dir(self) -> Path:
        """Scratch space of running rayline processes (artifact staging); empty when none runs."""
        return self.root / "tmp"

    def ensure(self) -> "Workspace":
        """Create the local directories; for a URI workspace, also prove the bucket takes writes
        (a wrong endpoint, bucket or credentials is one line now, not a failure after training)."""
        with self._writable():
            self.root.mkdir(parents=True, exist_ok=True)
            if not self.storage_uri:
                (self.root / "runs").mkdir(parents=True, exist_ok=True)
                (self.root / "mlartifacts").mkdir(parents=True, exist_ok=True)
        if self.storage_uri:
            from rayline.storage import ensure_dir

            self._check_artifact_client()
            ensure_dir(self.storage_uri)
        return self

    # MLflow writes artifacts to s3:// with boto3 and to gs:// with google-cloud-storage; without
    # the package it failed only at registration, after training (extras rayline[s3], rayline[gcs]).
    _ARTIFACT_CLIENTS = {"s3": ("boto3", "boto3", "s3"), "gs": ("google.cloud.storage", "google-cloud-storage", "gcs")}

    def _check_artifact_client(self) -> None:
        import importlib.util

        scheme = self.storage_uri.split("://", 1)[0]
        module, package, extra = self._ARTIFACT_CLIENTS[scheme]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package (google.cloud) is missing
            found = False
        if not found:
            from rayline.storage import StorageError

            raise StorageError(f"workspace: MLflow needs the Python package {package} for {scheme}:// artifacts "
                               f"(got {self.storage_uri}; allowed: pip install 'rayline[{extra}]')")

    def temp_dir(self, kind: str) -> str:
        """A fresh directory under `tmp_dir` owned by this process; the caller removes it.
        Directories left by dead processes of this node are removed first."""
        with self._writable():
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            sweep_orphans(self.tmp_dir, f"{kind}-")
            return owned_tempdir(self.tmp_dir, f"{kind}-")

    @contextlib.contextmanager
    def _writable(self):
        """OSError (read-only, permissions, disk full) -> one line naming the workspace."""
        try:
            yield
        except OSError as exc:
            from rayline.errors import RaylineError

            raise RaylineError(f"workspace {self.root}: cannot write {exc.filename or self.root}: "
                               f"{exc.strerror or exc} (allowed: a writable directory, "
                               "chosen with --workspace or RAYLINE_WORKSPACE)") from exc


def workspace(path: str | os.PathLike | None = None, tracking_uri: str | None = None) -> Workspace:
    """The workspace named by `path`, else RAYLINE_WORKSPACE, else `./.rayline`: a directory, or an
    s3:// / gs:// URI (anything else is a one-line StorageError naming the value)."""
    from rayline.storage import is_uri, parse_location

    # A pathlib.Path of a URI (typer hands `--workspace` over as one) reads "s3:/bucket";
    # parse_location takes that spelling back to "s3://bucket".
    location = parse_location(path or os.environ.get("RAYLINE_WORKSPACE") or ".rayline", "workspace")
    uri = tracking_uri or os.environ.get("RAYLINE_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    if is_uri(location):
        return Workspace(root=local_state_dir(location), tracking_uri_override=uri, storage_uri=location)
    return Workspace(root=Path(location).resolve(), tracking_uri_override=uri)


def local_state_dir(uri: str) -> Path:
    """This machine's directory for what a URI workspace cannot keep on object storage."""
    scheme, rest = uri.split("://", 1)
    bucket = re.sub(r"[^a-z0-9.-]", "_", rest.split("/", 1)[0])[:40]
    digest = hashlib.sha256(uri.encode()).hexdigest()[:10]
    return (user_cache_dir() / "workspaces" / f"{scheme}-{bucket}-{digest}").resolve()


def user_cache_dir() -> Path:
    """This node's rayline cache outside any workspace: RAYLINE_CACHE_DIR, else XDG's ~/.cache/rayline."""
    explicit = os.environ.get("RAYLINE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rayline"


# ----------------------------------------------------------------- owned temporary directories

def _node_tag() -> str:
    # A workspace may sit on a filesystem shared by several nodes: a pid means something only
    # on the node that wrote it, so names carry a short hash of the host name too.
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def owned_tempdir(parent: str | os.PathLike, prefix: str) -> str:
    """mkdtemp in `parent` named `<prefix><pid>.<node>-<random>`: private (0700), unique, and
    recognisable by `sweep_orphans` once this process is gone."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.{_node_tag()}-", dir=str(parent))


def sweep_orphans(parent: str | os.PathLike, prefix: str) -> int:
    """Remove the `owned_tempdir(parent, prefix)` directories of processes of this node that no
    longer run; returns how many. Never touches another node's or a live process's directory."""
    import psutil

    pattern = re.compile(re.escape(prefix) + r"(\d+)\." + _node_tag() + r"-")
    removed = 0
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return 0
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or int(m.group(1)) == os.getpid() or psutil.pid_exists(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += not os.path.exists(entry.path)
    return removed
