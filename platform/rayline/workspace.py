"""Where rayline keeps state: one workspace directory (MLflow store, artifacts, Ray results).

Default `./.rayline`; override with `--workspace` or RAYLINE_WORKSPACE. The MLflow
tracking URI defaults to a SQLite store inside it; RAYLINE_TRACKING_URI (or
MLFLOW_TRACKING_URI) points at any MLflow server instead.

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

__all__ = ["Workspace", "workspace", "owned_tempdir", "sweep_orphans", "user_cache_dir"]


@dataclass(frozen=True)
class Workspace:
    root: Path
    tracking_uri_override: str | None = None

    @property
    def tracking_uri(self) -> str:
        return self.tracking_uri_override or f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifact_location(self) -> str:
        return (self.root / "mlartifacts").as_uri()

    @property
    def runs_dir(self) -> str:
        return str(self.root / "runs")

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
        with self._writable():
            (self.root / "runs").mkdir(parents=True, exist_ok=True)
            (self.root / "mlartifacts").mkdir(parents=True, exist_ok=True)
        return self

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
    root = Path(path or os.environ.get("RAYLINE_WORKSPACE") or ".rayline").expanduser().resolve()
    uri = tracking_uri or os.environ.get("RAYLINE_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    return Workspace(root=root, tracking_uri_override=uri)


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
