"""The Open Inference Protocol (KServe V2) at `/v2` of the Serve HTTP address.

One small Serve application, `rayline-v2` (route prefix `/v2`), so that tritonclient,
KServe's SDK and any other V2 client work unchanged against rayline models:

    GET  /v2                                      server metadata
    GET  /v2/health/live, /v2/health/ready        server health
    GET  /v2/models/{name}[/versions/{v}]         model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready   model readiness
    POST /v2/models/{name}[/versions/{v}]/infer   inference

It holds no model. Model NAME is the Serve application `NAME` (which follows the traffic
split), version v of it the application `NAME-vv`; each is reached through a deployment
handle and `ModelServer.call_http` (`/predict`, `/metadata`, `/health`), so a V2 request runs
the same validation, limits, API keys (the caller's Authorization header is passed on) and
metrics as one sent to `/NAME/predict`. Tensors <-> rows: `rayline.serve.oip_codec`.

A model deployed with `serve.oip` (the default) also has a V2 application of its own, `NAME-oip`
at `/v2/models/NAME` (Serve routes the longest matching prefix there): the same routes, built by
`build_oip_app` over `LocalApps`, in replicas that hold the model's live versions as the route's
replicas do (serve/router.py), so a V2 request reaches the model with no second hop. This shared
application still answers `/v2` itself, its health, and models without one of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from rayline.serve.oip_codec import HEADER_LENGTH, DecodedRequest, OipError, decode_request, encode_response, model_metadata, translate_detail

__all__ = ["OIP_APP", "OIP_ROUTE", "OipServer", "ServeApps", "LocalApps", "build_oip_app", "build_app",
           "ensure_oip_app"]

OIP_APP = "rayline-v2"
OIP_ROUTE = "/v2"
MAX_BODY_BYTES = 64 * 1024 * 1024  # the model's own serve.max_body_bytes still bounds the /predict body
# Headers a V2 caller sends that the model's app must see: its API keys (serve.auth).
_PASSED_HEADERS = (b"authorization", b"x-api-key")
# How long a looked-up application list, handle or /metadata answer is reused. The lookups
# are controller round trips (~1-3 ms each on the 2-core machine); a few seconds keeps them
# off the request path while a newly deployed version or a deleted app is seen soon.
APPS_TTL_S, HANDLE_TTL_S, META_TTL_S = 2.0, 10.0, 10.0
MIN_REFRESH_S = 0.5


def _error(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class ServeApps:
    """Serve applications by name, from inside a replica: the controller is asked
    asynchronously (never a blocking `ray.get` on the replica's event loop), and handles are
    cached per application."""

    def __init__(self, call_timeout_s: float = 120.0):
        # Serve's controller client: the same object serve.status() uses, already connected in a replica.
        from ray.serve.context import _get_global_client

        self._controller = _get_global_client()._controller
        self.call_timeout_s = call_timeout_s
        self._names: tuple[float, set[str]] = (0.0, set())
        self._handles: dict[str, tuple[float, Any]] = {}

    async def names(self, fresh: bool = False) -> set[str]:
        """Application names. `fresh`: look again unless the list is under MIN_REFRESH_S old, so a
        stream of requests for an unknown model costs the controller at most one call per interval."""
        expires, names = self._names
        now = time.monotonic()
        if now > expires or (fresh and now > expires - APPS_TTL_S + MIN_REFRESH_S):
            ids = await self._controller.list_deployment_ids.remote()
            names = {i.app_name for i in ids}
            self._names = (time.monotonic() + APPS_TTL_S, names)
        return names

    async def _handle(self, app: str):
        cached = self._handles.get(app)
        if cached and time.monotonic() < cached[0]:
            return cached[1]
        ingress = await self._controller.get_ingress_deployment_name.remote(app)
        if ingress is None:
            self._handles.pop(app, None)
            raise OipError(f"model application '{app}' is not deployed", 404)
        from ray.serve.handle import DeploymentHandle

        handle = DeploymentHandle(ingress, app)
        self._handles[app] = (time.monotonic() + HANDLE_TTL_S, handle)
        return handle

    async def call(self, app: str, method: str, path: str, headers: list, body: bytes = b""):
        """`ModelServer.call_http` of application `app`: a `HttpResult`, or OipError (404 when
        the app is gone or is not a rayline model, 503 when it cannot answer, 504 on timeout)."""
        from ray.serve.exceptions import RayServeException

        handle = await self._handle(app)

        async def once():
            return await handle.call_http.remote(method, path, headers, body)

        try:
            return await asyncio.wait_for(once(), self.call_timeout_s)
        except asyncio.TimeoutError as exc:
            raise OipError(f"model application '{app}' did not answer within {self.call_timeout_s:g}s", 504) from exc
        except RayServeException as exc:  # e.g. DeploymentUnavailableError: deleted or failed meanwhile
            self._handles.pop(app, None)
            raise OipError(f"model application '{app}' is not available ({type(exc).__name__})", 503) from exc
        except Exception as exc:
            self._handles.pop(app, None)
            if "call_http" in str(exc):  # its ingress has no call_http: not a rayline model server
                raise OipError(f"application '{app}' is not a rayline model", 404) from exc
            raise OipError(f"model application '{app}' failed to answer ({type(exc).__name__})", 503) from exc

    async def predict(self, app: str, decoded: DecodedRequest, headers: list):
        """`POST /predict` of application `app` with the decoded request's rows: its `HttpResult` and,
        when 200, the answer parsed ({predictions, probabilities?, version, ...})."""
        body = json.dumps({"instances": decoded.rows, "probabilities": "probabilities" in decoded.outputs},
                          separators=(",", ":")).encode()
        result = await self.call(app, "POST", "/predict", [(b"content-type", b"application/json"), *headers], body)
        return result, (json.loads(result.body) if result.status == 200 else None)


class LocalApps:
    """`ServeApps` for the replicas of one model's own V2 application (`NAME-oip` at /v2/models/NAME,
    serve.oip): the model's split (application NAME) and each version it holds (NAME-vN) are answered
    by this replica's own request stacks, with no deployment handle in between (one hop, as /predict);
    a version it does not hold goes to that version's application over a handle, as before."""

    def __init__(self, router, call_timeout_s: float = 120.0):
        self.router = router
        self.remote = ServeApps(call_timeout_s)

    async def names(self, fresh: bool = False) -> set[str]:
        return await self.remote.names(fresh)

    async def call(self, app: str, method: str, path: str, headers: list, body: bytes = b""):
        from rayline.serve.asgi_call import call_asgi

        if app == self.router.name:
            return await self.router.call_http(method, path, headers, body)
        stack = self._held(app)
        if stack is not None:
            return await call_asgi(stack.app, method, path, headers=headers, body=body)
        return await self.remote.call(app, method, path, headers, body)

    def _held(self, app: str):
        """The stack of version application `app` (NAME-vN) when this replica holds that version, else None."""
        prefix = f"{self.router.name}-v"
        return self.router.routes.stacks.get(app[len(prefix):]) if app.startswith(prefix) else None

    async def predict(self, app: str, decoded: DecodedRequest, headers: list):
        """As `ServeApps.predict`; for a version this replica holds, the decoded rows (or, for a
        numbers-only model, the decoded matrix) are handed to its stack in-process
        (asgi_call.HANDED_INSTANCES) and the answer comes back as a dict: no JSON between the two
        protocols, the same middleware (keys, limits, metrics) and validation."""
        from rayline.serve.asgi_call import ANSWER_BOX, HANDED_INSTANCES, HandedRows, call_asgi

        stack = self._held(app)
        if app != self.router.name and stack is None:
            return await self.remote.predict(app, decoded, headers)
        box: dict = {}
        handed = HandedRows(rows=lambda: decoded.rows, probabilities="probabilities" in decoded.outputs,
                            matrix=decoded.matrix, value=decoded.value)
        scope = {HANDED_INSTANCES: handed, ANSWER_BOX: box}
        if stack is None:
            result = await self.router.call_http("POST", "/predict", headers, extra_scope=scope)
        else:
            result = await call_asgi(stack.handed, "POST", "/predict", headers=headers, extra_scope=scope)
        return result, box.get("result")


