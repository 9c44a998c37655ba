"""The HTTP API (KServe V1 style) as a plain FastAPI app around a `Predictor`.

Routes, relative to the Serve route prefix: POST /predict, GET /health, GET /metadata,
and FastAPI's /docs and /openapi.json. Pure FastAPI: testable without Ray.

The request path: body bytes (size-checked) -> one pydantic-core validation into plain
dicts (schema.build_request_adapter) -> `predictor.encode` (numpy) -> `infer` (the model,
through the batcher on a replica) -> `predictor.respond`. No pandas, no per-row model
objects; the validators are built once per replica, here. A caller in the same process that
already decoded the rows (the V2 route, serve/oip.py) hands them over in the ASGI scope
(asgi_call.HANDED_INSTANCES, a HandedRows): validated with the same schema from Python objects,
or, for a numbers-only model, taken as the one matrix the caller already checked; answered as a
dict (asgi_call.ANSWER_BOX), through `app.state.predict_handed` without FastAPI's routing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Optional

import numpy as np
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from rayline.errors import DataError, PredictionError
from rayline.inference.predictor import Predictor
from rayline.serve.asgi_call import ANSWER_BOX, HANDED_INSTANCES, HandedRows
from rayline.serve.limits import BodyTooLarge, read_body
from rayline.serve.metrics import observe_rows
from rayline.serve.responses import error_response, install_error_handlers, validation_response
from rayline.serve.schema import FLOAT32_MAX, PredictResponse, located, build_request_adapter, build_request_model

__all__ = ["build_http_app", "DEFAULT_MAX_BODY_BYTES"]

DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024

# infer(x, alone): `alone` is True when no other request is in this app right now, so a
# batcher need not wait for company (it would only add its wait to this request's latency).
AsyncInfer = Callable[[np.ndarray, bool], Awaitable[np.ndarray]]


def build_http_app(predictor: Predictor, version: str, max_instances: int = 10_000, *,
                   infer: Optional[AsyncInfer] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   request_timeout_s: Optional[float] = None, on_rows: Callable[[int], None] = observe_rows,
                   monitor=None) -> FastAPI:
    """`infer`: awaitable model call (the replica passes its batcher); default: the model directly.
    `on_rows`: called with the rows of each answered prediction (the version's metrics).
    `monitor`: the version's LiveMonitor (rayline/monitoring/live.py), or None when it is off."""
    name = predictor.name
    app = FastAPI(
        title=f"rayline model {name}",
        version=version,
        description=f"{predictor.meta['framework']} {predictor.task} model {name!r}, version {version}.",
    )
    install_error_handlers(app)
    adapter = build_request_adapter(predictor.preprocessing, max_instances)
    features = predictor.preprocessing.features
    nullable = [f.name for f in features if f.nullable]
    feature_names = [f.name for f in features]
    takes_matrix = predictor.preprocessing.compiled.takes_matrix  # numbers only: V2 may hand over one matrix
    if infer is None:
        async def infer(x: np.ndarray, alone: bool) -> np.ndarray:
            return predictor.infer(x)

    inflight = 0  # requests inside /predict now (one event loop: no lock needed)

    @app.post("/predict", response_model=PredictResponse, response_model_exclude_none=True,
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}}}}},
              responses={413: {"description": "Body larger than serve.max_body_bytes"},
                         422: {"description": "Invalid request: each error names the field"},
                         429: {"description": "Queue full (serve.max_queued_requests); see Retry-After"},
                         504: {"description": "Not answered within serve.request_timeout_s"}})
    async def predict(request: Request):
        nonlocal inflight
        inflight += 1
        try:
            return await answer(request)
        finally:
            inflight -= 1

    async def predict_handed(scope, receive, send) -> None:
        """`/predict` as a plain ASGI app for an in-process hand-over (asgi_call.HANDED_INSTANCES): the
        caller picked the route itself, so FastAPI's routing and dependency solving (tens of
        microseconds) are skipped. serve/stack.py wraps it in the same middleware as the app."""
        response = await predict(Request(scope, receive))
        await response(scope, receive, send)

    app.state.predict_handed = predict_handed

    async def answer(request: Request):
        started = time.monotonic()
        handed: Optional[HandedRows] = request.scope.get(HANDED_INSTANCES)  # decoded by a caller in this process (V2)
        matrix = handed.matrix if handed is not None and takes_matrix else None
        try:
            if handed is None:
                data = adapter.validate_json(await read_body(request, max_body_bytes))
            elif matrix is not None and 0 < len(matrix) <= max_instances and matrix.shape[1] == len(feature_names):
                data = {"probabilities": handed.probabilities}  # values checked by the caller (HandedRows)
            else:
                matrix = None
                data = adapter.validate_python({"instances": handed.rows(), "probabilities": handed.probabilities})
        except BodyTooLarge as exc:
            return error_response(413, str(exc))
        except ValidationError as exc:
            return validation_response(_explained(exc.errors(include_url=False, include_input=False, include_context=False),
                                                  feature_names))
        rows = data.get("instances")
        if rows is not None and nullable and isinstance(rows[0], dict):
            for row in rows:
                for feature in nullable:
                    row.setdefault(feature, None)
        try:
            x = predictor.encode(rows) if matrix is None else predictor.encode_matrix(matrix, handed.value)
            if request_timeout_s is None:
                outputs = await infer(x, inflight == 1)
            else:
                left = request_timeout_s - (time.monotonic() - started)
                if left <= 0:
                    raise asyncio.TimeoutError
                outputs = await asyncio.wait_for(infer(x, inflight == 1), left)
            result = predictor.respond(outputs, data.get("probabilities", False))
        except DataError as exc:
            return validation_response([{"loc": ("instances",), "msg": str(exc), "type": "value_error"}])
        except PredictionError as exc:
            return validation_response([{"loc": ("instances",), "msg": str(exc), "type": "prediction_error"}])
        except asyncio.TimeoutError:
            return error_response(504, f"not answered within {request_timeout_s:g}s (serve.request_timeout_s); "
                                       "retry later, or send fewer instances per request")
        # A plain JSONResponse: FastAPI's response_model validation would re-check every prediction.
        on_rows(len(x))
        if monitor is not None:  # a queue append (the inputs were queued as they were encoded)
            monitor.observe_outputs(outputs)
        answer = {**result, "model": name, "version": version}
        box = request.scope.get(ANSWER_BOX)
        if box is not None:  # an in-process caller takes the dict: no JSON body to write and parse back
            box["result"] = answer
            return Response(status_code=200)
        return JSONResponse(answer)

    @app.get("/health")
    def health():
        return {"status": "ok", "model": name, "version": version}

    @app.get("/monitoring", responses={404: {"description": "Monitoring is off for this version"}})
    def monitoring():
        """Drift of this version's live traffic against its training statistics, over the window
        all its replicas share (serve.monitoring): per feature PSI, nulls, unseen or out-of-range."""
        if monitor is None:
            why = ("serve.monitoring is false" if predictor.statistics is not None else
                   "the version has no training statistics (registered before rayline kept them)")
            return error_response(404, f"monitoring is off for {name} v{version}: {why}")
        return monitor.report()

    @app.get("/metadata")
    def metadata():
        meta = predictor.meta
        return {
            "name": name,
            "version": version,
            "framework": meta["framework"],
            "task": meta["task"],
            "features": [
                {"name": f.name, "type": f.kind, "nullable": f.nullable,
                 **({"categories": f.categories, "handle_unknown": f.unknown} if f.categories is not None else {})}
                for f in features
            ],
            "labels": predictor.preprocessing.label.classes,
            "metric": meta["metric"],
            "metrics": meta["metrics"],
            "created": meta["created"],
            "versions": meta["versions"],
            "data_fingerprint": meta["data_fingerprint"],
        }

    _document_request_body(app, build_request_model(predictor.preprocessing, max_instances))
    return app


# The only numeric bounds in the request schema are float32's: say so rather than print 39 digits.
_RANGE_MSG = f"outside the model's float32 input range (allowed: -{FLOAT32_MAX:.8g} to {FLOAT32_MAX:.8g})"


def _explained(errors: list[dict], feature_names: list[str]) -> list[dict]:
    for error in errors:
        if error["type"] in ("less_than_equal", "greater_than_equal"):
            error["msg"] = _RANGE_MSG
        error["loc"] = located(tuple(error["loc"]), feature_names)
    return errors




def _document_request_body(app: FastAPI, model) -> None:
    """Put the request model's JSON schema into the OpenAPI document (the route reads raw
    bytes, so FastAPI cannot see it): /docs and schemathesis describe what is validated."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            request = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request.pop("$defs", {}))
            components["PredictRequest"] = request
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
