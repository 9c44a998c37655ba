"""A torch model: built from its arch (training builds it the same way) and loaded for prediction."""

from __future__ import annotations

import os

import numpy as np

from rayline.inference.arch import build_from_arch, read_arch
from rayline.inference.outputs import softmax

__all__ = ["WEIGHTS_FILE", "BUILDERS", "build_mlp", "build_cnn", "build_text_cnn", "build_transformer", "build_model", "load"]

WEIGHTS_FILE = "weights.pt"


def build_mlp(num_features: int, num_outputs: int, hidden_sizes=(128, 64), dropout: float = 0.0):
    import torch.nn as nn

    layers: list = []
    width = num_features
    for size in hidden_sizes:
        layers += [nn.Linear(width, int(size)), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(float(dropout)))
        width = int(size)
    layers.append(nn.Linear(width, num_outputs))
    return nn.Sequential(*layers)


def _combined(kind: str):
    def build(num_features: int, num_outputs: int, input_schema: dict | None = None, **params):
        from rayline.inference.torch_combined import build_combined

        return build_combined(kind, num_features, num_outputs, input_schema=input_schema, **params)

    build.__name__ = f"build_{kind}"
    return build


build_cnn, build_text_cnn, build_transformer = _combined("cnn"), _combined("text_cnn"), _combined("transformer")

# model.kind -> builder (frameworks.BACKENDS["torch"].kinds names each one's params)
BUILDERS = {"mlp": build_mlp, "cnn": build_cnn, "text_cnn": build_text_cnn, "transformer": build_transformer}


def build_model(arch: dict):
    model_spec = arch["model"]
    model = build_from_arch(arch, BUILDERS)
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        from rayline.errors import SpecError

        raise SpecError([f"model.import: {model_spec['import']} returned {type(model).__name__} (allowed: a torch.nn.Module)"])
    return model


def load(model_dir: str, meta: dict):
    import torch

    model = build_model(read_arch(model_dir))
    model.load_state_dict(torch.load(os.path.join(model_dir, WEIGHTS_FILE), weights_only=True, map_location="cpu"))
    model.eval()
    classification = meta["task"] == "classification"

    def predict(features: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            raw = model(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))).numpy()
        return softmax(raw) if classification else raw.reshape(-1)

    return predict
