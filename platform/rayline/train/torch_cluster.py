"""PyTorch's process-group setup for Ray Train, in a module that does not import torch.

Ray Train's TrainController (an actor of its own, one per run and per trial) unpickles the trainer's
backend config and runs its backend's hooks. Ray's `TorchConfig` lives in `ray.train.torch.config`,
which imports torch at its top, so every torch run's controller spent 2.4-3.4 s of CPU (2-core box,
2026-12-06: benchmarks/train_startup.py) importing a framework it never calls, before it started
the worker group. `TorchClusterConfig` does what Ray's `_TorchBackend` does for CPU and GPU workers
(the master's address, each worker's rank and its environment, `init_process_group` with gloo or
nccl, the process group's shutdown), from here; each step that touches torch runs on the workers,
through Ray's own functions, which the workers import with torch anyway. TPU workers (backend
`tpu_dist`) take Ray's own backend unchanged: its multislice setup is Ray's to keep.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ray.train.backend import Backend, BackendConfig

__all__ = ["TorchClusterConfig"]

_TPU = "tpu_dist"


# ------------------------------------------------------------------ run on the workers


def _master_address() -> tuple:
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def _set_distributed_env() -> None:
    """LOCAL_RANK, RANK, WORLD_SIZE... as torchrun sets them (Ray's own function)."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _init_process_group(**kwargs) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


class _CudaDevice:
    """Around the train function on each worker: its CUDA device made the current one (Ray's
    TorchConfigContextManager, imported where it runs)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


# ------------------------------------------------------------------ run on the controller


def process_group_backend(config: "TorchClusterConfig", resources: dict) -> str:
    """The process group's backend: the config's, else nccl for GPU workers, tpu_dist for TPU
    workers, gloo for CPU workers (as Ray's TorchTrainer and _TorchBackend choose it)."""
    if config.backend:
        return config.backend
    if resources.get("GPU", 0) > 0:
        return "nccl"
    if resources.get("TPU", 0) > 0:
        return _TPU
    return "gloo"


class _TorchClusterBackend(Backend):
    share_cuda_visible_devices: bool = True  # local GPU workers see each other's devices (nccl's P2P)

    def on_start(self, worker_group, backend_config: "TorchClusterConfig") -> None:
        import ray

        backend = process_group_backend(backend_config, worker_group.get_resources_per_worker())
        if backend == _TPU:
            from ray.train.torch.config import _TorchBackend

            _TorchBackend().on_start(worker_group, backend_config.with_backend(backend))
            return
        addr, port = worker_group.execute_single(0, _master_address)
        if backend_config.init_method == "env":
            worker_group.execute(_set_master, addr=addr, port=port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            from ray._common.network_utils import build_address

            url = f"tcp://{build_address(addr, port)}"
        else:
            raise ValueError(f"torch init_method {backend_config.init_method!r}: 'env' or 'tcp' only")
        worker_group.execute(_set_distributed_env)  # before init_process_group, which reads them
        ray.get([worker_group.execute_single_async(i, _init_process_group, backend=backend, world_rank=i,
                                                   world_size=len(worker_group), init_method=url,
                                                   timeout_s=backend_config.timeout_s)
                 for i in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config) -> None:
        import logging

        import ray
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                         TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)

        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logging.getLogger(__name__).warning("torch process group shutdown timed out after %s seconds", timeout_s)


@dataclass
class TorchClusterConfig(BackendConfig):
    """Ray's TorchConfig (same fields, same meaning), minus the torch import where it is unpickled.
    TorchTrainer takes it as `torch_config` (it reads and sets only `backend`)."""

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _TorchClusterBackend

    @property
    def train_func_context(self):
        return _CudaDevice

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def with_backend(self, backend: str):
        """Ray's own TorchConfig with these settings (TPU workers: Ray's backend takes it)."""
        from ray.train.torch.config import TorchConfig

        return TorchConfig(backend=backend, init_method=self.init_method, timeout_s=self.timeout_s)

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}
