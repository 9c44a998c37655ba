"""A pipeline on a multi-node Ray cluster, submitted with `rayline submit`, surviving a dead node.

The test starts a cluster of its own on this machine (tests/integration/multinode_cluster.py):
a head with no CPUs (it runs the job's driver, the Train controller and Serve's controller) and
two worker nodes with 1 CPU each, every node a separate `ray start` with its own ports and Ray
temp dir. The pipeline (diabetes, torch, 2 DDP workers x 1 CPU) is submitted through the head's
Jobs API, as a user would from a laptop. Then, from Ray's own state (the dashboard's state API
and Ray Train's run state), while training runs:

- the two DDP workers run on the two different worker nodes (one rank per node);
- once a checkpoint of epoch >= 1 is registered in the run's storage, the node hosting rank 1
  is killed outright (SIGKILL of its raylet, agents and workers: a machine dying), and a fresh
  1-CPU node joins (what an autoscaler does), so the two workers can be placed again;
- the run recovers from its latest checkpoint -- on shared storage: every node is on this
  machine, so the workspace, a local path, is a filesystem every node reads and writes, as an
  NFS or a cloud volume mount would be on a real cluster -- and completes: the job succeeds,
  the model is registered, the checkpoint's history shows training resumed from epoch >= 1
  (not from epoch 0), the recovered workers' live weights and optimizer state before their first
  step were exactly those of the checkpoint they restored (copied at the kill), Ray Train ran a
  second attempt on the surviving and the new node;
- the registered model is served by a replica on a worker node, and the endpoint answers HTTP;
- the split its data stage made on the two worker nodes is the one the session's single node
  makes of the same data (split sizes and the raw test rows, from the data cache entry);
- the model's retrain loop (the spec's retrain section) runs on the head node; restarted, it runs
  again a retrain recorded on a node that has since died, and waits for one that still runs on its
  own node (the next test).

The cluster runs without token authentication, and the client's HOME holds a token file it never
heard of (as one left on a laptop by an earlier `ray start`): rayline used to send that token to any
cluster named, and `rayline run --address` then failed in the data stage or hung. The submit above,
and after it `rayline run --address` (the driver in the client, the training on the worker nodes)
and `rayline jobs list`, run with that HOME (the token cluster's side is test_cluster_auth.py's).

The pytest process never joins this cluster, nor uses the session's embedded Ray (so it runs in
the lane beside that Ray's tests): it talks to the cluster through rayline's CLI and the
dashboard's HTTP API only. Every node is stopped after
the module, on failure too, and the test checks that no process of any node is left.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .. import loopback
from ..hang_report import run_or_report
from .conftest import ROOT
from .multinode_cluster import LocalCluster
from .restore_evidence import assert_restored, copy_checkpoints, latest_checkpoint

GCS_PORT = 6414
DASHBOARD_PORT = 8314
CLIENT_PORT = 20414
SERVE_PORT = 8814
EPOCHS = 20  # the node dies at epoch 1-2 (measured); the rest run after the recovery


@pytest.fixture(scope="module")
def cluster():
    cluster = LocalCluster(GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, auth={"RAY_AUTH_MODE": "disabled"})
    try:
        started = time.monotonic()
        cluster.start_head(num_cpus=0)
        cluster.add_workers(2, num_cpus=1)
        print(f"cluster of 3 nodes up in {time.monotonic() - started:.0f} s")
        yield cluster
    finally:
        started = time.monotonic()
        left = cluster.shutdown()
        print(f"cluster stopped in {time.monotonic() - started:.0f} s")
    assert left == [], "processes of the test cluster left running:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory):
    """The submitted pipeline's workspace: a path every node of this one-machine cluster reaches."""
    return tmp_path_factory.mktemp("shared") / "shared-ws"


@pytest.fixture(scope="module")
def stray_token_home(tmp_path_factory):
    """A client's HOME whose ~/.ray/auth_token this cluster never heard of."""
    home = tmp_path_factory.mktemp("client") / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("rl-" + secrets.token_hex(16))
    return home


