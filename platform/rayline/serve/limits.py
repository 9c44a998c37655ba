"""Request limits enforced inside the replica's app: body size (413) and time budget (504).

The queue limit (429 with Retry-After) is Ray Serve's own (`max_queued_requests` with a
`BackpressureConfig`, see app.py): it rejects requests before they reach this code.
"""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["BodyTooLarge", "read_body"]


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
