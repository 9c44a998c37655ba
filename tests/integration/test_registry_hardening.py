"""The MLflow boundary under stress: concurrent first starts, odd names, read-only and locked
stores, secrets in tracking URIs, and no temporary directory left behind by a run, a
`load_model` or a replica start.

Store tests need no Ray (each builds its own workspace); the temp-dir test runs a tiny
sweep on the session's Ray and starts a Serve replica.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.cli import rayline
from tests.integration.conftest import PORT, deploy_registered, run
from .. import loopback

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "pipelines" / "digits-torch.yaml"


def _cli(*args, env=None, preexec_fn=None, timeout=120, in_process=False):
    """`rayline ARGS` in a process of its own (one without root's privileges: preexec_fn), or in this
    one (tests/cli.py) where the process is not what is tested."""
    if in_process:
        return rayline(*args, cwd=ROOT, extra_env=env)
    return subprocess.run([sys.executable, "-m", "rayline.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, preexec_fn=preexec_fn, timeout=timeout)


def _error_line(proc) -> str:
    """The CLI's error, whitespace collapsed (rich may wrap a long line at the terminal width)."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return " ".join(proc.stderr.split())


# ----------------------------------------------------------------- concurrent first starts

def _first_start(ws_path: str, go, results) -> None:
    try:
        from rayline.registry import Registry
        from rayline.spec import load_spec
        from rayline.workspace import workspace

        spec = load_spec(SPEC)
        ws = workspace(ws_path)
        artifact = Path(ws_path).parent / f"artifact-{os.getpid()}"
        artifact.mkdir(parents=True)
        (artifact / "rayline.json").write_text("{}")
        go.wait(120)  # every process opens the brand-new store at the same moment
        registry = Registry(ws.ensure())
        run_id = registry.start_pipeline_run(spec, str(SPEC))
        results.put(("ok", registry.register(run_id, spec.name, str(artifact), {"valid_accuracy": 0.5}, {}).version))
    except BaseException as exc:  # reported to the test, not swallowed
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def test_concurrent_first_starts_on_one_fresh_workspace_all_succeed(tmp_path):
    """Three runs starting at once on a new workspace: each opens the store, starts its MLflow run
    and registers its version of one model."""
    # Without the store lock and the tolerant get-or-create, 3 of 4 such starts died with
    # "table ... already exists" / "Online migration expected to match one row".
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_first_start, args=(str(tmp_path / "ws"), go, results)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    go.set()
    outcomes = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(30)
    assert [o[0] for o in outcomes] == ["ok"] * 3, outcomes
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name.startswith("rayline/")]
    assert len(client.search_runs([experiment.experiment_id])) == 3
    assert sorted(o[1] for o in outcomes) == ["1", "2", "3"]  # each run registered its own version


# ----------------------------------------------------------------- odd names

@pytest.fixture(scope="module")
def odd_store(tmp_path_factory):
    """A workspace whose registry holds models named with quotes, wildcards and spaces."""
    from rayline.registry import Registry
    from rayline.workspace import workspace

    ws = workspace(tmp_path_factory.mktemp("odd")).ensure()
    client = Registry(ws).client
    for name in ("a'b", 'a"b', "a'\"b", "a_b", "x%"):
        client.create_registered_model(name)
        client.create_model_version(name, source=f"file:///nonexistent/{len(name)}", tags={"framework": "torch"})
    return ws


def test_models_with_odd_names_are_listed_and_found(odd_store):
    import json

    from rayline.registry import Registry

    listed = _cli("models", "-w", str(odd_store.root), "-o", "json", in_process=True)
    assert listed.returncode == 0, listed.stderr
    assert sorted(v["name"] for v in json.loads(listed.stdout)) == sorted(["a'b", 'a"b', "a'\"b", "a_b", "x%"])
    # MLflow's filter parser keeps backslashes and wildcards: each name finds itself, only itself.
    one = _cli("models", "a'\"b", "-w", str(odd_store.root), "-o", "json", in_process=True)
    assert one.returncode == 0 and [v["name"] for v in json.loads(one.stdout)] == ["a'\"b"], one.stderr
    registry = Registry(odd_store)
    for name in ("a'b", 'a"b', "a_b", "x%"):
        assert [v.name for v in registry.list_models(name)] == [name]


