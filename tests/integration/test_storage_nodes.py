"""The multi-node start check on a real two-node Ray cluster where one node cannot see the workspace.

A head and a worker node are started with `ray start` (own ports 20240-20259, own temp dirs).
The worker node runs in its own mount namespace (`unshare -m`) with an empty tmpfs mounted
over the workspace directory: the same path exists on both "machines", but the worker node's
copy is a different, empty filesystem -- a node-local path, as on two real machines without
NFS. `rayline run --address` against that cluster must fail before the data stage, naming the
worker node; a directory both nodes see passes, checked on both nodes.

Needs root and mount namespaces (the development and CI containers run as root); skipped
otherwise, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT = 6412, 8312, 20412
_PORT_NAMES = ("--node-manager-port", "--object-manager-port", "--metrics-export-port", "--runtime-env-agent-port",
               "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port")
_PORT_BASE = 20240  # node i: _PORT_BASE + 10 * i + k
ALLOWED = "(allowed: an s3:// or gs:// URI, or a path every node mounts, e.g. NFS)"


def _can_unshare() -> str | None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "needs root and unshare(1) for a private mount namespace"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt && umount /mnt"],
                          capture_output=True, text=True, timeout=30)
    return None if proc.returncode == 0 else f"unshare -m cannot mount here: {proc.stderr.strip()[:200]}"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env["RAY_AUTH_MODE"] = "disabled"  # this test's own cluster; token auth is tested elsewhere
    return env


def _ray() -> str:
    return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    from ray._private.services import get_node_ip_address

    from rayline.cluster.head import stop_head

    base = tmp_path_factory.mktemp("nodes")
    hidden = base / "node-local"  # the worker node sees an empty tmpfs here
    shared = base / "shared"
    hidden.mkdir()
    shared.mkdir()
    tag = uuid.uuid4().hex[:6]
    temp_dirs = [f"/tmp/rlst-{tag}-{i}" for i in range(2)]
    ip = get_node_ip_address()

    def ports(i):
        return [f"{name}={_PORT_BASE + 10 * i + k}" for k, name in enumerate(_PORT_NAMES)]

    try:
        head = [_ray(), "start", "--head", f"--port={GCS_PORT}", "--include-dashboard=false", f"--dashboard-port={DASHBOARD_PORT}",
                f"--ray-client-server-port={CLIENT_PORT}", "--num-cpus=1", f"--temp-dir={temp_dirs[0]}",
                "--disable-usage-stats", *ports(0)]
        proc = subprocess.run(head, capture_output=True, text=True, timeout=180, env=_env())
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        worker = " ".join([_ray(), "start", f"--address={ip}:{GCS_PORT}", "--num-cpus=1", f"--temp-dir={temp_dirs[1]}",
                           "--disable-usage-stats", *ports(1)])
        # The raylet, its agents and workers inherit the namespace: none of them sees `hidden`'s files.
        proc = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {hidden} && exec {worker}"],
                              capture_output=True, text=True, timeout=180, env=_env())
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        yield {"address": f"{ip}:{GCS_PORT}", "hidden": hidden, "shared": shared, "temp_dirs": temp_dirs}
    finally:
        for temp_dir in reversed(temp_dirs):
            stop_head({"temp_dir": temp_dir, "address": "", "haproxy_dir": f"/tmp/rlst-none-{tag}"}, grace_s=5)


_DRIVER = """
import json, sys, time
import ray
from rayline.storage import StorageError, check_shared
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(1)
nodes = {n["NodeID"]: n["ObjectStoreSocketName"] for n in ray.nodes() if n["Alive"]}
out = {"nodes": nodes, "checked": check_shared(sys.argv[2])}
try:
    check_shared(sys.argv[3])
    out["hidden"] = None
except StorageError as exc:
    out["hidden"] = str(exc)
print(json.dumps(out))
"""


def test_a_path_every_node_sees_passes_and_a_node_local_one_names_the_node(cluster):
    proc = subprocess.run([sys.executable, "-c", _DRIVER, cluster["address"], str(cluster["shared"]), str(cluster["hidden"])],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["nodes"]) == 2, out
    assert sorted(out["checked"]) == sorted(out["nodes"]), out  # a task ran on each node
    (worker_id,) = [i for i, sock in out["nodes"].items() if sock.startswith(cluster["temp_dirs"][1])]
    assert out["hidden"] is not None, "the worker node cannot see the hidden directory, but the check passed"
    assert out["hidden"].startswith(f"workspace: {cluster['hidden']} is not shared: node "), out["hidden"]
    assert worker_id[:12] in out["hidden"] and out["hidden"].endswith(f"does not see it {ALLOWED}"), out["hidden"]
    # The marker is removed again.
    assert not [p for p in os.listdir(cluster["hidden"]) if p.startswith(".rayline-shared-check-")]


def test_rayline_run_on_a_node_local_workspace_fails_before_the_data_stage(cluster, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "nodecheck",
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
        "model": {"framework": "xgboost", "kind": "gbdt", "params": {"num_boost_round": 2}},
        "train": {"workers": 1},
    }, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "rayline.cli", "run", str(spec), "--address", cluster["address"],
                           "--workspace", str(cluster["hidden"]), "--no-serve"],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: workspace: {cluster['hidden']} is not shared: node "), proc.stderr
    assert errors[0].endswith(ALLOWED)
    assert "sklearn iris" not in proc.stdout + proc.stderr, proc.stdout  # the data stage never started
