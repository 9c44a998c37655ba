"""A client with a Ray token file against a two-node cluster with token authentication.

`~/.ray/auth_token` is left on a machine by any earlier `ray start` or `rayline cluster up`; it says
nothing about the cluster a user then names. rayline used to turn Ray's token mode on whenever such
a file existed: against a cluster started without token auth, `rayline run --address` then failed in
the data stage ("The object's owner has exited") or sat there printing nothing for 13 minutes. That
case, a client whose token file the cluster never heard of, is tests/integration/test_multinode.py's:
its cluster runs without token auth, and its `rayline submit --follow`, `rayline run --address` and
`rayline jobs list` run with such a file (a cluster of its own here cost the suite ~75 s).

The cluster is two separate `ray start` nodes on this machine (tests/integration/multinode_cluster.py):
a head with no CPUs and a worker node with 2, so every read and training task runs on the other
node and every result crosses nodes to the driver. The client's HOME holds the cluster's token file:
`rayline run --address` (the driver in the client process) trains and registers a tiny pipeline, the
token file reaches the Jobs API, and a client without the token gets one line naming the variables to
set.
"""

import json
import os
import secrets
import sys
import time

import pytest

from .. import loopback
from ..hang_report import run_or_report
from .multinode_cluster import LocalCluster
from .test_submit import write_iris_csv

SPEC = """name: iris-auth
data:
  source: {format: csv, path: iris.csv}
  label: target
  split: {valid: 0.2, test: 0.2, seed: 0}
task: classification
model:
  framework: xgboost
  kind: gbdt
  params: {max_depth: 3, eta: 0.3, num_boost_round: 5}
train: {workers: 1, metric: accuracy}
"""

# Ports apart from every other module's clusters and heads (test_multinode 6414/8314/20414 and node
# ports 20420+; test_submit 6411; test_cluster 6390-6393).
PORTS = (6416, 8316, 20416, 20520)


def _home_with_token(root, token: str | None):
    home = root / ("home-with-token" if token else "home-without-token")
    (home / ".ray").mkdir(parents=True)
    if token:
        (home / ".ray" / "auth_token").write_text(token)
    return home


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("auth-token")
    project = root / "project"
    project.mkdir()
    write_iris_csv(project / "iris.csv")
    (project / "iris.yaml").write_text(SPEC)
    cluster_token = "rl-" + secrets.token_hex(16)
    gcs, dashboard, client, base = PORTS
    cluster = LocalCluster(gcs, dashboard, client, auth={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster_token},
                           port_base=base)
    home = _home_with_token(root, cluster_token)  # the client's token file: the cluster's own
    try:
        started = time.monotonic()
        cluster.start_head(num_cpus=0)
        cluster.add_workers(1, num_cpus=2)
        print(f"token cluster of 2 nodes up in {time.monotonic() - started:.0f} s")
        yield {"cluster": cluster, "root": root, "project": project, "home": home}
    finally:
        left = cluster.shutdown()
    assert left == [], "processes of the test cluster left running:\n" + "\n".join(left)


def _client(setup, *args, home=None, timeout=420):
    """The CLI as a user on this machine runs it: HOME with a token file, no Ray variables set."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_API_SERVER", "RAYLINE_WORKSPACE"))}
    env["HOME"] = str(home or setup["home"])
    started = time.monotonic()
    proc = run_or_report([sys.executable, "-m", "rayline.cli", *args], cwd=setup["project"], env=env, timeout=timeout)
    return proc, time.monotonic() - started


def test_run_with_address_trains_and_registers(cluster):
    """The driver is this client; the data is read and trained on the other node."""
    ws = cluster["root"] / "ws-run"
    proc, took = _client(cluster, "run", "iris.yaml", "--address", cluster["cluster"].address, "--no-serve",
                         "--workspace", str(ws))
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 0, shown[-4000:]
    assert "registered: model iris-auth version 1" in shown, shown[-4000:]
    print(f"token: rayline run --address took {took:.0f} s")


def test_jobs_api_gets_the_token_from_the_clients_token_file(cluster):
    """The client's token file reaches the Jobs API: `jobs list` lists a job only an authenticated
    caller sees (a client without one is refused, below). The whole submit to a token head, with the
    client's token from ~/.ray/auth_token and no RAY_AUTH_* variable, is test_submit.py's (its job's
    driver runs on the head with the cluster's own token, as here); a second one here cost the suite ~70 s."""
    # A job only an authenticated caller can see: submitted with the cluster's token over Ray's own
    # Jobs REST API, then listed by `rayline jobs list` with nothing but the client's token file.
    job_id = "rl-auth-" + secrets.token_hex(4)
    submitted = loopback.post(f"{cluster['cluster'].dashboard}/api/jobs/", json={"entrypoint": "true", "submission_id": job_id},
                           headers=cluster["cluster"].headers(), timeout=60)
    assert submitted.status_code == 200, submitted.text
    jobs, _ = _client(cluster, "jobs", "list", "--address", cluster["cluster"].dashboard, "-o", "json", timeout=120)
    assert jobs.returncode == 0 and "error" not in jobs.stderr, jobs.stdout + jobs.stderr
    assert job_id in [job["job"] for job in json.loads(jobs.stdout)], jobs.stdout


def test_a_client_without_the_token_gets_one_line(cluster):
    no_token = _home_with_token(cluster["root"] / "elsewhere", None)
    jobs, _ = _client(cluster, "jobs", "list", "--address", cluster["cluster"].dashboard, home=no_token, timeout=120)
    run, _ = _client(cluster, "run", "iris.yaml", "--address", cluster["cluster"].address, "--no-serve", home=no_token,
                     timeout=120)
    for proc in (run, jobs):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "requires token authentication and no token is set" in proc.stderr, proc.stderr
        assert "RAY_AUTH_TOKEN" in proc.stderr and "RAY_AUTH_TOKEN_PATH" in proc.stderr, proc.stderr