def _client_env(home) -> dict:
    """The CLI as a user on this machine runs it: HOME as given, no Ray variables set."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_API_SERVER", "RAYLINE_WORKSPACE"))}
    env["HOME"] = str(home)
    return env


def _train_run(cluster) -> dict | None:
    """Ray Train's record of the (only) training run on the cluster: attempts, workers, ranks, nodes."""
    response = loopback.get(f"{cluster.dashboard}/api/train/v2/runs/v1", headers=cluster.headers(), timeout=30)
    if response.status_code != 200:
        return None  # no Train run yet (the state actor starts with the first run)
    runs = response.json()["train_runs"]
    return runs[0] if runs else None


def _running_workers(cluster) -> dict[int, str]:
    """world rank -> node id of the RUNNING attempt's workers, or {}."""
    run = _train_run(cluster)
    for attempt in (run or {}).get("attempts", []):
        if attempt["status"] == "RUNNING":
            return {w["world_rank"]: w["node_id"] for w in attempt["workers"]}
    return {}


def _checkpoint_epochs(run_dir: str) -> list[int]:
    """Epochs of the checkpoints Ray Train's controller has registered: its snapshot's record only.

    Not rayline's `_registered_checkpoints`, which scans every checkpoint_* folder when the
    snapshot is missing or half-written: the workers write a checkpoint's folder before the
    controller registers it, and a kill in between restores the one before (S1 of 2026-12-01: the
    scan showed epoch 1, the controller had registered only epoch 0, and the run resumed from 0)."""
    from rayline.train.loop import read_state
    from rayline.train.run import snapshot_checkpoints

    registered = snapshot_checkpoints(run_dir) if os.path.isdir(run_dir) else None
    return sorted(s["epoch"] for s in map(read_state, registered or []) if s)


