"""The one interface every framework implements; the rest of rayline never branches on framework names.

A backend builds the model, runs the per-worker train loop (through `loop.EpochReporter`
for checkpoints, metrics and resume) and creates the Ray Train trainer. Loading a saved model
for prediction is the framework's other half, in `rayline.inference` (serving imports nothing
from here). Adding a framework means one module here with a `BACKEND` object, its inference
module, and one entry in `rayline.frameworks.BACKENDS` naming both.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

__all__ = ["Backend", "load_backend"]


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
            **self.trainer_options(),
        )

    def trainer_options(self) -> dict:
        """The trainer class's own options beyond those every data-parallel trainer takes."""
        return {}

    def versions(self) -> dict[str, str]:
        """Framework package versions recorded in the model artifact."""
        return {}

    def worker_env(self) -> dict[str, str]:
        """Environment variables the training workers need (the framework's `rayline.inference` module's
        ENV: the same for serving replicas)."""
        from rayline.inference import framework_env

        return framework_env(self.name)


def load_backend(framework: str) -> Backend:
    """Import the training backend module for `framework` (rayline.frameworks) and return its `BACKEND`."""
    from rayline.frameworks import BACKENDS

    return importlib.import_module(BACKENDS[framework].module).BACKEND
