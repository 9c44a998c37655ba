"""Baseline (a) of the serving benchmark: the server a competent user writes by hand.

The same torch weights and the same fitted standard scaling as rayline's endpoint, behind a
FastAPI app on one uvicorn worker, taking a bare list of floats per row:

    POST /predict  {"inputs": [[64 floats], ...]}  ->  {"predictions": [label, ...]}
    GET  /health

It reads a copy of the registered artifact (`weights/arch.json`, `weights/weights.pt`,
`preprocessing.json`) and does not import rayline: the MLP is rebuilt by hand from the
architecture, the scaling is one numpy scale-and-shift. Choices, so the comparison is fair
and the baseline realistic rather than handicapped:
- `async def` handler: the model call is ~0.05 ms, cheaper than a hop to FastAPI's thread pool.
- `torch.set_num_threads(1)` (default; `--threads`): on a small box one intra-op thread per
  process is what a user sets to avoid oversubscription, and it matches the thread count
  Ray gives a Serve replica with a fractional CPU (OMP_NUM_THREADS=1).
- One uvicorn worker, access log off (uvicorn's per-request logging costs ~10% at 1 ms).

    python benchmarks/baseline_server.py --model-dir DIR --port 8821
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

__all__ = ["build_app", "load_model", "main"]


class PredictRequest(BaseModel):
    inputs: list[list[float]]


def _mlp(arch: dict) -> torch.nn.Sequential:
    """The builtin rayline MLP, rebuilt from its arch.json (layer order decides state-dict keys)."""
    model = arch["model"]
    if model.get("import") or model.get("kind") != "mlp":
        raise SystemExit(f"baseline_server: only the builtin torch mlp is supported (got {model})")
    params = model.get("params", {})
    layers: list[torch.nn.Module] = []
    width = arch["num_features"]
    for size in params.get("hidden_sizes", [128, 64]):
        layers += [torch.nn.Linear(width, int(size)), torch.nn.ReLU()]
        if params.get("dropout"):
            layers.append(torch.nn.Dropout(float(params["dropout"])))
        width = int(size)
    layers.append(torch.nn.Linear(width, arch["num_outputs"]))
    return torch.nn.Sequential(*layers)


def load_model(model_dir: str):
    """(model, mean, scale, feature names, class labels) from an artifact copy."""
    with open(os.path.join(model_dir, "weights", "arch.json")) as fh:
        arch = json.load(fh)
    model = _mlp(arch)
    model.load_state_dict(torch.load(os.path.join(model_dir, "weights", "weights.pt"), weights_only=True, map_location="cpu"))
    model.eval()
    with open(os.path.join(model_dir, "preprocessing.json")) as fh:
        prep = json.load(fh)
    names = [f["name"] for f in prep["features"]]
    if prep.get("output_columns", names) != names:
        raise SystemExit("baseline_server: the model input columns differ from the raw features (not a scale-only model)")
    mean = np.zeros(len(names))
    std = np.ones(len(names))
    for step in prep["steps"]:
        if step["kind"] != "standard_scale":
            raise SystemExit(f"baseline_server: only standard_scale preprocessing is supported (got {step['kind']})")
        for col, (m, s) in step["stats"].items():
            i = names.index(col)
            # Same convention as rayline: a constant column (std 0) is only centred.
            mean[i], std[i] = m, (s if s > 0 else 1.0)
    return model, mean, std, names, prep["label"].get("classes")


def build_app(model_dir: str) -> FastAPI:
    model, mean, std, names, classes = load_model(model_dir)
    labels = np.asarray(classes if classes is not None else [])
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(req: PredictRequest) -> dict:
        x = np.asarray(req.inputs, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(names) or len(x) == 0:
            raise HTTPException(422, f"inputs: expected a non-empty list of rows of {len(names)} floats")
        features = ((x - mean) / std).astype(np.float32)
        with torch.no_grad():
            out = model(torch.from_numpy(features)).numpy()
        if len(labels):
            return {"predictions": labels[out.argmax(axis=1)].tolist()}
        return {"predictions": out.reshape(-1).tolist()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8821)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    uvicorn.run(build_app(args.model_dir), host=args.host, port=args.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
