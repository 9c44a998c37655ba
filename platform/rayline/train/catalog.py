"""What each framework backend offers, described without importing the framework.

The spec validates `model.framework`, `model.kind`, `model.params` and accelerator choices
against this table, so `rayline validate` and `rayline --help` never import torch,
TensorFlow or xgboost. The backend module itself is imported only when training or
serving needs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

__all__ = ["BackendInfo", "BACKENDS", "backend_info", "load_backend"]


@dataclass(frozen=True)
class BackendInfo:
    """One framework backend: its module, built-in model kinds and their parameters."""

    name: str
    module: str  # "rayline.train.torch_backend"; imported lazily
    kinds: dict[str, frozenset[str]]  # built-in kind -> parameters it accepts
    accelerators: frozenset[str] = field(default_factory=lambda: frozenset({"cpu", "gpu"}))
    epoch_based: bool = True  # False: rounds instead of epochs (xgboost)
    import_returns: str = ""  # what a `model.import` callable must return
    precisions: frozenset[str] = frozenset({"fp32", "bf16", "fp16"})  # train.precision values it trains in
    grad_accumulation: bool = True  # whether train.grad_accumulation > 1 means anything (mini-batch training)
    grad_compressions: frozenset[str] = frozenset()  # train.grad_compression values besides none
    strategies: frozenset[str] = frozenset({"ddp"})  # train.strategy values (ddp: the framework's data parallelism)
    multi_gpu_workers: bool = False  # whether one worker trains on several GPUs (resources_per_worker.GPU > 1)
    param_choices: dict[str, tuple] = field(default_factory=dict)  # parameter -> the only values it takes


_MLP_PARAMS = frozenset({"hidden_sizes", "dropout"})

BACKENDS: dict[str, BackendInfo] = {
    "torch": BackendInfo(
        name="torch",
        module="rayline.train.torch_backend",
        kinds={"mlp": _MLP_PARAMS},
        import_returns="a torch.nn.Module",
        grad_compressions=frozenset({"fp16", "bf16", "powersgd"}),
        strategies=frozenset({"ddp", "fsdp"}),
    ),
    "tensorflow": BackendInfo(
        name="tensorflow",
        module="rayline.train.tensorflow_backend",
        kinds={"mlp": _MLP_PARAMS},
        import_returns="a Keras model (tf_keras.Model)",
        multi_gpu_workers=True,  # MirroredStrategy / MWMS over a worker's local GPUs (train/tf_steps.py)
    ),
    "xgboost": BackendInfo(
        name="xgboost",
        module="rayline.train.xgboost_backend",
        kinds={
            "gbdt": frozenset(
                {
                    "max_depth", "eta", "learning_rate", "subsample", "colsample_bytree",
                    "colsample_bylevel", "colsample_bynode", "min_child_weight", "gamma",
                    "lambda", "alpha", "reg_lambda", "reg_alpha", "max_bin", "tree_method",
                    "num_boost_round", "early_stopping_rounds", "max_leaves", "grow_policy",
                    "scale_pos_weight", "checkpoint_every", "external_memory",
                }
            )
        },
        # As xgboost_backend.EXTERNAL_MEMORY (not imported: this table never imports a backend).
        param_choices={"external_memory": ("auto", "always", "never")},
        epoch_based=False,
        import_returns="",
        precisions=frozenset({"fp32"}),
        grad_accumulation=False,
    ),
}


def backend_info(framework: str) -> BackendInfo:
    return BACKENDS[framework]


def load_backend(framework: str):
    """Import the backend module for `framework` and return its `BACKEND` object."""
    info = BACKENDS[framework]
    return importlib.import_module(info.module).BACKEND
