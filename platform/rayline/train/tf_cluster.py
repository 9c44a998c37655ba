"""TensorFlow's multi-worker setup for Ray Train, in a module that does not import TensorFlow.

Ray Train's TrainController (an actor of its own) unpickles the trainer's backend config. Ray's
`TensorflowConfig` lives in `ray.train.tensorflow`, whose package `__init__` imports TensorFlow, so
every TensorFlow run's controller spent 5.3 s of CPU (2-core box, 2026-12-06) importing a framework
it never calls, before it started the worker group. `TfClusterConfig` does what Ray's
`_TensorflowBackend` does (each worker's TF_CONFIG: every worker's address and its own index), from
here; the workers import TensorFlow themselves, in the train loop.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ray.train.backend import Backend, BackendConfig

__all__ = ["TfClusterConfig"]


def _worker_url() -> str:
    from ray._common.network_utils import build_address
    from ray.train._internal.utils import get_address_and_port

    return build_address(*get_address_and_port())


def _set_tf_config(worker_addresses: list[str], index: int) -> None:
    """Run on each worker: the cluster MultiWorkerMirroredStrategy reads (as Ray's own backend sets it)."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": worker_addresses}, "task": {"type": "worker", "index": index}})
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


class _TfClusterBackend(Backend):
    def on_start(self, worker_group, backend_config) -> None:
        import ray

        urls = worker_group.execute(_worker_url)
        ray.get([worker_group.execute_single_async(i, _set_tf_config, worker_addresses=urls, index=i)
                 for i in range(len(worker_group))])


@dataclass
class TfClusterConfig(BackendConfig):
    """Ray's TensorflowConfig, minus the TensorFlow import where it is unpickled."""

    @property
    def backend_cls(self):
        return _TfClusterBackend

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TENSORFLOW

    def to_dict(self) -> dict:
        return {}
