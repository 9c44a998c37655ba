"""Request limits enforced inside the replica's app: body size (413), time budget (504) and
the queue (429 with Retry-After).

Why the queue limit is ours and not only Ray's: Ray Serve's `max_queued_requests` with a
`BackpressureConfig` answers 429 and Retry-After, but with Ray's plain-text body "Request
dropped due to backpressure" (Ray 2.60 has no option for it), and every rayline error is a
JSON body. So Ray lets `max_ongoing + max_queued` requests (plus some to refuse) into each
replica and queues no more itself (app.py); `AdmissionLimit` here runs `max_ongoing` of them,
holds up to `max_queued` waiting, and answers the next with a JSON 429.
"""

from __future__ import annotations

import asyncio
import json
import math

from starlette.requests import Request

__all__ = ["BodyTooLarge", "read_body", "AdmissionSlots", "AdmissionLimit", "install_admission_limit"]


class AdmissionSlots:
    """The queue limit's state: at most `max_ongoing` requests running, at most `max_queued`
    waiting for a slot (-1: no limit). One per replica, shared by every version it serves."""

    def __init__(self, max_ongoing: int, max_queued: int, retry_after_s: int):
        self.max_queued = max_queued
        self.retry_after = str(max(0, math.ceil(retry_after_s))).encode()
        self.semaphore = asyncio.Semaphore(max_ongoing)
        self.waiting = 0
        self.body = json.dumps({"detail": f"too many requests: {max_ongoing} running and {max_queued} waiting in this "
                                          f"replica (serve.max_ongoing_requests, serve.max_queued_requests); "
                                          f"retry after {self.retry_after.decode()} s"}).encode()

    def full(self) -> bool:
        return 0 <= self.max_queued <= self.waiting and self.semaphore.locked()


class AdmissionLimit:
    """ASGI middleware: at most `max_ongoing` requests in the app, at most `max_queued` waiting
    for a slot (-1: no limit); beyond that a JSON 429 with Retry-After. GET /health always passes.
    `slots`: an `AdmissionSlots` shared with other apps (then the three numbers are its own)."""

    def __init__(self, app, max_ongoing: int = 1, max_queued: int = -1, retry_after_s: int = 1, open_paths=("/health",),
                 slots: "AdmissionSlots | None" = None):
        self.app = app
        self.slots = slots if slots is not None else AdmissionSlots(max_ongoing, max_queued, retry_after_s)
        self.open = frozenset(open_paths)

    def _open(self, scope) -> bool:
        root, path = scope.get("root_path", ""), scope["path"]
        if root and path.startswith(root):  # Serve mounts the app at its route prefix
            path = path[len(root):] or "/"
        return scope.get("method") in ("GET", "HEAD") and path in self.open

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self._open(scope):
            return await self.app(scope, receive, send)
        slots = self.slots
        if slots.full():
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", slots.retry_after),
                (b"content-length", str(len(slots.body)).encode())]})
            await send({"type": "http.response.body", "body": slots.body})
            return
        slots.waiting += 1
        try:
            await slots.semaphore.acquire()
        finally:
            slots.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            slots.semaphore.release()


def install_admission_limit(app, max_ongoing: int, max_queued: int, retry_after_s: int) -> None:
    app.add_middleware(AdmissionLimit, max_ongoing=max_ongoing, max_queued=max_queued, retry_after_s=retry_after_s)


class BodyTooLarge(Exception):
    """The request body is larger than serve.max_body_bytes."""

    def __init__(self, size: int, limit: int, declared: bool):
        self.size, self.limit = size, limit
        what = f"{size} bytes" if declared else f"more than {limit} bytes"
        super().__init__(f"request body too large: {what} (allowed: at most {limit} bytes, serve.max_body_bytes; "
                         "send fewer instances per request)")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused before it is read when Content-Length says it is too large, and
    cut off as soon as a chunked body passes the limit (never buffered whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit, declared=True)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(size, limit, declared=False)
        chunks.append(chunk)
    return b"".join(chunks)
