"""`rayline submit` and `rayline jobs` against a real Ray head with token auth on (Ray 2.60's
default), through its Jobs API only: the pytest process drives the session's embedded Ray and
never joins this head, so every step is the real CLI in a subprocess.

One head for the module (`ray start --head` with a token of its own and every port its own, as
on a cluster rayline did not start), stopped at the end with rayline.cluster's own stop, which
finds its processes by its temp dir. A tiny xgboost pipeline on iris keeps the job under a minute on 2 cores.
"""

import json
import os
import re
import secrets
import shutil
import time

import pytest
import yaml

from .. import loopback
from . import slow_model
from .test_cluster import _cli

_GCS = int(os.environ.get("RAYLINE_TEST_SUBMIT_GCS_PORT", "6411"))
_DASH = int(os.environ.get("RAYLINE_TEST_SUBMIT_DASHBOARD_PORT", "8311"))
_CLIENT = int(os.environ.get("RAYLINE_TEST_SUBMIT_CLIENT_PORT", "20411"))
_SERVE = int(os.environ.get("RAYLINE_TEST_SUBMIT_SERVE_PORT", "8811"))

SPEC = """name: iris-submit
data:
  source: {format: csv, path: data/iris.csv}
  label: target
  split: {valid: 0.2, test: 0.2, seed: 0}
task: classification
model:
  framework: xgboost
  kind: gbdt
  params: {max_depth: 3, eta: 0.3, num_boost_round: 5}
train: {workers: 1, metric: accuracy}
serve: {route: /iris-submit, replicas: {min: 1, max: 1}, oip: false}
"""


def write_iris_csv(path) -> None:
    """scikit-learn's iris as a CSV with plain column names (sepal_length, ..., target)."""
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame
    frame.columns = [c.replace(" (cm)", "").replace(" ", "_") for c in frame.columns]
    frame.to_csv(path, index=False)


# Every port of the head is ours: two heads on one machine otherwise collide on Ray's fixed
# default dashboard-agent port (52365), and a head whose agent cannot bind answers every job
# submission with 500 "No available agent" (measured: another test's head held it).
_AGENT_PORTS = {"--dashboard-agent-listen-port": 20150, "--dashboard-agent-grpc-port": 20151,
                "--metrics-export-port": 20152, "--runtime-env-agent-port": 20153, "--node-manager-port": 20154,
                "--object-manager-port": 20155}


def _start_head(temp_dir, auth):
    """`ray start --head` with token auth on, as on a cluster rayline did not start (KubeRay, the launcher)."""
    import subprocess

    from rayline.cluster.env import train_env
    from rayline.cluster.head import ray_cli

    cmd = [ray_cli(), "start", "--head", f"--port={_GCS}", "--num-cpus=2", "--disable-usage-stats",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={_DASH}",
           f"--ray-client-server-port={_CLIENT}", f"--temp-dir={temp_dir}",
           *(f"{flag}={port}" for flag, port in _AGENT_PORTS.items())]
    env = {**os.environ, **train_env(), **auth}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A token-auth head on this module's ports, a workspace for its jobs, and a project to submit."""
    from rayline.cluster.head import stop_head

    root = tmp_path_factory.mktemp("submit")
    ws, project = root / "ws", root / "proj"
    (project / "data").mkdir(parents=True)
    write_iris_csv(project / "data" / "iris.csv")
    (project / "iris.yaml").write_text(SPEC)
    # A run that lasts until it is stopped, its training step asleep (not 100,000 boosting rounds
    # keeping a CPU busy while the test waits): the builder module beside the spec, sent with the project.
    slow_model.write(project)
    long = {**yaml.safe_load(SPEC), "name": "iris-long", "model": slow_model.MODEL,
            "train": {"workers": 1, "metric": "accuracy", "epochs": 100_000, "batch_size": 16}}
    del long["serve"]
    (project / "iris-long.yaml").write_text(yaml.safe_dump(long))
    (project / ".gitignore").write_text("data/\n*.log\n")  # data is ignored by git, yet the job needs it
    (project / "debug.log").write_text("x")
    token = "rl-" + secrets.token_hex(16)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    temp_dir = f"/tmp/rlsub-{os.getpid()}"  # short: Ray's socket paths must stay under ~107 characters
    head_info = {"temp_dir": temp_dir, "address": f"127.0.0.1:{_GCS}"}
    try:
        up = _start_head(temp_dir, auth)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        outputs = []  # every CLI output of the module, grepped for the token at the end
        yield {"ws": ws, "project": project, "token": token, "outputs": outputs, "root": root,
               "env": {**auth, "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{_DASH}"}}
    finally:
        stop_head(head_info)  # this head's processes only (found by its temp dir); never `ray stop`
        shutil.rmtree(temp_dir, ignore_errors=True)


