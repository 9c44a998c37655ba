"""Which registered model and version each Serve application serves, recorded by its replicas in
Ray's KV under the application's name: `serve status` names them from the first replica on, not
only once Ray's metrics export has carried a request's labels (every 10 s, later on a loaded
machine), and for applications that Serve's config does not describe (`serve.run` in Python).
"""

from __future__ import annotations

import json

from rayline.serve.kv_namespace import KV_NAMESPACE

__all__ = ["record_app_model", "app_model"]

_PREFIX = "app-model:"


def record_app_model(model: str, version: str) -> None:
    """On a replica: this replica's application serves `model` version `version`."""
    from ray import serve
    from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

    try:
        app = serve.get_replica_context().app_name
    except Exception:  # noqa: BLE001 - not on a Serve replica (a model server built in a test process)
        return
    if _internal_kv_initialized():
        _internal_kv_put(_PREFIX + app, json.dumps({"model": model, "version": str(version)}).encode(), overwrite=True,
                         namespace=KV_NAMESPACE)


def app_model(app: str) -> dict | None:
    """{"model", "version"} that application `app`'s replicas recorded, or None."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return None
    raw = _internal_kv_get(_PREFIX + app, namespace=KV_NAMESPACE)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
