"""The routers' table of a model, in Ray's internal KV: the split of the route's traffic between
live versions (weights, champion, canary and gate), written by a rollout and followed by every
replica of the model's route (rayline/serve/router.py says why the KV), and the replicas' acks of
the revision they serve, which a rollout waits for (`settle`).
"""

from __future__ import annotations

import json
import time
from typing import Optional

from rayline.errors import ServeError

__all__ = ["write_routing_table", "rollout_state", "forget_replicas", "forget_routing_table", "settle", "canary_counts"]


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
        from rayline.registry import Registry
        from rayline.serve.champions import ROLLBACK_TAG

        registry = Registry(ws)
        if registry.alias_version(name, "canary") == canary:
            registry.delete_alias(name, "canary")
        registry.set_model_tag(name, ROLLBACK_TAG, json.dumps(gate))
    return table


def forget_replicas(name: str) -> None:
    """Drop the acks of a deleted route's replicas: a new route's replicas say their own."""
    from ray.experimental.internal_kv import _internal_kv_del

    from rayline.serve.router import KV_NAMESPACE, ack_prefix

    _internal_kv_del(ack_prefix(name), del_by_prefix=True, namespace=KV_NAMESPACE)


def forget_routing_table(name: str) -> None:
    """Drop model `name`'s table, its gate's decision and its replicas' acks (its endpoint was deleted)."""
    from ray.experimental.internal_kv import _internal_kv_del

    from rayline.serve.router import KV_NAMESPACE, gate_key, routing_key

    for key in (routing_key(name), gate_key(name)):
        _internal_kv_del(key, namespace=KV_NAMESPACE)
    forget_replicas(name)


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


def canary_counts(name: str, rollout: str, version: str) -> tuple[int, int]:
    """(requests, errors) version `version` answered in rollout `rollout` of model `name`, summed over
    the route's running replicas as each last said (router.py's acks, at most ACK_EVERY_S old). A
    replica that stopped takes its counts with it: the sum only ever undercounts."""
    acks, running = _replica_acks(name), _running_route_replicas(name)
    requests = errors = 0
    for replica in running:
        ack = acks.get(replica) or {}
        if ack.get("rollout") != rollout:
            continue
        n, e = (ack.get("counts") or {}).get(str(version)) or (0, 0)
        requests, errors = requests + int(n), errors + int(e)
    return requests, errors


def settle(table: dict, timeout_s: float = 120.0) -> None:
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
