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

from typing import Any

from ray import serve

from rayline.errors import ServeError
from rayline.serve.deployment_options import deployment_options, workspace_arg

__all__ = ["ModelServer", "build_app"]


@serve.deployment(max_ongoing_requests=64, health_check_period_s=10)
@serve.ingress()
class ModelServer:
    """Loads one registered model version and serves the HTTP API for it."""

    def __init__(self, name: str, version: str | None, workspace: str, tracking_uri: str | None, settings: dict):
        # Keys are read here, on the replica, from the variable or file the spec names: never a
        # deployment argument, so never in Serve's config or status (rayline/serve/auth.py).
        # First, so missing keys fail the replica in milliseconds, before the model loads.
        from rayline.serve.auth import load_api_keys

        self.api_keys = load_api_keys(settings["auth"]) if settings.get("auth") else None

        from rayline.serve.app_models import record_app_model
        from rayline.serve.version_files import load_version
        from rayline.spec import ServeSpec

        # From this node's cache when the deploy recorded the version's files (no MLflow: ~3 s of CPU a replica).
        self.predictor, self.version = load_version(name, version, workspace, tracking_uri)
        record_app_model(name, self.version)  # for `serve status`, before any request's metrics are exported
        settings = dict(settings)
        self.delay_s = float(settings.pop("debug_infer_delay_s", 0.0) or 0.0)  # test-only, see serve/stack.py
        self.settings = ServeSpec.model_validate(settings)

    def __serve_build_asgi_app__(self):
        from rayline.serve.stack import build_stack

        self.stack = build_stack(self.predictor, self.version, self.settings, self.api_keys, delay_s=self.delay_s)
        self.http_app = self.stack.app
        return self.stack.app

    def __del__(self):
        # Serve calls __del__ as the replica stops: the version's monitoring entry of this replica
        # leaves the shared window now rather than going stale in 30 s (rayline/monitoring/live.py).
        stack = getattr(self, "stack", None)
        if stack is not None and stack.monitor is not None:
            stack.monitor.close()

    async def call_http(self, method: str, path: str, headers: list | None = None, body: bytes = b"",
                        query: bytes = b""):
        """The replica's own HTTP API, called through a deployment handle (the traffic router, the
        Open Inference Protocol app): same validation, limits, auth, metrics and error bodies as a
        request over HTTP. `path` is relative to the version's route ("/predict", "/metadata").
        Returns a `rayline.serve.asgi_call.HttpResult`."""
        from rayline.serve.asgi_call import call_asgi

        return await call_asgi(self.http_app, method, path, headers=headers or (), body=body, query=query)


# build_app args besides the serve spec's own keys (route is the application's route_prefix).
_APP_ARGS = {"name", "version", "workspace", "tracking_uri", "framework", "debug_infer_delay_s"}


def build_app(args: dict[str, Any]):
    """Serve application builder. args: name (required), version, workspace, tracking_uri,
    framework, and any key of the spec's `serve` section but route (replicas,
    resources_per_replica, batching, max_ongoing_requests, max_queued_requests, ...)."""
    if not args.get("name"):
        raise ServeError("build_app args: 'name' is required (the registered model name)")
    from pydantic import ValidationError

    from rayline.spec import ServeSpec

    settings = {k: v for k, v in args.items() if k not in _APP_ARGS}
    unknown = sorted(set(settings) - set(ServeSpec.model_fields) | ({"route"} & set(settings)))
    if unknown:
        allowed = sorted(_APP_ARGS | set(ServeSpec.model_fields) - {"route"})
        raise ServeError(f"build_app args: unknown keys {unknown} (allowed: {', '.join(allowed)})")
    try:
        spec = ServeSpec.model_validate(settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ServeError(f"build_app args: {problems}") from None
    options = deployment_options(spec, args.get("framework"), f"{args['name']}-model")
    settings = spec.model_dump()
    if args.get("debug_infer_delay_s"):
        settings["debug_infer_delay_s"] = float(args["debug_infer_delay_s"])
    version = _resolved_version(args)
    from rayline.serve.router import record_version_settings

    record_version_settings(args["name"], version, settings)  # the model's route serves N with N's settings
    return ModelServer.options(**options).bind(
        args["name"],
        version,
        workspace_arg(args.get("workspace")),
        args.get("tracking_uri"),
        settings,
    )


def _resolved_version(args: dict) -> str:
    """`version: latest` (or none) resolved here, once, where the application is built: every
    replica of the deployment then loads the same version, even one started by a scale-up after
    a newer version was registered (a replica resolving "latest" itself could serve another)."""
    version = args.get("version")
    if version not in (None, "latest"):
        return str(version)
    from rayline.registry import Registry
    from rayline.workspace import workspace as make_workspace

    return Registry(make_workspace(workspace_arg(args.get("workspace")), args.get("tracking_uri"))).resolve(args["name"]).version
