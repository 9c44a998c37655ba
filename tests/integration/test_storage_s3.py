"""An s3:// workspace for real: a local S3-compatible server (moto in server mode, on loopback,
started here) and the real `rayline run` in a subprocess, as a user runs it.

The pipeline runs in its own process with its own embedded Ray: the session's Ray workers
were started before any AWS_* variable existed, and a user exports them before `rayline run`
too. Everything S3 is reached through the environment only (AWS_ENDPOINT_URL and fake
credentials): pyarrow (Ray Train/Tune storage, rayline's run records and checkpoint reads)
and boto3 (MLflow's artifact store) both read it.

Data: sklearn iris with a tiny xgboost booster, 1 worker, no serving: a few seconds of
training on top of Ray's start-up: one `rayline run` took 31 s end to end on the 2-core machine,
the whole module (two runs and a load) 153 s with the machine at load average 18.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MOTO_PORT = 20231  # this module's port (storage work owns 20200-20299)
BUCKET = "rayline-test"
PREFIX = "team/ws"
WORKSPACE = f"s3://{BUCKET}/{PREFIX}"
SPEC = {
    "name": "s3iris",
    "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target",
             "split": {"valid": 0.2, "test": 0.2, "seed": 0}},
    "task": "classification",
    "model": {"framework": "xgboost", "kind": "gbdt",
              "params": {"max_depth": 2, "eta": 0.3, "num_boost_round": 6, "checkpoint_every": 2, "early_stopping_rounds": 0}},
    "train": {"workers": 1, "metric": "log_loss"},
}


def _patch_moto_complete_multipart() -> None:
    """moto 5.2.1 answers CompleteMultipartUpload with a `<CompleteMultipartUploadResponse>` root;
    S3 (and its API model) says `<CompleteMultipartUploadResult>`. pyarrow >= 15 checks that root
    to catch errors S3 embeds in a 200 answer and, seeing another, retries for ~25 s and fails
    every upload. boto3 does not look, so only pyarrow notices. Fixed in the server we start
    here, so every client (pyarrow, boto3) talks to it unmodified."""
    from moto.core.serialize import S3Serializer

    if getattr(S3Serializer, "_rayline_patched", False):
        return
    original = S3Serializer._serialized_result_to_response

    def patched(self, resp, result, shape, serialized_result):
        resp = original(self, resp, result, shape, serialized_result)
        if self.operation_model.name == "CompleteMultipartUpload":
            body = resp["body"]
            wrong, right = "CompleteMultipartUploadResponse", "CompleteMultipartUploadResult"
            resp["body"] = body.replace(wrong.encode(), right.encode()) if isinstance(body, bytes) else body.replace(wrong, right)
        return resp

    S3Serializer._serialized_result_to_response = patched
    S3Serializer._rayline_patched = True


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with an empty bucket; yields a boto3 client of it."""
    import boto3
    from moto.server import ThreadedMotoServer

    _patch_moto_complete_multipart()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=MOTO_PORT, verbose=False)
    server.start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{MOTO_PORT}", region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.stop()


