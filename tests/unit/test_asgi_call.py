"""call_asgi runs the real HTTP app of a model in-process: status, headers and body come back whole."""

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rayline.serve.asgi_call import call_asgi


def _app():
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        body = await request.body()
        return JSONResponse({"got": json.loads(body), "q": request.query_params.get("x"),
                             "auth": request.headers.get("authorization")}, headers={"x-version": "7"})

    @app.get("/boom")
    def boom():
        return JSONResponse({"detail": "no"}, status_code=418)

    return app


def test_post_with_body_headers_and_query():
    result = asyncio.run(call_asgi(_app(), "POST", "/echo", headers=[(b"Authorization", b"Bearer k")],
                                   body=b'{"a": 1}', query=b"x=5"))
    assert result.status == 200
    assert json.loads(result.body) == {"got": {"a": 1}, "q": "5", "auth": "Bearer k"}
    assert result.header("X-Version") == "7"


def test_error_status_and_unknown_path():
    app = _app()
    assert asyncio.run(call_asgi(app, "GET", "/boom")).status == 418
    missing = asyncio.run(call_asgi(app, "GET", "/nope"))
    assert missing.status == 404 and json.loads(missing.body) == {"detail": "Not Found"}


def test_root_path_is_stripped_like_serve_mounts_it():
    result = asyncio.run(call_asgi(_app(), "POST", "/echo", body=b"{}", root_path="/digits"))
    assert result.status == 200
