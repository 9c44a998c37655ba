"""The replica's own queue limit: JSON 429 with Retry-After past max_queued (no Ray)."""

import asyncio
import json

import httpx

from rayline.serve.limits import AdmissionLimit


def test_requests_past_running_plus_waiting_get_json_429_and_health_passes():
    release = asyncio.Event()
    running = []

    async def slow_app(scope, receive, send):
        running.append(scope["path"])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def scenario():
        app = AdmissionLimit(slow_app, max_ongoing=1, max_queued=1, retry_after_s=2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            first = [asyncio.create_task(client.post("/predict")) for _ in range(2)]  # one runs, one waits
            await asyncio.sleep(0.05)
            refused = await asyncio.gather(*(client.post("/predict") for _ in range(3)))
            assert running == ["/predict"]  # the waiting one has not started
            health = asyncio.create_task(client.get("/health"))  # never queued behind predictions
            await asyncio.sleep(0.05)
            assert running == ["/predict", "/health"]
            release.set()
            done = await asyncio.gather(*first, health)
        return refused, done

    refused, done = asyncio.run(scenario())
    assert [r.status_code for r in done] == [200, 200, 200]
    for r in refused:
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert json.loads(r.content)["detail"].startswith("too many requests: 1 running and 1 waiting in this replica")


def test_no_queue_limit_never_refuses():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario():
        limited = AdmissionLimit(app, max_ongoing=1, max_queued=-1, retry_after_s=1)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limited), base_url="http://r") as client:
            return await asyncio.gather(*(client.post("/predict") for _ in range(20)))

    assert {r.status_code for r in asyncio.run(scenario())} == {200}
