"""Rollouts of a registered model's versions on Ray Serve: deploy (as champion or canary),
promote, rollback, remove. Used by the CLI (`rayline serve deploy|promote|rollback|remove`) and
by `rayline run`.

Layout on Serve, for model NAME served at ROUTE:
- application `NAME-vN` at `ROUTE/v/N`: version N's own ModelServer (build_app with version N).
  Serve routes the longest matching route prefix (ray/serve/_private/proxy_router.py and the
  HAProxy config, ray/serve/_private/haproxy.py), so `ROUTE/v/N/predict` reaches it directly;
- application `NAME` at `ROUTE`: the router (rayline/serve/router.py), which splits
  `ROUTE/predict` between live versions by weight.

The record is MLflow: aliases `champion`, `canary` (while one is live) and `previous-champion`,
with the registered-model tag `rayline.champion_history` (JSON list, oldest first) so rollback
knows where to go; and on each version the deployments that gave it traffic (deploy, promote,
rollback to it: when, route, app, role and share; the version tag `rayline.deployments`, which
`rayline models show` prints). The split the routers follow is in Ray's internal KV (router.py
says why).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from rayline.errors import ServeError

__all__ = ["Rollout", "deploy", "promote", "rollback", "remove", "rollout_state", "version_app", "version_route",
           "live_versions", "record_deployment", "HISTORY_TAG", "ROLLBACK_TAG"]

HISTORY_TAG = "rayline.champion_history"
ROLLBACK_TAG = "rayline.canary_rolled_back"


@dataclass
class Rollout:
    name: str
    route: str
    champion: Optional[str]
    canary: Optional[str]
    weights: dict
    message: str  # one line: what changed
    created: list = field(default_factory=list)  # Serve applications this call started
    url: str = ""  # the route's URL (deploy only)


def version_app(name: str, version: str) -> str:
    return f"{name}-v{version}"


def version_route(route: str, version: str) -> str:
    return f"{route}/v/{version}"


# ---------------------------------------------------------------- the KV (the routers' table)


def _kv_get(key: bytes) -> Optional[dict]:
    from ray.experimental.internal_kv import _internal_kv_get

    from rayline.serve.router import KV_NAMESPACE

    raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None


def write_routing_table(name: str, table: dict) -> None:
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    from rayline.serve.router import KV_NAMESPACE, gate_key, routing_key

    if table.get("rollout") != (_kv_get(routing_key(name)) or {}).get("rollout"):
        _internal_kv_del(gate_key(name), namespace=KV_NAMESPACE)  # a new rollout is judged afresh
    _internal_kv_put(routing_key(name), json.dumps(table).encode(), overwrite=True, namespace=KV_NAMESPACE)


def _apps() -> dict:
    from ray import serve

    try:
        return serve.status().applications
    except Exception:  # noqa: BLE001 - Serve not started on this cluster: nothing served
        return {}


def live_versions(name: str, apps: Optional[dict] = None) -> list[str]:
    """Versions of `name` with an application of their own, oldest first."""
    pattern = re.compile(rf"^{re.escape(name)}-v(\d+)$")
    found = [m.group(1) for a in (apps if apps is not None else _apps()) if (m := pattern.match(a))]
    return sorted(found, key=int)


def _router_running(name: str, apps: dict) -> bool:
    app = apps.get(name)
    return app is not None and f"{name}-router" in app.deployments


def rollout_state(name: str, ws=None) -> Optional[dict]:
    """The routers' table of `name` with the gate's decision (None when `name` has no router).
    With `ws`, a canary the gate rolled back loses its MLflow alias here (the router cannot reach
    MLflow; the decision is recorded in the KV at once and in MLflow at the next look)."""
    from rayline.serve.router import canary_share_to_champion, gate_key, routing_key

    table = _kv_get(routing_key(name))
    if table is None:
        return None
    gate = _kv_get(gate_key(name))
    if gate and gate.get("rollout") == table.get("rollout") and table.get("canary"):
        if ws is None:  # a look only: the next call with the registry records it
            weights = canary_share_to_champion(table["weights"], table["canary"], table["champion"])
            return {**table, "weights": weights, "canary": None, "gate": None, "rolled_back": gate}
        table = _settle_trip(name, table, gate, ws)
    return table


def _settle_trip(name: str, table: dict, gate: dict, ws) -> dict:
    """The gate tripped: the table says so for good (canary out, decision kept under rolled_back)."""
    from rayline.serve.router import canary_share_to_champion

    canary = table["canary"]
    weights = canary_share_to_champion(table["weights"], canary, table["champion"])
    table = {**table, "weights": weights, "canary": None, "gate": None, "revision": table["revision"] + 1,
             "rolled_back": gate}
    # Same rollout id: the routers already follow the decision; the gate record stays with it.
    from ray.experimental.internal_kv import _internal_kv_put

    from rayline.serve.router import KV_NAMESPACE, routing_key

    _internal_kv_put(routing_key(name), json.dumps(table).encode(), overwrite=True, namespace=KV_NAMESPACE)
    if ws is not None:
        registry = _registry(ws)
        if registry.alias_version(name, "canary") == canary:
            registry.delete_alias(name, "canary")
        registry.set_model_tag(name, ROLLBACK_TAG, json.dumps(gate))
    return table


# ---------------------------------------------------------------- Serve applications


def _registry(ws):
    from rayline.registry import Registry

    return Registry(ws)


def _ensure_serve(host: str, port: int):
    from ray import serve

    from rayline.serve.address import ServeAddress, running_serve_http, serve_address

    running = running_serve_http()
    if running is not None:  # the cluster's Serve answers where it already does
        return ServeAddress(running[0], running[1], existing=True)
    address = serve_address(host, port)
    if not address.existing:
        serve.start(http_options={"host": host, "port": port})
    return address


def _start_version(name: str, version: str, route: str, settings: dict, ws, framework: str, created: list) -> None:
    """Application NAME-vN, answering, unless it already runs."""
    from ray import serve

    from rayline.serve.app import wait_for_replica_resources, build_app

    app = version_app(name, version)
    current = _apps().get(app)
    if current is not None and str(getattr(current.status, "value", current.status)) == "RUNNING":
        return
    args = {"name": name, "version": version, "workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override,
            "framework": framework or None, **settings}
    from rayline.spec import ServeSpec

    spec = ServeSpec.model_validate(settings)
    wait_for_replica_resources(app, spec.resources_per_replica.cpus, max(1, spec.replicas.min))
    created.append(app)
    try:
        serve.run(build_app(args), name=app, route_prefix=version_route(route, version), blocking=False)
    except Exception as exc:
        from rayline.serve.details import deployment_failure

        reason = deployment_failure(app) or str(exc).strip().splitlines()[-1]
        _delete([app])
        created.remove(app)
        raise ServeError(f"deploying {name} v{version} at {version_route(route, version)} failed: {reason}") from exc


def _delete(apps: list) -> None:
    from ray import serve

    for app in apps:
        try:
            serve.delete(app)
        except Exception:  # noqa: BLE001 - best effort
            pass


def _router_args(ws, framework: Optional[str], settings: dict) -> dict:
    return {"workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override, "framework": framework or None,
            "settings": settings}


def _start_early(name: str, route: str, router_args: dict, apps: dict, created: list) -> list[str]:
    """Start the model's router (when it has none yet) and the Open Inference Protocol app (/v2,
    one for every model on this Serve) without waiting for them, so that their replicas start
    while the version's loads: one after another, the three took 13 s of a 2-core run's deploy.
    A new router finds no table (a stale one is dropped) and answers 503 until `deploy` writes it."""
    from ray import serve

    from rayline.serve.oip import OIP_APP, OIP_ROUTE, build_app as build_oip
    from rayline.serve.router import KV_NAMESPACE, build_router, oip_app, oip_route, routing_key

    targets = []
    if not _router_running(name, apps):
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(routing_key(name), namespace=KV_NAMESPACE)  # a deleted router's old split
        _forget_replicas(name)
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


def _wait_running(names: list, timeout_s: float = 120.0) -> None:
    """Until every app in `names` is RUNNING; a one-line ServeError naming the one that failed."""
    deadline = time.monotonic() + timeout_s
    waiting = list(names)
    while waiting:
        apps = _apps()
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


def _start_router(name: str, route: str, router_args: dict, apps: dict, created: list) -> None:
    if _router_running(name, apps):
        return
    from ray import serve

    from rayline.serve.router import build_router

    created.append(name)
    _forget_replicas(name)
    serve.run(build_router(name, **router_args), name=name, route_prefix=route, blocking=False)


def _forget_replicas(name: str) -> None:
    """Drop the acks of a deleted route's replicas: a new route's replicas say their own."""
    from ray.experimental.internal_kv import _internal_kv_del

    from rayline.serve.router import KV_NAMESPACE, ack_prefix

    _internal_kv_del(ack_prefix(name), del_by_prefix=True, namespace=KV_NAMESPACE)


def _replica_acks(name: str) -> dict[str, dict]:
    """Replica id -> what that route replica last said it serves (router.py's acks)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    from rayline.serve.router import KV_NAMESPACE, ack_prefix

    prefix = ack_prefix(name)
    acks = {}
    for key in _internal_kv_list(prefix, namespace=KV_NAMESPACE):
        raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw:
            acks[key[len(prefix):].decode()] = json.loads(raw)
    return acks


def _running_route_replicas(name: str) -> set[str]:
    """Ids of the RUNNING replicas of the model's route and of its own V2 application (both follow
    the split). Ids, not a count: a replica being replaced may still ack the new split as it goes."""
    from rayline.serve.router import oip_app
    from rayline.serve.details import serve_details

    apps = serve_details().get("applications") or {}
    running = set()
    for app_name in (name, oip_app(name)):
        deployment = ((apps.get(app_name) or {}).get("deployments") or {}).get(f"{name}-router") or {}
        running |= {r["replica_id"] for r in deployment.get("replicas") or () if str(r.get("state")).endswith("RUNNING")}
    return running


def _settle(table: dict, timeout_s: float = 120.0) -> None:
    """Until every running replica of the model's route serves the table's revision (each loads
    the versions it names first, then switches; replicas/ID acks in the KV, router.py), so the
    command returns once the new split is what callers get. A replica that cannot load a version
    is a ServeError naming it; the replicas keep serving the split they had."""
    from rayline.serve.router import POLL_S

    name, revision = table["model"], int(table["revision"])
    deadline = time.monotonic() + timeout_s
    time.sleep(POLL_S)
    while True:
        acks, running = _replica_acks(name), _running_route_replicas(name)
        behind = [r for r in running if int((acks.get(r) or {}).get("revision") or 0) < revision]
        failed = [acks[r]["error"] for r in behind if (acks.get(r) or {}).get("error")]
        if failed:
            raise ServeError(f"model {name}: the route's replicas cannot load the new split ({failed[0]}); they keep "
                             f"serving the previous one")
        if running and not behind:
            return
        if time.monotonic() > deadline:
            raise ServeError(f"model {name}: the route's replicas do not serve revision {revision} after {timeout_s:g} s "
                             f"({len(behind)} of {len(running)} still behind)")
        time.sleep(POLL_S / 2)


def champion_history(registry, name: str) -> list:
    with registry._guard(f"read tags of model {name!r}"):
        tags = registry.client.get_registered_model(name).tags or {}
    try:
        return [str(v) for v in json.loads(tags.get(HISTORY_TAG) or "[]")]
    except ValueError:
        return []


def set_champion(registry, name: str, new: str, old: Optional[str], history: list) -> None:
    """Alias champion -> new; the old champion goes on the history (alias previous-champion)."""
    if old and old != new:
        history = [*history, old]
    registry.set_model_tag(name, HISTORY_TAG, json.dumps(history[-50:]))
    registry.set_alias(name, "champion", new)
    if history:
        registry.set_alias(name, "previous-champion", history[-1])
    else:
        registry.delete_alias(name, "previous-champion")


def record_deployment(registry, name: str, version: str, *, action: str, role: str, percent: int, route: str,
                      **extra) -> None:
    """One entry on version `version`'s deployment record (registry.DEPLOYMENTS_TAG): it was given
    `percent`% of `route`'s traffic as `role` by `action`, now (UTC)."""
    entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "action": action, "role": role,
             "percent": percent, "route": route, "app": version_app(name, version),
             **{k: v for k, v in extra.items() if v}}
    registry.record_deployment(name, version, entry)


