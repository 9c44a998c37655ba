"""`rayline submit`: one pipeline spec as a Ray Job on any cluster, through its Jobs API.

The job's driver runs the same runner as `rayline run` (`rayline run SPEC --exit-after-deploy`),
in the project folder Ray unpacked on the cluster; Ray sets RAY_ADDRESS for job drivers, so
`rayline run` joins that cluster instead of starting a Ray of its own.

Where the job keeps its state (MLflow store, artifacts, checkpoints): never the job's working_dir,
which Ray deletes with the job. First found wins:
1. `--workspace` (or RAYLINE_WORKSPACE where `rayline submit` runs): passed through as a path on
   the cluster or a URI (s3://, gs://); a relative path only for a head on this machine;
2. a head started by `rayline cluster up` on this machine: that workspace (the same machine);
3. otherwise the cluster decides when the job starts: RAYLINE_WORKSPACE of its nodes, else
   ~/.rayline on the node that runs the driver (the head, by default). On a multi-node cluster
   set a shared path or a URI, so every worker reaches the checkpoints.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rayline.errors import ClusterError
from rayline.jobs.package import DEFAULT_MAX_FILE_BYTES, Package, PackageError, collect_files

__all__ = ["Submission", "plan_submission", "job_workspace", "submit", "CLUSTER_DEFAULT_WORKSPACE", "JOB_ENV"]

# Expanded by the shell that runs the entrypoint on the cluster (Ray runs it with shell=True).
CLUSTER_DEFAULT_WORKSPACE = '"${RAYLINE_WORKSPACE:-$HOME/.rayline}"'
# Job drivers write to a file, so Python would buffer stdout in 8 KiB blocks and `rayline jobs
# logs --follow` would show the stage lines minutes late; unbuffered, each line as it is printed.
JOB_ENV = {"PYTHONUNBUFFERED": "1"}


@dataclass
class Submission:
    """Everything a submission sends, decided before anything is sent."""

    entrypoint: str
    package: Package
    workspace: str  # as the user should read it
    spec_in_project: str
    name: str
    metadata: dict = field(default_factory=dict)

    def runtime_env(self, working_dir: str) -> dict:
        # Nothing to install: the cluster image has rayline and its frameworks (deploy/Dockerfile).
        # Only non-secret settings: the runtime_env is readable by anyone who can list jobs.
        return {"working_dir": working_dir, "env_vars": dict(JOB_ENV)}


def job_workspace(explicit: str | None, local_head_ws: Path | None) -> tuple[str, str]:
    """(the entrypoint's --workspace argument, shell-quoted; how to describe it). See the module doc."""
    if explicit:
        if "://" in explicit:
            return shlex.quote(explicit), explicit
        path = Path(explicit).expanduser()
        if path.is_absolute():
            return shlex.quote(str(path)), str(path)
        if local_head_ws is not None:
            resolved = str(path.resolve())
            return shlex.quote(resolved), resolved
        raise ClusterError(f"--workspace: a relative path would be inside the job's temporary working_dir on the "
                           f"cluster, deleted with the job (got {explicit}; allowed: an absolute path on the cluster, "
                           "shared by its nodes, or an s3:// or gs:// URI)")
    if local_head_ws is not None:
        return shlex.quote(str(local_head_ws)), str(local_head_ws)
    return CLUSTER_DEFAULT_WORKSPACE, "RAYLINE_WORKSPACE of the cluster's nodes, else ~/.rayline on the node running the job's driver"


def _raw_spec(spec_path: Path, overrides: dict) -> dict:
    from rayline.spec.loading import read_spec_text
    from rayline.spec.assign import set_paths
    from rayline.spec.yaml_safe import load_yaml

    raw = load_yaml(read_spec_text(spec_path), str(spec_path))
    if overrides and isinstance(raw, dict):
        set_paths(raw, overrides)
    return raw if isinstance(raw, dict) else {}


def _get(raw: dict, *keys):
    for key in keys:
        if not isinstance(raw, dict):
            return None
        raw = raw.get(key)
    return raw


def _local_paths(spec_path: Path, project: Path, raw: dict) -> list[str]:
    """The spec's local data paths (absolute) to ship; errors for ones the job could not read."""
    value = _get(raw, "data", "source", "path")
    keys_file = _get(raw, "serve", "auth", "api_keys_file")
    if isinstance(keys_file, str) and keys_file.strip() and not Path(keys_file).expanduser().is_absolute():
        resolved = (spec_path.parent / keys_file).resolve()
        raise PackageError(f"serve.auth.api_keys_file: a key file relative to the spec would be uploaded with the "
                           f"job's code, readable by anyone who can list the cluster's jobs (got {keys_file} -> "
                           f"{resolved}; allowed: an absolute path on the cluster's nodes, e.g. a mounted Secret, "
                           "or serve.auth.api_keys_env)")
    if not isinstance(value, str) or "://" in value:
        return []  # no path (sklearn), or a URI the cluster reads itself
    if Path(value).expanduser().is_absolute():
        return []  # meant on the cluster: read there, as written (a path every node sees)
    resolved = (spec_path.parent / value).resolve()
    try:
        resolved.relative_to(project)
    except ValueError:
        raise PackageError(f"data.source.path: {value} is outside the project folder {project}, so it would not "
                           f"reach the cluster (got {resolved}; allowed: a path inside the project, --project on a "
                           "folder holding both the spec and the data, or an absolute path or s3:// / gs:// URI "
                           "the cluster's nodes can read)") from None
    return [str(resolved)]


def plan_submission(spec_path: str | Path, set_options: list[str], *, project: str | Path | None = None,
                    workspace: str | None = None, local_head_ws: Path | None = None, exclude_dirs: tuple = (),
                    no_serve: bool = False, host: str | None = None, port: int | None = None,
                    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Submission:
    """Check the spec and the project, and build the entrypoint; sends nothing."""
    from rayline.spec import load_spec, parse_set_options

    spec_path = Path(spec_path)
    overrides = parse_set_options(set_options)
    # Keys, types and values are checked here, before anything is uploaded; the data is checked
    # on the cluster, where it is read (an absolute path or a URI may exist only there).
    spec = load_spec(spec_path, check_data=False, overrides=overrides)
    spec_abs = spec_path.resolve()
    root = Path(project).expanduser().resolve() if project else spec_abs.parent
    if not root.is_dir():
        raise PackageError(f"--project: not a folder (got {project})")
    try:
        spec_rel = spec_abs.relative_to(root).as_posix()
    except ValueError:
        raise PackageError(f"--project: the spec is not inside the project folder (got spec {spec_abs}, project "
                           f"{root}; allowed: a folder that holds the spec)") from None
    data = _local_paths(spec_abs, root, _raw_spec(spec_abs, overrides))
    package = collect_files(root, data_paths=tuple(data), force_files=(str(spec_abs),), exclude_dirs=exclude_dirs,
                            max_file_bytes=max_file_bytes)
    ws_arg, ws_text = job_workspace(workspace, local_head_ws)
    cmd = ["rayline", "run", spec_rel, "--exit-after-deploy"]
    if no_serve:
        cmd.append("--no-serve")
    if host:
        cmd += ["--host", host]
    if port:
        cmd += ["--port", str(port)]
    for item in set_options:
        cmd += ["--set", item]
    entrypoint = shlex.join(cmd) + " --workspace " + ws_arg
    metadata = {"rayline_spec": spec_rel, "rayline_name": spec.name, "submitted_by": "rayline"}
    return Submission(entrypoint=entrypoint, package=package, workspace=ws_text, spec_in_project=spec_rel,
                      name=spec.name, metadata=metadata)


def submit(client, submission: Submission) -> str:
    """Stage the package, submit the job, remove the staging copy; returns the submission id."""
    import shutil

    from rayline.workspace import owned_tempdir, sweep_orphans, user_cache_dir
    from rayline.jobs.package import stage_package

    parent = user_cache_dir() / "tmp"
    parent.mkdir(parents=True, exist_ok=True)
    sweep_orphans(parent, "submit-")  # staging copies of submissions killed mid-upload
    staging = owned_tempdir(parent, "submit-")
    try:
        stage_package(submission.package, staging)
        return client.submit(entrypoint=submission.entrypoint, runtime_env=submission.runtime_env(staging),
                             metadata=submission.metadata)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
