"""The HTTP API (KServe V1 style) as a plain FastAPI app around a `Predictor`.

Routes, relative to the Serve route prefix: POST /predict, GET /health, GET /metadata,
and FastAPI's /docs and /openapi.json. Pure FastAPI: testable without Ray.
"""

# No `from __future__ import annotations`: FastAPI must see the generated request model
# itself, not its name as a string, to read it as the JSON body.
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from rayline.errors import DataError
from rayline.model import Predictor
from rayline.serve.schema import PredictResponse, build_request_model

__all__ = ["build_http_app"]


def build_http_app(predictor: Predictor, version: str, max_instances: int = 10_000) -> FastAPI:
    name = predictor.name
    app = FastAPI(
        title=f"rayline model {name}",
        version=version,
        description=f"{predictor.meta['framework']} {predictor.task} model {name!r}, version {version}.",
    )
    Request = build_request_model(predictor.preprocessing, max_instances)
    features = predictor.preprocessing.features

    @app.post("/predict", response_model=PredictResponse, response_model_exclude_none=True)
    def predict(body: Request):  # type: ignore[valid-type]
        rows = [instance.model_dump(by_alias=True) for instance in body.instances]
        try:
            result = predictor.predict(rows, body.probabilities)
        except DataError as exc:
            return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", "instances"], "msg": str(exc), "type": "value_error"}]})
        return {**result, "model": name, "version": version}

    @app.get("/health")
    def health():
        return {"status": "ok", "model": name, "version": version}

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

    return app
