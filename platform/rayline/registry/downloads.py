"""Downloaded versions, cached in the workspace (`<workspace>/cache/models`) and reused by later loads and
by Serve replicas on the machine; a download lands under a partial name and is renamed when complete.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from rayline.redact import redact_uri
from rayline.registry.registered import ModelVersion
from rayline.workspace import owned_tempdir, sweep_orphans, user_cache_dir

__all__ = ["Downloads", "cache_root", "cache_entry"]

_PARTIAL = ".partial-"


def cache_root(ws) -> Path:
    """Where downloaded versions are kept on this node.

    The workspace's `cache/models` when the workspace is on this node: always so with the
    default SQLite store (the store is a file in it), and so for a workspace on a shared
    filesystem. A Serve replica on another node of a cluster with a remote tracking URI
    gets a workspace path that may not exist there (or not be writable): it uses this
    node's user cache (RAYLINE_CACHE_DIR, else ~/.cache/rayline), never creating the
    driver's workspace path on a node it does not belong to. Entries are keyed by run id
    and source, so one cache serves several stores without mixing their versions.
    """
    root = ws.root
    if root.is_dir() and os.access(root, os.W_OK | os.X_OK):
        return ws.cache_dir / "models"
    return user_cache_dir() / "models"


def cache_entry(ws, name: str, version: str, run_id: str, source: str) -> Path:
    """The directory that holds (or will hold) version `version` of `name` on this node: no MLflow
    call, so a Serve replica told the run id and source finds a complete copy without opening the
    store (rayline/serve/version_files.py)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "_"
    key = hashlib.sha256(f"{run_id}\n{source}".encode()).hexdigest()[:12]
    return cache_root(ws) / safe / f"{version}-{key}"


class Downloads:
    """The workspace's cache of downloaded versions (`<workspace>/cache/models`)."""

    def cache_root(self) -> Path:
        """Where downloaded versions are kept on this node (the module's `cache_root`)."""
        return cache_root(self.ws)

    def download(self, mv: ModelVersion) -> str:
        """A local directory with the artifact of `mv`: this node's cached copy, downloaded once.

        The copy is written to a `.partial-` sibling and renamed into place, so a concurrent
        reader (another replica on this node) sees either no entry or a complete one; the
        loser of a download race drops its copy and uses the winner's.
        """
        import mlflow.artifacts

        with self._guard(f"download model {mv.name!r} version {mv.version} ({redact_uri(mv.source)})"):
            final = cache_entry(self.ws, mv.name, mv.version, mv.run_id, mv.source)
            parent = final.parent
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
