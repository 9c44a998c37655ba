"""The route of one model: `ROUTE/predict` (and every other route under ROUTE) is answered by a
live version picked by weight; `ROUTE/v/N/...` never comes here (Serve routes the longest
matching route prefix to version N's own application, see rayline/serve/versions.py).

The route's replicas hold the live versions' models in-process: the champion's, and during a
canary the canary's too, each in the same request stack as its own replica (serve/stack.py:
validation, body limit, queue limit, API keys, metrics). A request is picked a version by weight
and answered by that version's stack in this replica, plus `x-rayline-version: N`. No second hop:
forwarding every request over a deployment handle to the version's replica cost 1.6 ms at p50 and
60% of the throughput on the 2-core machine (issue 23), and Ray's gRPC path between replicas
refused bodies over 4 MB before the version's body limit could answer.

Where the split lives: Ray's internal KV (GCS), key `rayline/routing/NAME`, written by the driver
(rayline/serve/routing_table.py) and read by every route replica every `POLL_S` in a thread of its
own. A new split whose versions this replica has not loaded is loaded there first (from the
registry, with the settings version N was deployed with, `rayline/versions/NAME/N`), then switched
to in one assignment: requests never wait for a model load and never see a half-built table.
Each replica says which revision it serves under `rayline/routing/NAME/replicas/ID` (and again
every `ACK_EVERY_S`), so `rayline serve deploy|promote|rollback` return once every RUNNING replica
(by id, from Serve's details) follows the new split. Not the deployment's `user_config`: in Ray 2.60 `serve.run` gives each deployment
a fresh random code version unless one is set, and setting one (`Deployment.options(version=...)`)
is removed from the public API (ray/serve/_private/client.py, deployment.py), so a redeploy with
a new user_config restarts the replicas; and even an in-place reconfigure takes a replica out of
routing while it is UPDATING (deployment_state.get_running_replica_infos keeps RUNNING replicas
only) — with one replica that is a window of failed requests. A KV read changes nothing on
Serve's side.

The metric gate: each replica counts, per version, answered requests, errors (5xx; a 4xx is the
client's fault) and the canary's latencies. Once `min_requests` canary requests are in, a canary
over `max_error_rate` or `max_p99_ms` loses its traffic at once, and the decision goes to the KV
(`rayline/routing/NAME/gate`), which every replica (and a restarted one) reads and follows. The
KV, not a named actor: it is already there on every Ray cluster, survives replica restarts, needs
no actor to keep alive or find, and the driver reads it without a handle.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import random
import re
import threading
import time
from typing import Optional

from ray import serve

from rayline.serve.asgi_call import HANDED_INSTANCES
from rayline.serve.kv_namespace import KV_NAMESPACE  # re-exported: routing_table, applications, export

__all__ = ["RoutingTable", "Router", "build_router", "oip_app", "oip_route", "routing_key", "gate_key", "ack_prefix", "version_settings_key",
           "record_version_settings", "KV_NAMESPACE", "VERSION_HEADER", "POLL_S", "ACK_EVERY_S", "evaluate_gate",
           "canary_share_to_champion"]

VERSION_HEADER = b"x-rayline-version"
POLL_S = 0.25  # how soon every replica follows a new split: one KV read (~0.3 ms) per replica per poll
LATENCY_WINDOW = 10_000  # canary latencies kept for the p99 (most recent)
ACK_EVERY_S = 2.0  # a replica re-says which revision it serves (and why a load failed) at least this often
RETRY_LOAD_S = 5.0  # a version that failed to load is tried again after this long, not every poll
RETIRE_S = 30.0  # a stack replaced by one with new settings is closed this long after: its requests in flight finish
log = logging.getLogger("ray.serve")


def routing_key(name: str) -> bytes:
    return f"rayline/routing/{name}".encode()


def gate_key(name: str) -> bytes:
    return f"rayline/routing/{name}/gate".encode()


def oip_app(name: str) -> str:
    """The application answering the Open Inference Protocol for model `name` in-process (serve.oip)."""
    return f"{name}-oip"


def oip_route(name: str) -> str:
    return f"/v2/models/{name}"


def ack_prefix(name: str) -> bytes:
    """Keys `PREFIX + replica id`: {"revision", "versions", "error", "at", "rollout", "counts"} of each
    route replica (counts: version -> [requests, errors] in this rollout)."""
    return f"rayline/routing/{name}/replicas/".encode()


def version_settings_key(name: str, version: str) -> bytes:
    return f"rayline/versions/{name}/{version}".encode()


def record_version_settings(name: str, version: str, settings: dict) -> None:
    """The serve settings version `version` of `name` is deployed with (written where its
    application is built), so the model's route serves it with the same ones."""
    from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

    if not _internal_kv_initialized():  # built outside a Ray job (a config check): nothing serves it here
        return
    _internal_kv_put(version_settings_key(name, str(version)), json.dumps(settings).encode(), overwrite=True,
                     namespace=KV_NAMESPACE)


