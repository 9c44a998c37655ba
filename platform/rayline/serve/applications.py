"""A model's Serve applications: `NAME-vN` at `ROUTE/v/N` (version N's ModelServer, built by
rayline/serve/app.py), the router `NAME` at `ROUTE` and the V2 applications; starting them,
waiting until they run, deleting them. Serve routes the longest matching route prefix, so
`ROUTE/v/N/predict` reaches version N directly.
"""

from __future__ import annotations

import json
import re
import time
from typing import Optional

from rayline.errors import ServeError
from rayline.serve.routing_table import forget_replicas

__all__ = ["version_app", "version_route", "serve_apps", "live_versions", "router_running", "ensure_serve",
           "wait_for_replica_resources", "start_version", "running_settings", "settings_changes", "settings_record", "delete_apps", "router_build_args", "start_early",
           "wait_running", "start_router"]


def version_app(name: str, version: str) -> str:
    return f"{name}-v{version}"


def version_route(route: str, version: str) -> str:
    return f"{route}/v/{version}"


def serve_apps() -> dict:
    from rayline.serve.details import serve_status

    try:
        return serve_status().applications
    except Exception:  # noqa: BLE001 - Serve not started on this cluster: nothing served
        return {}


def live_versions(name: str, apps: Optional[dict] = None) -> list[str]:
    """Versions of `name` with an application of their own, oldest first."""
    pattern = re.compile(rf"^{re.escape(name)}-v(\d+)$")
    found = [m.group(1) for a in (apps if apps is not None else serve_apps()) if (m := pattern.match(a))]
    return sorted(found, key=int)


def router_running(name: str, apps: dict) -> bool:
    app = apps.get(name)
    return app is not None and f"{name}-router" in app.deployments


def ensure_serve(host: str, port: int):
    """Where Serve answers once started (`rayline.serve.address`): an already-running Serve's own
    address (with a warning when another was asked for), else Serve started at (host, port)."""
    from ray import serve

    from rayline.serve.address import serve_address

    address = serve_address(host, port)
    if not address.existing:
        from ray.exceptions import RayActorError

        try:
            serve.start(http_options={"host": host, "port": port})
        except RayActorError:
            # Serve's controller killed a proxy whose start-up health checks timed out (seen on a 2-core
            # machine at load average 10: "HAProxyManager ... killed by `ray.kill`") and starts it again;
            # serve.start only waited on the first one. Wait for the controller's proxies instead.
            _wait_proxies_healthy()
    return address


def _wait_proxies_healthy(timeout_s: float = 120.0) -> None:
    from rayline.serve.details import serve_status

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            proxies = serve_status().proxies
        except Exception:  # noqa: BLE001 - the controller is still coming up
            proxies = {}
        if proxies and all(str(getattr(p, "value", p)) == "HEALTHY" for p in proxies.values()):
            return
        if time.monotonic() > deadline:
            raise ServeError(f"Serve's HTTP proxies not healthy after {timeout_s:g} s (got {proxies or 'none'}; "
                             "allowed: a machine with CPU time to spare for Serve's start; see `ray status`)")
        time.sleep(0.5)


def wait_for_replica_resources(name: str, cpus: float, replicas: int, timeout_s: float = 60.0) -> None:
    """Fail fast, naming the resource, instead of letting Serve wait forever for CPUs."""
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
                f"serve.resources_per_replica.cpus: {replicas} replica(s) of {name} need {need:g} CPUs; the cluster has "
                f"{available:g} available after {timeout_s:g}s (allowed: lower serve.resources_per_replica.cpus or serve.replicas.min, or free CPUs)"
            )
        time.sleep(0.5)

def start_version(name: str, version: str, route: str, settings: dict, ws, framework: str, created: list,
                  update: bool = False, registry=None) -> list[str]:
    """Application NAME-vN, answering. One that already runs is left as it is, unless `update` (the
    user changed settings: `serve deploy --set`) and it runs with other settings: then it is updated
    in place through Serve's own update of the application (the old replicas serve until the new
    ones answer); the changes come back as 'replicas.max: 2 -> 4', [] when nothing changed."""
    from ray import serve

    from rayline.serve.app import build_app
    from rayline.spec import ServeSpec

    app = version_app(name, version)
    current = serve_apps().get(app)
    spec = ServeSpec.model_validate(settings)
    running = current is not None and str(getattr(current.status, "value", current.status)) == "RUNNING"
    changes = settings_changes(running_settings(name, version), spec.model_dump()) if running and update else []
    if running and not changes:
        return []
    args = {"name": name, "version": version, "workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override,
            "framework": framework or None, **settings}
    if not running:
        wait_for_replica_resources(app, spec.resources_per_replica.cpus, max(1, spec.replicas.min))
        created.append(app)
    _record_files(name, version, ws, registry)
    try:
        serve.run(build_app(args), name=app, route_prefix=version_route(route, version), blocking=False)
        return changes
    except Exception as exc:
        from rayline.serve.details import deployment_failure

        reason = deployment_failure(app) or str(exc).strip().splitlines()[-1]
        if not running:  # an update that Serve refused leaves the running application as it was
            delete_apps([app])
            created.remove(app)
        raise ServeError(f"deploying {name} v{version} at {version_route(route, version)} failed: {reason}") from exc