class _Models:
    """Model name (+ version) -> application, and per-application /metadata, cached."""

    def __init__(self, apps: ServeApps):
        self.apps = apps
        self._meta: dict[tuple[str, bytes], tuple[float, dict]] = {}

    async def _find(self, name: str) -> set[str]:
        names = await self.apps.names()
        if name not in names:
            names = await self.apps.names(fresh=True)  # deployed a moment ago?
        return names

    @staticmethod
    def versions_of(name: str, names: set[str]) -> list[str]:
        pattern = re.compile(re.escape(name) + r"-v(\d+)")
        return sorted((m.group(1) for n in names if (m := pattern.fullmatch(n))), key=int)

    async def resolve(self, name: str, version: Optional[str], headers: list) -> str:
        """The application that serves `name` (its traffic split) or its `version`."""
        if name == OIP_APP:
            raise OipError(f"no model named '{name}' (it is this protocol's own application)", 404)
        names = await self._find(name if version is None else f"{name}-v{version}")
        if version is None:
            if name in names:
                return name
            served = sorted(n for n in names if n != OIP_APP)
            raise OipError(f"no model named '{name}' is served here (served applications: {', '.join(served[:20]) or 'none'})", 404)
        app = f"{name}-v{version}"
        if app in names:
            return app
        live = self.versions_of(name, names)
        if not live and name in names:
            # A single-version deployment (app NAME, no NAME-vN apps): it serves one version.
            meta = await self.metadata(name, headers)
            if str(meta.get("version")) == str(version):
                return name
            live = [str(meta.get("version"))]
        if not live and name not in names:
            raise OipError(f"no model named '{name}' is served here", 404)
        raise OipError(f"model '{name}' has no live version '{version}' (live versions: {', '.join(live)})", 404)

    async def metadata(self, app: str, headers: list) -> dict:
        # Keyed by the caller's credentials too: a caller without the model's key never gets
        # metadata another caller fetched (the model answers it 401 itself).
        key = (app, hashlib.sha256(repr(sorted(headers)).encode()).digest())
        cached = self._meta.get(key)
        if cached and time.monotonic() < cached[0]:
            return cached[1]
        result = await self.apps.call(app, "GET", "/metadata", headers)
        if result.status != 200:
            raise _model_error(result)
        meta = json.loads(result.body)
        if len(self._meta) > 256:
            self._meta.clear()
        self._meta[key] = (time.monotonic() + META_TTL_S, meta)
        return meta


