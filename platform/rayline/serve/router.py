"""The traffic router of one model: `ROUTE/predict` (and every other route under ROUTE) goes to a
live version picked by weight; `ROUTE/v/N/...` never comes here (Serve routes the longest
matching route prefix to version N's own application, see rayline/serve/versions.py).

The router is a raw ASGI app (no FastAPI: it is on every request's path) that forwards the
request's method, path, headers (API keys too), body and query to the chosen version's
`ModelServer.call_http` over a deployment handle and returns its status, headers and body
unchanged, plus `x-rayline-version: N`.

Where the split lives: Ray's internal KV (GCS), key `rayline/routing/NAME`, written by the driver
(rayline/serve/versions.py) and read by every router replica every `POLL_S`. Not the deployment's
`user_config`: in Ray 2.60 `serve.run` gives each deployment a fresh random code version unless
one is set, and setting one (`Deployment.options(version=...)`) is removed from the public API
(ray/serve/_private/client.py, deployment.py), so a redeploy with a new user_config restarts the
router's replicas; and even an in-place reconfigure takes a replica out of routing while it is
UPDATING (deployment_state.get_running_replica_infos keeps RUNNING replicas only) — with one router
replica that is a window of failed requests. A KV read changes nothing on Serve's side.

The metric gate: each replica counts, per version, answered requests, errors (5xx and handle
failures; a 4xx is the client's fault) and the canary's latencies. Once `min_requests` canary
requests are in, a canary over `max_error_rate` or `max_p99_ms` loses its traffic at once, and the
decision goes to the KV (`rayline/routing/NAME/gate`), which every replica (and a restarted one)
reads and follows. The KV, not a named actor: it is already there on every Ray cluster, survives
router restarts, needs no actor to keep alive or find, and the driver reads it without a handle.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
import time
from typing import Optional

from ray import serve

__all__ = ["RoutingTable", "Router", "build_router", "routing_key", "gate_key", "KV_NAMESPACE", "VERSION_HEADER",
           "POLL_S", "evaluate_gate", "canary_share_to_champion"]

KV_NAMESPACE = "rayline"
VERSION_HEADER = b"x-rayline-version"
POLL_S = 0.25  # how soon every replica follows a new split: one KV read (~0.3 ms) per replica per poll
LATENCY_WINDOW = 10_000  # canary latencies kept for the p99 (most recent)


def routing_key(name: str) -> bytes:
    return f"rayline/routing/{name}".encode()


def gate_key(name: str) -> bytes:
    return f"rayline/routing/{name}/gate".encode()


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


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.05})
@serve.ingress()
class Router:
    """Ingress of application NAME: forwards each request to a version picked by weight."""

    def __init__(self, name: str):
        self.name = name
        self.table = RoutingTable({})
        self.tripped: Optional[dict] = None
        self.handles: dict = {}
        self.stats: dict[str, _Stats] = {}
        self._cumulative: list[int] = []
        self._versions: list[str] = []
        self._load()  # first table before the first request
        self._poller = None

    # ---------------------------------------------------------------- the table

    def _read_kv(self):
        from ray.experimental.internal_kv import _internal_kv_get

        table = _internal_kv_get(routing_key(self.name), namespace=KV_NAMESPACE)
        gate = _internal_kv_get(gate_key(self.name), namespace=KV_NAMESPACE)
        return table, gate

    def _load(self, raw=None) -> None:
        table_raw, gate_raw = raw if raw is not None else self._read_kv()
        if table_raw is None:
            return
        data = json.loads(table_raw)
        if int(data.get("revision") or 0) != self.table.revision or not self.table.data:
            table = RoutingTable(data)
            if table.rollout != self.table.rollout or table.canary != self.table.canary:
                self.stats = {}  # a new rollout is judged on its own requests
            self.table = table
        tripped = json.loads(gate_raw) if gate_raw else None
        self.tripped = tripped if tripped and tripped.get("rollout") == self.table.rollout else None
        self._apply()

    def _apply(self) -> None:
        weights = self.table.effective(self.tripped)
        for v in weights:
            if v not in self.handles:
                # _check_exists=False: a router may start before the versions its table names (a
                # Serve config deploys every app at once; `deploy` starts the router early); calls
                # then wait for the version's replicas instead of failing this replica's start.
                self.handles[v] = serve.get_deployment_handle(f"{self.name}-model", f"{self.name}-v{v}",
                                                              _check_exists=False)
        self._versions = list(weights)
        total, self._cumulative = 0, []
        for v in self._versions:
            total += weights[v]
            self._cumulative.append(total)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                self._load(await asyncio.to_thread(self._read_kv))
            except Exception:  # noqa: BLE001 - a bad read keeps the last good table
                pass

    def _pick(self) -> Optional[str]:
        if not self._versions:
            return None
        if len(self._versions) == 1:
            return self._versions[0]
        return self._versions[bisect.bisect_right(self._cumulative, random.random() * self._cumulative[-1])]

    # ---------------------------------------------------------------- the gate

    def _record(self, version: str, failed: bool, ms: float) -> None:
        stats = self.stats.get(version)
        if stats is None:
            stats = self.stats[version] = _Stats()
        stats.requests += 1
        stats.errors += failed
        if version != self.table.canary or self.tripped:
            return
        lat = stats.latencies_ms
        lat.append(ms)
        if len(lat) > LATENCY_WINDOW:
            del lat[: len(lat) - LATENCY_WINDOW]
        n = stats.requests
        gate = self.table.gate
        # Checked at every canary request up to 1000 (a sort of <= 1000 floats, ~0.1 ms), then every 50th.
        if gate and n >= int(gate.get("min_requests") or 1) and (n <= 1000 or n % 50 == 0):
            broke = evaluate_gate(gate, n, stats.errors, lat)
            if broke:
                self._trip(version, *broke, n, stats.errors)

    def _trip(self, version: str, limit: str, detail: str, requests: int, errors: int) -> None:
        decision = {"rollout": self.table.rollout, "version": version, "limit": limit, "detail": detail,
                    "requests": requests, "errors": errors,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.tripped = decision
        self._apply()  # this replica at once; the others within POLL_S, from the KV

        def put():
            from ray.experimental.internal_kv import _internal_kv_put

            # overwrite=False: the first replica's decision (and its numbers) is the one recorded.
            _internal_kv_put(gate_key(self.name), json.dumps(decision).encode(), overwrite=False, namespace=KV_NAMESPACE)

        asyncio.get_running_loop().run_in_executor(None, put)

    # ---------------------------------------------------------------- requests

    def routing(self) -> dict:
        return {"model": self.name, "revision": self.table.revision, "weights": self.table.weights,
                "effective_weights": self.table.effective(self.tripped), "champion": self.table.champion,
                "canary": self.table.canary, "gate": self.table.gate, "rollout": self.table.rollout,
                "tripped": self.tripped, "stats": {v: s.as_dict() for v, s in self.stats.items()}}

    async def forward(self, method: str, path: str, headers, body: bytes, query: bytes):
        """(status, headers, body) of `path` on a version picked by weight."""
        from rayline.serve.asgi_call import HttpResult

        if self._poller is None:  # first request: the table may have changed since __init__
            self._poller = asyncio.get_running_loop().create_task(self._poll())
            self._load(await asyncio.to_thread(self._read_kv))
        if path.startswith("/v/"):  # a version with no application of its own (any live one has a longer route)
            wanted = path.split("/")[2]
            live = ", ".join(sorted(self.table.weights, key=int)) or "none"
            return HttpResult(*_json(404, {"detail": f"version {wanted} of model {self.name} is not deployed "
                                                     f"(got {wanted}; allowed: {live})"}))
        if path == "/-/routing":
            return HttpResult(*_json(200, self.routing()))
        version = self._pick()
        if version is None:
            return HttpResult(*_json(503, {"detail": f"model {self.name}: no version is deployed yet"}))
        started = time.perf_counter()
        try:
            result = await self.handles[version].call_http.remote(method, path, list(headers), body, query)
        except Exception as exc:  # noqa: BLE001 - the version's replica died or timed out: a 503, counted
            self._record(version, True, (time.perf_counter() - started) * 1000)
            return HttpResult(*_json(503, {"detail": f"model {self.name} version {version} did not answer "
                                                     f"({type(exc).__name__}); retry"},
                                     [(VERSION_HEADER, version.encode())]))
        self._record(version, result.status >= 500, (time.perf_counter() - started) * 1000)
        return HttpResult(result.status, [*result.headers, (VERSION_HEADER, version.encode())], result.body)

    async def call_http(self, method: str, path: str, headers: list | None = None, body: bytes = b"",
                        query: bytes = b""):
        """Same contract as ModelServer.call_http, on the split: a `HttpResult` from the version picked."""
        return await self.forward(method, path, [(bytes(k).lower(), bytes(v)) for k, v in headers or ()], body, query)

    def __serve_build_asgi_app__(self):
        async def app(scope, receive, send):
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
            chunks = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            path, root = scope["path"], scope.get("root_path") or ""
            if root and path.startswith(root):
                path = path[len(root):] or "/"
            status, headers, body = await self.forward(scope["method"], path, scope.get("headers") or [],
                                                       b"".join(chunks), scope.get("query_string") or b"")
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app


def build_router(name: str, replicas_max: int = 2):
    """The router deployment of model `name` (bind it as application NAME at the model's route)."""
    return Router.options(
        name=f"{name}-router",
        autoscaling_config={"min_replicas": 1, "initial_replicas": 1, "max_replicas": max(1, replicas_max),
                            "target_ongoing_requests": 32},
    ).bind(name)