def _percent(value) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not float(value).is_integer() or not 1 <= int(value) <= 99:
        raise ServeError(f"--canary: percent of traffic for the canary outside 1..99 (got {value}; allowed: 1 to 99)")
    return int(value)


def deploy(name: str, version: str, *, ws, canary_percent: Optional[int] = None, gate: Optional[dict] = None,
           serve_spec=None, host: str = "127.0.0.1", port: int = 8000, created: Optional[list] = None) -> Rollout:
    """Start version `version` of model `name` (if not running) and route traffic to it: all of it,
    as the new champion, or `canary_percent` of it as a canary beside the champion (checked
    against `gate` = {max_error_rate, max_p99_ms, min_requests} when given).

    `serve_spec` (a ServeSpec): the versions' settings and route; default: those of the running
    router (else ServeSpec's defaults). `created` collects the Serve applications this call started,
    for a caller that cleans up after an interruption."""
    from rayline.spec import ServeSpec

    percent = _percent(canary_percent)
    created = created if created is not None else []
    registry = _registry(ws)
    mv = registry.resolve(name, str(version))  # unknown model or version: a one-line RegistryError
    version = mv.version
    apps = _apps()
    table = rollout_state(name, ws) if _router_running(name, apps) else None
    if serve_spec is None:
        serve_spec = ServeSpec.model_validate((table or {}).get("serve") or {})
    route = serve_spec.route or (table or {}).get("route") or f"/{name}"
    settings = serve_spec.model_dump(exclude={"route", "canary"})
    champion = registry.alias_version(name, "champion")
    if percent:
        if champion is None:
            raise ServeError(f"model {name}: no champion to split traffic with (got --canary {percent}; allowed: deploy a "
                             f"champion first: rayline serve deploy {name} --version N)")
        if champion == version:
            raise ServeError(f"model {name}: version {version} is the champion already (got --version {version} --canary "
                             f"{percent}; allowed: another version)")
    address = _ensure_serve(host, port)
    router_args = _router_args(ws, mv.framework, settings)
    early = _start_early(name, route, router_args, apps, created)
    _start_version(name, version, route, settings, ws, mv.framework, created)
    if percent:
        _start_version(name, champion, route, settings, ws, mv.framework, created)  # a champion whose app was removed
    rollout = uuid.uuid4().hex[:12]
    history = champion_history(registry, name)
    if percent:
        weights = {champion: 100 - percent, version: percent}
        new = {"champion": champion, "canary": version, "gate": gate}
        registry.set_alias(name, "canary", version)
        message = f"model {name}: version {version} is the canary with {percent}% of traffic at {route}, " \
                  f"version {champion} (champion) has {100 - percent}%" + (f"; gate {_gate_text(gate)}" if gate else "")
    else:
        weights = {version: 100}
        new = {"champion": version, "canary": None, "gate": None}
        set_champion(registry, name, version, champion, history)
        if registry.alias_version(name, "canary"):
            registry.delete_alias(name, "canary")
        message = f"model {name}: version {version} is the champion with 100% of traffic at {route}" + (
            f" (was version {champion})" if champion and champion != version else "")
    table = {"model": name, "route": route, "weights": weights, **new, "rollout": rollout,
             "revision": int((table or {}).get("revision") or 0) + 1, "serve": settings}
    write_routing_table(name, table)
    if name not in early:
        _start_router(name, route, router_args, _apps(), created)
    _wait_running(early)
    _settle(table)
    url = address.url(route, host)
    record_deployment(registry, name, version, action="deploy", role="canary" if percent else "champion",
                      percent=percent or 100, route=route, url=url, gate=gate if percent else None)
    return Rollout(name, route, table["champion"], table["canary"], weights, f"{message} ({url})", created, url)