def _model_error(result) -> OipError:
    """A model app's non-200 answer -> OipError with its message (422 -> 400, as V2 asks)."""
    try:
        detail = json.loads(result.body).get("detail", "")
    except (ValueError, AttributeError):
        detail = result.body.decode("utf-8", "replace")[:500]
    error = OipError(translate_detail(detail) or f"model answered HTTP {result.status}",
                     400 if result.status == 422 else result.status)
    error.headers = {k: v for k in ("Retry-After", "WWW-Authenticate") if (v := result.header(k))}
    return error


class _ServerRoot:
    """ASGI middleware: `GET /v2` (tritonclient's get_server_metadata) is the app's "/" route,
    not a 307 redirect to `/v2/` (Starlette's redirect_slashes), which clients do not follow."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].rstrip("/") == scope.get("root_path", "").rstrip("/"):
            root = scope.get("root_path", "").rstrip("/")
            scope = {**scope, "path": root + "/", "raw_path": (root + "/").encode()}
        await self.app(scope, receive, send)


def _unexpected_error(exc: Exception) -> JSONResponse:
    logging.getLogger(__name__).error("V2 request failed", exc_info=exc)
    return _error(500, f"internal error ({type(exc).__name__}); the server log has the details")


def _passed(request: Request) -> list:
    return [(k, v) for k, v in request.headers.raw if k.lower() in _PASSED_HEADERS]


def build_oip_app(apps: ServeApps, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The V2 routes as a FastAPI app, relative to the `/v2` route prefix. `max_body_bytes`: the
    largest inference body read (a model's own V2 application passes its serve.max_body_bytes)."""
    from rayline.version import __version__
    from rayline.serve.limits import BodyTooLarge, read_body

    app = FastAPI(title="rayline Open Inference Protocol (KServe V2)", version=__version__, docs_url=None, redoc_url=None)
    app.add_middleware(_ServerRoot)
    models = _Models(apps)

    @app.exception_handler(OipError)
    async def _oip_error(request: Request, exc: OipError):
        return _error(exc.status, exc.message, getattr(exc, "headers", None))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return _unexpected_error(exc)

    @app.get("/")
    async def server_metadata():
        return {"name": "rayline", "version": __version__, "extensions": ["binary_tensor_data"]}

    @app.get("/health/live")
    async def live():
        return {"live": True}

    @app.get("/health/ready")
    async def ready():
        await apps.names()  # the controller answers: models can be found
        return {"ready": True}

    async def metadata(request: Request, name: str, version: Optional[str]):
        headers = _passed(request)
        target = await models.resolve(name, version, headers)
        meta = await models.metadata(target, headers)
        names = await apps.names()
        versions = models.versions_of(name, names) or [str(meta["version"])]
        body = model_metadata({**meta, "name": name}, versions if version is None else [str(version)])
        return body

    async def model_ready(request: Request, name: str, version: Optional[str]):
        target = await models.resolve(name, version, _passed(request))
        result = await apps.call(target, "GET", "/health", [])
        if result.status != 200:
            return _error(503, f"model '{name}' is not ready (its /health answered {result.status})")
        return {"name": name, "ready": True}

    async def infer(request: Request, name: str, version: Optional[str]):
        headers = _passed(request)
        try:
            body = await read_body(request, max_body_bytes)
        except BodyTooLarge as exc:
            return _error(413, str(exc))
        if request.headers.get("content-encoding", "identity").lower() != "identity":
            return _error(415, f"Content-Encoding {request.headers['content-encoding']!r} not supported "
                               "(allowed: identity; send the request uncompressed)")
        target = await models.resolve(name, version, headers)
        meta = await models.metadata(target, headers)
        decoded = decode_request(body, request.headers.get(HEADER_LENGTH), meta["features"], meta["task"])
        result, predict = await apps.predict(target, decoded, headers)
        if result.status != 200:
            raise _model_error(result)
        payload, header_length = encode_response(name, predict.get("version", meta["version"]), decoded, predict, meta)
        if header_length is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(header_length)})

    async def answer_infer(scope, receive, send, name: str, version: Optional[str]) -> None:
        """`infer` as a plain ASGI call, for a caller that matched the path itself (a model's own V2
        application, serve/router.py): the FastAPI app's routing and dependency solving cost more
        than the rest of a one-row request. Errors are answered as the app's handlers answer them."""
        try:
            response = await infer(Request(scope, receive), name, version)
        except OipError as exc:
            response = _error(exc.status, exc.message, getattr(exc, "headers", None))
        except Exception as exc:  # noqa: BLE001 - as the app's own handler: a JSON 500, details in the log
            response = _unexpected_error(exc)
        await response(scope, receive, send)

    app.state.answer_infer = answer_infer

    for suffix, version in (("", False), ("/versions/{version}", True)):
        base = "/models/{name}" + suffix

        def bind(handler, with_version=version):
            if with_version:
                async def route(request: Request, name: str, version: str):
                    return await handler(request, name, version)
            else:
                async def route(request: Request, name: str):
                    return await handler(request, name, None)
            return route

        app.add_api_route(base, bind(metadata), methods=["GET"])
        app.add_api_route(base + "/ready", bind(model_ready), methods=["GET"])
        app.add_api_route(base + "/infer", bind(infer), methods=["POST"])
    return app


