"""Elastic workers and per-worker resources on real Rays: the session's (2 CPUs, no custom
resources; its tests run in the session-Ray lane) and the embedded Rays of `rayline run`
subprocesses (in the other lane, beside the session's Ray: each pins its own state API,
rayline.cluster.connection.pin_state_api, so two Rays on one machine do not confuse it).

- `train.workers: {min: 1, max: 2}` trains for real through Ray Train V2's elastic scaling
  policy; a `model.import` builder records each worker's rank and world size, so the test
  sees how many workers Ray actually started (2: both fit the subprocess's 2-CPU Ray).
- `train.resources_per_worker` with CPU and memory reaches the workers' placement.
- A custom resource or an accelerator type the cluster lacks fails at plan time, naming it,
  before anything trains or is registered.
"""

import json
import re
import textwrap

import pytest
import yaml

from .conftest import run

_BUILDER = textwrap.dedent('''
    """A tiny torch model that records which worker built it (rank and world size) and the
    resources Ray assigned to that worker (JSON)."""
    import json
    import os


    def build(num_features, num_outputs, record_to=None):
        import torch.nn as nn

        if record_to:
            try:
                import ray.train

                context = ray.train.get_context()
                name = f"rank{context.get_world_rank()}-of-{context.get_world_size()}"
                assigned = ray.get_runtime_context().get_assigned_resources()
            except Exception:  # loaded outside training (registering, serving)
                name = None
            if name:
                with open(os.path.join(record_to, name), "w") as fh:
                    json.dump(assigned, fh)
        return nn.Linear(num_features, num_outputs)
''')


def _spec(tmp_path, train: dict, name: str):
    from rayline.spec import load_spec

    (tmp_path / "elastic_net.py").write_text(_BUILDER)
    (tmp_path / "built").mkdir()
    raw = {
        "name": name,
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target",
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "model": {"framework": "torch", "import": "elastic_net:build", "params": {"record_to": str(tmp_path / "built")}},
        "train": {"epochs": 1, "batch_size": 16, **train},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path), str(path)


