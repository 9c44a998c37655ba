"""Storage locations without Ray: parsing and validation of --workspace values, the exact error
texts, where a URI workspace keeps its local part, reads and writes through pyarrow on local
paths, and the one-line failure for an S3 endpoint nothing answers (a real connection refusal)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from rayline import storage
from rayline.errors import RaylineError
from rayline.storage import StorageError, is_uri, join, parse_location
from rayline.workspace import local_state_dir, workspace
from tests.cli import rayline as rayline_in_process

ALLOWED = "allowed: a local path or one every node mounts (NFS), s3://bucket/prefix or gs://bucket/prefix"


def test_all_is_complete():
    public = {n for n, v in vars(storage).items() if not n.startswith("_") and getattr(v, "__module__", None) == storage.__name__}
    assert public <= set(storage.__all__), public - set(storage.__all__)
    assert all(hasattr(storage, n) for n in storage.__all__)


@pytest.mark.parametrize("value, expected", [
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("s3://bucket/prefix/", "s3://bucket/prefix"),
    ("s3://bucket", "s3://bucket"),
    ("s3://my.bucket-1/a//b/", "s3://my.bucket-1/a/b"),
    ("gs://bucket/p", "gs://bucket/p"),
    ("gcs://bucket/p", "gs://bucket/p"),
    ("S3://bucket/p", "s3://bucket/p"),
    (Path("s3://bucket/prefix"), "s3://bucket/prefix"),  # what typer hands over: "s3:/bucket/prefix"
    ("file:///srv/ws", "/srv/ws"),
    ("/srv/ws", "/srv/ws"),
])
def test_locations_are_normalised(value, expected):
    assert parse_location(value) == expected


def test_relative_and_home_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_location("ws") == str(tmp_path / "ws")
    assert parse_location("~/ws") == os.path.expanduser("~/ws")


@pytest.mark.parametrize("value, message", [
    ("http://host/ws", "workspace: unsupported storage scheme 'http://' (got 'http://host/ws'; " + ALLOWED + ")"),
    ("hdfs://namenode/ws", "workspace: unsupported storage scheme 'hdfs://' (got 'hdfs://namenode/ws'; " + ALLOWED + ")"),
    ("azure://c/ws", "workspace: unsupported storage scheme 'azure://' (got 'azure://c/ws'; " + ALLOWED + ")"),
    ("s3://", "workspace: bad bucket name '' (got 's3://'; allowed: s3://bucket/prefix, a bucket of 3-63 lowercase "
              "letters, digits, '.', '-' or '_')"),
    ("s3://Bucket/x", "workspace: bad bucket name 'Bucket' (got 's3://Bucket/x'; allowed: s3://bucket/prefix, a bucket "
                      "of 3-63 lowercase letters, digits, '.', '-' or '_')"),
    ("s3://b/x?region=us-east-1", "workspace: query or fragment in a storage URI (got 's3://b/x?region=us-east-1'; "
                                  "allowed: s3://bucket/prefix; endpoints and regions come from the environment, "
                                  "e.g. AWS_ENDPOINT_URL)"),
    ("gs://bucket/../x", "workspace: '.' or '..' in a storage URI (got 'gs://bucket/../x'; allowed: gs://bucket/prefix)"),
    ("   ", "workspace: empty location (" + ALLOWED + ")"),
])
def test_bad_locations_are_one_line_errors_naming_the_value(value, message):
    with pytest.raises(StorageError) as info:
        parse_location(value)
    assert str(info.value) == message
    assert isinstance(info.value, RaylineError) and "\n" not in str(info.value)


def test_credentials_in_a_uri_are_refused_and_never_echoed():
    with pytest.raises(StorageError) as info:
        parse_location("s3://AKIAEXAMPLE:verysecret@bucket/ws")
    assert "verysecret" not in str(info.value)
    assert str(info.value).startswith("workspace: credentials in the URI (got 's3://AKIAEXAMPLE:***@bucket/ws'; allowed:")


def test_where_names_the_setting():
    with pytest.raises(StorageError, match=r"^storage_path: unsupported storage scheme"):
        parse_location("ftp://x/y", where="storage_path")


def test_join_and_is_uri():
    assert is_uri("s3://b/p") and is_uri("gs://b") and not is_uri("/srv/ws")
    assert join("s3://b/p", "runs", "exp") == "s3://b/p/runs/exp"
    assert join("s3://b/p/", "runs") == "s3://b/p/runs"
    assert join("/srv/ws", "runs") == "/srv/ws/runs"


# ----------------------------------------------------------------- the workspace


def test_a_path_workspace_keeps_everything_in_its_directory(tmp_path):
    ws = workspace(tmp_path / "ws")
    assert not ws.remote and ws.location == str(tmp_path / "ws") == str(ws.root)
    assert ws.runs_dir == str(tmp_path / "ws" / "runs")
    assert ws.artifact_location == (tmp_path / "ws" / "mlartifacts").as_uri()
    assert ws.tracking_uri == f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}"


def test_a_uri_workspace_puts_runs_and_artifacts_on_the_uri_and_the_rest_in_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RAYLINE_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ws = workspace("s3://team-bucket/ml/ws/")
    assert ws.remote and ws.location == "s3://team-bucket/ml/ws"
    assert ws.runs_dir == "s3://team-bucket/ml/ws/runs"
    assert ws.artifact_location == "s3://team-bucket/ml/ws/mlartifacts"
    assert ws.root.parent == (tmp_path / "cache" / "workspaces").resolve()
    assert ws.root.name.startswith("s3-team-bucket-")
    assert ws.tracking_uri == f"sqlite:///{ws.root / 'mlflow.db'}"
    assert ws.cache_dir == ws.root / "cache" and ws.tmp_dir == ws.root / "tmp" and ws.cluster_file == ws.root / "cluster.json"
    # The same URI always finds the same local part, from any working directory; another URI another.
    monkeypatch.chdir(tmp_path)
    assert workspace("s3://team-bucket/ml/ws").root == ws.root
    assert workspace("s3://team-bucket/ml/other").root != ws.root
    assert local_state_dir("gs://team-bucket/ml/ws") != ws.root


def test_rayline_workspace_env_takes_a_uri(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RAYLINE_WORKSPACE", "gs://bucket/ws")
    assert workspace().location == "gs://bucket/ws"
    monkeypatch.setenv("RAYLINE_WORKSPACE", "http://bucket/ws")
    with pytest.raises(StorageError, match=r"^workspace: unsupported storage scheme 'http://'"):
        workspace()


def test_a_tracking_server_still_gets_the_uri_workspace_as_artifact_store(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYLINE_CACHE_DIR", str(tmp_path))
    ws = workspace("s3://bucket/ws", tracking_uri="http://mlflow.internal:5000")
    assert ws.tracking_uri == "http://mlflow.internal:5000" and ws.artifact_location == "s3://bucket/ws/mlartifacts"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_with_an_unknown_scheme_is_one_line_exit_1(tmp_path):
    spec = Path(__file__).resolve().parents[2] / "pipelines" / "digits-torch.yaml"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYLINE_WORKSPACE")}
    proc = rayline_in_process("run", spec, "--workspace", "http://host/ws", cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: workspace: unsupported storage scheme 'http://' (got 'http://host/ws'; " + ALLOWED + ")"]


def test_an_s3_endpoint_nothing_answers_fails_ensure_in_one_line_and_fast(tmp_path, monkeypatch):
    # Real pyarrow against a closed loopback port (connection refused), not a mock.
    monkeypatch.setenv("RAYLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    storage._filesystem.cache_clear()
    import time

    t0 = time.monotonic()
    try:
        with pytest.raises(StorageError) as info:
            workspace("s3://bucket/ws").ensure()
    finally:
        storage._filesystem.cache_clear()
    message = str(info.value)
    assert message.startswith("workspace: cannot write to s3://bucket/ws: ") and "\n" not in message, message
    assert "AWS_ENDPOINT_URL" in message and "Details" not in message
    assert time.monotonic() - t0 < 30


# ----------------------------------------------------------------- reads and writes


def test_json_round_trip_and_listing_on_a_local_path(tmp_path):
    run = join(str(tmp_path), "runs", "exp-1")
    storage.write_json(join(run, "rayline-run.json"), {"status": "running"})
    storage.write_json(join(run, "rayline-run.json"), {"status": "registered"})
    assert storage.read_json(join(run, "rayline-run.json")) == {"status": "registered"}
    assert storage.read_json(join(run, "missing.json")) is None
    (tmp_path / "runs" / "exp-1" / "bad.json").write_text("{not json")
    assert storage.read_json(join(run, "bad.json")) is None
    assert storage.list_names(join(str(tmp_path), "runs")) == ["exp-1"]
    assert storage.list_names(join(str(tmp_path), "nothing-here")) == []
    assert sorted(os.listdir(run)) == ["bad.json", "rayline-run.json"]  # no temporary file left
    assert storage.exists(run) and not storage.exists(join(run, "nope"))


def test_download_dir_copies_a_tree(tmp_path):
    src = tmp_path / "ckpt"
    (src / "model").mkdir(parents=True)
    (src / "model" / "weights.bin").write_bytes(b"\x00\x01")
    (src / "rayline_state.json").write_text(json.dumps({"epoch": 3}))
    dest = storage.download_dir(str(src), str(tmp_path / "copy"))
    assert (Path(dest) / "model" / "weights.bin").read_bytes() == b"\x00\x01"
    assert json.loads((Path(dest) / "rayline_state.json").read_text()) == {"epoch": 3}


def test_check_shared_skips_uris_without_touching_ray():
    assert storage.check_shared("s3://bucket/ws/runs") == []
