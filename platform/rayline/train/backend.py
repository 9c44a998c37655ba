"""The one interface every framework implements; the rest of rayline never branches on framework names.

A backend builds the model, runs the per-worker train loop (through `loop.EpochReporter`
for checkpoints, metrics and resume), creates the Ray Train trainer, and loads a saved
model for prediction. Adding a framework means one module with a `BACKEND` object and one
entry in `catalog.BACKENDS`.
"""

from __future__ import annotations

import importlib
import sys
from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

__all__ = ["Backend", "Predict", "import_callable", "build_from_arch"]

# features (n, d) float32 -> class probabilities (n, classes) or values (n,)
Predict = Callable[[np.ndarray], np.ndarray]


class Backend(ABC):
    """A framework behind rayline: torch, tensorflow, xgboost."""

    name: str

    @abstractmethod
    def train_loop(self, config: dict) -> None:
        """The Ray Train per-worker function; `config` is the loop config from `train.run`."""

    @abstractmethod
    def trainer_class(self):
        """The Ray Train trainer class (TorchTrainer, TensorflowTrainer, XGBoostTrainer, ...)."""

    def make_trainer(self, *, loop_config: dict, scaling_config, run_config, datasets: dict, dataset_config):
        """The trainer running `train_loop` on every worker; every Ray data-parallel trainer takes these."""
        return self.trainer_class()(
            train_loop_per_worker=self.train_loop,
            train_loop_config=loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
        )

    @abstractmethod
    def load(self, model_dir: str, meta: dict) -> Predict:
        """Load a saved model directory; return a batch predict function."""

    def versions(self) -> dict[str, str]:
        """Framework package versions recorded in the model artifact."""
        return {}

    def worker_env(self) -> dict[str, str]:
        """Environment variables the training workers and serving replicas need."""
        return {}

    def total_units(self, model_params: dict, epochs: int) -> int:
        """Units of training a run does at most: ASHA's clock (`tune.asha_settings`).

        Epochs by default; a backend that trains in other units (xgboost: boosting rounds)
        says how many its parameters give.
        """
        return epochs


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


def build_from_arch(arch: dict, builtin: Callable[..., Any]):
    """The model `arch` describes: `model.import`'s callable if set, else the backend's `builtin`,
    called as (num_features, num_outputs, **model.params)."""
    model_spec = arch["model"]
    factory = import_callable(model_spec["import"], arch.get("search_paths", [])) if model_spec.get("import") else builtin
    return factory(arch["num_features"], arch["num_outputs"], **model_spec.get("params", {}))

