"""The Ray Serve application: one autoscaled deployment per model, FastAPI built on the replica.

`build_app(args)` is an application builder, so the same app runs from `rayline run`
and from a Serve config file (`serve deploy serving/digits.yaml`, KubeRay RayService):

    applications:
      - name: digits
        route_prefix: /digits
        import_path: rayline.serve.app:build_app
        args: {name: digits, version: latest, workspace: /path/to/.rayline}
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve

from rayline.errors import ServeError

__all__ = ["ModelServer", "build_app", "deploy"]


@serve.deployment(max_ongoing_requests=16, health_check_period_s=10)
@serve.ingress()
class ModelServer:
    """Loads one registered model version and serves the HTTP API for it."""

    def __init__(self, name: str, version: str | None, workspace: str, tracking_uri: str | None, max_instances: int):
        from rayline.model import Predictor
        from rayline.registry import Registry
        from rayline.workspace import workspace as make_workspace

        registry = Registry(make_workspace(workspace, tracking_uri))
        mv = registry.resolve(name, version)
        self.version = mv.version
        self.predictor = Predictor(registry.download(mv), version=mv.version)
        self.max_instances = max_instances

    def __serve_build_asgi_app__(self):
        from rayline.serve.http import build_http_app

        return build_http_app(self.predictor, self.version, self.max_instances)


def build_app(args: dict[str, Any]):
    """Serve application builder. args: name (required), version, workspace, tracking_uri,
    replicas {min, max, target_ongoing_requests, cpus}, max_instances."""
    if not args.get("name"):
        raise ServeError("build_app args: 'name' is required (the registered model name)")
    replicas = {"min": 1, "max": 1, "target_ongoing_requests": 2, "cpus": 0.25, **(args.get("replicas") or {})}
    from rayline.train.catalog import backend_info, load_backend

    env = {}
    if args.get("framework"):
        env = load_backend(args["framework"]).worker_env() if backend_info(args["framework"]) else {}
    options: dict[str, Any] = {
        "name": f"{args['name']}-model",
        "autoscaling_config": {
            "min_replicas": int(replicas["min"]),
            "initial_replicas": max(1, int(replicas["min"])),
            "max_replicas": int(replicas["max"]),
            "target_ongoing_requests": float(replicas["target_ongoing_requests"]),
        },
        "ray_actor_options": {"num_cpus": float(replicas["cpus"]), **({"runtime_env": {"env_vars": env}} if env else {})},
    }
    return ModelServer.options(**options).bind(
        args["name"],
        str(args["version"]) if args.get("version") not in (None, "latest") else None,
        os.path.abspath(args["workspace"]) if args.get("workspace") else None,
        args.get("tracking_uri"),
        int(args.get("max_instances", 10_000)),
    )


def deploy(spec, version: str, ws, host: str, port: int) -> str:
    """Deploy `version` of model `spec.name` at `spec.route`; return the endpoint URL."""
    serve_spec = spec.serve
    args = {
        "name": spec.name,
        "version": version,
        "workspace": str(ws.root),
        "tracking_uri": ws.tracking_uri_override,
        "framework": spec.model.framework,
        "replicas": serve_spec.replicas.model_dump() if serve_spec else None,
        "max_instances": serve_spec.max_instances if serve_spec else 10_000,
    }
    _wait_for_replica_resources(spec.name, serve_spec.replicas.cpus if serve_spec else 0.25,
                                max(1, serve_spec.replicas.min) if serve_spec else 1)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(args), name=spec.name, route_prefix=spec.route, blocking=False)
    except Exception as exc:
        raise ServeError(f"deploying {spec.name} v{version} at {spec.route} failed: {str(exc).strip().splitlines()[-1]}") from None
    return f"http://{host}:{port}{spec.route}"


def _wait_for_replica_resources(name: str, cpus: float, replicas: int, timeout_s: float = 60.0) -> None:
    """Fail fast, naming the resource, instead of letting Serve wait forever for CPUs."""
    import time

    import ray

    need = cpus * replicas
    deadline = time.monotonic() + timeout_s
    while True:
        # Training just ended: its placement groups may take a moment to be released.
        available = ray.available_resources().get("CPU", 0.0)
        if available + 1e-9 >= need:
            return
        if time.monotonic() > deadline:
            from rayline.errors import ResourceError

            raise ResourceError(
                f"serve.replicas.cpus: {replicas} replica(s) of {name} need {need:g} CPUs; the cluster has "
                f"{available:g} available after {timeout_s:g}s (allowed: lower serve.replicas.cpus or min, or free CPUs)"
            )
        time.sleep(0.5)
