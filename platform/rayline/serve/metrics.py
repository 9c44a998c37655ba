"""Prometheus metrics per model and version, exported beside Ray Serve's own.

Recorded on the replica with `ray.serve.metrics` (which adds the `application`,
`deployment` and `replica` tags); Ray's metrics agent on each node serves them in
Prometheus format at the node's metrics export port, each name prefixed `ray_`:

    ray_rayline_requests_total{model, version, endpoint, code}   every HTTP request
    ray_rayline_errors_total{model, version, endpoint, code}     those answered 4xx/5xx
    ray_rayline_request_latency_s_bucket{model, version, endpoint, le}
    ray_rayline_rows_predicted_total{model, version}             rows in answered predictions
    ray_rayline_batch_size_bucket{model, version, le}            rows per model call (batching)
    ray_rayline_model_info{model, version}                       1 per live replica

`endpoint` is the route relative to the app (predict, health, metadata, docs, openapi.json)
or `other`, so a scan of random paths cannot blow up the number of series.

Cost, measured on the 2-core development machine: one Ray metric record is ~3-5 us (its
Cython recorder, plus ~1 us of tag checks in Python); a request records two (three when it
fails) and the middleware adds ~1 us around them, ~10 us in all against a ~2 ms request.
tests/unit/test_serve_metrics.py measures it.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

__all__ = [
    "ENDPOINTS",
    "LATENCY_BOUNDARIES_S",
    "BATCH_SIZE_BOUNDARIES",
    "METRIC_NAMES",
    "ModelMetrics",
    "MetricsMiddleware",
    "install_metrics",
    "current",
    "observe_batch",
    "observe_rows",
]

ENDPOINTS = ("predict", "health", "metadata", "monitoring", "docs", "openapi.json")
# From well under the ~1 ms a tiny model costs up to the per-request timeout range.
LATENCY_BOUNDARIES_S = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
BATCH_SIZE_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384]
METRIC_NAMES = {
    "requests": "rayline_requests",
    "errors": "rayline_errors",
    "latency": "rayline_request_latency_s",
    "rows": "rayline_rows_predicted",
    "batch": "rayline_batch_size",
    "info": "rayline_model_info",
    # rayline/monitoring/live.py: drift of the live window against the training statistics
    "drift_psi": "rayline_drift_psi",
    "drift_nulls": "rayline_drift_null_share",
    "drift_outside": "rayline_drift_outside_share",
    "drift_alerts": "rayline_drift_alerts",
    "drift_window": "rayline_drift_window_rows",
}


class ModelMetrics:
    """The metrics of one served model version, recorded in this replica process.

    Also keeps plain per-replica totals (`snapshot()`): a dictionary increment, ~0.1 us.
    """

    def __init__(self, model: str, version: str):
        from ray.serve.metrics import Counter, Gauge, Histogram

        self.model, self.version = model, str(version)
        base = {"model": self.model, "version": self.version}
        per_route = ("model", "version", "endpoint", "code")
        self._requests = Counter(METRIC_NAMES["requests"], "HTTP requests to a rayline model, by endpoint and status code.",
                                 tag_keys=per_route)
        self._errors = Counter(METRIC_NAMES["errors"], "HTTP requests answered with a 4xx or 5xx status.", tag_keys=per_route)
        self._latency = Histogram(METRIC_NAMES["latency"], "Seconds from request to response inside the replica.",
                                  boundaries=LATENCY_BOUNDARIES_S, tag_keys=("model", "version", "endpoint"))
        self._rows = Counter(METRIC_NAMES["rows"], "Rows in answered predictions.", tag_keys=("model", "version"))
        self._batch = Histogram(METRIC_NAMES["batch"], "Rows per model call (one batch of merged requests).",
                                boundaries=BATCH_SIZE_BOUNDARIES, tag_keys=("model", "version"))
        info = Gauge(METRIC_NAMES["info"], "1 for each live replica serving this model version.", tag_keys=("model", "version"))
        for metric in (self._requests, self._errors, self._latency, self._rows, self._batch, info):
            metric.set_default_tags(dict(base))
        # Ray's metrics agent drops a gauge series not re-reported for two export intervals
        # (20 s by default; seen: the series vanished from a live replica's export), so
        # re-set it every second from a daemon thread: ~3 us a second.
        self._info = info
        self._closed = threading.Event()
        threading.Thread(target=self._keep_info_alive, name="rayline-model-info", daemon=True).start()
        # Tag dicts built once per (endpoint, code): no allocation per request.
        self._tags: dict[tuple[str, int], tuple[dict, dict]] = {}
        self._totals: dict[tuple[str, int], int] = {}
        self.rows_total = 0
        self.batches_total = 0

    def _keep_info_alive(self) -> None:
        while not self._closed.is_set():
            self._info.set(1)
            self._closed.wait(1.0)
        self._info.set(0)

    def close(self) -> None:
        """This version left the replica (a route replica switched versions): its info series says 0."""
        self._closed.set()

    def observe_request(self, endpoint: str, code: int, seconds: float) -> None:
        key = (endpoint, code)
        tags = self._tags.get(key)
        if tags is None:
            tags = self._tags[key] = ({"endpoint": endpoint, "code": str(code)}, {"endpoint": endpoint})
        self._requests.inc(1, tags[0])
        if code >= 400:
            self._errors.inc(1, tags[0])
        self._latency.observe(seconds, tags[1])
        self._totals[key] = self._totals.get(key, 0) + 1

    def observe_rows(self, rows: int) -> None:
        if rows > 0:
            self._rows.inc(rows)
            self.rows_total += rows

    def observe_batch(self, size: int) -> None:
        if size > 0:
            self._batch.observe(size)
            self.batches_total += 1

    def snapshot(self) -> dict:
        """This replica's totals since it started: {"requests": {"predict 200": n, ...}, ...}."""
        return {
            "model": self.model,
            "version": self.version,
            "requests": {f"{e} {c}": n for (e, c), n in sorted(self._totals.items())},
            "errors": sum(n for (_, c), n in self._totals.items() if c >= 400),
            "rows": self.rows_total,
            "batches": self.batches_total,
        }


def _endpoint(scope) -> str:
    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):  # Serve mounts the app at its route prefix
        path = path[len(root):]
    name = path.strip("/")
    return name if name in ENDPOINTS else "other"


class MetricsMiddleware:
    """ASGI middleware recording every HTTP request's endpoint, status code and latency.

    A plain ASGI wrapper, not Starlette's BaseHTTPMiddleware (which costs tens of
    microseconds and a task per request). Outermost, so 401s from the API-key check count.
    """

    def __init__(self, app, metrics: ModelMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # an exception before the response started is answered 500 by the server

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.observe_request(_endpoint(scope), status, time.perf_counter() - start)


_current: Optional[ModelMetrics] = None  # one model per replica process


def current() -> Optional[ModelMetrics]:
    """The metrics of the model this replica serves, once `install_metrics` ran."""
    return _current


def install_metrics(app, model: str, version: str) -> ModelMetrics:
    """Record `app`'s requests as model `model` version `version`. Call it after the other
    middleware (install_auth), so this one is outermost and counts every answer."""
    global _current
    _current = ModelMetrics(model, version)
    app.add_middleware(MetricsMiddleware, metrics=_current)
    return _current


def observe_rows(rows: int) -> None:
    """Count `rows` predicted (call once per answered prediction request). No-op before install."""
    if _current is not None:
        _current.observe_rows(rows)


def observe_batch(size: int) -> None:
    """Record one model call over `size` rows (the batching path calls it per batch). No-op before install."""
    if _current is not None:
        _current.observe_batch(size)
