"""`rayline serve export NAME`: a Ray Serve config file for a registered model version — what Ray's
own `serve deploy FILE` and KubeRay's RayService (`serveConfigV2`) read — serving the same API as
`rayline run` / `rayline serve deploy`:

- application `NAME-vN` at `ROUTE/v/N`: the version's ModelServer (`rayline.serve.app:build_app`);
- application `NAME` at `ROUTE`: the traffic router (`rayline.serve.export:build_router_app`),
  all traffic to version N, which becomes the champion the routers follow;
- application `NAME-oip` at `/v2/models/NAME` (when the spec's `serve.oip` is on, the default): the
  model's own Open Inference Protocol replicas, following the router's split
  (`rayline.serve.export:build_oip_router_app`), so a V2 request reaches the model in one hop;
- application `rayline-v2` at `/v2`: the Open Inference Protocol for the rest (`/v2` itself, its
  health, models without an application of their own: `rayline.serve.oip:build_app`).

The version is written as a number, resolved here once (default: the `champion` alias, else the
newest version): a config names exactly what it serves, and changing the number is the rollout.
The serving settings (replicas, resources, batching, limits, auth) are the ones the version was
trained with (its spec.yaml); the route too.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any, Optional

from rayline.errors import ServeError

__all__ = ["export_config", "config_for", "write_config", "build_router_app", "build_oip_router_app",
           "ROUTER_IMPORT_PATH", "OIP_ROUTER_IMPORT_PATH"]

ROUTER_IMPORT_PATH = "rayline.serve.export:build_router_app"
OIP_ROUTER_IMPORT_PATH = "rayline.serve.export:build_oip_router_app"


def export_config(ws, name: str, version: Optional[str] = None, *, cluster_workspace: Optional[str] = None,
                  host: str = "127.0.0.1", port: int = 8000, with_v2: bool = True) -> tuple[dict, list[str]]:
    """(the Serve config as a dict, notes for the user) for a registered version of `name`.
    `cluster_workspace`: the workspace path as the cluster's nodes see it (default: this
    workspace's absolute path, right for a head on this machine or a shared filesystem mounted
    at the same path)."""
    from rayline.inference.predictor import version_spec
    from rayline.redact import redact_uri
    from rayline.registry import Registry

    notes: list[str] = []
    registry = Registry(ws)
    if version in (None, "champion"):
        version = registry.alias_version(name, "champion")
        if version is None:
            notes.append(f"model {name} has no champion alias: exporting its newest version")
    mv = registry.resolve(name, None if version in (None, "latest") else str(version))
    spec = version_spec(registry, mv)
    tracking_uri = ws.tracking_uri_override
    if tracking_uri and redact_uri(tracking_uri) != tracking_uri:
        # A credential written into a config file ends up in Serve's status and KubeRay's CR.
        notes.append("the tracking URI holds credentials and is left out: set RAYLINE_TRACKING_URI on every node")
        tracking_uri = None
    workspace = ws.storage_uri or cluster_workspace or str(ws.root)
    return config_for(spec, mv.version, workspace=workspace, tracking_uri=tracking_uri, host=host, port=port,
                      with_v2=with_v2), notes


def config_for(spec, version: str, *, workspace: Optional[str], tracking_uri: Optional[str] = None,
               host: str = "127.0.0.1", port: int = 8000, with_v2: bool = True) -> dict:
    """The Serve config serving version `version` of the model a pipeline spec trains, with the
    spec's serve settings and route (serving/*.yaml are this, for the reference pipelines)."""
    from ray.serve.schema import ServeDeploySchema

    from rayline.spec import ServeSpec

    serve_spec = spec.serve or ServeSpec()
    settings = serve_spec.model_dump(mode="json", exclude={"route", "canary"}, exclude_none=True)
    name, route, version = spec.name, spec.route, str(version)
    common: dict[str, Any] = {"name": name}
    if workspace:
        common["workspace"] = workspace
    if tracking_uri:
        common["tracking_uri"] = tracking_uri
    import copy

    applications = [
        {"name": f"{name}-v{version}", "route_prefix": f"{route}/v/{version}",
         "import_path": "rayline.serve.app:build_app",
         "args": {**common, "version": version, "framework": spec.model.framework, **copy.deepcopy(settings)}},
        # Copies: the two apps sharing one dict would be written as YAML anchors (&id001, *id001).
        {"name": name, "route_prefix": route, "import_path": ROUTER_IMPORT_PATH,
         "args": {**common, "route": route, "champion": version, "framework": spec.model.framework,
                  **copy.deepcopy(settings)}},
    ]
    if with_v2:
        from rayline.serve.oip import OIP_APP, OIP_ROUTE
        from rayline.serve.router import oip_app, oip_route

        if serve_spec.oip:
            applications.append({"name": oip_app(name), "route_prefix": oip_route(name), "import_path": OIP_ROUTER_IMPORT_PATH,
                                 "args": {**common, "framework": spec.model.framework, **copy.deepcopy(settings)}})
        applications.append({"name": OIP_APP, "route_prefix": OIP_ROUTE, "import_path": "rayline.serve.oip:build_app"})
    config = {"proxy_location": "EveryNode", "http_options": {"host": host, "port": port}, "applications": applications}
    ServeDeploySchema.model_validate(config)  # what `serve deploy` will check, checked before writing
    return config