@serve.deployment(name="rayline-v2", num_replicas=1, ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=512,
                  health_check_period_s=10)
@serve.ingress()
class OipServer:
    """Answers the Open Inference Protocol for every rayline model on this Serve instance."""

    def __init__(self, call_timeout_s: float = 120.0):
        self.apps = ServeApps(call_timeout_s)

    def __serve_build_asgi_app__(self):
        return build_oip_app(self.apps)


def build_app(args: Optional[dict] = None):
    """Serve application builder (`import_path: rayline.serve.oip:build_app`, route_prefix /v2).
    args: call_timeout_s (seconds a model may take to answer; default 120)."""
    args = dict(args or {})
    timeout = float(args.pop("call_timeout_s", 120.0))
    if args:
        from rayline.errors import ServeError

        raise ServeError(f"rayline.serve.oip:build_app args: unknown keys {sorted(args)} (allowed: call_timeout_s)")
    return OipServer.bind(timeout)


def ensure_oip_app() -> bool:
    """Deploy `rayline-v2` at `/v2` unless this Serve instance already runs it; True when deployed now.
    Needs a connected Ray with Serve started."""
    from rayline.serve.details import serve_status

    status = serve_status().applications.get(OIP_APP)
    if status is not None and str(status.status) not in ("DEPLOY_FAILED", "DELETING", "ApplicationStatus.DEPLOY_FAILED",
                                                         "ApplicationStatus.DELETING"):
        return False
    serve.run(build_app(), name=OIP_APP, route_prefix=OIP_ROUTE, blocking=False)
    return True
