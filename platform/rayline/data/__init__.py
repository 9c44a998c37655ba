"""The data stage: sources, deterministic split, preprocessing fitted on train.

Names load lazily: the spec imports `rayline.data.steps` (pydantic models only), and
`rayline --help` must not pay for pandas and Ray Data.
"""

from __future__ import annotations

import importlib

__all__ = ["PreparedData", "prepare_data", "prepare_variants", "FeatureInfo", "FittedPreprocessing", "LabelInfo"]

_HOMES = {
    "PreparedData": "rayline.data.pipeline",
    "prepare_data": "rayline.data.pipeline",
    "prepare_variants": "rayline.data.pipeline",
    "FeatureInfo": "rayline.data.preprocess",
    "FittedPreprocessing": "rayline.data.preprocess",
    "LabelInfo": "rayline.data.preprocess",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rayline.data' has no attribute {name!r}")