class RoutingTable:
    """The split as written by versions.py: weights per version (percent, summing to 100), the
    champion, the canary (or None), the canary's gate limits and the rollout id the gate applies to."""

    def __init__(self, data: dict):
        self.data = data
        self.weights = {str(v): int(w) for v, w in (data.get("weights") or {}).items()}
        self.champion = data.get("champion")
        self.canary = data.get("canary")
        self.gate = data.get("gate")
        self.rollout = data.get("rollout")
        self.revision = int(data.get("revision") or 0)
        if self.weights and sum(self.weights.values()) != 100:
            raise ValueError(f"weights must sum to 100 (got {self.weights})")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError(f"weights must be >= 0 (got {self.weights})")

    def effective(self, tripped: Optional[dict]) -> dict[str, int]:
        """Weights with a tripped canary's share moved to the champion."""
        weights = dict(self.weights)
        if tripped and self.canary and tripped.get("rollout") == self.rollout and self.champion:
            weights = canary_share_to_champion(weights, self.canary, self.champion)
        return {v: w for v, w in weights.items() if w > 0}


def canary_share_to_champion(weights: dict, canary: str, champion: str) -> dict:
    """`weights` with the canary's share added to the champion's and the canary gone."""
    moved = {v: w for v, w in weights.items() if v != canary}
    moved[champion] = moved.get(champion, 0) + weights.get(canary, 0)
    return moved


def evaluate_gate(gate: dict, count: int, errors: int, latencies_ms: list) -> Optional[tuple[str, str]]:
    """(limit, explanation) when the canary broke a limit over at least min_requests requests, else None."""
    if not gate or count < int(gate.get("min_requests") or 1):
        return None
    rate = errors / count if count else 0.0
    max_rate = gate.get("max_error_rate")
    if max_rate is not None and rate > float(max_rate):
        return "max_error_rate", f"error rate {rate:.3g} > max_error_rate {float(max_rate):g} over {count} requests"
    max_p99 = gate.get("max_p99_ms")
    if max_p99 is not None and latencies_ms:
        ordered = sorted(latencies_ms)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        if p99 > float(max_p99):
            return "max_p99_ms", f"p99 {p99:.1f} ms > max_p99_ms {float(max_p99):g} over {count} requests"
    return None


class _Stats:
    __slots__ = ("requests", "errors", "latencies_ms")

    def __init__(self):
        self.requests, self.errors, self.latencies_ms = 0, 0, []

    def as_dict(self) -> dict:
        lat = sorted(self.latencies_ms)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
        return {"requests": self.requests, "errors": self.errors, "p99_ms": p99}


def _json(status: int, payload: dict, extra=()) -> tuple[int, list, bytes]:
    return status, [(b"content-type", b"application/json"), *extra], json.dumps(payload).encode()


