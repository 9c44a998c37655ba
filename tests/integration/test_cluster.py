"""`rayline cluster up|status|down` and `rayline run` against a running cluster, through the CLI.

Runs before the other integration modules (file order) and never touches the session's
embedded Ray: while two Ray instances share a machine, Ray's state API refuses to pick one,
so each head here is up only while nothing else trains.
"""

import json
import os
import subprocess
import sys

import httpx

from .conftest import ROOT

HEAD_PORTS = (6390, 6391)
DASHBOARD_PORTS = (8275, 8276)
SERVE_PORT = 8767


def _cli(ws, *args, timeout=600):
    env = {**os.environ, "RAYLINE_WORKSPACE": str(ws)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "rayline.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def _up(ws, i):
    proc = _cli(ws, "cluster", "up", f"--port={HEAD_PORTS[i]}", f"--dashboard-port={DASHBOARD_PORTS[i]}", "--num-cpus=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((ws / "cluster.json").read_text())


def test_run_on_a_cluster_returns_and_down_stops_only_its_own_head(tmp_path):
    from rayline.cluster import _head_processes

    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    info_a = _up(ws_a, 0)
    info_b = None
    try:
        status = _cli(ws_a, "cluster", "status")
        assert status.returncode == 0 and f"127.0.0.1:{HEAD_PORTS[0]}" in status.stdout, status.stdout + status.stderr

        # `rayline run` finds the recorded head, deploys there and returns; the endpoint outlives it.
        run = _cli(ws_a, "run", "pipelines/diabetes-torch.yaml", f"--port={SERVE_PORT}", "--set", "train.epochs=2")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"The endpoint stays up on the cluster at 127.0.0.1:{HEAD_PORTS[0]}" in run.stdout
        response = httpx.post(f"http://127.0.0.1:{SERVE_PORT}/diabetes/predict", timeout=60,
                              json={"instances": [{f: 0.01 for f in ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")}]})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "diabetes" and isinstance(response.json()["predictions"][0], float)

        # A second head on the same machine must survive the first one's `down`.
        info_b = _up(ws_b, 1)
        assert _head_processes(info_a["temp_dir"]) and _head_processes(info_b["temp_dir"])
        down = _cli(ws_a, "cluster", "down")
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        assert _head_processes(info_a["temp_dir"]) == []
        assert not (ws_a / "cluster.json").exists()
        assert _cli(ws_a, "cluster", "status").returncode == 1
        assert _cli(ws_b, "cluster", "status").returncode == 0
    finally:
        for ws in (ws_a, ws_b):
            if (ws / "cluster.json").exists():
                _cli(ws, "cluster", "down")
    assert info_b and _head_processes(info_b["temp_dir"]) == []