def test_elastic_min1_max2_trains_with_the_workers_that_fit(tmp_path):
    """A `rayline run` with its own embedded 2-CPU Ray (a subprocess, as a user runs it), not the
    session's: that one runs sweeps, and Ray's autoscaling coordinator keeps their resource requests
    for 180 s, which held an elastic start there for ~3 minutes (README)."""
    import os
    import subprocess
    import sys

    spec, path = _spec(tmp_path, {"workers": {"min": 1, "max": 2}, "resources_per_worker": {"CPU": 0.5, "memory": 50e6}},
                       "elastic-iris")
    assert spec.train.elastic and (spec.train.min_workers, spec.train.max_workers) == (1, 2)
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # its own embedded Ray, never the session's
    proc = subprocess.run([sys.executable, "-m", "rayline.cli", "run", path, "--no-serve", "--workspace", str(tmp_path / "ws"),
                           "--timings"], cwd=tmp_path, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    _check_phases(proc.stdout, tmp_path / "ws")
    # The plan started both workers (2 x 0.5 CPU fit the 2 CPUs), said so, and they trained.
    assert "train: started 1-2 workers (starting with 2) x 0.5 CPU, 1 epochs" in proc.stdout, proc.stdout
    assert "registered: model elastic-iris version 1" in proc.stdout and "accuracy" in proc.stdout
    built = sorted((tmp_path / "built").iterdir())
    assert [p.name for p in built] == ["rank0-of-2", "rank1-of-2"]
    # train.resources_per_worker is what Ray gave each worker: half a CPU and 50 MB of memory.
    for p in built:
        assigned = json.loads(p.read_text())
        assert (assigned.get("CPU"), assigned.get("memory")) == (0.5, 50e6), assigned


def _check_phases(stdout: str, ws) -> None:
    """`--timings` (rayline/pipeline/phases.py): the run's phases printed after Ray's stop and kept in its
    record; the train stage's parts, from the worker's timeline and the driver's clock, add up to it."""
    from rayline.pipeline.record import RECORD_FILE

    (record,) = [json.loads(p.read_text()) for p in (ws / "runs").glob(f"*/{RECORD_FILE}")]
    phases = record["phases"]
    parts = ("train_startup", "train_worker_setup", "train_first_step", "train_epochs", "train_between_epochs",
             "train_shutdown")
    assert {"cli_start", "ray_start", "data", "train", "register", "ray_stop", "total", *parts} <= set(phases), phases
    assert all(phases[k] >= 0 for k in parts) and phases["train_epochs"] > 0 and phases["train_startup"] > 1, phases
    assert sum(phases[k] for k in parts) == pytest.approx(phases["train"], abs=0.5), phases
    top = ("cli_start", "ray_start", "data", "train", "register", "ray_stop")
    assert phases["total"] == pytest.approx(sum(phases[k] for k in top)) and phases["cli_start"] < 60, phases
    table = stdout[stdout.index("where the time went"):]
    for label, key in (("ray start", "ray_start"), ("startup", "train_startup"), ("epochs", "train_epochs"),
                       ("ray stop", "ray_stop"), ("total", "total")):
        assert re.search(rf"{label}\s+│\s+{phases[key]:.1f}\s", table), (label, table)


@pytest.mark.parametrize("train, expected", [
    ({"workers": 1, "resources_per_worker": {"rayline_test_slot": 1}},
     r"^train.resources_per_worker.rayline_test_slot: 1 workers x 1 rayline_test_slot need 1 rayline_test_slot; "
     r"the cluster has 0 available"),
    ({"workers": 1, "accelerator_type": "A100"},
     r"^train.accelerator_type: no node of the cluster with accelerator type A100 has room "
     r"\(Ray resource 'accelerator_type:A100': 0 available; accelerator types available: none\)"),
    ({"workers": {"min": 3, "max": 4}, "cpus_per_worker": 1},
     # CPUs of an earlier test's workers may still be on their way back: any amount under 3
     r"^train.cpus_per_worker: 3 workers x 1 CPUs need 3 CPUs; the cluster has [\d.]+ available "
     r"\(allowed: lower train.workers.min or train.cpus_per_worker\)"),
], ids=["custom-resource", "accelerator-type", "elastic-min"])
def test_what_the_cluster_lacks_fails_at_plan_time(ray_session, ws, tmp_path, train, expected):
    from rayline.errors import ResourceError
    from rayline.registry import Registry

    spec, path = _spec(tmp_path, train, "lacking-iris")
    before = {m.name for m in Registry(ws).client.search_registered_models()}
    with pytest.raises(ResourceError, match=expected):
        run(spec, ws, spec_path=path)
    assert not list((tmp_path / "built").iterdir())  # no worker ever started
    assert "lacking-iris" not in {m.name for m in Registry(ws).client.search_registered_models()} - before


def test_accelerator_type_and_custom_resource_place_the_workers(tmp_path):
    """A `rayline run` with its own embedded Ray whose node has the logical resources of an A100
    node and one `rayline_slot` (RAY_OVERRIDE_RESOURCES, read by Ray when the node starts): the
    workers are placed there, and the custom resource decides the elastic size — 1 of max 2."""
    import os
    import subprocess
    import sys

    spec, path = _spec(tmp_path, {"workers": {"min": 1, "max": 2}, "accelerator_type": "A100",
                                  "resources_per_worker": {"rayline_slot": 1}}, "placed-iris")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # its own embedded Ray, never the session's
    env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"accelerator_type:A100": 1, "rayline_slot": 1})
    proc = subprocess.run([sys.executable, "-m", "rayline.cli", "run", path, "--no-serve", "--workspace", str(tmp_path / "ws")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (built,) = (tmp_path / "built").iterdir()
    assert built.name == "rank0-of-1"
    # The worker holds its share of the A100 node resource and the slot: it was placed by both.
    assigned = json.loads(built.read_text())
    assert (assigned.get("accelerator_type:A100"), assigned.get("rayline_slot")) == (0.001, 1), assigned
