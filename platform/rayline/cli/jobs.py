"""`rayline submit` and `rayline jobs list|status|logs|stop`: Ray Jobs through the Jobs API."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from rayline.cli.apps import app, jobs_app
from rayline.cli.options import HeadWorkspaceOpt, JobWorkspaceOpt, JobsAddressOpt, open_workspace
from rayline.cli.render import shown, when
from rayline.console import console, err_console
from rayline.errors import RaylineError


def _local_ws_for(workspace: Optional[str]):
    """The local workspace where `rayline cluster up` records its head (None for a URI)."""
    return None if workspace and "://" in workspace else open_workspace(Path(workspace) if workspace else None)


def _jobs_client(address: Optional[str], workspace: Optional[str]):
    from rayline.jobs import JobsClient, resolve_address

    url, source = resolve_address(address, _local_ws_for(workspace))
    return JobsClient.connect(url), source


def _follow_job(client, job_id: str) -> None:
    """Stream the job's logs until it ends; exit with its status (see rayline.jobs.exit_code_for)."""
    from rayline.jobs import exit_code_for

    def write(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        client.follow(job_id, write)
        info = client.info(job_id)
        deadline = time.monotonic() + 30  # the log stream can close a moment before the status is final
        while info.status not in ("SUCCEEDED", "FAILED", "STOPPED") and time.monotonic() < deadline:
            time.sleep(0.5)
            info = client.info(job_id)
    except KeyboardInterrupt:
        err_console.print(f"stopped following {job_id}; the job keeps running on the cluster "
                          f"(stop it with `rayline jobs stop {job_id}`)")
        raise typer.Exit(130)
    status = str(getattr(info.status, "value", info.status))
    code = exit_code_for(status, getattr(info, "driver_exit_code", None))
    # Ray's message of a failed job appends the driver's last logs, already streamed above: first line only.
    message = (info.message or "").split(", last available logs", 1)[0].strip().splitlines()
    line = f"job {job_id} {status}" + (f": {shown(message[0])}" if code and message else "")
    (err_console if code else console).print(line)
    raise typer.Exit(code)


@app.command()
def submit(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Pipeline spec file, inside the project folder."),
    address: Optional[str] = JobsAddressOpt,
    workspace: Optional[str] = JobWorkspaceOpt,
    project: Optional[Path] = typer.Option(None, "--project", help="The folder shipped as the job's working_dir "
                                           "(default: the spec's folder)."),
    set_: List[str] = typer.Option([], "--set", metavar="PATH=VALUE", help="Override a spec key (VALUE is YAML)."),
    host: Optional[str] = typer.Option(None, "--host", help="HTTP host for Ray Serve on the cluster (default: rayline run's)."),
    port: Optional[int] = typer.Option(None, "--port", help="HTTP port for Ray Serve on the cluster (default: rayline run's)."),
    no_serve: bool = typer.Option(False, "--no-serve", help="Train and register only."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream the job's logs and exit with its status "
                                "(0 succeeded, 130 stopped, else the driver's exit code or 1)."),
    max_file_mb: float = typer.Option(10.0, "--max-file-mb", help="Largest file shipped with the job, in MiB."),
) -> None:
    """Submit the pipeline as a Ray Job (Jobs API): the same runner as `rayline run`, on the cluster."""
    from rayline.jobs import human_size, plan_submission
    from rayline.jobs import submit as submit_job

    if not max_file_mb > 0:
        raise RaylineError(f"--max-file-mb: must be > 0 (got {max_file_mb:g})")
    local_ws = _local_ws_for(workspace)
    from rayline.jobs import resolve_address

    url, source = resolve_address(address, local_ws)
    head_here = source.startswith("the head of")
    submission = plan_submission(spec_path, set_, project=project, workspace=workspace,
                                 local_head_ws=local_ws.root if head_here and local_ws else None,
                                 exclude_dirs=(str(local_ws.root),) if local_ws else (), no_serve=no_serve, host=host,
                                 port=port, max_file_bytes=int(max_file_mb * 1024 * 1024))
    from rayline.jobs import JobsClient

    client = JobsClient.connect(url)
    job_id = submit_job(client, submission)
    pkg = submission.package
    left = "; ".join(f"{reason}: {len(paths)}" for reason, paths in sorted(pkg.skipped.items()))
    console.print(f"submitted job {job_id} to {url} (from {source})")
    console.print(f"  shipped: {len(pkg.files)} files, {human_size(pkg.total_bytes)} from {pkg.root}"
                  + (f" (left out: {left})" if left else ""))
    console.print(f"  runs:    {shown(submission.entrypoint)}")
    console.print(f"  workspace on the cluster: {shown(submission.workspace)}")
    console.print(f"  dashboard: {url}/#/jobs/{job_id}")
    where = "" if source.startswith("the head of") else f" --address {url}"
    if not follow:
        console.print(f"  follow:  rayline jobs logs {job_id} --follow{where}")
        console.print(f"  stop:    rayline jobs stop {job_id}{where}")
        return
    _follow_job(client, job_id)


@jobs_app.command("list")
def jobs_list(address: Optional[str] = JobsAddressOpt, workspace: Optional[str] = HeadWorkspaceOpt,
              output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """Jobs on the cluster, newest first: id, status, pipeline, start and end."""
    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    client, _ = _jobs_client(address, workspace)
    jobs = sorted(client.list(), key=lambda j: j.start_time or 0, reverse=True)
    rows = [{"job": j.submission_id or j.job_id, "status": str(getattr(j.status, "value", j.status)),
             "pipeline": (j.metadata or {}).get("rayline_spec", ""), "start": when(j.start_time), "end": when(j.end_time),
             "entrypoint": shown(j.entrypoint or "")} for j in jobs]
    if output == "json":
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"no jobs on {client.url}")
        return
    # Plain columns, never cut: ids are copied from here (a table fitted to 80 columns truncated them).
    cols = ("job", "status", "start", "end", "pipeline")
    cells = [[r["job"], r["status"], r["start"], r["end"], r["pipeline"] or r["entrypoint"][:60]] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    for row in [list(cols), *cells]:
        console.print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


@jobs_app.command("status")
def jobs_status(job: str = typer.Argument(..., metavar="JOB", help="Submission id (from `rayline submit` or `jobs list`)."),
                address: Optional[str] = JobsAddressOpt, workspace: Optional[str] = HeadWorkspaceOpt) -> None:
    """One job's status, message, times and entrypoint."""
    client, _ = _jobs_client(address, workspace)
    info = client.info(job)
    status = str(getattr(info.status, "value", info.status))
    console.print(f"job:        {info.submission_id or job}\nstatus:     {status}")
    message = (info.message or "").split(", last available logs", 1)[0].strip().splitlines()
    if message:  # Ray appends a failed driver's last logs to its message: `rayline jobs logs` has them
        console.print(f"message:    {shown(message[0])}")
    if getattr(info, "driver_exit_code", None) is not None:
        console.print(f"exit code:  {info.driver_exit_code}")
    console.print(f"started:    {when(info.start_time)}\nended:      {when(info.end_time)}\n"
                  f"entrypoint: {shown(info.entrypoint or '')}\ndashboard:  {client.url}/#/jobs/{info.submission_id or job}")


@jobs_app.command("logs")
def jobs_logs(job: str = typer.Argument(..., metavar="JOB", help="Submission id."),
              address: Optional[str] = JobsAddressOpt, workspace: Optional[str] = HeadWorkspaceOpt,
              follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the job ends; exit with its status.")) -> None:
    """The job's driver output (the same progress lines and summary as `rayline run`)."""
    client, _ = _jobs_client(address, workspace)
    if follow:
        _follow_job(client, job)
    sys.stdout.write(client.logs(job))
    sys.stdout.flush()


@jobs_app.command("stop")
def jobs_stop(job: str = typer.Argument(..., metavar="JOB", help="Submission id."),
              address: Optional[str] = JobsAddressOpt, workspace: Optional[str] = HeadWorkspaceOpt,
              wait: float = typer.Option(60.0, "--wait", help="Seconds to wait until it has stopped (0: do not wait).")) -> None:
    """Stop a running job (SIGTERM to its driver, then SIGKILL); waits until it has stopped."""
    client, _ = _jobs_client(address, workspace)
    if not client.stop(job):
        info = client.info(job)
        console.print(f"job {job} is not running ({getattr(info.status, 'value', info.status)})")
        return
    deadline = time.monotonic() + wait
    status = "STOPPING"
    while wait > 0 and time.monotonic() < deadline:
        info = client.info(job)
        status = str(getattr(info.status, "value", info.status))
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.5)
    console.print(f"job {job} {status if status != 'STOPPING' else 'asked to stop'}")
