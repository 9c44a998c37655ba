"""What `rayline submit` ships (rayline.jobs): the packaging rules, the entrypoint, the token and
address look-ups, exit codes. No Ray; CLI behaviour through the real command in a subprocess."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rayline.errors import ClusterError
from rayline.jobs import PackageError, collect_files, exit_code_for, job_workspace, plan_submission, resolve_address
from rayline.jobs.auth import auth_headers, load_token, missing_token_message
from rayline.jobs.submit import CLUSTER_DEFAULT_WORKSPACE
from tests.cli import rayline as rayline_in_process

SPEC = """name: iris-job
data:
  source: {format: csv, path: DATA}
  label: target
task: classification
model: {framework: xgboost, kind: gbdt, params: {num_boost_round: 5}}
train: {workers: 1, metric: accuracy}
"""


def _write(root: Path, rel: str, content: str | bytes = "x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def _project(tmp_path, data="data/iris.csv") -> Path:
    root = tmp_path / "proj"
    _write(root, "spec.yaml", SPEC.replace("DATA", data))
    _write(root, "data/iris.csv", "a,target\n1,0\n2,1\n")
    return root


def test_gitignore_rules_nested_files_negation_and_rayignore(tmp_path):
    root = tmp_path / "p"
    _write(root, ".gitignore", "*.log\nbuild/\n/out.txt\n!keep.log\n")
    _write(root, "a.log")
    _write(root, "keep.log")
    _write(root, "build/lib.py")
    _write(root, "out.txt")
    _write(root, "sub/out.txt")  # `/out.txt` is anchored to the root
    _write(root, "sub/.gitignore", "*.tmp\n")
    _write(root, "sub/x.tmp")
    _write(root, "x.tmp")  # sub's rule applies below sub only
    _write(root, ".rayignore", "notebooks/\n")
    _write(root, "notebooks/n.ipynb")
    _write(root, "model.py")
    pkg = collect_files(root)
    assert sorted(pkg.files) == ["keep.log", "model.py", "sub/out.txt", "x.tmp"]
    assert sorted(pkg.skipped[".gitignore/.rayignore"]) == ["a.log", "build/", "notebooks/", "out.txt", "sub/x.tmp"]


def test_caches_vcs_venvs_and_workspaces_are_never_shipped(tmp_path):
    root = tmp_path / "p"
    for rel in (".git/config", "__pycache__/m.cpython-311.pyc", ".rayline/mlflow.db", ".pytest_cache/x", "m.pyc",
                "myenv/pyvenv.cfg", "myenv/lib/site.py", "state/mlflow.db", "node_modules/x.js"):
        _write(root, rel)
    _write(root, "code/net.py")
    pkg = collect_files(root, exclude_dirs=(str(root / "state"),))
    assert pkg.files == ["code/net.py"]


def test_credentials_are_not_shipped_even_when_not_ignored(tmp_path):
    root = tmp_path / "p"
    for rel in (".env", ".env.prod", "certs/server.pem", "deploy/tls.key", ".ssh/id_rsa", "id_ed25519",
                ".aws/credentials", ".netrc", "auth_token"):
        _write(root, rel, "SECRET-VALUE")
    _write(root, "net.py")
    pkg = collect_files(root)
    assert pkg.files == ["net.py"]
    assert len(pkg.skipped["credentials"]) == 9


def test_links_out_of_the_project_are_not_followed(tmp_path):
    outside = _write(tmp_path, "elsewhere/private.txt", "mine")
    root = tmp_path / "p"
    _write(root, "net.py")
    (root / "private.txt").symlink_to(outside)
    (root / "linked").symlink_to(outside.parent, target_is_directory=True)
    assert collect_files(root).files == ["net.py"]


def test_a_file_over_the_limit_fails_naming_it_its_size_the_limit_and_the_fix(tmp_path):
    root = tmp_path / "p"
    _write(root, "weights/big.bin", b"\0" * (3 * 1024 * 1024))
    with pytest.raises(PackageError) as err:
        collect_files(root, max_file_bytes=1024 * 1024)
    msg = str(err.value)
    assert msg.startswith("weights/big.bin: 3.0 MiB is over the 1.0 MiB limit"), msg
    assert "s3://" in msg and "gs://" in msg and "every node sees" in msg and "--max-file-mb" in msg
    assert "\n" not in msg and err.value.exit_code == 2 and ".rayignore" in msg
    # An ignored big file does not count: it is not shipped.
    _write(root, ".gitignore", "weights/\n")
    assert collect_files(root, max_file_bytes=1024 * 1024).files == []


def test_total_over_rays_package_limit_names_the_largest_files(tmp_path):
    root = tmp_path / "p"
    for i in range(4):
        _write(root, f"d/{i}.bin", b"\0" * (1000 + i))
    with pytest.raises(PackageError, match=r"total 3\.9 KiB, over Ray's 3\.0 KiB limit .*got largest: d/3\.bin"):
        collect_files(root, max_total_bytes=3 * 1024)


def test_spec_data_is_shipped_even_when_gitignored_and_checked_for_size(tmp_path):
    root = _project(tmp_path)
    _write(root, ".gitignore", "data/\nspec.yaml\n")
    sub = plan_submission(root / "spec.yaml", [], workspace="/shared/ws")
    assert sorted(sub.package.files) == ["data/iris.csv", "spec.yaml"]
    _write(root, "data/iris.csv", "a,target\n" + "1,0\n" * 400_000)
    with pytest.raises(PackageError, match=r"^data\.source\.path: data/iris\.csv: 1\.5 MiB is over the 1\.0 MiB limit") as err:
        plan_submission(root / "spec.yaml", [], workspace="/shared/ws", max_file_bytes=1024 * 1024)
    assert ".rayignore" not in str(err.value)  # the job needs its data: ignoring it is no fix


def test_data_outside_the_project_fails_unless_absolute_or_a_uri(tmp_path):
    root = _project(tmp_path, data="../shared.csv")
    _write(tmp_path, "shared.csv", "a,target\n1,0\n")
    with pytest.raises(PackageError, match=r"^data\.source\.path: \.\./shared\.csv is outside the project folder"):
        plan_submission(root / "spec.yaml", [], workspace="/ws")
    # --project on a folder holding both ships it.
    sub = plan_submission(root / "spec.yaml", [], project=tmp_path, workspace="/ws")
    assert "shared.csv" in sub.package.files and sub.spec_in_project == "proj/spec.yaml"
    # An absolute path or a URI is read on the cluster, as written.
    for where in ("/mnt/shared/iris.csv", "s3://bucket/iris.csv"):
        sub = plan_submission(root / "spec.yaml", [f"data.source.path={where}"], workspace="/ws")
        assert "spec.yaml" in sub.package.files and not any("shared" in f for f in sub.package.files)


def test_a_relative_api_key_file_is_refused_not_uploaded(tmp_path):
    root = _project(tmp_path)
    _write(root, "keys.txt", "k" * 32)
    spec = (root / "spec.yaml").read_text() + "serve:\n  auth: {api_keys_file: keys.txt}\n"
    (root / "spec.yaml").write_text(spec)
    with pytest.raises(PackageError, match=r"^serve\.auth\.api_keys_file: a key file relative to the spec would be uploaded"):
        plan_submission(root / "spec.yaml", [], workspace="/ws")


def test_entrypoint_runs_rayline_run_with_quoted_options_and_a_cluster_side_workspace(tmp_path):
    root = _project(tmp_path)
    sub = plan_submission(root / "spec.yaml", ["train.epochs=2", "model.params.eta=0.1 # x"], no_serve=True, port=8811)
    argv = shlex.split(sub.entrypoint.replace(CLUSTER_DEFAULT_WORKSPACE, "WS"))
    assert argv == ["rayline", "run", "spec.yaml", "--exit-after-deploy", "--no-serve", "--port", "8811", "--set",
                    "train.epochs=2", "--set", "model.params.eta=0.1 # x", "--workspace", "WS"]
    # Expanded by the cluster's shell, never the job's throwaway working_dir.
    out = subprocess.run(["sh", "-c", "echo " + CLUSTER_DEFAULT_WORKSPACE], capture_output=True, text=True,
                         env={"HOME": "/home/ray"}).stdout.strip()
    assert out == "/home/ray/.rayline"
    out = subprocess.run(["sh", "-c", "echo " + CLUSTER_DEFAULT_WORKSPACE], capture_output=True, text=True,
                         env={"HOME": "/home/ray", "RAYLINE_WORKSPACE": "s3://b/ws"}).stdout.strip()
    assert out == "s3://b/ws"


def test_workspace_choice(tmp_path):
    assert job_workspace("s3://bucket/ws", None) == ("s3://bucket/ws", "s3://bucket/ws")
    assert job_workspace("/shared/ws", None)[1] == "/shared/ws"
    assert job_workspace(None, tmp_path)[1] == str(tmp_path)
    assert job_workspace("rel/ws", tmp_path)[1] == str(Path("rel/ws").resolve())  # a head on this machine
    with pytest.raises(ClusterError, match=r"^--workspace: a relative path would be inside the job's temporary working_dir"):
        job_workspace("rel/ws", None)
    assert job_workspace(None, None)[0] == CLUSTER_DEFAULT_WORKSPACE


def test_runtime_env_and_metadata_hold_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-" + "z" * 28)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-" + "y" * 28)
    root = _project(tmp_path)
    sub = plan_submission(root / "spec.yaml", [], workspace="/ws")
    shipped = repr(sub.runtime_env("/staging")) + repr(sub.metadata) + sub.entrypoint
    assert "z" * 28 not in shipped and "y" * 28 not in shipped
    assert sub.runtime_env("/staging") == {"working_dir": "/staging", "env_vars": {"PYTHONUNBUFFERED": "1"}}
    assert "pip" not in sub.runtime_env("/staging")  # installs nothing: the image has rayline


def test_token_sources_in_rays_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    assert load_token() is None and auth_headers(None) == {}
    _write(tmp_path, ".ray/auth_token", "from-home\n")
    assert load_token() == "from-home"
    _write(tmp_path, "t", "from-path\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert load_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert auth_headers(load_token()) == {"Authorization": "Bearer from-env"}
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    with pytest.raises(ClusterError, match="RAY_AUTH_TOKEN_PATH: no such file"):
        load_token()
    msg = missing_token_message("http://h:8265", had_token=False)
    assert all(v in msg for v in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token"))


def test_address_order(tmp_path, monkeypatch):
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ClusterError, match="no Ray cluster to submit to"):
        resolve_address(None, ws)
    ws.cluster_file.write_text('{"address": "127.0.0.1:6411", "dashboard": "http://127.0.0.1:8311"}')
    assert resolve_address(None, ws)[0] == "http://127.0.0.1:8311"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a GCS address: for drivers, not the Jobs API
    assert resolve_address(None, ws)[0] == "http://127.0.0.1:8311"
    monkeypatch.setenv("RAY_ADDRESS", "https://ray.example.com/")
    assert resolve_address(None, ws) == ("https://ray.example.com", "RAY_ADDRESS")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "head:8265")
    assert resolve_address(None, ws) == ("http://head:8265", "RAY_API_SERVER_ADDRESS")
    assert resolve_address("http://other:8265", ws) == ("http://other:8265", "--address")
    with pytest.raises(ClusterError, match="a Ray Client address cannot take jobs"):
        resolve_address("ray://head:10001", ws)


@pytest.mark.parametrize("status, driver_code, expected", [
    ("SUCCEEDED", 0, 0), ("FAILED", 2, 2), ("FAILED", 3, 3), ("FAILED", None, 1), ("FAILED", -9, 1), ("STOPPED", None, 130),
])
def test_exit_codes(status, driver_code, expected):
    assert exit_code_for(status, driver_code) == expected


def _cli(*args, cwd=None, env=None):
    env = {**os.environ, **(env or {})}
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(var, None)
    return rayline_in_process(*args, cwd=cwd, env=env)


def test_cli_oversized_file_fails_before_contacting_the_cluster(tmp_path):
    root = _project(tmp_path)
    _write(root, "big.parquet", b"\0" * (2 * 1024 * 1024))
    proc = _cli("submit", str(root / "spec.yaml"), "--address", "http://127.0.0.1:1", "--max-file-mb", "1",
                "-w", "/ws")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: big.parquet: 2.0 MiB is over the 1.0 MiB limit"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_unreachable_address_is_one_line_naming_it(tmp_path):
    root = _project(tmp_path)
    for args in (["submit", str(root / "spec.yaml"), "-w", "/ws"], ["jobs", "list"], ["jobs", "status", "raysubmit_x"]):
        proc = _cli(*args, "--address", "http://127.0.0.1:1", cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("error: http://127.0.0.1:1: no Ray Jobs API answers there"), proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_spec_data_named_like_a_credential_is_shipped_and_not_reported_as_left_out(tmp_path):
    root = _project(tmp_path, data="data/train.key")
    _write(root, "data/train.key", "a,target\n1,0\n")
    _write(root, "data/other.key", "secret")
    sub = plan_submission(root / "spec.yaml", [], workspace="/shared/ws")
    assert "data/train.key" in sub.package.files and "data/other.key" not in sub.package.files
    assert sub.package.skipped["credentials"] == ["data/other.key"]  # the shipped one is not counted
