"""The CLI as users run it, in subprocesses: the README's quick start on an embedded Ray
(serves until Ctrl-C), and `rayline cluster up|status|down` with `rayline run` on a cluster.

Runs before the other integration modules (file order) and never touches the session's
embedded Ray: while two Ray instances share a machine, Ray's state API refuses to pick one,
so each head here is up only while nothing else trains.
"""

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from .conftest import ROOT

HEAD_PORTS = (6390, 6391)
DASHBOARD_PORTS = (8275, 8276)
SERVE_PORT = 8767
QUICK_START_PORT = 8768


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
        # Every process of that head, Ray's client server (re-parented to init) included.
        assert _head_processes(info_a["temp_dir"], str(HEAD_PORTS[0])) == []
        assert not (ws_a / "cluster.json").exists()
        assert _cli(ws_a, "cluster", "status").returncode == 1
        assert _cli(ws_b, "cluster", "status").returncode == 0
    finally:
        for ws in (ws_a, ws_b):
            if (ws / "cluster.json").exists():
                _cli(ws, "cluster", "down")
    assert info_b and _head_processes(info_b["temp_dir"], str(HEAD_PORTS[1])) == []


def test_quick_start_serves_until_ctrl_c(tmp_path):
    """`rayline run pipelines/digits-torch.yaml` (a smaller sweep): summary, a working curl, clean Ctrl-C."""
    env = {**os.environ, "RAYLINE_WORKSPACE": str(tmp_path / "ws")}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rayline.cli", "run", "pipelines/digits-torch.yaml",
                                 f"--port={QUICK_START_PORT}", "--set", "tune.num_samples=2", "--set", "train.epochs=3"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 480
        while "Press Ctrl-C to stop" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no served model within 8 minutes:\n" + log.read_text()[-3000:]
            time.sleep(1)
        text = log.read_text()
        assert "registered: model digits version 1" in text and "trials" in text
        curl = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl -s -X POST"))
        assert f"http://127.0.0.1:{QUICK_START_PORT}/digits/predict" in curl
        body = json.loads(curl.split(" -d '", 1)[1].rstrip("'"))
        assert len(body["instances"][0]) == 64  # one real row: every pixel feature
        served = httpx.post(f"http://127.0.0.1:{QUICK_START_PORT}/digits/predict", json=body, timeout=60)
        assert served.status_code == 200 and served.json()["predictions"][0] in range(10), served.text
        assert "Starting execution of Dataset" not in text  # Ray Data's INFO logs stay off the terminal

        proc.send_signal(signal.SIGINT)  # one Ctrl-C stops it, also after a Tune sweep
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
        assert "stopping..." in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