def _run(head, *args, env=None, unset=(), timeout=300):
    """The CLI with the head's settings (`env` on top); `unset`: variables it must not see at all."""
    if unset:
        import subprocess
        import sys

        from .conftest import ROOT

        full = {**os.environ, "RAYLINE_WORKSPACE": str(head["ws"]), **head["env"], **(env or {})}
        for key in (*unset, "RAY_ADDRESS"):
            full.pop(key, None)
        proc = subprocess.run([sys.executable, "-m", "rayline.cli", *args], capture_output=True, text=True, cwd=ROOT,
                              env=full, timeout=timeout)
    else:
        proc = _cli(head["ws"], *args, env={**head["env"], **(env or {})}, timeout=timeout)
    head["outputs"].append(proc.stdout + proc.stderr)
    return proc


def _one_line_error(proc, start):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert proc.stderr.startswith(start), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def _job_id(stdout):
    return stdout.split("submitted job ", 1)[1].split()[0]


def test_submit_follow_runs_the_pipeline_and_jobs_show_it(head, tmp_path):
    # The client's token comes from a token FILE, as for a user after `ray start` or `ray get-auth-token`
    # (~/.ray/auth_token), with no RAY_AUTH_* variable set: rayline finds the head requires one and
    # sends it (the two-node token cluster of test_cluster_auth.py covers `run --address` that way).
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(head["token"] + "\n")
    start = time.monotonic()
    proc = _run(head, "submit", str(head["project"] / "iris.yaml"), f"--port={_SERVE}", "--follow",
                env={"HOME": str(tmp_path)}, unset=("RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"))
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    out = proc.stdout
    job = _job_id(out)
    # What was shipped: the project's two specs, the slow model's module and the (git-ignored) data, not
    # the ignored log.
    assert "shipped: 4 files" in out and "left out: .gitignore/.rayignore: 1" in out, out[:2000]
    assert f"workspace on the cluster: {head['ws']}" in out
    assert f"dashboard: http://127.0.0.1:{_DASH}/#/jobs/{job}" in out
    # The driver's progress, as plain lines while it runs, and the summary.
    # The job's driver trains the one worker itself (a head of one node), and says how long: xgboost's rounds.
    assert re.search(r"train: started 1 workers x [\d.]+ CPUs?, in this process, 5 boosting rounds, one booster", out), out[-4000:]
    for line in ("data: started csv", "data: done in", "train: started 1 workers", "train: done in",
                 "register: done in", "registered: model iris-submit version 1",
                 f"deploy: started /iris-submit on 127.0.0.1:{_SERVE}", f"endpoint: http://127.0.0.1:{_SERVE}/iris-submit",
                 f"job {job} SUCCEEDED"):
        assert line in out, (line, out[-4000:])
    # The endpoint outlives the job: Serve apps belong to the cluster.
    answer = loopback.post(f"http://127.0.0.1:{_SERVE}/iris-submit/predict", timeout=60, json={"instances": [
        {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]})
    assert answer.status_code == 200 and answer.json()["predictions"] == [0], answer.text
    print(f"submit --follow: {took:.1f} s")

    listed = _run(head, "jobs", "list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [line.split() for line in listed.stdout.splitlines() if job in line][0][:2] == [job, "SUCCEEDED"]
    assert listed.stdout.rstrip().endswith("iris.yaml")
    status = _run(head, "jobs", "status", job)
    assert status.returncode == 0 and "status:     SUCCEEDED" in status.stdout and "exit code:  0" in status.stdout
    logs = _run(head, "jobs", "logs", job)
    assert logs.returncode == 0 and "train: done in" in logs.stdout and "registered: model iris-submit" in logs.stdout
    # The model landed in the workspace the job was given, not in its throwaway working_dir.
    assert f"register: started sqlite:///{head['ws']}/mlflow.db" in out and (head["ws"] / "mlflow.db").is_file()

    unknown = _run(head, "jobs", "status", "raysubmit_doesnotexist")
    _one_line_error(unknown, "error: raysubmit_doesnotexist: no such job on")


def test_without_a_token_it_fails_closed_and_the_token_never_shows(head, tmp_path):
    no_token = {"RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": "", "RAY_AUTH_MODE": "", "HOME": str(tmp_path)}
    before = loopback.get(f"http://127.0.0.1:{_DASH}/api/jobs/", headers={"Authorization": f"Bearer {head['token']}"},
                       timeout=30).json()
    for args in (["submit", str(head["project"] / "iris.yaml"), "--no-serve"], ["jobs", "list"]):
        proc = _run(head, *args, env=no_token)
        _one_line_error(proc, f"error: http://127.0.0.1:{_DASH}: the Ray cluster requires token authentication "
                              "and no token is set")
        assert "RAY_AUTH_TOKEN" in proc.stderr and "RAY_AUTH_TOKEN_PATH" in proc.stderr
    wrong = _run(head, "jobs", "list", env={"RAY_AUTH_TOKEN": "rl-wrong-" + "0" * 20})
    _one_line_error(wrong, f"error: http://127.0.0.1:{_DASH}: the Ray cluster rejected the auth token")
    after = loopback.get(f"http://127.0.0.1:{_DASH}/api/jobs/", headers={"Authorization": f"Bearer {head['token']}"},
                      timeout=30).json()
    assert len(after) == len(before)  # nothing was submitted without the token

    # An oversized file fails at submit, naming it, before anything is uploaded.
    big = head["project"] / "weights.bin"
    big.write_bytes(b"\0" * (2 * 1024 * 1024))
    try:
        proc = _run(head, "submit", str(head["project"] / "iris.yaml"), "--max-file-mb", "1")
        _one_line_error(proc, "error: weights.bin: 2.0 MiB is over the 1.0 MiB limit")
    finally:
        big.unlink()

    # The token is nowhere: not in any output of this module, nor in what the cluster keeps of a job.
    jobs = json.dumps(after)
    assert head["token"] not in jobs and "RAY_AUTH_TOKEN" not in jobs
    for text in head["outputs"]:
        assert head["token"] not in text


def test_a_failing_job_exits_with_its_drivers_code(head):
    # An absolute data path is read on the cluster, as written; there it does not exist: the
    # driver's `rayline run` exits 2 (bad data), and so does `submit --follow`.
    proc = _run(head, "submit", str(head["project"] / "iris.yaml"), "--no-serve", "--follow",
                "--set", "data.source.path=/nonexistent/iris.csv")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "data.source.path" in proc.stdout and "/nonexistent/iris.csv" in proc.stdout, proc.stdout[-3000:]
    assert proc.stderr.strip().splitlines()[-1].endswith("FAILED: Job entrypoint command failed with exit code 2"), proc.stderr
    status = _run(head, "jobs", "status", _job_id(proc.stdout))
    assert "status:     FAILED\nmessage:    Job entrypoint command failed with exit code 2\nexit code:  2\n" in status.stdout, status.stdout


def test_jobs_stop_stops_a_running_job(head):
    # A long run, stopped while it trains: 100,000 epochs of a model whose step sleeps (slow_model.py).
    proc = _run(head, "submit", str(head["project"] / "iris-long.yaml"), "--no-serve")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = _job_id(proc.stdout)
    assert f"follow:  rayline jobs logs {job} --follow" in proc.stdout and f"rayline jobs stop {job}" in proc.stdout
    deadline = time.monotonic() + 120
    logs = ""
    while "train: started" not in logs and time.monotonic() < deadline:  # polled over HTTP: a CLI call costs ~3 s here
        time.sleep(1)
        logs = loopback.get(f"http://127.0.0.1:{_DASH}/api/jobs/{job}/logs", timeout=30,
                         headers={"Authorization": f"Bearer {head['token']}"}).json()["logs"]
    assert "train: started" in logs, logs[-3000:]
    # Ctrl-C while following stops following, not the job; so does SIGTERM (docker stop, Kubernetes).
    # Two followers at once, one per signal: one CLI start-up paid for both.
    import signal
    import subprocess
    import sys
    import threading

    from .conftest import ROOT

    env = {**os.environ, **head["env"], "RAYLINE_WORKSPACE": str(head["ws"])}
    followers = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([sys.executable, "-m", "rayline.cli", "jobs", "logs", job, "--follow"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list = []
        reader = threading.Thread(target=lambda p=proc, into=lines: into.extend(iter(p.stdout.readline, "")), daemon=True)
        reader.start()
        followers[sig] = (proc, lines, reader)
    deadline = time.monotonic() + 60
    while not all(any("train: started" in line for line in lines) for _, lines, _ in followers.values()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)  # until both stream
    for sig, (proc, _, _) in followers.items():
        proc.send_signal(sig)
    for sig, (proc, lines, reader) in followers.items():
        err = proc.stderr.read()
        proc.wait(timeout=60)
        reader.join(timeout=10)
        out = "".join(lines)
        head["outputs"].append(out + err)
        assert proc.returncode == 130, (sig, out[-2000:] + err)
        assert err.strip().splitlines()[-1] == (f"stopped following {job}; the job keeps running on the cluster "
                                                f"(stop it with `rayline jobs stop {job}`)"), (sig, err)
        assert "Traceback" not in err and "SIGTERM received" not in err and "train: started" in out, (sig, err)
    status = loopback.get(f"http://127.0.0.1:{_DASH}/api/jobs/{job}", headers={"Authorization": f"Bearer {head['token']}"},
                       timeout=30).json()["status"]
    assert status == "RUNNING"
    stopped = _run(head, "jobs", "stop", job)
    assert stopped.returncode == 0 and f"job {job} STOPPED" in stopped.stdout, stopped.stdout + stopped.stderr
    follow = _run(head, "jobs", "logs", job, "--follow", timeout=120)
    assert follow.returncode == 130, follow.stdout[-2000:] + follow.stderr
    assert f"job {job} STOPPED" in follow.stderr
    again = _run(head, "jobs", "stop", job)
    assert again.returncode == 0 and "is not running (STOPPED)" in again.stdout
