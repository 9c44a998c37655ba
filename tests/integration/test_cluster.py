"""The CLI as users run it, in subprocesses: the README's quick start on an embedded Ray
(serves until Ctrl-C), and `rayline cluster up|status|down` with `rayline run` on a cluster:
a head listens on loopback only unless --host 0.0.0.0 is asked for (warned about, recorded),
`down` leaves no process of it, a `ray start` that times out or is interrupted leaves nothing,
and deploying prints where Serve really listens or names the process holding the port.

Runs in the own-processes lane, beside the session-Ray lane's embedded Ray, and never touches
it: the heads here have ports of their own (below), and every embedded Ray (the session's, a
`rayline run`'s) pins its state API address (rayline.cluster.connection.pin_state_api), without
which Ray's state API refuses to pick one of two Rays on a machine.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import yaml

from .. import loopback
from ..hang_report import run_or_report
from .conftest import ROOT

# Ports of the heads these tests start (env overrides: for parallel runs on one machine).
_GCS = int(os.environ.get("RAYLINE_TEST_GCS_PORT", "6390"))
_DASH = int(os.environ.get("RAYLINE_TEST_DASHBOARD_PORT", "8275"))
_CLIENT = int(os.environ.get("RAYLINE_TEST_CLIENT_PORT", "20401"))  # outside Ray's worker ports 10002-19999
HEAD_PORTS = (_GCS, _GCS + 1, _GCS + 2, _GCS + 3)
DASHBOARD_PORTS = (_DASH, _DASH + 1, _DASH + 2, _DASH + 3)
CLIENT_PORTS = (_CLIENT, _CLIENT + 1, _CLIENT + 2, _CLIENT + 3)
SERVE_PORT = int(os.environ.get("RAYLINE_TEST_PORT", "8765")) + 2
QUICK_START_PORT = SERVE_PORT + 1
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


@pytest.fixture(autouse=True)
def _remove_head_dirs(tmp_path):
    """The Ray session logs and HAProxy state of the heads a test started (after their `down`)."""
    yield
    import shutil

    for ws in tmp_path.iterdir():
        if ws.is_dir():
            if (ws / "cluster.json").exists():  # a failed test's head: stop it, or it holds the ports of the next
                _cli(ws, "cluster", "down")
            temp_dir = head_temp_dir(ws)
            for path in (temp_dir, "/tmp/rlhap-" + temp_dir.rsplit("-", 1)[-1]):
                shutil.rmtree(path, ignore_errors=True)


def _cli(ws, *args, timeout=600, env=None):
    env = {**os.environ, "RAYLINE_WORKSPACE": str(ws), **(env or {})}
    env.pop("RAY_ADDRESS", None)
    return run_or_report([sys.executable, "-m", "rayline.cli", *args], cwd=ROOT, env=env, timeout=timeout)


def _up(ws, i, *extra, env=None):
    proc = _cli(ws, "cluster", "up", f"--port={HEAD_PORTS[i]}", f"--dashboard-port={DASHBOARD_PORTS[i]}", "--num-cpus=2",
                f"--client-port={CLIENT_PORTS[i]}", *extra, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((ws / "cluster.json").read_text())


def head_temp_dir(ws):
    from rayline.cluster.head import head_temp_dir
    from rayline.workspace import workspace

    return head_temp_dir(workspace(ws))


def _processes_naming(temp_dir, port):
    """Every process on the machine whose command line names the head's temp dir, its HAProxy
    state dir or its GCS port, or whose output goes to the temp dir: independent of rayline's
    own matching, so a process `cluster down` misses is caught here."""
    haproxy_dir = "/tmp/rlhap-" + temp_dir.rsplit("-", 1)[-1]
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or ())
            outputs = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (1, 2) if os.path.exists(f"/proc/{proc.pid}/fd/{fd}")]
        except (psutil.Error, OSError):
            continue
        if proc.pid == os.getpid():
            continue
        if (temp_dir in line or haproxy_dir in line or f":{port} " in line + " " or f"--port={port}" in line
                or any(o.startswith(temp_dir + "/") for o in outputs)):
            found.append(f"{proc.pid}: {line[:200]}")
    return found


def _name(proc) -> str:
    """A process's name, "" when it exited since it was listed (a Ray worker can, any moment)."""
    try:
        return proc.name()
    except psutil.Error:
        return ""


