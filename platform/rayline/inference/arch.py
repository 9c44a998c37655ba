"""The model a saved `arch.json` describes: built the same way for training and for prediction."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Callable

__all__ = ["ARCH_FILE", "import_callable", "build_from_arch", "read_arch"]

ARCH_FILE = "arch.json"  # beside the weights: num_features, num_outputs, the spec's model section


def import_callable(ref: str, search_paths: list[str]) -> Callable[..., Any]:
    """Import 'module.path:callable', looking in `search_paths` as well as sys.path."""
    for path in reversed(search_paths):
        if path and path not in sys.path:
            sys.path.insert(0, path)
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        from rayline.errors import SpecError

        raise SpecError([f"model.import: cannot import module {module_name!r} ({exc}; searched {search_paths})"]) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        from rayline.errors import SpecError

        raise SpecError([f"model.import: module {module_name!r} has no attribute {attr!r}"]) from exc


def build_from_arch(arch: dict, builtin: Callable[..., Any] | dict[str, Callable[..., Any]]):
    """The model `arch` describes: `model.import`'s callable if set, else the backend's builtin for
    `model.kind` (`builtin`: one builder, or kind -> builder), called as (num_features, num_outputs,
    **model.params), plus `input_schema=` (images, tabular positions) when the builder takes it:
    builders written for tables only keep working."""
    model_spec = arch["model"]
    if model_spec.get("import"):
        factory = import_callable(model_spec["import"], arch.get("search_paths", []))
    else:
        factory = builtin[model_spec.get("kind") or "mlp"] if isinstance(builtin, dict) else builtin
    extra = {"input_schema": arch["input_schema"]} if arch.get("input_schema") and _takes_input_schema(factory) else {}
    return factory(arch["num_features"], arch["num_outputs"], **extra, **model_spec.get("params", {}))


def _takes_input_schema(factory: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "input_schema" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: no introspection, tables only
        return False


def read_arch(model_dir: str) -> dict:
    """The arch.json the training backend saved beside the weights."""
    with open(os.path.join(model_dir, ARCH_FILE)) as fh:
        return json.load(fh)
