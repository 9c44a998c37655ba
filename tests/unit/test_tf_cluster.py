"""rayline.train.tf_cluster: TensorFlow's multi-worker setup that Train's controller unpickles without
importing TensorFlow, setting on each worker the TF_CONFIG Ray's own backend sets.

The 2-worker TensorFlow runs of the suite (tests/integration/test_frameworks.py, test_csv_and_faults.py,
test_images.py) train through it: their strategy checks that it sees every worker
(rayline.train.tf_steps.make_strategy), so a worker left without the cluster fails the run."""

import json
import os
import pickle
import subprocess
import sys

from rayline.train.tf_cluster import TfClusterConfig


def test_unpickled_where_the_controller_runs_it_imports_no_tensorflow():
    code = ("import pickle, sys; config = pickle.loads(sys.stdin.buffer.read()); backend = config.backend_cls(); "
            "print(type(backend).__name__, config.framework.name, config.to_dict(), 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(TfClusterConfig()), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["_TfClusterBackend", "TENSORFLOW", "{}", "False"]


class _Workers:
    """The worker-group calls the backend makes, each worker a dict standing for its environment."""

    def __init__(self, addresses):
        self.addresses, self.envs = addresses, [{} for _ in addresses]

    def __len__(self):
        return len(self.addresses)

    def execute(self, fn):
        assert fn.__name__ == "_worker_url"
        return list(self.addresses)

    def execute_single_async(self, i, fn, **kwargs):
        saved = dict(os.environ)
        try:
            fn(**kwargs)
            self.envs[i] = {k: os.environ[k] for k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return i  # the "future" ray.get is handed (patched below)


def test_each_worker_gets_every_address_and_its_own_index(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: [None for _ in refs])
    workers = _Workers(["10.0.0.1:4001", "10.0.0.2:4002", "10.0.0.2:4003"])
    TfClusterConfig().backend_cls().on_start(workers, TfClusterConfig())
    for index, env in enumerate(workers.envs):
        assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": workers.addresses}, "task": {"type": "worker", "index": index}}
        assert env["TF_USE_LEGACY_KERAS"] == "1"
