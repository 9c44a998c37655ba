"""A served version's files, found by its replicas without opening MLflow.

Opening the store costs a replica about 3 s of CPU (MLflow's and SQLAlchemy's imports), paid by
every replica that holds a model: the version's own, the route's and the V2 route's, and each
one a scale-up starts. Deploying already resolved the version in the driver, so the driver
records what it resolved (run id and artifact source) in Ray's KV and puts the files in this
node's download cache; a replica that finds the record (same store, same version) and a complete
copy in its node's cache loads from there. Anything else (no record: an application deployed
from a Serve config file; another store; a node without the copy) opens the registry as before.
The cache entry is keyed by run id and source (rayline/registry/downloads.py), and a registered
version's run and source never change, so a record can only point at the right files or at none.
"""

from __future__ import annotations

import json

from rayline.serve.kv_namespace import KV_NAMESPACE

__all__ = ["record_version_files", "load_version"]


def _key(name: str, version: str) -> bytes:
    return f"rayline/version-files/{name}/{version}".encode()


def record_version_files(registry, mv) -> None:
    """In the deploying driver: the files of `mv` in this node's cache (when a node of the cluster
    is this machine, where replicas can find them), and what was resolved, for the replicas."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

    if not _internal_kv_initialized():
        return
    if _a_node_is_this_machine(ray):
        registry.download(mv)
    record = {"tracking_uri": registry.ws.tracking_uri, "run_id": mv.run_id, "source": mv.source,
              "version": mv.version}
    _internal_kv_put(_key(mv.name, mv.version), json.dumps(record).encode(), overwrite=True, namespace=KV_NAMESPACE)


def _a_node_is_this_machine(ray) -> bool:
    try:
        here = ray.util.get_node_ip_address()
        return any(node.get("Alive") and node.get("NodeManagerAddress") == here for node in ray.nodes())
    except Exception:  # noqa: BLE001 - no answer: the replicas download for themselves
        return False


def load_version(name: str, version: str | None, workspace: str | None, tracking_uri: str | None):
    """On a replica: (Predictor of version `version` of `name`, its version string). From this
    node's cache when the deploy recorded the version's files for this store; else through the
    registry (resolve, download), as a replica always did before."""
    from rayline.inference.predictor import Predictor
    from rayline.workspace import workspace as make_workspace

    ws = make_workspace(workspace, tracking_uri)
    path = _recorded_copy(name, version, ws)
    if path is not None:
        return Predictor(path, version=str(version)), str(version)
    from rayline.registry import Registry

    registry = Registry(ws)
    mv = registry.resolve(name, version)
    return Predictor(registry.download(mv), version=mv.version), mv.version


def _recorded_copy(name: str, version: str | None, ws) -> str | None:
    if version in (None, "latest"):
        return None
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    from rayline.registry.downloads import cache_entry

    if not _internal_kv_initialized():
        return None
    raw = _internal_kv_get(_key(name, str(version)), namespace=KV_NAMESPACE)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not record or record.get("tracking_uri") != ws.tracking_uri or record.get("version") != str(version):
        return None
    entry = cache_entry(ws, name, str(version), record["run_id"], record["source"])
    return str(entry) if entry.is_dir() else None