def write_config(config: dict, path: Optional[str], name: str, version: str) -> str:
    """YAML with a header saying what it serves and how to deploy it; to `path` (atomically) or the text."""
    import yaml

    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"# Ray Serve config for model {name} version {version}, written by `rayline serve export` ({when}).\n"
              "# Deploy on a running cluster with Ray's CLI:   serve deploy THIS_FILE --address http://HEAD:8265\n"
              "# or put `applications` into a KubeRay RayService's serveConfigV2. Roll out another version by\n"
              "# exporting it (or editing the version number: the app name, route and router's champion).\n")
    text = header + yaml.safe_dump(config, sort_keys=False)
    if path in (None, "-"):
        return text
    from rayline.files import atomic_write

    try:
        atomic_write(path, text)
    except OSError as exc:
        raise ServeError(f"--output: cannot write {path} ({exc.strerror or exc})") from exc
    return text


def build_router_app(args: dict[str, Any]):
    """Serve application builder for the router of a config file (`serve deploy`, RayService):
    args name, route, champion (a version number), the registry (workspace, tracking_uri), framework
    and the serve settings (the keys of the spec's `serve` section but route and canary: the route's
    replicas hold the champion's model and scale as its versions' do). Building it makes `champion` the version the model's routers send all traffic
    to and moves the MLflow `champion` alias there, as `rayline serve deploy NAME --version N` does:
    a config is declarative, so applying it again resets the split to what it says."""
    import json
    import uuid

    from rayline.serve.router import KV_NAMESPACE, build_router, routing_key

    # replicas_max: what configs written before the route held models said (now serve.replicas.max).
    settings = _builder_settings("build_router_app", args, required=("name", "route", "champion"),
                                 extra=("replicas_max",))
    name, champion = str(args["name"]), str(args["champion"])
    if not champion.isdigit():
        raise ServeError(f"build_router_app args.champion: a registered version number (got {champion!r})")
    from ray.experimental.internal_kv import _internal_kv_get

    from rayline.serve.routing_table import write_routing_table

    raw = _internal_kv_get(routing_key(name), namespace=KV_NAMESPACE)
    old = json.loads(raw) if raw else {}
    table = {"model": name, "route": str(args["route"]), "weights": {champion: 100}, "champion": champion,
             "canary": None, "gate": None, "rollout": uuid.uuid4().hex[:12], "revision": int(old.get("revision") or 0) + 1,
             "serve": settings}
    write_routing_table(name, table)  # as `rayline serve deploy` writes it: a new rollout drops an old gate decision
    if args.get("workspace") or args.get("tracking_uri"):
        _record_champion(name, champion, str(args["route"]), args)
        _start_retrain_loop(name, champion, args)
    return build_router(name, workspace=args.get("workspace"), tracking_uri=args.get("tracking_uri"),
                        framework=args.get("framework"), settings=settings)