def _keys(client, prefix: str = PREFIX) -> list[str]:
    keys, token = [], None
    while True:
        page = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        keys += [o["Key"] for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            return keys


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """What a user exports: the endpoint and credentials, nothing rayline-specific but a cache dir
    (where a URI workspace keeps its local part) inside the test's temp dir."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "RAYLINE_WORKSPACE", "RAYLINE_TRACKING_URI", "MLFLOW_")) and k != "RAY_ADDRESS"}
    env.update({
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{MOTO_PORT}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "RAYLINE_CACHE_DIR": str(tmp_path_factory.mktemp("cache")),
    })
    return env


def _rayline(args: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rayline.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def trained(s3, env, tmp_path_factory):
    """One `rayline run --workspace s3://...` (no serving), in a fresh working directory."""
    cwd = tmp_path_factory.mktemp("project")
    spec = cwd / "s3iris.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    proc = _rayline(["run", str(spec), "--workspace", WORKSPACE, "--no-serve"], cwd, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cwd, spec, proc


def test_runs_checkpoints_records_and_artifacts_are_objects_in_the_bucket(s3, env, trained):
    cwd, _, proc = trained
    keys = _keys(s3)
    runs = [k for k in keys if k.startswith(f"{PREFIX}/runs/")]
    records = [k for k in runs if k.endswith("/rayline-run.json")]
    assert len(records) == 1, runs
    record = json.loads(s3.get_object(Bucket=BUCKET, Key=records[0])["Body"].read())
    assert record["spec_name"] == "s3iris" and record["status"] == "registered" and record["version"] == "1", record
    experiment = record["experiment"]
    # Ray Train's own checkpoints (model + rayline's state file) and its checkpoint manager's record.
    train_dir = f"{PREFIX}/runs/{experiment}/train"
    states = [k for k in runs if k.startswith(train_dir + "/checkpoint_") and k.endswith("/rayline_state.json")]
    assert states, runs
    assert any(k.startswith(train_dir + "/checkpoint_") and "/model/" in k for k in runs), runs
    assert f"{train_dir}/checkpoint_manager_snapshot.json" in runs
    # The run's TensorBoard event files, written locally and uploaded beside them.
    assert any(k.startswith(f"{PREFIX}/runs/{experiment}/tensorboard/train/events.out.tfevents.") for k in runs), runs
    # MLflow's artifacts of the registered version: the pyfunc model (its MLmodel) wrapping the
    # model directory rayline assembled (artifacts/rayline: metadata, preprocessing, weights).
    artifacts = [k for k in keys if k.startswith(f"{PREFIX}/mlartifacts/")]
    model_roots = [k[:-len("/MLmodel")] for k in artifacts if k.endswith("/model/MLmodel")]
    assert model_roots, artifacts
    for root in model_roots:
        for name in ("rayline.json", "preprocessing.json"):
            assert f"{root}/artifacts/rayline/{name}" in artifacts, (name, artifacts)
        assert any(k.startswith(f"{root}/artifacts/rayline/weights/") for k in artifacts), artifacts
    # Nothing of it on this machine: no runs/ or mlartifacts/ in the local part of the workspace,
    # nor a ./.rayline in the working directory.
    local = Path(env["RAYLINE_CACHE_DIR"]) / "workspaces"
    (state_dir,) = list(local.iterdir())
    assert (state_dir / "mlflow.db").is_file()
    assert not (state_dir / "runs").exists() and not (state_dir / "mlartifacts").exists(), list(state_dir.iterdir())
    assert not (cwd / ".rayline").exists()
    assert not list(state_dir.rglob("rayline_state.json")), "a checkpoint was written locally"
    # The data stage's cache entry is objects too, written by the Ray tasks that computed the
    # splits: the splits' Parquet files, the fitted preprocessing, and the meta.json listing them
    # (written last, with each file's size).
    cached = [k for k in keys if k.startswith(f"{PREFIX}/data-cache/")]
    metas = [k for k in cached if k.endswith("/meta.json")]
    assert len(metas) == 1, cached
    entry = metas[0][:-len("/meta.json")]
    meta = json.loads(s3.get_object(Bucket=BUCKET, Key=metas[0])["Body"].read())
    listed = {f"{entry}/{name}": size for name, size in meta["files"].items()}
    for split in ("train", "valid", "test_rows"):
        assert any(k.startswith(f"{entry}/{split}/") and k.endswith(".parquet") for k in listed), (split, listed)
    assert f"{entry}/preprocessing.json" in listed
    sizes = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=entry + "/")["Contents"]}
    assert {k: sizes[k] for k in listed} == listed
    assert not [k for k in cached if "/." in k], "a scratch folder was left"  # the shared test rows' folder
    assert not (state_dir / "data-cache").exists()
    assert "stored in the data cache (" in proc.stdout, proc.stdout[-2000:]


def test_the_registered_model_loads_back_from_s3_through_the_registry(s3, env, trained):
    cwd, _, _ = trained
    code = ("import json, rayline\n"
            f"m = rayline.load_model('s3iris', workspace={WORKSPACE!r})\n"
            "rows = [{'sepal length (cm)': 5.1, 'sepal width (cm)': 3.5, 'petal length (cm)': 1.4, 'petal width (cm)': 0.2},\n"
            "        {'sepal length (cm)': 6.7, 'sepal width (cm)': 3.0, 'petal length (cm)': 5.2, 'petal width (cm)': 2.3}]\n"
            "print(json.dumps(m.predict(rows)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["predictions"] == [0, 2], answer


def test_resume_finds_an_interrupted_run_on_s3_and_restores_its_checkpoints(s3, env, trained):
    """A run recorded as interrupted (what Ctrl-C leaves: rayline's record says so, Ray Train's
    checkpoints are there) is found on S3 by --resume, and Ray Train restores it from S3: the
    finished booster trains no round again, so no new checkpoint appears (a restart from
    round 0 would write three)."""
    cwd, spec, _ = trained
    (key,) = [k for k in _keys(s3) if k.endswith("/rayline-run.json")]
    record = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({**record, "status": "interrupted"}).encode())
    train_dir = f"{PREFIX}/runs/{record['experiment']}/train/"

    def checkpoints():
        return {k[len(train_dir):].split("/", 1)[0] for k in _keys(s3, train_dir) if k.endswith("rayline_state.json")}

    before = checkpoints()
    proc = _rayline(["run", str(spec), "--workspace", WORKSPACE, "--no-serve", "--resume"], cwd, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed the interrupted run {record['experiment']}" in proc.stdout, proc.stdout[-2000:]
    # Its data stage came from the bucket's data cache, not recomputed.
    assert re.search(r"^data: done in [0-9.]+ s: .*, cached \(", proc.stdout, re.M), proc.stdout[-2000:]
    after = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    assert after["status"] == "registered" and after["version"] == "2" and after["experiment"] == record["experiment"], after
    assert after["resumed_runs"] == [record["run_id"]], after
    assert checkpoints() == before and before


def test_the_data_cache_on_s3_is_listed_and_pruned(s3, env, trained):
    """`rayline cache list` and `prune` on the s3:// workspace: the entry the runs wrote and read
    (its size, last used by the resumed run), then no objects left under data-cache/."""
    cwd, _, _ = trained
    before = [k for k in _keys(s3) if k.startswith(f"{PREFIX}/data-cache/")]
    listed = _rayline(["cache", "list", "--workspace", WORKSPACE, "-o", "json"], cwd, env, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    document = json.loads(listed.stdout)
    assert document["root"] == f"{WORKSPACE}/data-cache"
    (entry,) = document["entries"]
    assert entry["pipeline"] == "s3iris" and entry["rows"] == 150 and not entry["broken"], entry
    sizes = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/data-cache/")["Contents"]}
    assert entry["bytes"] == document["bytes"] == sum(sizes.values()) and before
    pruned = _rayline(["cache", "prune", "--workspace", WORKSPACE], cwd, env, timeout=120)
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert pruned.stdout.startswith("removed 1 entry ("), pruned.stdout
    # (pyarrow's S3 filesystem keeps an empty `data-cache/` marker for the emptied folder)
    assert not [k for k in _keys(s3) if k.startswith(f"{PREFIX}/data-cache/") and not k.endswith("/")]