def _record_files(name: str, version: str, ws, registry) -> None:
    """The version's files where its replicas (and the route's) load them without MLflow
    (rayline/serve/version_files.py). A failure here only leaves them the registry's way, which
    reports the same problem itself."""
    from rayline.serve.version_files import record_version_files

    try:
        if registry is None:
            from rayline.registry import Registry

            registry = Registry(ws)
        record_version_files(registry, registry.resolve(name, version))
    except Exception as exc:  # noqa: BLE001 - see above
        import logging

        logging.getLogger(__name__).debug("rayline: version files of %s v%s not recorded: %s", name, version, exc)


def running_settings(name: str, version: str) -> dict | None:
    """The serve settings version `version`'s application was last built with (router.py's record)."""
    from ray.experimental.internal_kv import _internal_kv_get

    from rayline.serve.router import KV_NAMESPACE, version_settings_key

    raw = _internal_kv_get(version_settings_key(name, str(version)), namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None


def settings_changes(before: dict | None, after: dict) -> list[str]:
    """'replicas.max: 2 -> 4' for each setting that differs (nested keys dotted); a version recorded
    before settings were (None) counts as unchanged: nothing to compare."""
    if before is None:
        return []
    old, new = _flat(before), _flat(after)
    return [f"{key}: {json.dumps(old.get(key))} -> {json.dumps(new.get(key))}"
            for key in sorted(set(old) | set(new)) if key != "debug_infer_delay_s" and old.get(key) != new.get(key)]


def settings_record(settings: dict) -> dict:
    """The settings that differ from ServeSpec's defaults, dotted: what a deployment record keeps
    (the whole mapping is ~750 characters, and the record keeps its newest entries within a tag's size)."""
    from rayline.spec import ServeSpec

    defaults = _flat(ServeSpec().model_dump(exclude={"route", "canary"}))
    return {k: v for k, v in _flat(settings).items() if defaults.get(k, object()) != v}


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def delete_apps(apps: list, timeout_s: float = 60.0) -> None:
    """Delete Serve applications, all at once, and wait until they are gone (best effort: what is
    still listed after `timeout_s` is left to Serve). One blocking delete after another took ~3 s
    an application on the 2-core machine; asked together they go in about the time of one."""
    from ray import serve

    asked = []
    for app in apps:
        try:
            serve.delete(app, _blocking=False)
            asked.append(app)
        except Exception:  # noqa: BLE001 - best effort
            pass
    deadline = time.monotonic() + timeout_s
    while asked and time.monotonic() < deadline:
        listed = serve_apps()
        asked = [a for a in asked if a in listed]
        if asked:
            time.sleep(0.2)


def router_build_args(ws, framework: Optional[str], settings: dict) -> dict:
    return {"workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override, "framework": framework or None,
            "settings": settings}


def start_early(name: str, route: str, router_args: dict, apps: dict, created: list) -> list[str]:
    """Start the model's router (when it has none yet) and the Open Inference Protocol app (/v2,
    one for every model on this Serve) without waiting for them, so that their replicas start
    while the version's loads: one after another, the three took 13 s of a 2-core run's deploy.
    A new router finds no table (a stale one is dropped) and answers 503 until `deploy` writes it."""
    from ray import serve

    from rayline.serve.oip import OIP_APP, OIP_ROUTE, build_app as build_oip
    from rayline.serve.router import KV_NAMESPACE, build_router, oip_app, oip_route, routing_key

    targets = []
    if not router_running(name, apps):
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(routing_key(name), namespace=KV_NAMESPACE)  # a deleted router's old split
        forget_replicas(name)
        targets.append(serve.RunTarget(build_router(name, **router_args), name=name, route_prefix=route))
    if router_args["settings"].get("oip", True) and oip_app(name) not in apps:
        # The model's own V2 application: replicas holding the live versions, as the route's do.
        targets.append(serve.RunTarget(build_router(name, **router_args, protocol="v2"), name=oip_app(name),
                                       route_prefix=oip_route(name)))
    oip = apps.get(OIP_APP)
    if oip is None or _status_text(oip) in ("DEPLOY_FAILED", "DELETING"):
        targets.append(serve.RunTarget(build_oip(), name=OIP_APP, route_prefix=OIP_ROUTE))
    if targets:
        created.extend(t.name for t in targets)
        serve.run_many(targets, wait_for_applications_running=False)
    return [t.name for t in targets]


def _status_text(app) -> str:
    return str(getattr(app.status, "value", app.status))


def wait_running(names: list, timeout_s: float = 120.0) -> None:
    """Until every app in `names` is RUNNING; a one-line ServeError naming the one that failed."""
    deadline = time.monotonic() + timeout_s
    waiting = list(names)
    while waiting:
        apps = serve_apps()
        for app in list(waiting):
            status = _status_text(apps[app]) if app in apps else "NOT_STARTED"
            if status == "RUNNING":
                waiting.remove(app)
            elif status in ("DEPLOY_FAILED", "UNHEALTHY"):
                from rayline.serve.details import deployment_failure

                raise ServeError(f"Serve application {app} failed to start: "
                                 f"{deployment_failure(app) or getattr(apps[app], 'message', '') or status}")
        if waiting and time.monotonic() > deadline:
            raise ServeError(f"Serve applications {', '.join(waiting)} not running after {timeout_s:g} s")
        if waiting:
            time.sleep(0.2)


def start_router(name: str, route: str, router_args: dict, apps: dict, created: list) -> None:
    if router_running(name, apps):
        return
    from ray import serve

    from rayline.serve.router import build_router

    created.append(name)
    forget_replicas(name)
    serve.run(build_router(name, **router_args), name=name, route_prefix=route, blocking=False)