def _wait(what: str, check, proc, log, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"the job ended before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def _answer(url: str, body: dict, cluster, tmp_path, attempts: int = 3) -> httpx.Response:
    """The endpoint's answer. A request that timed out is sent again, up to `attempts` in all (on a
    CI machine at load average 15 one took over 60 s, right after the job had seen the route
    answer); the last timeout fails the test with the nodes' logs kept in tmp_path/ray-logs."""
    for attempt in range(1, attempts + 1):
        try:
            return loopback.post(url, json=body, timeout=60)
        except httpx.TimeoutException:
            if attempt == attempts:
                cluster.save_logs(str(tmp_path / "ray-logs"))
                raise


def test_submitted_pipeline_trains_across_nodes_survives_a_dead_node_and_serves(cluster, stray_token_home, shared_ws,
                                                                                  tmp_path):
    ws = shared_ws
    log = tmp_path / "submit.log"
    env = _client_env(stray_token_home)
    cmd = [sys.executable, "-m", "rayline.cli", "submit", "pipelines/diabetes-torch.yaml",
           "--address", cluster.dashboard, "--workspace", str(ws), "--port", str(SERVE_PORT), "--follow",
           "--set", f"train.epochs={EPOCHS}", "--set", "train.cpus_per_worker=1", "--set", "train.max_failures=2",
           "--set", "serve.oip=false",  # no V2 app of the model's own: a replica more, not what this is about
           # A retrain loop that only the next test's record sets retraining (a day's schedule: no retrain here).
           "--set", "retrain.on=[schedule]", "--set", "retrain.every=1d"]
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        # DDP across nodes, from Ray's state: one worker actor per worker node, ranks 0 and 1.
        ranks = _wait("2 training workers running", lambda: (lambda w: w if len(w) == 2 else None)(_running_workers(cluster)),
                      proc, log, 240)
        t_train = time.monotonic()
        worker_nodes = {n.node_id for n in cluster.nodes[1:]}
        assert set(ranks) == {0, 1} and set(ranks.values()) == worker_nodes, (ranks, worker_nodes)
        actors = cluster.state("actors", class_name="RayTrainWorker", state="ALIVE")
        assert sorted(a["node_id"] for a in actors) == sorted(worker_nodes), actors

        runs = ws / "runs"
        run_dir = _wait("the run's folder", lambda: next(iter(runs.glob("diabetes-*/train")), None) if runs.exists() else None,
                        proc, log, 60)
        epochs = _wait("a checkpoint of epoch >= 1", lambda: [e for e in _checkpoint_epochs(str(run_dir)) if e >= 1],
                       proc, log, 120)
        assert max(epochs) < EPOCHS - 1, f"training finished before the node was killed ({epochs}): raise EPOCHS"

        victim = next(n for n in cluster.nodes if n.node_id == ranks[1])
        victim_workers = [a["pid"] for a in cluster.state("actors", class_name="RayTrainWorker", state="ALIVE")
                          if a["node_id"] == victim.node_id]
        killed = cluster.kill(victim)
        assert killed, "no process of the rank-1 node was found"
        # Its training worker dies with it. (Once, in a CI run, the worker outlived the kill of the
        # node's process tree and rank 0 trained on with it: no failure, no restart to check.)
        for pid in set(victim_workers) - set(killed):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        t_kill = time.monotonic()
        # No report completes without rank 1, so no checkpoint registers (and none is deleted) until the
        # recovered attempt has restored: the checkpoint it restores from is among these copies.
        copies = copy_checkpoints(str(run_dir), str(tmp_path / "at-kill"))
        replacement = cluster.add_worker(num_cpus=1)  # as an autoscaler would: the 2 workers fit again
        t_added = time.monotonic()

        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    except BaseException:
        cluster.save_logs(str(tmp_path / "ray-logs"))  # what each node logged, kept past the teardown
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - started
    text = log.read_text()
    assert "registered: model diabetes version 1" in text, text[-4000:]
    # Not "no Traceback": the job's log also carries Ray's own reports about the dead node's workers.
    assert not [line for line in text.splitlines() if line.startswith("error:")], text[-4000:]
    assert text.rstrip().endswith("SUCCEEDED"), text[-2000:]
    assert "worker failures: training restarted from the checkpoints of epochs" in text, text[-4000:]
    assert "retrain loop of diabetes: watching (schedule;" in text, text[-4000:]

    # Recovered from the checkpoint on shared storage, not from scratch.
    from rayline.train.run import locate_best

    result = locate_best(str(run_dir), "rmse", "min")
    assert len(result.resumed_from) >= 1 and result.resumed_from[0] >= 1, result.resumed_from
    assert [row["epoch"] for row in result.history] == list(range(EPOCHS)), result.history
    resumed_at = result.resumed_from[0]
    assert all(row["resumed"] == 0 for row in result.history[:resumed_at + 1])
    assert all(row["resumed"] >= 1 for row in result.history[resumed_at + 1:])
    # The recovered workers trained from exactly that checkpoint's weights and optimizer state (read from
    # their live model and optimizer before the first step), not a fresh model's, and trained on.
    restores = assert_restored(result.starts, result.resumed_from, copies, latest_checkpoint(str(run_dir)))
    assert restores[0]["epoch"] == resumed_at
    # Ray Train's view: a failed attempt, then one on the surviving and the new node that finished.
    attempts = _train_run(cluster)["attempts"]
    assert len(attempts) >= 2 and attempts[-1]["status"] == "FINISHED", [a["status"] for a in attempts]
    survivor = next(n for n in cluster.nodes[1:3] if n is not victim)
    assert {w["node_id"] for w in attempts[-1]["workers"]} == {survivor.node_id, replacement.node_id}, attempts[-1]

    # Served from a worker node (the head has no CPUs), over HTTP through the head's Serve port.
    body = {"instances": [{f: 0.01 for f in ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")}]}
    response = _answer(f"http://127.0.0.1:{SERVE_PORT}/diabetes/predict", body, cluster, tmp_path)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "diabetes" and response.json()["version"] == "1"
    assert isinstance(response.json()["predictions"][0], float)
    replicas = [a for a in cluster.state("actors", state="ALIVE") if a["class_name"].startswith("ServeReplica:diabetes")]
    assert replicas and all(a["node_id"] in {survivor.node_id, replacement.node_id} for a in replicas), replicas
    # The split the cluster's data stage made (its tasks ran on the two worker nodes: the head has
    # no CPUs) is the split of the data by its definition (rayline/data/split.py: a hash of each
    # row's values and the seed, computed here in pandas, no Ray): the same split sizes, and the
    # same raw test rows, read from the data cache entry the cluster's tasks wrote.
    import json

    import pyarrow.parquet as pq
    from sklearn.datasets import load_diabetes

    from rayline.data.split import TEST, Thresholds, row_hashes
    from rayline.data.sources import feature_columns
    from rayline.spec import load_spec

    data = load_spec(ROOT / "pipelines" / "diabetes-torch.yaml").data
    frame = load_diabetes(as_frame=True).frame
    hashes = row_hashes(frame, feature_columns(data, list(frame.columns)) + [data.label], data.split.seed)
    thresholds = Thresholds(data.split.valid, data.split.test)
    (meta_file,) = list((ws / "data-cache").glob("*/meta.json"))
    meta = json.loads(meta_file.read_text())
    assert meta["rows"] == thresholds.counts(hashes), (meta["rows"], thresholds.counts(hashes))
    on_cluster = pq.read_table(meta_file.parent / "test_rows").to_pandas()
    on_one_node = frame[thresholds.mask(hashes, TEST)]
    key = list(on_one_node.columns)
    assert sorted(map(tuple, on_cluster[key].to_numpy().tolist())) == sorted(map(tuple, on_one_node[key].to_numpy().tolist()))
    print(f"multi-node run: {took:.0f} s from submit to served (workers placed {t_train - started:.0f} s, node killed "
          f"{t_kill - started:.0f} s, replacement joined {t_added - started:.0f} s); resumed from epoch {resumed_at}; "
          f"killed node {victim.index} ({len(killed)} processes)")


def _loop_actor(cluster) -> dict | None:
    actors = cluster.state("actors", class_name="RetrainLoop", state="ALIVE")
    return actors[0] if len(actors) == 1 else None


def test_the_retrain_loop_lives_on_the_head_and_finds_its_retrain_on_the_retrains_own_node(cluster, stray_token_home,
                                                                                             shared_ws):
    """After the test above: the served model's retrain loop (a detached actor the job's driver started,
    watching a schedule of a day) runs on the head node, where a worker node's death or scale-down
    never reaches it. A loop restarted while its record says a retrain runs asks the retrain's own
    node whether its process lives:

    - the record names the node killed above and a pid that lives on this machine (as some other
      process's pid would on the node where the loop restarts): the old check of the loop's own kernel
      waited for it forever; the node is gone, so the retrain is run again (here it fails at once, as
      the endpoint's replicas hold part of both 1-CPU nodes, and the loop records why);
    - the record names the head and a process of its own session that runs there (a retrain that
      outlived the loop's process): the restarted loop waits for it, does not start a second, and
      `rayline retrain stop` from the client ends it with the loop."""

    from rayline.registry import RETRAIN_LOOP_TAG, Registry
    from rayline.retrain.decisions import new_record
    from rayline.workspace import workspace

    head, dead = cluster.nodes[0], next(n for n in cluster.nodes if not n.alive)
    registry = Registry(workspace(shared_ws))
    env = _client_env(stray_token_home)

    def restart_with(record: dict, loop: dict) -> None:
        """Save `record` as the loop's and kill the loop's process: Ray restarts the actor, which reads it."""
        registry.set_model_tag("diabetes", RETRAIN_LOOP_TAG, json.dumps(record))
        os.kill(loop["pid"], signal.SIGKILL)

    def status() -> dict:
        shown = run_or_report([sys.executable, "-m", "rayline.cli", "retrain", "status", "diabetes", "--address",
                               cluster.address, "--workspace", str(shared_ws), "-o", "json"], cwd=ROOT, env=env, timeout=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        return json.loads(shown.stdout)

    def saved() -> dict:
        return json.loads(registry.model_tag("diabetes", RETRAIN_LOOP_TAG) or "{}")

    def wait_for(what: str, check, timeout_s: float = 120):
        deadline = time.monotonic() + timeout_s
        while not (value := check()):
            assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}; the record: {saved()}"
            time.sleep(0.5)
        return value

    def restarted(*before: dict) -> dict | None:
        """The loop's actor when it is alive in a process none of `before` had."""
        loop = _loop_actor(cluster)
        return loop if loop and loop["pid"] not in {b["pid"] for b in before} else None

    def decided_after_lost_retrain() -> dict | None:
        record = saved()
        return record if record.get("state") == "watching" and record["decisions"][-1]["decision"] == "failed" else None

    def waiting_for_inherited_retrain() -> dict | None:
        shown = status()
        return shown if "started before a restart" in (shown["waiting"] or "") else None

    first = _loop_actor(cluster)
    assert first and first["node_id"] == head.node_id, cluster.state("actors", class_name="RetrainLoop")
    record = new_record(time.time(), 86400.0)  # the loop's own until its first change of state (a day's schedule)

    def retraining(run_id: str, pid: int, node: str) -> dict:
        return {**record, "state": "retraining", "current": {
            "id": run_id, "trigger": "schedule", "detail": "every 86400 s", "started": time.time(), "fingerprint": None,
            "champion": "1", "version": None, "rollout": None, "pid": pid, "node": node, "log": None}}

    # A retrain on the dead node, whose pid lives here.
    restart_with(retraining("lost0node001", os.getpid(), dead.node_id), first)
    after = wait_for("the restarted loop's decision on the lost retrain", decided_after_lost_retrain)
    decided = [d["decision"] for d in after["decisions"]]
    assert decided[-2:] == ["resumed", "failed"], after["decisions"]
    assert "CPUs" in after["decisions"][-1]["why"], after["decisions"][-1]  # the run itself said why, on this cluster
    assert (shared_ws / "retrain" / "diabetes-lost0node001.log").exists()  # started again, under the same id
    again = wait_for("the restarted loop", lambda: restarted(first))
    assert again["node_id"] == head.node_id, again

    # A retrain of the head's that outlived the loop's process (a session of its own, as the loop starts them).
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        record = after
        restart_with(retraining("outlived0001", survivor.pid, head.node_id), again)
        third = wait_for("the loop restarted again", lambda: restarted(first, again))
        assert third["node_id"] == head.node_id, third
        shown = wait_for("the restarted loop's look at the retrain", waiting_for_inherited_retrain)
        assert shown["record"]["state"] == "retraining" and f"pid {survivor.pid}" in shown["waiting"], shown
        stop = run_or_report([sys.executable, "-m", "rayline.cli", "retrain", "stop", "diabetes", "--address", cluster.address,
                              "--workspace", str(shared_ws)], cwd=ROOT, env=env, timeout=180)
        assert stop.returncode == 0 and "retrain loop stopped" in stop.stdout, stop.stdout + stop.stderr
        assert survivor.wait(timeout=30) == -signal.SIGTERM  # ended by the stop, as Ctrl-C ends a run
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait()
    assert _loop_actor(cluster) is None
    final = saved()
    assert final["state"] == "stopped" and [d["decision"] for d in final["decisions"]][-3:] == ["resumed", "failed", "stopped"], \
        final["decisions"]


def test_a_client_with_a_stray_token_file_runs_and_lists_jobs_without_token_auth(cluster, stray_token_home, tmp_path):
    """After the test above, on the same cluster (its two worker nodes hold the diabetes endpoint's
    replicas): `rayline run --address` with the token file the cluster never heard of trains and
    registers, the driver in this client and the training on a worker node; `rayline jobs list`, with
    that file and with none, lists the submitted job: nothing to send, nothing asked."""
    from .test_cluster_auth import SPEC
    from .test_submit import write_iris_csv

    project = tmp_path / "project"
    project.mkdir()
    write_iris_csv(project / "iris.csv")
    (project / "iris.yaml").write_text(SPEC)
    # A quarter CPU for the trainer: the endpoint's replicas hold a quarter each on the 1-CPU nodes.
    run = run_or_report([sys.executable, "-m", "rayline.cli", "run", "iris.yaml", "--address", cluster.address, "--no-serve",
                         "--workspace", str(tmp_path / "ws-run"), "--set", "train.cpus_per_worker=0.25"],
                        cwd=project, env=_client_env(stray_token_home), timeout=420)
    shown = run.stdout + run.stderr
    assert run.returncode == 0, shown[-4000:]
    assert "registered: model iris-auth version 1" in shown, shown[-4000:]
    no_token = tmp_path / "home-without-token"
    (no_token / ".ray").mkdir(parents=True)
    for home in (stray_token_home, no_token):
        jobs = run_or_report([sys.executable, "-m", "rayline.cli", "jobs", "list", "--address", cluster.dashboard, "-o", "json"],
                             cwd=project, env=_client_env(home), timeout=120)
        assert jobs.returncode == 0 and "error" not in jobs.stderr, jobs.stdout + jobs.stderr
        listed = json.loads(jobs.stdout)
        submitted = [job for job in listed if job["pipeline"].endswith("diabetes-torch.yaml")]
        assert [job["status"] for job in submitted] == ["SUCCEEDED"], listed  # the submit above
