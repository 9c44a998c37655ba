"""What Serve itself says about applications: its details, and the rayline error that failed a
deployment's replicas (Serve's own message hides it). Read by `rayline serve status` and by
deploys waiting for their applications."""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["serve_details", "serve_status", "deployment_failure"]


def serve_details() -> dict:
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:  # Serve was never started on this cluster
        return {"applications": {}}
    return client.get_serve_details()


def serve_status():
    """What `serve.status()` answers (a ServeStatus: each application's and deployment's status,
    message and replica states, each proxy's status), built from the controller's details as
    `ServeInstanceDetails._get_status` builds it, without validating those details into Serve's
    pydantic models first: that validation cloudpickles every deployment's request-router class,
    51 ms of CPU per call with 6 applications against 1.5 ms here (benchmarks/serve_status.py, 2-core
    box, 2026-12-06), and deploys and the suite poll it several times a second."""
    from collections import Counter

    from ray.serve.schema import ApplicationStatusOverview, DeploymentStatusOverview, ServeStatus

    details = serve_details()
    return ServeStatus(
        target_capacity=details.get("target_capacity"),
        proxies={node: proxy["status"] for node, proxy in (details.get("proxies") or {}).items()},
        applications={
            name: ApplicationStatusOverview(
                status=app["status"], message=app.get("message", ""), last_deployed_time_s=app.get("last_deployed_time_s", 0),
                deployments={
                    dep_name: DeploymentStatusOverview(
                        status=dep["status"], status_trigger=dep["status_trigger"],
                        replica_states=dict(Counter(getattr(r["state"], "value", r["state"]) for r in dep.get("replicas") or ())),
                        message=dep.get("message", ""))
                    for dep_name, dep in (app.get("deployments") or {}).items()})
            for name, app in (details.get("applications") or {}).items()},
    )


_RAYLINE_ERROR = re.compile(r"^rayline\.errors\.\w+: (.+)$", re.MULTILINE)


def deployment_failure(app_name: str) -> Optional[str]:
    """The message of the rayline error that failed `app_name`'s replicas, if one did."""
    try:
        app = serve_status().applications.get(app_name)
    except Exception:
        return None
    if app is None:
        return None
    for dep in app.deployments.values():
        found = _RAYLINE_ERROR.findall(dep.message or "")
        if found:
            return found[-1]
    return None
