"""Rollouts of a registered model's versions on Ray Serve: deploy (as champion or canary),
promote, rollback, remove one version, delete the whole endpoint. Used by the CLI (`rayline serve
deploy|promote|rollback|remove|delete`) and by `rayline run`.

Layout on Serve, for model NAME served at ROUTE (rayline/serve/applications.py):
- application `NAME-vN` at `ROUTE/v/N`: version N's own ModelServer (build_app with version N).
  Serve routes the longest matching route prefix (ray/serve/_private/proxy_router.py and the
  HAProxy config, ray/serve/_private/haproxy.py), so `ROUTE/v/N/predict` reaches it directly;
- application `NAME` at `ROUTE`: the router (rayline/serve/router.py), which splits
  `ROUTE/predict` between live versions by weight.

The record is MLflow (rayline/serve/champions.py): aliases `champion`, `canary` (while one is
live) and `previous-champion`, the champion history and each version's deployments. The split
the routers follow is in Ray's internal KV (rayline/serve/routing_table.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Optional

from rayline.errors import ServeError
from rayline.registry import Registry
from rayline.serve.applications import (delete_apps, ensure_serve, live_versions, router_build_args, router_running,
                                        serve_apps, settings_record, start_early, start_router, start_version, version_app,
                                        version_route, wait_running)
from rayline.serve.champions import HISTORY_TAG, champion_history, record_deployment, set_champion
from rayline.serve.routing_table import rollout_state, settle, write_routing_table

__all__ = ["Rollout", "deploy", "promote", "rollback", "remove", "delete", "check_canary_percent"]


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


def check_canary_percent(value) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not float(value).is_integer() or not 1 <= int(value) <= 99:
        raise ServeError(f"--canary: percent of traffic for the canary outside 1..99 (got {value}; allowed: 1 to 99)")
    return int(value)


def deploy(name: str, version: str, *, ws, canary_percent: Optional[int] = None, gate: Optional[dict] = None,
           serve_spec=None, host: str = "127.0.0.1", port: int = 8000, created: Optional[list] = None,
           overrides: Optional[dict] = None) -> Rollout:
    """Start version `version` of model `name` (if not running) and route traffic to it: all of it,
    as the new champion, or `canary_percent` of it as a canary beside the champion (checked
    against `gate` = {max_error_rate, max_p99_ms, min_requests} when given).

    `serve_spec` (a ServeSpec): the versions' settings and route; default: those of the running
    router (else ServeSpec's defaults). `overrides` ({"serve.replicas.max": 4}, `--set`): set on
    those (serve_settings.with_serve_overrides); a running version with other settings is updated. `created` collects the Serve applications this call started,
    for a caller that cleans up after an interruption; a deploy that fails before the new split is
    written deletes them itself (no router left answering 503 for a version that never came up)."""
    from rayline.serve.address import serve_address, wait_routed
    from rayline.serve.settings import with_serve_overrides
    from rayline.spec import ServeSpec

    percent = check_canary_percent(canary_percent)
    created = created if created is not None else []
    address = serve_address(host, port)  # a port another process holds fails first, naming the holder
    registry = Registry(ws)
    mv = registry.resolve(name, str(version))  # unknown model or version: a one-line RegistryError
    version = mv.version
    apps = serve_apps()
    table = rollout_state(name, ws) if router_running(name, apps) else None
    if serve_spec is None:
        serve_spec = ServeSpec.model_validate((table or {}).get("serve") or {})
    if overrides:
        serve_spec = with_serve_overrides(serve_spec, overrides)
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
    ensure_serve(host, port)
    build_args = router_build_args(ws, mv.framework, settings)
    started = len(created)
    try:
        early = start_early(name, route, build_args, apps, created)
        # --set on a version already running with other settings: updated in place, and what changed is said.
        changes = start_version(name, version, route, settings, ws, mv.framework, created, update=bool(overrides),
                                registry=registry)
        if percent:  # a champion whose app was removed
            start_version(name, champion, route, settings, ws, mv.framework, created, registry=registry)
    except Exception:
        delete_apps(created[started:])
        del created[started:]
        raise
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
        start_router(name, route, build_args, serve_apps(), created)
    wait_running(early)
    settle(table)
    # RUNNING is a moment before the HTTP ingress routes the new prefixes: the URL printed next must answer.
    wait_routed(address, [route, version_route(route, version)], host)
    url = address.url(route, host)
    record_deployment(registry, name, version, action="deploy", role="canary" if percent else "champion",
                      percent=percent or 100, route=route, url=url, gate=gate if percent else None,
                      settings=settings_record(settings), changed=changes)
    if changes:
        message += f"; its serve settings changed in place: {', '.join(changes)}"
    return Rollout(name, route, table["champion"], table["canary"], weights, f"{message} ({url})", created, url)


def _gate_text(gate: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in gate.items() if v is not None)


def _current(name: str, ws) -> dict:
    apps = serve_apps()
    table = rollout_state(name, ws) if router_running(name, apps) else None
    if table is None:
        running = ", ".join(sorted(a for a in apps if router_running(a, apps))) or "none"
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
    registry = Registry(ws)
    old = table["champion"]
    set_champion(registry, name, canary, old, champion_history(registry, name))
    registry.delete_alias(name, "canary")
    new = {**table, "weights": {canary: 100}, "champion": canary, "canary": None, "gate": None,
           "rollout": uuid.uuid4().hex[:12], "revision": table["revision"] + 1}
    new.pop("rolled_back", None)
    write_routing_table(name, new)
    settle(new)
    record_deployment(registry, name, canary, action="promote", role="champion", percent=100, route=table["route"])
    return Rollout(name, table["route"], canary, None, new["weights"],
                   f"model {name}: version {canary} promoted to champion with 100% of traffic (was version {old})")


def rollback(name: str, *, ws) -> Rollout:
    """A live canary: all traffic back to the champion. None: the previous champion again."""
    table = _current(name, ws)
    registry = Registry(ws)
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
        start_version(name, previous, table["route"], table.get("serve") or {}, ws,
                       registry.resolve(name, previous).framework, created, registry=registry)
        registry.set_alias(name, "champion", previous)
        registry.set_model_tag(name, HISTORY_TAG, json.dumps(history))
        if history:
            registry.set_alias(name, "previous-champion", history[-1])
        else:
            registry.delete_alias(name, "previous-champion")
        new.update(weights={previous: 100}, champion=previous)
        message = f"model {name}: rolled back to version {previous} (champion, 100% of traffic; was version {champion})"
    write_routing_table(name, new)
    settle(new)
    if not canary:  # the previous champion has the route again (a canary's rollback leaves the champion as it was)
        record_deployment(registry, name, new["champion"], action="rollback", role="champion", percent=100,
                          route=table["route"])
    return Rollout(name, table["route"], new["champion"], None, new["weights"], message)


def remove(name: str, version: str, *, ws) -> str:
    """Delete version `version`'s application; refused while it holds traffic."""
    apps = serve_apps()
    live = live_versions(name, apps)
    version = str(version)
    if version not in live:
        raise ServeError(f"model {name}: version {version} is not deployed (got --version {version}; allowed: "
                         f"{', '.join(live) or 'none deployed'})")
    table = rollout_state(name, ws) if router_running(name, apps) else None
    if table:
        if version == table.get("champion"):
            raise ServeError(f"model {name}: version {version} is the champion (got --version {version}; allowed: another "
                             f"version, or deploy a new champion first)")
        if version == table.get("canary"):
            raise ServeError(f"model {name}: version {version} is the live canary (got --version {version}; allowed: "
                             f"rayline serve promote {name} or rayline serve rollback {name} first)")
        if table["weights"].get(version):
            raise ServeError(f"model {name}: version {version} still has {table['weights'][version]}% of traffic")
    delete_apps([version_app(name, version)])
    return f"model {name}: version {version} removed ({version_app(name, version)} deleted; still deployed: " \
           f"{', '.join(v for v in live if v != version) or 'none'})"


def delete(name: str, *, ws) -> str:
    """Take model `name` off Serve: its router, its versions' and its V2 applications, and the
    routing table its routers followed. The registry keeps every version and the champion alias
    (what is registered is not what is served): a later `serve deploy` serves it again. The shared
    /v2 application goes with the last model it serves. Its retrain loop is the caller's to stop
    first (`rayline serve delete` does): it would deploy a canary into the endpoint being deleted."""
    from rayline.serve.oip import OIP_APP
    from rayline.serve.router import oip_app
    from rayline.serve.routing_table import forget_routing_table

    apps = serve_apps()
    mine = [a for a in (name, oip_app(name), *(version_app(name, v) for v in live_versions(name, apps))) if a in apps]
    table = rollout_state(name, ws) or {}
    if not mine and not table:
        served = sorted(a for a in apps if router_running(a, apps))
        raise ServeError(f"model {name}: not served on this cluster (got {name!r}; allowed: "
                         f"{', '.join(served) or 'none served'})")
    others = [a for a in apps if a not in mine and router_running(a, apps)]
    shared = [OIP_APP] if OIP_APP in apps and not others else []
    delete_apps(mine + shared)
    forget_routing_table(name)
    registry = Registry(ws)
    if registry.alias_version(name, "canary"):
        registry.delete_alias(name, "canary")  # no canary is live any more; the champion alias stays
    for version, percent in (table.get("weights") or {}).items():
        record_deployment(registry, name, version, action="delete", role="deleted", percent=0,
                          route=table.get("route") or f"/{name}", was_percent=percent)
    return f"model {name}: deleted from Serve ({', '.join(mine + shared) or 'nothing was running'}); its registered " \
           f"versions are kept"