def test_models_unknown_odd_name_is_a_one_line_error(odd_store):
    from rayline.errors import RegistryError
    from rayline.registry import Registry

    proc = _cli("models", "c'd", "-w", str(odd_store.root), in_process=True)
    line = _error_line(proc)
    assert proc.returncode == 1 and line.startswith("error: model \"c'd\": no registered versions in sqlite:"), line
    registry = Registry(odd_store)
    for name in ("a'\"", "a%", "", "a\nb"):
        with pytest.raises(RegistryError, match="no registered versions") as info:
            registry.list_models(name)
        assert "\n" not in str(info.value)
    with pytest.raises(RegistryError, match=r"version 7: not found"):
        registry.resolve("a'b", "7")


# ----------------------------------------------------------------- unwritable and locked stores

def _without_root_privileges():
    """In the child: drop the capabilities that let root ignore file modes, so chmod means what it says."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone after exec
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _read_only(path: Path):
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def test_read_only_workspace_reads_and_refuses_writes_in_one_line(tmp_path):
    from rayline.registry import Registry
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    Registry(ws).client.create_registered_model("kept")
    empty = tmp_path / "empty"
    empty.mkdir()
    _read_only(ws.root)
    _read_only(empty)
    try:
        probe = _cli("--help", preexec_fn=_without_root_privileges)
        if probe.returncode != 0:
            pytest.skip(f"cannot drop root's file privileges here: {probe.stderr[-200:]}")
        # Reading an existing store needs no write.
        listed = _cli("models", "-w", str(ws.root), preexec_fn=_without_root_privileges)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        # Creating a store in a read-only directory: one line naming the directory and what to do
        # (the environment fault's line, rayline/faults.py: the PermissionError is in the chain).
        created = _cli("models", "-w", str(empty / "ws"), preexec_fn=_without_root_privileges)
        line = _error_line(created)
        assert created.returncode == 1 and str(empty / "ws") in line and "Permission denied" in line, line
        assert "--workspace" in line, line
        # Writing to a read-only store (what `rayline run` does first): one line, no traceback.
        code = ("from rayline.registry import Registry; from rayline.spec import load_spec; "
                "from rayline.workspace import workspace; import sys\n"
                f"try: Registry(workspace({str(ws.root)!r})).start_pipeline_run(load_spec({str(SPEC)!r}), None)\n"
                "except Exception as e: print(type(e).__name__, e); sys.exit(1)")
        wrote = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                               preexec_fn=_without_root_privileges)
        out = wrote.stdout.strip()
        assert wrote.returncode == 1 and out.startswith("RegistryError MLflow") and "\n" not in out, wrote
        assert "cannot start a run for pipeline 'digits'" in out and "not writable" in out, out
        # The run's own directories (runs/, staging) in a read-only workspace: one line too.
        code = ("from rayline.workspace import workspace; import sys\n"
                f"try: workspace({str(empty / 'ws')!r}).ensure()\n"
                "except Exception as e: print(type(e).__name__, e); sys.exit(1)")
        made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              preexec_fn=_without_root_privileges)
        out = made.stdout.strip()
        assert made.returncode == 1 and out.startswith(f"RaylineError workspace {empty / 'ws'}: cannot write"), made
        assert "Permission denied" in out and "\n" not in out, out
    finally:
        for p in (ws.root, empty):
            for q in [p, *p.rglob("*")]:
                q.chmod(0o755 if q.is_dir() else 0o644)


def _hold_write_lock(db: Path, seconds: float, held: threading.Event):
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    held.set()
    time.sleep(seconds)
    conn.execute("ROLLBACK")
    conn.close()


@pytest.fixture()
def store(tmp_path):
    from rayline.registry import Registry
    from rayline.spec import load_spec
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    return Registry(ws), load_spec(SPEC), ws.root / "mlflow.db"


@pytest.mark.session_lane  # conftest.SESSION_LANE_MARK
def test_locked_database_is_a_one_line_error(store, capfd):
    # Another process holding SQLite's write lock past MLflow's own 20 s wait.
    from rayline.errors import RegistryError
    from rayline.registry import SQLITE_BUSY_TIMEOUT_S

    reg, spec, db = store
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db, SQLITE_BUSY_TIMEOUT_S + 3, held), daemon=True)
    holder.start()
    assert held.wait(60)
    t0 = time.monotonic()
    with pytest.raises(RegistryError) as info:
        reg.start_pipeline_run(spec, None)
    assert time.monotonic() - t0 < SQLITE_BUSY_TIMEOUT_S + 2.5, "waited for the lock's release instead"
    holder.join()
    message = str(info.value)
    assert "\n" not in message and "cannot start a run for pipeline 'digits'" in message
    assert "locked by another process" in message, message
    # MLflow logs the SQLAlchemy error with a traceback: one line of it, unless RAYLINE_DEBUG=1.
    assert "Traceback" not in capfd.readouterr().err


# ----------------------------------------------------------------- secrets in tracking URIs

@pytest.mark.parametrize("uri, secret", [
    ("postgresql://rayline:Pa55-w0rd-x@127.0.0.1:1/mlflow", "Pa55-w0rd-x"),
    ("postgresql://rayline@127.0.0.1:1/mlflow?password=Pa55-w0rd-y", "Pa55-w0rd-y"),
    ("https://rayline:t0ken-z@127.0.0.1:1", "t0ken-z"),
    # No host to check first: fails in MLflow (no driver installed, or no such socket).
    ("postgresql://rayline:Pa55-w0rd-s@/mlflow?host=/nonexistent", "Pa55-w0rd-s"),
])
def test_failing_store_error_never_shows_the_password(tmp_path, uri, secret):
    # A closed port answers in milliseconds; MLflow alone would retry for minutes (4 min for https).
    no_proxy = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    started = time.monotonic()
    proc = _cli("models", "-w", str(tmp_path / "ws"), env={"RAYLINE_TRACKING_URI": uri, **no_proxy}, timeout=300)
    line = _error_line(proc)
    scheme = uri.split("://")[0]
    assert proc.returncode == 1 and line.startswith(f"error: MLflow ({scheme}://"), line
    assert secret not in proc.stderr + proc.stdout and "***" in line, line
    if "127.0.0.1:1" in uri:
        assert "127.0.0.1:1 does not answer" in line and time.monotonic() - started < 60, line


# ----------------------------------------------------------------- temporary directories

def _tmp_entries() -> set[str]:
    """Entries of the temp dir that rayline (or MLflow on its behalf) could have made."""
    return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith(("rayline-", ".rayline", "tmp", "mlflow"))
            and not e.startswith("rayline-haproxy")}


def _ours(entries: set[str], model: str) -> set[str]:
    """The entries this test's processes made: on a machine shared with other Ray sessions,
    theirs come and go in the same temp dir. rayline's own temp dirs carry their owner's pid
    (`owned_tempdir`), so they count when that pid is this process or a worker of this Ray
    session (dead ones included); any other name counts when it names this test's model
    (a download to a plain mkdtemp did: `rayline-<model>-v1-xxxx`)."""
    import re

    from ray.util.state import list_workers

    import ray

    workers = list_workers(address=ray.get_runtime_context().gcs_address, limit=10_000, raise_on_missing_output=False)
    pids = {os.getpid()} | {w.pid for w in workers}
    owned = re.compile(r"^rayline-[a-z]+-(\d+)\.[0-9a-f]{8}-")
    return {e for e in entries if (int(m.group(1)) in pids if (m := owned.match(e)) else model in e)}


def test_run_load_model_and_replica_leave_no_temporary_directories(ray_session, tmp_path):
    """A training run, a replica start and two `load_model`s: nothing new in /tmp or the workspace's tmp/,
    one cached copy per version, and the second load reuses it (no copy)."""
    from ray import serve

    import rayline
    from rayline.spec import load_spec
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    raw = {
        "name": "tmpcheck",
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target",
                 "split": {"valid": 0.2, "test": 0.2, "seed": 0}},
        "task": "classification",
        "model": {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [8]}},
        "train": {"workers": 1, "epochs": 3, "batch_size": 32, "metric": "accuracy"},
        "serve": {"route": "/tmpcheck"},
    }
    (tmp_path / "tmpcheck.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    before = _tmp_entries()

    summary = run(load_spec(tmp_path / "tmpcheck.yaml"), ws, spec_path=str(tmp_path / "tmpcheck.yaml"), deploy=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})  # as `run` does when it deploys
    try:
        url = deploy_registered("tmpcheck", summary, ws)  # the replica downloads the version into the cache
    except AssertionError as exc:
        from rayline.serve.details import deployment_failure

        raise AssertionError(f"{exc}: {deployment_failure('tmpcheck')}") from exc
    assert loopback.get(f"{url}/health", timeout=10).status_code == 200
    cached = list((ws.cache_dir / "models" / "tmpcheck").iterdir())
    assert [p.name.split("-")[0] for p in cached] == [summary.version], cached

    first = rayline.load_model("tmpcheck", workspace=str(ws.root))
    assert Path(first.model_dir) == cached[0]  # reused what the replica downloaded
    sentinel = cached[0] / "sentinel"
    sentinel.write_text("a re-copy would remove this")
    second = rayline.load_model("tmpcheck", summary.version, workspace=str(ws.root))
    assert Path(second.model_dir) == cached[0] and sentinel.exists()
    sentinel.unlink()
    serve.delete("tmpcheck")

    # A new version of a served model is judged at registration against the champion, on the new run's
    # own test split (rayline/retrain/judge.py): the champion's score is the test metric it registered
    # with (same seed, same split), the new one's its own; recorded on the version, said in the summary.
    # The champion's copy comes from the cache: still nothing left in /tmp below.
    import json

    from rayline.registry import JUDGEMENT_TAG, Registry

    assert summary.judgement is None  # no champion when it registered
    Registry(ws).set_alias("tmpcheck", "champion", summary.version)  # as `rayline serve deploy` leaves it
    raw["train"]["epochs"] = 1
    (tmp_path / "tmpcheck.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    second = run(load_spec(tmp_path / "tmpcheck.yaml"), ws, spec_path=str(tmp_path / "tmpcheck.yaml"), deploy=False)
    assert second.version == str(int(summary.version) + 1)
    judged = json.loads(Registry(ws).client.get_model_version("tmpcheck", second.version).tags[JUDGEMENT_TAG])
    assert (judged["champion"], judged["challenger"], judged["metric"], judged["rows"]) == \
        (summary.version, second.version, "accuracy", second.rows["test"])
    assert judged["champion_score"] == pytest.approx(summary.test_metrics["accuracy"])
    assert judged["challenger_score"] == pytest.approx(second.test_metrics["accuracy"])
    assert judged["qualifies"] is (second.test_metrics["accuracy"] >= summary.test_metrics["accuracy"])
    assert second.judgement.startswith(f"tmpcheck: challenger version {second.version} accuracy="), second.judgement

    assert _ours(_tmp_entries() - before, "tmpcheck") == set()
    assert not ws.tmp_dir.exists() or list(ws.tmp_dir.iterdir()) == []
    assert [p.name for p in (ws.cache_dir / "models" / "tmpcheck").iterdir()] == [cached[0].name]  # no .partial-


# ----------------------------------------------------------------- the download cache

def test_concurrent_downloads_of_one_version_share_one_complete_copy(tmp_path):
    """Replicas starting together on one node: each sees a complete copy, one copy is kept, none is redone."""
    from rayline.registry import Registry
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    registry = Registry(ws)
    model = tmp_path / "artifact" / "model"
    (model / "weights").mkdir(parents=True)
    payload = os.urandom(8 << 20)  # big enough that copies overlap in time
    (model / "weights" / "blob.bin").write_bytes(payload)
    run_id = registry.client.create_run(registry._experiment_id("cachetest")).info.run_id
    registry.client.log_artifacts(run_id, str(model), artifact_path="model")
    registry.client.create_registered_model("cache test é")  # a name that is not a safe directory name
    registry.client.create_model_version("cache test é", source=f"{registry.client.get_run(run_id).info.artifact_uri}/model",
                                         run_id=run_id)
    mv = registry.resolve("cache test é")

    barrier, paths, errors = threading.Barrier(4), [], []

    def load():
        try:
            barrier.wait(30)
            paths.append(Registry(ws).download(mv))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(set(paths)) == 1, (errors, paths)
    (path,) = set(paths)
    assert (Path(path) / "weights" / "blob.bin").read_bytes() == payload
    assert Path(path).parent.parent == ws.cache_dir / "models"
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name]  # no partial copy left
    (Path(path) / "sentinel").write_text("a re-download would remove this")
    assert registry.download(mv) == path and (Path(path) / "sentinel").exists()


def test_orphaned_temp_dirs_of_dead_processes_are_swept(tmp_path):
    from rayline.workspace import owned_tempdir, sweep_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = owned_tempdir(tmp_path, "rayline-ckpt-")
    orphan = Path(mine.replace(f"-{os.getpid()}.", f"-{dead.pid}.", 1))
    orphan.mkdir()
    other_node = tmp_path / f"rayline-ckpt-{dead.pid}.00000000-abc"  # another node's: its pid means nothing here
    other_node.mkdir()
    unrelated = tmp_path / "rayline-ckpt-abcdef"
    unrelated.mkdir()
    assert sweep_orphans(tmp_path, "rayline-ckpt-") == 1
    assert not orphan.exists() and Path(mine).exists() and other_node.exists() and unrelated.exists()