def build_oip_router_app(args: dict[str, Any]):
    """Serve application builder for a model's own Open Inference Protocol application in a config file
    (`NAME-oip` at `/v2/models/NAME`): args name, the registry (workspace, tracking_uri), framework and the
    serve settings, as build_router_app's. Its replicas hold the live versions of the split the model's
    router application (NAME, build_router_app) records, and follow it; building it changes nothing."""
    from rayline.serve.router import build_router

    settings = _builder_settings("build_oip_router_app", args, required=("name",))
    return build_router(str(args["name"]), workspace=args.get("workspace"), tracking_uri=args.get("tracking_uri"),
                        framework=args.get("framework"), settings=settings, protocol="v2")


def _builder_settings(builder: str, args: dict, *, required: tuple, extra: tuple = ()) -> dict:
    """A config builder's args checked (unknown keys and missing ones are a ServeError naming them and
    what is allowed) -> its serve settings, validated as the spec's `serve` section."""
    from pydantic import ValidationError

    from rayline.spec import ServeSpec

    serve_keys = set(ServeSpec.model_fields) - {"route", "canary"}
    allowed = {*required, *extra, "workspace", "tracking_uri", "framework"} | serve_keys
    unknown = sorted(set(args) - allowed)
    missing = [k for k in required if not args.get(k)]
    if unknown or missing:
        raise ServeError(f"{builder} args: {'unknown keys ' + str(unknown) if unknown else 'missing ' + str(missing)} "
                         f"(allowed: {', '.join(sorted(allowed))})")
    settings = {k: v for k, v in args.items() if k in serve_keys}
    if args.get("replicas_max") and "replicas" not in settings:
        settings["replicas"] = {"max": int(args["replicas_max"])}
    try:
        return ServeSpec.model_validate(settings).model_dump(exclude={"route", "canary"})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ServeError(f"{builder} args: {problems}") from None


def _start_retrain_loop(name: str, champion: str, args: dict) -> None:
    """The champion's retrain loop, when the spec it was trained with has a `retrain` section, as
    `rayline serve deploy NAME --version N` starts it. Why here: a config is what a cluster applies
    again when it comes back (KubeRay's RayService after the head restarts, `serve deploy` on a new
    head), and the loop, a detached actor, was lost with the old head; it picks up from its record
    (a tag of the registered model). A running loop is found and handed the same spec. The loop is
    the endpoint's helper: a loop that cannot start is logged on the cluster, never a failed build."""
    import logging

    from rayline.retrain.loop import start_for_version

    line = start_for_version(name, champion, _config_workspace(args))
    if line:
        logging.getLogger("rayline.retrain").warning("rayline: %s", line)


def _config_workspace(args: dict):
    """The workspace a config's builder args name (`workspace`, `tracking_uri`)."""
    from rayline.serve.deployment_options import workspace_arg
    from rayline.workspace import workspace as make_workspace

    return make_workspace(workspace_arg(args.get("workspace")), args.get("tracking_uri"))


def _record_champion(name: str, champion: str, route: str, args: dict) -> None:
    """The MLflow record follows the config: alias champion -> `champion` (the old one onto the
    history that `rayline serve rollback` walks back), no canary, and the deployment on the
    version's record (`rayline models show`)."""
    from rayline.registry import Registry
    from rayline.serve.champions import champion_history, record_deployment, set_champion

    registry = Registry(_config_workspace(args))
    registry.resolve(name, champion)  # an unknown version fails the build, naming it
    old = registry.alias_version(name, "champion")
    if old != champion:
        set_champion(registry, name, champion, old, champion_history(registry, name))
    if registry.alias_version(name, "canary"):
        registry.delete_alias(name, "canary")
    record_deployment(registry, name, champion, action="config", role="champion", percent=100, route=route)
