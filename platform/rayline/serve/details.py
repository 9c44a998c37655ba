"""What Serve itself says about applications: its details, and the rayline error that failed a
deployment's replicas (Serve's own message hides it). Read by `rayline serve status` and by
deploys waiting for their applications."""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["serve_details", "deployment_failure"]


def serve_details() -> dict:
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:  # Serve was never started on this cluster
        return {"applications": {}}
    return client.get_serve_details()


_RAYLINE_ERROR = re.compile(r"^rayline\.errors\.\w+: (.+)$", re.MULTILINE)


def deployment_failure(app_name: str) -> Optional[str]:
    """The message of the rayline error that failed `app_name`'s replicas, if one did."""
    try:
        from ray import serve

        app = serve.status().applications.get(app_name)
    except Exception:
        return None
    if app is None:
        return None
    for dep in app.deployments.values():
        found = _RAYLINE_ERROR.findall(dep.message or "")
        if found:
            return found[-1]
    return None