async def _answer(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _Routes:
    """What requests are picked from: versions, cumulative weights and each version's stack.
    Immutable once built; the replica swaps the whole object when the split changes."""

    __slots__ = ("table", "tripped", "versions", "cumulative", "stacks")

    def __init__(self, table: RoutingTable, tripped: Optional[dict], stacks: dict):
        self.table, self.tripped, self.stacks = table, tripped, stacks
        weights = {v: w for v, w in table.effective(tripped).items() if v in stacks}
        self.versions = list(weights)
        total, self.cumulative = 0, []
        for v in self.versions:
            total += weights[v]
            self.cumulative.append(total)

    def pick(self) -> Optional[str]:
        if not self.versions:
            return None
        if len(self.versions) == 1:
            return self.versions[0]
        return self.versions[bisect.bisect_right(self.cumulative, random.random() * self.cumulative[-1])]


@serve.deployment(max_ongoing_requests=256, health_check_period_s=10)
@serve.ingress()
class Router:
    """Ingress of application NAME: answers each request with a live version picked by weight,
    from that version's model held in this replica."""

    def __init__(self, name: str, workspace: Optional[str] = None, tracking_uri: Optional[str] = None,
                 settings: Optional[dict] = None, protocol: str = "rayline"):
        from rayline.serve.auth import load_api_keys
        from rayline.serve.limits import AdmissionSlots
        from rayline.spec import ServeSpec

        self.name, self.workspace, self.tracking_uri = name, workspace, tracking_uri
        self.protocol = protocol  # "rayline": ROUTE/...; "v2": /v2/models/NAME/... (the Open Inference Protocol)
        settings = dict(settings or {})
        # Keys read here, on the replica (serve/auth.py says why); first, so missing keys fail fast.
        self.api_keys = load_api_keys(settings["auth"]) if settings.get("auth") else None
        self.settings = ServeSpec.model_validate({k: v for k, v in settings.items() if k in ServeSpec.model_fields})
        s = self.settings
        self.slots = AdmissionSlots(s.max_ongoing_requests, s.max_queued_requests, s.retry_after_s)  # one per replica
        self.stats: dict[str, _Stats] = {}
        self.stacks: dict = {}  # version -> VersionStack, loaded in this replica
        self.built_with: dict = {}  # version -> the recorded settings (raw) its stack was built with
        self.failed: dict[str, tuple[float, str]] = {}  # version -> (when, why) its load last failed
        self.routes = _Routes(RoutingTable({}), None, {})
        self.error: Optional[str] = None
        try:
            from ray.serve import get_replica_context

            self.replica_id = get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Serve (unit tests): any unique name will do
            import uuid

            self.replica_id = uuid.uuid4().hex[:8]
        self._last_ack = 0.0
        self._sync(self._read_kv())  # the first split's models before the first request
        self._stop = threading.Event()
        threading.Thread(target=self._follow, name=f"rayline-route-{name}", daemon=True).start()

    # ---------------------------------------------------------------- the table

    def _read_kv(self):
        from ray.experimental.internal_kv import _internal_kv_get

        table = _internal_kv_get(routing_key(self.name), namespace=KV_NAMESPACE)
        gate = _internal_kv_get(gate_key(self.name), namespace=KV_NAMESPACE)
        return table, gate

    def _follow(self) -> None:
        """The replica's thread: read the KV every POLL_S and follow it."""
        while not self._stop.wait(POLL_S):
            try:
                self._sync(self._read_kv())
            except Exception as exc:  # noqa: BLE001 - a bad read keeps the last good table
                log.warning("rayline route %s: reading the split failed: %s", self.name, exc)

    def _sync(self, raw) -> None:
        table_raw, gate_raw = raw
        current = self.routes
        table = current.table
        if table_raw is not None:
            data = json.loads(table_raw)
            if int(data.get("revision") or 0) != table.revision or not table.data:
                table = RoutingTable(data)
        tripped = json.loads(gate_raw) if gate_raw else None
        tripped = tripped if tripped and tripped.get("rollout") == table.rollout else None
        if tripped is None and current.tripped and current.tripped.get("rollout") == table.rollout:
            tripped = current.tripped  # this replica's own trip, not in the KV yet
        if table is not current.table or (tripped or None) != (current.tripped or None):
            wanted = list(table.effective(tripped))
            self._load(wanted)
            missing = [v for v in wanted if v not in self.stacks]
            self.error = "; ".join(f"version {v}: {self.failed[v][1]}" for v in missing if v in self.failed) or None
            if not missing:
                if table.rollout != current.table.rollout or table.canary != current.table.canary:
                    self.stats = {}  # a new rollout is judged on its own requests
                self.routes = _Routes(table, tripped, {v: self.stacks[v] for v in wanted})  # one assignment: old or new
                self._drop(set(wanted))
                self._ack(force=True)
                return
        self._ack()

    def _load(self, versions: list) -> None:
        """Load each version in `versions` not held yet (a failure is retried after RETRY_LOAD_S)."""
        from ray.experimental.internal_kv import _internal_kv_get

        for version in versions:
            # `rayline serve deploy --set` rebuilds a version's application with new settings and
            # records them: a held stack built with other settings is built again, then swapped in.
            raw = _internal_kv_get(version_settings_key(self.name, version), namespace=KV_NAMESPACE)
            if version in self.stacks and self.built_with.get(version) == raw:
                continue
            failed = self.failed.get(version)
            if failed and time.monotonic() - failed[0] < RETRY_LOAD_S:
                continue
            try:
                old = self.stacks.get(version)
                self.stacks[version], self.built_with[version] = self._build(version, raw), raw
                if old is not None:  # requests already routed to it finish on it first
                    threading.Timer(RETIRE_S, old.close).start()
                self.failed.pop(version, None)
            except Exception as exc:  # noqa: BLE001 - keep serving what is loaded; say why in the ack
                why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                self.failed[version] = (time.monotonic(), why)
                log.warning("rayline route %s: loading version %s failed: %s", self.name, version, why)

    def _build(self, version: str, raw: bytes | None):
        """Version `version`'s request stack, with the settings it was deployed with (`raw`: as recorded)."""
        from rayline.serve.stack import build_stack
        from rayline.serve.version_files import load_version
        from rayline.spec import ServeSpec

        settings = json.loads(raw) if raw else self.settings.model_dump()
        delay_s = float(settings.pop("debug_infer_delay_s", 0.0) or 0.0)  # test-only, see serve/stack.py
        spec = ServeSpec.model_validate(settings)
        predictor, resolved = load_version(self.name, version, self.workspace, self.tracking_uri)
        return build_stack(predictor, resolved, spec, self.api_keys, delay_s=delay_s, slots=self.slots)

    def _drop(self, keep: set) -> None:
        for version in [v for v in self.stacks if v not in keep]:
            self.stacks.pop(version).close()

    def _ack(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_ack < ACK_EVERY_S:
            return
        from ray.experimental.internal_kv import _internal_kv_put

        routes = self.routes
        # The rollout's requests and errors per version in this replica: what promotes a canary that
        # stayed within its gate (rayline/serve/routing_table.py canary_counts, the retrain loop).
        counts = {v: [s.requests, s.errors] for v, s in self.stats.items()}
        ack = {"revision": routes.table.revision, "versions": routes.versions, "error": self.error, "at": now,
               "rollout": routes.table.rollout, "counts": counts}
        _internal_kv_put(ack_prefix(self.name) + self.replica_id.encode(), json.dumps(ack).encode(), overwrite=True,
                         namespace=KV_NAMESPACE)
        self._last_ack = now

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        # Serve calls __del__ as the replica stops: its monitoring entries leave the shared window now
        # rather than going stale in 30 s (rayline/monitoring/live.py).
        for stack in list(getattr(self, "stacks", {}).values()):
            if stack.monitor is not None:
                stack.monitor.close()

    # ---------------------------------------------------------------- the gate

    def _record(self, version: str, failed: bool, ms: float) -> None:
        stats = self.stats.get(version)
        if stats is None:
            stats = self.stats[version] = _Stats()
        stats.requests += 1
        stats.errors += failed
        routes = self.routes
        if version != routes.table.canary or routes.tripped:
            return
        lat = stats.latencies_ms
        lat.append(ms)
        if len(lat) > LATENCY_WINDOW:
            del lat[: len(lat) - LATENCY_WINDOW]
        n = stats.requests
        gate = routes.table.gate
        # Checked at every canary request up to 1000 (a sort of <= 1000 floats, ~0.1 ms), then every 50th.
        if gate and n >= int(gate.get("min_requests") or 1) and (n <= 1000 or n % 50 == 0):
            broke = evaluate_gate(gate, n, stats.errors, lat)
            if broke:
                self._trip(version, *broke, n, stats.errors)

    def _trip(self, version: str, limit: str, detail: str, requests: int, errors: int) -> None:
        routes = self.routes
        decision = {"rollout": routes.table.rollout, "version": version, "limit": limit, "detail": detail,
                    "requests": requests, "errors": errors,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # This replica at once (the champion is loaded: it had traffic); the others within POLL_S, from the KV.
        self.routes = _Routes(routes.table, decision, routes.stacks)

        def put():
            from ray.experimental.internal_kv import _internal_kv_put

            # overwrite=False: the first replica's decision (and its numbers) is the one recorded.
            _internal_kv_put(gate_key(self.name), json.dumps(decision).encode(), overwrite=False, namespace=KV_NAMESPACE)

        asyncio.get_running_loop().run_in_executor(None, put)

    # ---------------------------------------------------------------- requests

    def routing(self) -> dict:
        routes = self.routes
        table = routes.table
        return {"model": self.name, "revision": table.revision, "weights": table.weights,
                "effective_weights": table.effective(routes.tripped), "champion": table.champion,
                "canary": table.canary, "gate": table.gate, "rollout": table.rollout, "tripped": routes.tripped,
                "loaded": sorted(self.stacks, key=int), "error": self.error,
                "stats": {v: s.as_dict() for v, s in self.stats.items()}}

    async def _route(self, scope, receive, send) -> None:
        path, root = scope["path"], scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        routes = self.routes
        if path.startswith("/v/"):  # a version with no application of its own (any live one has a longer route)
            wanted = path.split("/")[2]
            live = ", ".join(sorted(routes.table.weights, key=int)) or "none"
            return await _answer(send, *_json(404, {"detail": f"version {wanted} of model {self.name} is not deployed "
                                                              f"(got {wanted}; allowed: {live})"}))
        if path == "/-/routing":
            return await _answer(send, *_json(200, self.routing()))
        version = routes.pick()
        if version is None:
            return await _answer(send, *_json(503, {"detail": f"model {self.name}: no version is deployed yet"},
                                              [(b"retry-after", b"1")]))
        header = (VERSION_HEADER, version.encode())
        status = 500

        async def send_named(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        started = time.perf_counter()
        try:
            stack = routes.stacks[version]
            await (stack.handed if HANDED_INSTANCES in scope else stack.app)(scope, receive, send_named)
        finally:
            self._record(version, status >= 500, (time.perf_counter() - started) * 1000)

    async def call_http(self, method: str, path: str, headers: list | None = None, body: bytes = b"",
                        query: bytes = b"", extra_scope: dict | None = None):
        """Same contract as ModelServer.call_http, on the split: a `HttpResult` from the version picked.
        `extra_scope`: an in-process caller's hand-over (serve/asgi_call.py), never sent over a handle."""
        from rayline.serve.asgi_call import call_asgi

        return await call_asgi(self._asgi, method, path, headers=headers or (), body=body, query=query,
                               extra_scope=extra_scope)

    async def _asgi(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        await self._route(scope, receive, send)

    def __serve_build_asgi_app__(self):
        if self.protocol == "v2":
            return self._oip_asgi()

        async def app(scope, receive, send):  # a plain function: uvicorn took the bound method for ASGI2
            await self._asgi(scope, receive, send)

        return app

    def _oip_asgi(self):
        """The Open Inference Protocol app (serve/oip.py) over this replica's own versions: mounted at
        /v2/models/NAME, it sees paths as the shared /v2 app does (root_path /v2)."""
        from rayline.serve.oip import LocalApps, build_oip_app

        oip = build_oip_app(LocalApps(self), max_body_bytes=self.settings.max_body_bytes)
        answer_infer = oip.state.answer_infer
        infer_path = re.compile(rf"/v2/models/{re.escape(self.name)}(?:/versions/([^/]+))?/infer/?")

        async def app(scope, receive, send):
            if scope["type"] == "http":
                scope = {**scope, "root_path": "/v2"}
                if scope["method"] == "POST" and (match := infer_path.fullmatch(scope["path"])):
                    return await answer_infer(scope, receive, send, self.name, match.group(1))
            await oip(scope, receive, send)

        return app


def build_router(name: str, *, workspace: Optional[str] = None, tracking_uri: Optional[str] = None,
                 framework: Optional[str] = None, settings: Optional[dict] = None, protocol: str = "rayline"):
    """The route deployment of model `name` (bind it as application NAME at the model's route, or with
    protocol "v2" as application oip_app(NAME) at oip_route(NAME)): its replicas reserve what the
    versions' replicas do and autoscale as the spec says, since every request to the route is
    answered in them."""
    from rayline.serve.deployment_options import deployment_options, workspace_arg
    from rayline.spec import ServeSpec

    settings = {k: v for k, v in (settings or {}).items() if k in ServeSpec.model_fields and k not in ("route", "canary")}
    spec = ServeSpec.model_validate(settings)
    options = deployment_options(spec, framework, f"{name}-router")
    return Router.options(**options).bind(name, workspace_arg(workspace), tracking_uri,
                                          spec.model_dump(exclude={"route", "canary"}), protocol)