def _non_loopback_listeners(procs):
    bad = []
    for proc in procs:
        try:
            for conn in proc.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.ip not in LOOPBACK:
                    bad.append(f"{proc.pid} {proc.name()}: {conn.laddr.ip}:{conn.laddr.port}")
        except psutil.Error:
            continue
    return bad


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _hold_port(port: int):
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def _job_runs_on(dashboard: str) -> None:
    from rayline.jobs.api import TERMINAL, JobsClient

    client = JobsClient.connect(dashboard)
    job = client.submit(entrypoint="python -c 'print(40 + 2)'")
    deadline = time.monotonic() + 120
    while (status := str(client.info(job).status).split(".")[-1]) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(1)
    assert status == "SUCCEEDED", client.logs(job)
    assert "42" in client.logs(job)


def test_run_on_a_cluster_returns_and_down_stops_only_its_own_head(tmp_path):
    from rayline.cluster.head import head_processes

    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    agent_port = _hold_port(52365)  # as another Ray on this machine would (None: one already does)
    try:
        info_a = _up(ws_a, 0)
    finally:
        if agent_port:
            agent_port.close()
    info_b = None
    try:
        status = _cli(ws_a, "cluster", "status")
        assert status.returncode == 0 and f"127.0.0.1:{HEAD_PORTS[0]}" in status.stdout, status.stdout + status.stderr
        # The default head binds every port to 127.0.0.1, the Ray Client server's too.
        assert info_a["loopback"] is True and info_a["host"] == "127.0.0.1"
        procs = head_processes(info_a["temp_dir"], str(HEAD_PORTS[0]), info_a["haproxy_dir"])
        names = [" ".join(p.cmdline()) for p in procs]
        assert any("ray.util.client.server" in line and f"--port={CLIENT_PORTS[0]}" in line for line in names), names
        assert any("gcs_server" in line for line in names) and any("dashboard.py" in line for line in names), names
        bad = _non_loopback_listeners(procs)
        assert bad == [], "listening beyond loopback:\n" + "\n".join(bad)

        # The head takes jobs although another process held the dashboard agent's default port
        # (52365) when it started: its agent got another one. Before, every submission
        # failed with HTTP 500 "No available agent to submit job".
        _job_runs_on(f"http://127.0.0.1:{DASHBOARD_PORTS[0]}")

        # `rayline run` finds the recorded head, deploys there and returns; the endpoint outlives it.
        # One worker: it trains in the driver (train.in_process; this head is this machine's one
        # node), and the worker group's start-up is no part of what this test is about.
        run = _cli(ws_a, "run", "pipelines/diabetes-torch.yaml", f"--port={SERVE_PORT}", "--set", "train.epochs=2",
                   "--set", "train.workers=1")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"The endpoint stays up on the cluster at 127.0.0.1:{HEAD_PORTS[0]}" in run.stdout
        assert "train: started 1 workers x 1 CPU, in this process" in run.stdout, run.stdout[-3000:]
        response = loopback.post(f"http://127.0.0.1:{SERVE_PORT}/diabetes/predict", timeout=60,
                              json={"instances": [{f: 0.01 for f in ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")}]})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "diabetes" and isinstance(response.json()["predictions"][0], float)
        # `rayline` connected to the loopback-only head (Ray resolves 127.0.0.1 to the external address
        # unless told otherwise), and Serve runs HAProxy there. (Not on loopback only: Ray Serve 2.60 binds
        # each replica's inter-deployment gRPC server to [::]:0 and HAProxy's stats and metrics ports to
        # *, whatever Serve's host; docs/running.md says so.)
        procs = head_processes(info_a["temp_dir"], str(HEAD_PORTS[0]), info_a["haproxy_dir"])
        assert any(_name(p) == "haproxy" for p in procs), [_name(p) for p in procs]

        _export_and_serve_deploy(ws_a, DASHBOARD_PORTS[0], response.json()["predictions"][0], info_a["token_auth"])

        # Serve already runs there on SERVE_PORT: deploying with another port must print the
        # address where the app really is (Ray ignores the new HTTP options).
        other = _deploy(ws_a, OTHER_SERVE_PORT)
        assert other.returncode == 0 and f"URL http://127.0.0.1:{SERVE_PORT}/diabetes" in other.stdout, other.stdout + other.stderr[-3000:]
        assert f"Serve already runs on this cluster at 127.0.0.1:{SERVE_PORT}; the requested 127.0.0.1:{OTHER_SERVE_PORT} is ignored" in other.stderr
        # Answering at the port Serve really has. Waited for, not asserted at once: the apps were just
        # rebuilt from the exported config by Ray's own `serve deploy` (above), and this deploy changed
        # nothing; once, right after, the route answered 404 for a moment (the ingress re-registering it).
        deadline = time.monotonic() + 60
        while (health := loopback.get(f"http://127.0.0.1:{SERVE_PORT}/diabetes/health", timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, (health.status_code, health.text[:500])
            time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            loopback.get(f"http://127.0.0.1:{OTHER_SERVE_PORT}/diabetes/health", timeout=5)

        # A second head on the same machine must survive the first one's `down`. This one is
        # open to the network, an explicit choice: recorded, and warned about with auth off.
        exposed = _cli(ws_b, "cluster", "up", f"--port={HEAD_PORTS[1]}", f"--dashboard-port={DASHBOARD_PORTS[1]}",
                       "--num-cpus=1", f"--client-port={CLIENT_PORTS[1]}", "--host=0.0.0.0", env=NO_AUTH)
        assert exposed.returncode == 0, exposed.stdout + exposed.stderr
        warning = " ".join(exposed.stderr.split())
        assert warning.startswith("warning: --host 0.0.0.0") and "ray get-auth-token --generate" in warning, warning
        assert exposed.stderr.count("\n") == 1  # one line, also when stderr is not a terminal
        assert "token auth OFF" in exposed.stdout
        info_b = json.loads((ws_b / "cluster.json").read_text())
        assert info_b["host"] == "0.0.0.0" and info_b["loopback"] is False and info_b["token_auth"] is False
        assert head_processes(info_a["temp_dir"]) and head_processes(info_b["temp_dir"])
        # No Serve on head B yet, and its port is held by a process that is not Serve: an error
        # naming the port and the holder, before anything deploys.
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", HELD_PORT))
            holder.listen()
            held = _deploy(ws_b, HELD_PORT, env=NO_AUTH)
            # `rayline run` checks the port before the data stage: no training for an endpoint
            # that could never be served there.
            run_held = _cli(ws_b, "run", "pipelines/diabetes-torch.yaml", f"--port={HELD_PORT}", env=NO_AUTH)
        assert held.returncode == 0, held.stdout + held.stderr[-3000:]
        assert f"ServeError --port: 127.0.0.1:{HELD_PORT} is already in use by another process" in held.stdout, held.stdout
        assert f"pid {os.getpid()}:" in held.stdout and "URL" not in held.stdout
        assert run_held.returncode == 1, run_held.stdout + run_held.stderr[-3000:]
        assert f"--port: 127.0.0.1:{HELD_PORT} is already in use by another process" in run_held.stderr
        assert "registered" not in run_held.stdout and "Traceback" not in run_held.stderr
        assert not (ws_b / "runs").exists() or not any((ws_b / "runs").iterdir())

        pids = [p.pid for p in head_processes(info_a["temp_dir"], str(HEAD_PORTS[0]), info_a["haproxy_dir"])]
        started = time.monotonic()
        down = _cli(ws_a, "cluster", "down")
        took = time.monotonic() - started
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        assert took < 60, f"cluster down took {took:.0f} s"
        # Every process of that head (GCS, raylet, dashboard, HAProxy, Ray's client server re-parented to
        # init), found by its command line and by the pids it had, and HAProxy's state dir.
        left = _processes_naming(info_a["temp_dir"], HEAD_PORTS[0])
        assert left == [], "\n".join(left)
        survivors = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert survivors == []
        assert not os.path.exists(info_a["haproxy_dir"])
        assert not (ws_a / "cluster.json").exists()
        assert _cli(ws_a, "cluster", "status").returncode == 1
        assert _cli(ws_b, "cluster", "status", env=NO_AUTH).returncode == 0
    finally:
        for ws in (ws_a, ws_b):
            if (ws / "cluster.json").exists():
                _cli(ws, "cluster", "down")
    assert info_b
    left = _processes_naming(info_b["temp_dir"], HEAD_PORTS[1])
    assert left == [], "\n".join(left)


_ROW = {f: 0.01 for f in ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")}


def _export_and_serve_deploy(ws, dashboard_port, expected, token_auth):
    """`rayline serve export` writes a config that Ray's own `serve deploy` CLI deploys, and the
    cluster then serves the same API from it: the routed route, the version's own route and the
    Open Inference Protocol, all with the same prediction; Ray's `serve config` shows the apps."""
    config = ws / "diabetes-serve.yaml"
    export = _cli(ws, "serve", "export", "diabetes", "--output", str(config), f"--port={SERVE_PORT}")
    assert export.returncode == 0, export.stdout + export.stderr
    assert "version 1" in export.stderr and "Traceback" not in export.stderr
    address = ["--address", f"http://127.0.0.1:{dashboard_port}"]
    # As a user runs Ray's CLI against the head: its loopback-only mode, and its token when it has one.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token" if token_auth else "disabled"}
    deployed = subprocess.run(["serve", "deploy", str(config), *address], capture_output=True, text=True, env=env,
                              timeout=120)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    base = f"http://127.0.0.1:{SERVE_PORT}"
    deadline, answers = time.monotonic() + 120, {}
    while time.monotonic() < deadline:
        try:
            answers = {
                "routed": loopback.post(f"{base}/diabetes/predict", json={"instances": [_ROW]}, timeout=30),
                "version": loopback.post(f"{base}/diabetes/v/1/predict", json={"instances": [_ROW]}, timeout=30),
                "v2": loopback.post(f"{base}/v2/models/diabetes/infer", timeout=30, json={"inputs": [
                    {"name": f, "datatype": "FP64", "shape": [1], "data": [v]} for f, v in _ROW.items()]}),
            }
        except httpx.HTTPError:
            answers = {}
        if answers and all(r.status_code == 200 for r in answers.values()):
            break
        time.sleep(1)
    assert answers and all(r.status_code == 200 for r in answers.values()), {k: r.text for k, r in answers.items()}
    assert answers["routed"].json()["predictions"][0] == expected
    assert answers["routed"].headers["x-rayline-version"] == "1"
    assert answers["version"].json()["predictions"][0] == expected
    v2 = answers["v2"].json()
    assert v2["model_name"] == "diabetes" and v2["model_version"] == "1"
    assert v2["outputs"][0]["data"][0] == pytest.approx(expected)
    shown = subprocess.run(["serve", "config", *address], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert {"diabetes", "diabetes-v1", "diabetes-oip", "rayline-v2"} <= {a["name"] for a in yaml.safe_load_all(shown.stdout) if a}
    # The version's deployment record (`rayline models show`): `rayline run`'s deploy, then this config's,
    # recorded where the controller builds the route's application (`serve deploy` returns before that;
    # the apps `rayline run` deployed answer meanwhile). A build that failed is reported with Ray's
    # message (`serve status`), and one still going on at the deadline with its status.
    deadline = time.monotonic() + 300
    while True:
        lineage = _cli(ws, "models", "show", "diabetes")
        assert lineage.returncode == 0, lineage.stderr
        deployments = lineage.stdout.split("\ndeployments: ", 1)[1].splitlines()
        if " config: " in deployments[-1]:
            break
        status = subprocess.run(["serve", "status", *address], capture_output=True, text=True, env=env, timeout=60)
        route_app = (yaml.safe_load(status.stdout or "{}") or {}).get("applications", {}).get("diabetes", {})
        assert route_app.get("status") != "DEPLOY_FAILED", route_app.get("message")
        assert time.monotonic() < deadline, f"no config record in {deployments}; `serve status`:\n{status.stdout}{status.stderr}"
        time.sleep(1)
    assert deployments[0].endswith(f" deploy: champion 100% at /diabetes (app diabetes-v1; {base}/diabetes)"), deployments
    assert deployments[-1].endswith(" config: champion 100% at /diabetes (app diabetes-v1)"), deployments


NO_AUTH = {"RAY_AUTH_MODE": "disabled"}
OTHER_SERVE_PORT = QUICK_START_PORT + 2
HELD_PORT = QUICK_START_PORT + 3

# rayline.serve.versions.deploy (what `rayline serve deploy` calls) of diabetes v1, from a driver on
# the workspace's head.
_DEPLOY_DRIVER = """
import sys
from rayline.cluster.connection import connect
from rayline.errors import ServeError
from rayline.serve.versions import deploy
from rayline.workspace import workspace

ws = workspace(None)
conn = connect(ws)
try:
    print("URL", deploy("diabetes", "1", ws=ws, host="127.0.0.1", port=int(sys.argv[1])).url)
except ServeError as exc:
    print("ServeError", " ".join(str(exc).split()))
finally:
    conn.shutdown()
"""


def _deploy(ws, port, env=None):
    env = {**os.environ, "RAYLINE_WORKSPACE": str(ws), **(env or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", _DEPLOY_DRIVER, str(port)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)

def _sessions(temp_dir):
    return [n for n in os.listdir(temp_dir) if n.startswith("session_2")] if os.path.isdir(temp_dir) else []


def test_up_that_times_out_stops_what_it_started_and_records_nothing(tmp_path):
    # `ray start --head` takes 5-15 s on 2 cores, the GCS starting within its first second or
    # two: the limit must cut it off after that. A machine on which it finishes first gets a
    # shorter limit (that head is stopped first), one on which no session had begun (a CI machine
    # three times slower) a longer one, so the test never depends on one timing.
    limit, cut_mid_start = 5.0, False
    for attempt in range(6):
        ws = tmp_path / f"slow{attempt}"
        temp_dir = head_temp_dir(ws)
        proc = _cli(ws, "cluster", "up", f"--port={HEAD_PORTS[3]}", f"--dashboard-port={DASHBOARD_PORTS[3]}",
                    f"--client-port={CLIENT_PORTS[3]}", env={"RAYLINE_CLUSTER_START_TIMEOUT_S": f"{limit:g}"}, timeout=120)
        if proc.returncode == 0:
            assert _cli(ws, "cluster", "down").returncode == 0
            limit = round(limit * 0.7, 2)
            continue
        # Timed out: one message (rich wraps it at 80 columns when stderr is not a terminal), no
        # traceback, nothing recorded and nothing left, whether or not the GCS had started.
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
        assert f"no answer within {limit:g} s; stopped what it had started" in " ".join(proc.stderr.split())
        assert not (ws / "cluster.json").exists()
        left = _processes_naming(temp_dir, HEAD_PORTS[3])
        assert left == [], "left running:\n" + "\n".join(left)
        if _sessions(temp_dir):
            cut_mid_start = True
            break
        limit *= 2
    assert cut_mid_start, f"no limit cut ray start off after its session began (last: {limit:g} s)"


def test_ctrl_c_during_up_stops_what_it_started_and_exits_130(tmp_path):
    ws = tmp_path / "int"
    temp_dir = head_temp_dir(ws)
    env = {**os.environ, "RAYLINE_WORKSPACE": str(ws)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "rayline.cli", "cluster", "up", f"--port={HEAD_PORTS[3]}",
                             f"--dashboard-port={DASHBOARD_PORTS[3]}", f"--client-port={CLIENT_PORTS[3]}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _sessions(temp_dir):  # the GCS has started: interrupt mid-start
            assert proc.poll() is None and time.monotonic() < deadline, "ray start finished or never began"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err, err
    assert not (ws / "cluster.json").exists()
    left = _processes_naming(temp_dir, HEAD_PORTS[3])
    assert left == [], "left running:\n" + "\n".join(left)


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
        listening_before_deploy = False
        while "Press Ctrl-C to stop" not in (text := log.read_text()):
            assert proc.poll() is None, text[-3000:]
            assert time.monotonic() < deadline, "no served model within 8 minutes:\n" + text[-3000:]
            # Serve starts beside the data stage and training (rayline/pipeline/run.py serve_early): its
            # HTTP port listens before the deploy stage begins (the log is read before the port is tried).
            if not listening_before_deploy and "deploy: started" not in text:
                listening_before_deploy = _listening(QUICK_START_PORT)
            time.sleep(0.5)
        assert listening_before_deploy, "Serve's port listened only once the deploy stage had begun:\n" + text[-3000:]
        assert "registered: model digits version 1" in text and "trials" in text
        # Its 2 workers a trial, on 1,259 rows x 3 epochs, train as one process a trial (rayline/train/in_process.py):
        # said in the start line, and the summary's "trained on" says what trained.
        assert re.search(r"train: started tuning: 2 trials, \d at once, 1 workers x [\d.]+ CPU, each in its trial's "
                         r"process \(train.workers 2: 1,259 rows x 3 epochs fit one process, trained with \d threads?; "
                         r"train.in_process: never keeps 2 workers\)", text), text[-3000:]
        assert re.search(r"trained on: 1 worker x cpu \(\d threads?\)", text), text[-3000:]
        curl = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl -s -X POST"))
        assert f"http://127.0.0.1:{QUICK_START_PORT}/digits/predict" in curl
        body = json.loads(curl.split(" -d '", 1)[1].rstrip("'"))
        assert len(body["instances"][0]) == 64  # one real row: every pixel feature
        served = loopback.post(f"http://127.0.0.1:{QUICK_START_PORT}/digits/predict", json=body, timeout=60)
        assert served.status_code == 200 and served.json()["predictions"][0] in range(10), served.text
        # Its embedded Ray runs no log monitor (rayline.cluster.connection.stop_log_monitor: nothing
        # reads worker logs live without --verbose); its GCS and raylet are there.
        ray_processes = []
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                ray_processes.append(" ".join(child.cmdline()))
            except psutil.Error:
                pass
        assert any("raylet" in line for line in ray_processes), ray_processes
        assert not any("log_monitor.py" in line for line in ray_processes), ray_processes
        assert "Starting execution of Dataset" not in text  # Ray Data's INFO logs stay off the terminal
        assert "Downloading artifacts" not in text  # nor MLflow's progress bars
        report = re.search(r"sweep report: (\S+\.html)", text)  # the sweep's HTML report, written and named
        assert report and (ROOT / report.group(1)).is_file(), text[-2000:]  # (ROOT / an absolute path) is that path

        proc.send_signal(signal.SIGINT)  # one Ctrl-C stops it, also after a Tune sweep
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
        assert "Ctrl-C: stopping http://127.0.0.1:" in log.read_text()  # one line naming the URL and the drain
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, env, message", [
    (["--host=10.0.0.1"], None, "error: --host: unsupported bind address (got '10.0.0.1'; allowed: 127.0.0.1, 0.0.0.0)"),
    (["--client-port=12000"], None, "error: --client-port: Ray Client server port out of range (got 12000;"),
    ([], {"RAYLINE_CLUSTER_START_TIMEOUT_S": "soon"}, "error: RAYLINE_CLUSTER_START_TIMEOUT_S: must be a number of seconds > 0"),
])
def test_up_rejects_bad_settings_before_starting_anything(tmp_path, args, env, message):
    proc = _cli(tmp_path / "ws", "cluster", "up", f"--port={HEAD_PORTS[3]}", *args, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert " ".join(proc.stderr.split()).startswith(message), proc.stderr
    assert not (tmp_path / "ws" / "cluster.json").exists()


def test_up_names_the_process_holding_a_port_before_ray_start(tmp_path):
    # `ray start` itself retried ~45 s on a taken GCS port, then printed a traceback.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", HEAD_PORTS[3]))
        holder.listen()
        proc = _cli(tmp_path / "ws", "cluster", "up", f"--port={HEAD_PORTS[3]}", timeout=120)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert text.startswith(f"error: --port: port {HEAD_PORTS[3]} on 127.0.0.1 is already in use (got pid {os.getpid()}:"), text
    assert not (tmp_path / "ws" / "cluster.json").exists()
