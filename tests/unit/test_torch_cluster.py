"""rayline.train.torch_cluster: PyTorch's process-group setup that Train's controller unpickles without
importing torch, doing on each worker what Ray's own _TorchBackend does.

The suite's 2-worker torch runs train through it (tests/integration/test_csv_and_faults.py's FSDP
churn and its killed-worker restart, test_training_techniques.py's PowerSGD sweep, test_tune_strategies.py's
PBT, test_elastic.py): a worker left out of the process group fails their all-reduces."""

import os
import pickle
import subprocess
import sys

import pytest

from rayline.train import torch_cluster
from rayline.train.torch_cluster import TorchClusterConfig, process_group_backend


def test_unpickled_where_the_controller_runs_it_imports_no_torch():
    code = ("import pickle, sys; config = pickle.loads(sys.stdin.buffer.read()); backend = config.backend_cls(); "
            "print(type(backend).__name__, config.framework.name, config.backend, config.timeout_s, "
            "backend.share_cuda_visible_devices, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(TorchClusterConfig(backend="gloo", timeout_s=60)),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["_TorchClusterBackend", "TORCH", "gloo", "60", "True", "False"]


@pytest.mark.parametrize("backend, resources, expected", [
    (None, {"CPU": 1}, "gloo"),
    (None, {"CPU": 1, "GPU": 1}, "nccl"),
    (None, {"CPU": 1, "TPU": 4}, "tpu_dist"),
    ("gloo", {"CPU": 1, "GPU": 1}, "gloo"),  # the spec's choice wins, as in Ray's TorchConfig
])
def test_the_process_groups_backend_follows_the_workers_devices(backend, resources, expected):
    assert process_group_backend(TorchClusterConfig(backend=backend), resources) == expected


class _Workers:
    """The worker-group calls the backend makes; each worker's calls are recorded with their arguments."""

    def __init__(self, n, resources):
        self.n, self.resources = n, resources
        self.calls = [[] for _ in range(n)]

    def __len__(self):
        return self.n

    def get_resources_per_worker(self):
        return self.resources

    def execute_single(self, i, fn, **kwargs):
        self.calls[i].append((fn.__name__, kwargs))
        return ("10.0.0.7", 29500) if fn.__name__ == "_master_address" else None

    def execute(self, fn, **kwargs):
        return [self.execute_single(i, fn, **kwargs) for i in range(self.n)]

    def execute_single_async(self, i, fn, **kwargs):
        self.execute_single(i, fn, **kwargs)
        return i  # the "future" ray.get is handed (patched below)

    def execute_async(self, fn, **kwargs):
        return [self.execute_single_async(i, fn, **kwargs) for i in range(self.n)]


@pytest.mark.parametrize("init_method, url", [("env", "env://"), ("tcp", "tcp://10.0.0.7:29500")])
def test_every_worker_joins_one_group_at_rank_0s_address_with_its_own_rank(monkeypatch, init_method, url):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, **kw: [None for _ in refs])
    workers = _Workers(3, {"CPU": 1, "GPU": 1})
    config = TorchClusterConfig(init_method=init_method, timeout_s=90)
    config.backend_cls().on_start(workers, config)
    assert workers.calls[0][0] == ("_master_address", {})
    for rank, calls in enumerate(workers.calls):
        names = [name for name, _ in calls if name != "_master_address"]
        expected = (["_set_master"] if init_method == "env" else []) + ["_set_distributed_env", "_init_process_group"]
        assert names == expected, calls
        assert calls[-1][1] == {"backend": "nccl", "world_rank": rank, "world_size": 3, "init_method": url, "timeout_s": 90}
        if init_method == "env":
            assert ("_set_master", {"addr": "10.0.0.7", "port": 29500}) in calls
    config.backend_cls().on_shutdown(workers, config)
    assert all(calls[-1] == ("_shutdown", {"destroy_process_group": True}) for calls in workers.calls)


def test_an_unknown_init_method_is_refused_naming_it(monkeypatch):
    workers = _Workers(2, {"CPU": 1})
    with pytest.raises(ValueError, match="torch init_method 'file': 'env' or 'tcp' only"):
        TorchClusterConfig(init_method="file").backend_cls().on_start(workers, TorchClusterConfig(init_method="file"))


def test_the_worker_side_steps_are_rays_own(monkeypatch):
    """What runs on each worker sets the environment torchrun would and calls Ray's own functions."""
    import ray.train.torch.config as ray_torch_config

    seen = []
    monkeypatch.setattr(ray_torch_config, "_setup_torch_process_group", lambda **kw: seen.append(("init", kw)))
    monkeypatch.setattr(ray_torch_config, "_shutdown_torch", lambda **kw: seen.append(("shutdown", kw)))
    monkeypatch.setattr(ray_torch_config, "_set_torch_distributed_env_vars", lambda: seen.append(("env", {})))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    torch_cluster._set_master("10.0.0.7", 29500)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.7", "29500")
    torch_cluster._set_distributed_env()
    torch_cluster._init_process_group(backend="gloo", world_rank=1, world_size=2, init_method="env://", timeout_s=5)
    torch_cluster._shutdown(True)
    assert seen == [("env", {}), ("init", {"backend": "gloo", "world_rank": 1, "world_size": 2, "init_method": "env://",
                                           "timeout_s": 5}), ("shutdown", {"destroy_process_group": True})]


def test_the_torch_backend_hands_it_to_torchtrainer():
    from ray.train.torch import TorchTrainer

    from rayline.train.backend import load_backend

    backend = load_backend("torch")
    assert backend.trainer_class() is TorchTrainer
    (config,) = backend.trainer_options().values()
    assert isinstance(config, TorchClusterConfig) and list(backend.trainer_options()) == ["torch_config"]
