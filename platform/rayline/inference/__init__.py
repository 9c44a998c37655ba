"""Prediction without training: each framework's half that loads a saved model and runs it.

A Serve replica, `rayline.load_model` and batch scoring load models through this package (the
artifact's layout and the `Predictor` they all run: `rayline.inference.predictor`), which
imports nothing from `rayline.train` (tests/unit/test_import_rules.py), so serving never loads the
training loops, Ray Train or the tuners. Each framework's training half (`rayline.train.*_backend`)
writes the files its module here reads, and builds its models with the same code (`build_model`).

Adding a framework: one module here with `load(model_dir, meta) -> Predict` (and `ENV`, the
environment its process needs, if any), named with its training backend in
`rayline.frameworks.BACKENDS`.
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

__all__ = ["Predict", "load_predict", "framework_env"]

# features (n, d) float32 -> class probabilities (n, classes) or values (n,)
Predict = Callable[[np.ndarray], np.ndarray]



def _module(framework: str):
    from rayline.frameworks import BACKENDS

    if framework not in BACKENDS:
        raise ValueError(f"unknown framework {framework!r} (allowed: {', '.join(BACKENDS)})")
    return importlib.import_module(BACKENDS[framework].inference)


def framework_env(framework: str) -> dict[str, str]:
    """Environment variables a process must have before it loads `framework`'s models (set before
    the framework is imported: TensorFlow reads TF_USE_LEGACY_KERAS at import)."""
    return dict(getattr(_module(framework), "ENV", {}))


def load_predict(framework: str, model_dir: str, meta: dict) -> Predict:
    """The batch predict function of the model saved in `model_dir` (an artifact's weights/)."""
    return _module(framework).load(model_dir, meta)
