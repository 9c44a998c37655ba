"""The deploy stage: the registered version becomes its route's champion (all of the traffic), or
a canary beside it when the spec's serve section asks; its own route ROUTE/v/N answers either way
(rayline/serve/versions.py). It takes the serve section only.
"""

from __future__ import annotations

from typing import Callable

from rayline.errors import InterruptedRun
from rayline.spec import ServeSpec
from rayline.workspace import Workspace

__all__ = ["deploy_stage"]


def deploy_stage(name: str, version: str, serve_spec: ServeSpec, *, ws: Workspace, host: str, port: int,
                 run_id: str, on_stage: Callable[[str, str, str], None]) -> str:
    """Deploy version `version` of model `name` at `serve_spec.route`; the route's URL. Ctrl-C: the
    version stays registered and the Serve applications this call started are deleted."""
    from rayline.serve import versions

    created: list = []
    canary = serve_spec.canary
    try:
        on_stage("deploy", "start", f"{serve_spec.route} on {host}:{port}")
        rollout = versions.deploy(name, version, ws=ws, serve_spec=serve_spec,
                                  canary_percent=canary.percent if canary else None,
                                  gate=canary.gate() if canary else None, host=host, port=port, created=created)
    except KeyboardInterrupt as exc:
        deleted = [app for app in reversed(created) if _delete_app(app)]
        raise InterruptedRun(
            f"interrupted while deploying: model {name} version {version} stays registered "
            f"(MLflow run {run_id}); "
            + (f"the half-deployed Serve app {name!r} was deleted ({', '.join(deleted)})" if deleted
               else "no Serve app was started")
        ) from exc
    role = (f"version {version} canary ({canary.percent}%), version {rollout.champion} champion" if rollout.canary
            else f"version {version} champion")
    on_stage("deploy", "done", f"{rollout.url} ({role}; this version alone: {rollout.url}/v/{version})")
    return rollout.url


def _delete_app(name: str) -> bool:
    """Remove a Serve app whose deploy was cut off; True when there was one."""
    try:
        from ray import serve

        from rayline.serve.details import serve_status

        if name in serve_status().applications:
            serve.delete(name)
            return True
    except Exception:  # noqa: BLE001 - best effort on the way out of an interruption
        pass
    return False