def _gate_text(gate: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in gate.items() if v is not None)


def _current(name: str, ws) -> dict:
    apps = _apps()
    table = rollout_state(name, ws) if _router_running(name, apps) else None
    if table is None:
        running = ", ".join(sorted(a for a in apps if _router_running(a, apps))) or "none"
        raise ServeError(f"model {name}: no rollout is served on this cluster (got {name!r}; routed models: {running}; "
                         f"allowed: rayline serve deploy {name} --version N first)")
    return table


def promote(name: str, *, ws) -> Rollout:
    """The live canary becomes the champion, with all traffic."""
    table = _current(name, ws)
    canary = table.get("canary")
    if not canary:
        gone = table.get("rolled_back")
        why = (f"; version {gone['version']} was rolled back by the gate at {gone['at']}: {gone['detail']}"
               if gone and gone.get("version") else "")
        raise ServeError(f"model {name}: no canary to promote (champion is version {table['champion']}{why}; allowed: "
                         f"rayline serve deploy {name} --version N --canary PERCENT first)")
    registry = _registry(ws)
    old = table["champion"]
    set_champion(registry, name, canary, old, champion_history(registry, name))
    registry.delete_alias(name, "canary")
    new = {**table, "weights": {canary: 100}, "champion": canary, "canary": None, "gate": None,
           "rollout": uuid.uuid4().hex[:12], "revision": table["revision"] + 1}
    new.pop("rolled_back", None)
    write_routing_table(name, new)
    _settle(new)
    record_deployment(registry, name, canary, action="promote", role="champion", percent=100, route=table["route"])
    return Rollout(name, table["route"], canary, None, new["weights"],
                   f"model {name}: version {canary} promoted to champion with 100% of traffic (was version {old})")


