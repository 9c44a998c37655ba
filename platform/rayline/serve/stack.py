"""One model version's request stack in a replica: the HTTP API (serve/http.py) with its model call
(batched or not), inside the queue limit (429), the API-key check (401) and the metrics, in that
order from the inside out.

Both kinds of replica build it the same way, so a request meets the same validation, limits,
keys, metrics and error bodies on every route users can call:
- version N's own replica (`ModelServer`, serve/app.py, at `ROUTE/v/N`): one stack;
- the model's route replica (`Router`, serve/router.py, at `ROUTE`): one stack per live version
  (the champion's, and the canary's while one is live), which share one queue limit — the replica
  has one set of slots whichever version a request is routed to.
"""

from __future__ import annotations

import asyncio
from typing import Optional

__all__ = ["VersionStack", "build_stack"]


class VersionStack:
    """What `build_stack` returns: the outermost ASGI app, the same middleware around `/predict` for an
    in-process hand-over (`handed`), the FastAPI app inside, the version's metrics (per-version
    counters in this process) and its predictor."""

    __slots__ = ("app", "handed", "http_app", "metrics", "predictor", "version", "monitor")

    def __init__(self, app, handed, http_app, metrics, predictor, version: str, monitor=None):
        self.app, self.handed, self.http_app = app, handed, http_app
        self.metrics, self.predictor, self.version, self.monitor = metrics, predictor, version, monitor

    def close(self) -> None:
        """The version left this replica: its model-info series stops saying it is live here, and
        its monitoring stops."""
        self.metrics.close()
        if self.monitor is not None:
            self.monitor.close()


def _make_infer(predictor, batching, metrics, delay_s: float):
    if batching.enabled:
        from rayline.serve.batching import Batcher

        infer = Batcher(predictor.infer, batching.max_batch_size, batching.wait_timeout_ms / 1000.0,
                        on_batch=metrics.observe_batch)
    else:
        async def infer(x, alone=False):
            metrics.observe_batch(len(x))  # unbatched: every request is its own model call
            return predictor.infer(x)
    if not delay_s:
        return infer

    async def slow(x, alone=False):  # test-only (build_app arg debug_infer_delay_s): a slower model
        await asyncio.sleep(delay_s)
        return await infer(x, alone)

    return slow


def build_stack(predictor, version: str, settings, api_keys: Optional[list], *, delay_s: float = 0.0,
                slots=None) -> VersionStack:
    """The stack of `predictor` (version `version`) under `settings` (a ServeSpec). `slots`: an
    `AdmissionSlots` shared with other stacks of this replica (default: its own)."""
    from rayline.serve.auth import BearerAuthMiddleware
    from rayline.serve.http import build_http_app
    from rayline.serve.limits import AdmissionLimit, AdmissionSlots
    from rayline.serve.metrics import MetricsMiddleware, ModelMetrics

    metrics = ModelMetrics(predictor.name, version)
    monitor = _make_monitor(predictor, version, settings.monitoring)
    http_app = build_http_app(predictor, version, settings.max_instances,
                              infer=_make_infer(predictor, settings.batching, metrics, delay_s),
                              max_body_bytes=settings.max_body_bytes, request_timeout_s=settings.request_timeout_s,
                              on_rows=metrics.observe_rows, monitor=monitor)
    if slots is None:
        slots = AdmissionSlots(settings.max_ongoing_requests, settings.max_queued_requests, settings.retry_after_s)

    def guarded(inner):
        app = AdmissionLimit(inner, slots=slots)  # innermost
        if api_keys is not None:
            app = BearerAuthMiddleware(app, keys=list(api_keys))  # outside the queue: refused callers never wait for a slot
        return MetricsMiddleware(app, metrics=metrics)  # outermost: 401s are counted too

    # `handed`: POST /predict only, for rows decoded in this process (the V2 route), behind the same
    # slots, keys and metrics as `app`.
    return VersionStack(guarded(http_app), guarded(http_app.state.predict_handed), http_app, metrics, predictor, version,
                        monitor)


def _make_monitor(predictor, version: str, spec):
    """The version's LiveMonitor (rayline/monitoring/live.py), or None: serve.monitoring false, or
    a version registered before training statistics were kept."""
    import ray

    from rayline.monitoring.live import monitor_predictor

    # In a replica the window is shared through Ray's KV store; elsewhere (an app under plain
    # uvicorn, tests) it stays in this process.
    return monitor_predictor(predictor, version, spec, kv=ray.is_initialized())