def rollback(name: str, *, ws) -> Rollout:
    """A live canary: all traffic back to the champion. None: the previous champion again."""
    table = _current(name, ws)
    registry = _registry(ws)
    champion, canary = table["champion"], table.get("canary")
    new = {**table, "canary": None, "gate": None, "rollout": uuid.uuid4().hex[:12], "revision": table["revision"] + 1}
    new.pop("rolled_back", None)
    if canary:
        new["weights"] = {champion: 100}
        registry.delete_alias(name, "canary")
        message = f"model {name}: canary version {canary} rolled back; version {champion} (champion) has 100% of traffic"
    else:
        history = [v for v in champion_history(registry, name) if v != champion]
        if not history:
            raise ServeError(f"model {name}: nothing to roll back to (champion is version {champion}, no canary is live "
                             f"and no previous champion is recorded; allowed: rayline serve deploy {name} --version N)")
        previous = history.pop()
        created: list = []
        _start_version(name, previous, table["route"], table.get("serve") or {}, ws,
                       registry.resolve(name, previous).framework, created)
        registry.set_alias(name, "champion", previous)
        registry.set_model_tag(name, HISTORY_TAG, json.dumps(history))
        if history:
            registry.set_alias(name, "previous-champion", history[-1])
        else:
            registry.delete_alias(name, "previous-champion")
        new.update(weights={previous: 100}, champion=previous)
        message = f"model {name}: rolled back to version {previous} (champion, 100% of traffic; was version {champion})"
    write_routing_table(name, new)
    _settle(new)
    if not canary:  # the previous champion has the route again (a canary's rollback leaves the champion as it was)
        record_deployment(registry, name, new["champion"], action="rollback", role="champion", percent=100,
                          route=table["route"])
    return Rollout(name, table["route"], new["champion"], None, new["weights"], message)


def remove(name: str, version: str, *, ws) -> str:
    """Delete version `version`'s application; refused while it holds traffic."""
    apps = _apps()
    live = live_versions(name, apps)
    version = str(version)
    if version not in live:
        raise ServeError(f"model {name}: version {version} is not deployed (got --version {version}; allowed: "
                         f"{', '.join(live) or 'none deployed'})")
    table = rollout_state(name, ws) if _router_running(name, apps) else None
    if table:
        if version == table.get("champion"):
            raise ServeError(f"model {name}: version {version} is the champion (got --version {version}; allowed: another "
                             f"version, or deploy a new champion first)")
        if version == table.get("canary"):
            raise ServeError(f"model {name}: version {version} is the live canary (got --version {version}; allowed: "
                             f"rayline serve promote {name} or rayline serve rollback {name} first)")
        if table["weights"].get(version):
            raise ServeError(f"model {name}: version {version} still has {table['weights'][version]}% of traffic")
    _delete([version_app(name, version)])
    return f"model {name}: version {version} removed ({version_app(name, version)} deleted; still deployed: " \
           f"{', '.join(v for v in live if v != version) or 'none'})"
