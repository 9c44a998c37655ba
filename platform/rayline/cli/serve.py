"""`rayline serve status|deploy|promote|rollback|remove|export`: models on the connected cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from rayline.cli.apps import serve_app
from rayline.cli.options import ServeAddressOpt, WorkspaceOpt, open_workspace
from rayline.console import console, err_console, styled
from rayline.errors import RaylineError, ServeError


@serve_app.command("status")
def serve_status(
    name: Optional[str] = typer.Argument(None, help="A Serve application (the spec's name); default: all."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, a head "
                                          "from `rayline cluster up`, else the Ray running on this machine)."),
    workspace: Optional[Path] = WorkspaceOpt,
    output: str = typer.Option("table", "--output", "-o", help="table | json"),
) -> None:
    """Applications, model versions, routes, replicas (running/min/max) and request and error counts."""
    from rayline.serve.status import connect_existing, gather_status

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    ws = open_workspace(workspace)
    conn = connect_existing(ws, address)
    try:
        report = gather_status(name, ws=ws)
    finally:
        conn.shutdown()
    if output == "json":
        print(json.dumps(report.to_dict(), indent=2))
        return
    if not report.applications:
        console.print("no Serve applications are running on this cluster")
        return
    table = Table(title="served models", caption="replicas: running/min/max; requests, errors: since the replicas "
                  "started, as Ray last exported them (every ~10 s)")
    for col in ("app", "model", "version", "route", "status", "replicas", "requests", "errors"):
        table.add_column(col, justify="right" if col in ("requests", "errors") else "left", overflow="fold",
                         no_wrap=col not in ("app", "route"))
    for a in report.applications:
        bounds = f"{a.replicas_min}/{a.replicas_max}" if a.replicas_max is not None else f"{a.replicas_target}/{a.replicas_target}"
        table.add_row(a.name, a.model or "-", ", ".join(a.versions) or "-", a.route or "-",
                      a.status + (f": {a.message}" if a.message and a.status != "RUNNING" else ""),
                      f"{a.replicas_running}/{bounds}", "-" if a.requests is None else str(a.requests),
                      "-" if a.errors is None else str(a.errors))
    console.print(table)
    for a in report.applications:
        if a.rollout is not None:
            console.print(rollout_line(a.name, a.rollout), soft_wrap=True)
        if a.retrain is not None:
            from rayline.cli.retrain import loop_line

            console.print(loop_line(a.retrain), soft_wrap=True)
        for version, drift in a.monitoring.items():
            console.print(drift_line(a.model or a.name, version, drift), soft_wrap=True)
    if report.metrics_note:
        console.print(styled((report.metrics_note, "yellow")))


_DRIFT_NAMED = 3  # the features a status line names, the most drifted first


def drift_line(model: str, version: str, report: dict) -> str:
    """One line per monitored version: its status over the live window and the features that
    drifted most, with their numbers (rayline/monitoring/live.py)."""
    line = f"{model} v{version} monitoring: {report['status']} ({report['window_rows']:,} rows in the window"
    if report["status"] == "collecting":
        return line + f", judged from {report['min_rows']:,})"
    flagged = [f for f in report["features"] if f["level"] != "ok"]
    shown = (flagged or report["features"])[:_DRIFT_NAMED]
    parts = []
    for f in shown:
        share = f.get("unseen_share", f.get("out_of_range_share", 0.0))
        what = "unseen" if "unseen_share" in f else "out of range"
        parts.append(f"{f['feature']} PSI {f['psi']:.3f}, nulls {f['null_share']:.1%}, {what} {share:.1%}"
                     + (f" [{f['level']}]" if f["level"] != "ok" else ""))
    return line + ("); drifted: " if flagged else "); most drifted: ") + "; ".join(parts)


def rollout_line(name: str, rollout: dict) -> str:
    """One line per routed model: the split, the canary's gate, or the gate's rollback."""
    weights = rollout.get("weights") or {}
    parts = [f"version {v} {'champion' if v == rollout.get('champion') else 'canary' if v == rollout.get('canary') else ''} "
             f"{w}%".replace("  ", " ") for v, w in weights.items()]
    line = f"{name}: " + ", ".join(parts)
    if rollout.get("canary") and rollout.get("gate"):
        line += "; gate " + ", ".join(f"{k} {v:g}" for k, v in rollout["gate"].items() if v is not None)
    gone = rollout.get("rolled_back")
    if gone:
        line += (f"; canary version {gone['version']} rolled back automatically at {gone['at']}: "
                 f"{gone['limit']} ({gone['detail']})")
    return line


def _rollout(workspace: Optional[Path], address: Optional[str], action) -> None:
    """Connect the way `serve status` does, run one rollout action, print its one line."""
    from rayline.serve.status import connect_existing

    ws = open_workspace(workspace)
    conn = connect_existing(ws, address)
    try:
        message = action(ws)
    finally:
        conn.shutdown()
    console.print(message, soft_wrap=True)


@serve_app.command("deploy")
def serve_deploy(
    name: str = typer.Argument(..., help="Registered model name."),
    version: str = typer.Option(..., "--version", help="Registered version to deploy."),
    canary: Optional[int] = typer.Option(None, "--canary", metavar="PERCENT", help="Send PERCENT (1-99) of the route's "
                                         "traffic to this version and the rest to the champion (default: it becomes the champion)."),
    max_error_rate: Optional[float] = typer.Option(None, "--max-error-rate", help="With --canary: roll back when the "
                                                   "canary's error rate (5xx) goes above this (0-1)."),
    max_p99_ms: Optional[float] = typer.Option(None, "--max-p99-ms", help="With --canary: roll back when the canary's p99 "
                                               "latency goes above this many milliseconds."),
    min_requests: Optional[int] = typer.Option(None, "--min-requests", help="With a limit: canary requests seen before "
                                               "the limits are checked (default 100)."),
    set_: List[str] = typer.Option([], "--set", metavar="serve.PATH=VALUE", help="Change a serve setting of the model, "
                                   "e.g. --set serve.replicas.max=4 (VALUE is YAML); a running version is updated in place."),
    address: Optional[str] = ServeAddressOpt,
    workspace: Optional[Path] = WorkspaceOpt,
    host: str = typer.Option("127.0.0.1", help="HTTP host for Ray Serve, if it is not running yet."),
    port: int = typer.Option(8000, help="HTTP port for Ray Serve, if it is not running yet."),
) -> None:
    """Deploy a registered version: the new champion, or a canary beside it (--canary PERCENT)."""
    from pydantic import ValidationError

    from rayline.serve import versions
    from rayline.spec.serve_spec import CanarySpec

    from rayline.serve.settings import with_serve_overrides
    from rayline.spec import ServeSpec
    from rayline.spec.overrides import parse_set_options

    overrides = parse_set_options(set_)
    with_serve_overrides(ServeSpec(), overrides)  # bad paths and values fail here, before Ray is reached
    limits = {"max_error_rate": max_error_rate, "max_p99_ms": max_p99_ms, "min_requests": min_requests}
    given = [f"--{k.replace('_', '-')}" for k, v in limits.items() if v is not None]
    if given and canary is None:
        raise RaylineError(f"{given[0]}: only with --canary (got {' '.join(given)} without --canary; allowed: "
                           f"--canary PERCENT {' '.join(given)})")
    gate = None
    if canary is not None:
        versions.check_canary_percent(canary)
        try:
            spec = CanarySpec.model_validate({"percent": canary, **{k: v for k, v in limits.items() if v is not None}})
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]).replace("_", "-")
            raise RaylineError(f"--{field}: {error['msg']} (got {error.get('input')})") from exc
        if min_requests is not None and spec.gate() is None:
            raise RaylineError(f"--min-requests: only with --max-error-rate or --max-p99-ms (got --min-requests {min_requests})")
        gate = spec.gate()
    def deploy_and_loop(ws) -> str:
        rollout = versions.deploy(name, version, ws=ws, canary_percent=canary, gate=gate, host=host, port=port,
                                  overrides=overrides)
        if canary is not None:
            return rollout.message
        # A new champion: the retrain loop of the spec it was trained with, when that spec has one.
        from rayline.retrain.loop import start_for_version

        loop = start_for_version(name, rollout.champion, ws)
        return rollout.message + (f"\n{loop}" if loop else "")

    _rollout(workspace, address, deploy_and_loop)


@serve_app.command("promote")
def serve_promote(name: str = typer.Argument(..., help="Registered model name."),
                  address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Make the live canary the champion (all traffic)."""
    from rayline.serve import versions

    _rollout(workspace, address, lambda ws: versions.promote(name, ws=ws).message)


@serve_app.command("rollback")
def serve_rollback(name: str = typer.Argument(..., help="Registered model name."),
                   address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt) -> None:
    """All traffic back to the champion (a live canary), else to the previous champion."""
    from rayline.serve import versions

    _rollout(workspace, address, lambda ws: versions.rollback(name, ws=ws).message)


@serve_app.command("remove")
def serve_remove(name: str = typer.Argument(..., help="Registered model name."),
                 version: str = typer.Option(..., "--version", help="Deployed version to retire."),
                 address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Delete a deployed version's application (refused for the champion and a live canary)."""
    from rayline.serve import versions

    _rollout(workspace, address, lambda ws: versions.remove(name, version, ws=ws))


@serve_app.command("delete")
def serve_delete(name: str = typer.Argument(..., help="Registered model name."),
                 address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Take the model off Serve: its retrain loop, router, versions and V2 app (the registry keeps its versions)."""
    from rayline.retrain.loop import stop_loop
    from rayline.serve import versions

    def delete(ws) -> str:
        # The loop first: it would deploy a canary into the endpoint being deleted.
        stopped = stop_loop(name, "stopped by `rayline serve delete`")
        try:
            message = versions.delete(name, ws=ws)
        except ServeError:
            if not stopped:
                raise
            return f"model {name}: retrain loop stopped; nothing of it was served"
        return message + ("; its retrain loop is stopped" if stopped else "")

    _rollout(workspace, address, delete)


@serve_app.command("export")
def serve_export(name: str = typer.Argument(..., help="Registered model name."),
                 version: Optional[str] = typer.Option(None, "--version", help="Version to serve (default: the "
                                                       "champion alias, else the newest)."),
                 output: Optional[str] = typer.Option(None, "--output", "-o", help="File to write (default: print it)."),
                 cluster_workspace: Optional[str] = typer.Option(None, "--cluster-workspace", help="The workspace "
                                                                 "path as the cluster's nodes see it (default: this "
                                                                 "workspace's absolute path)."),
                 host: str = typer.Option("127.0.0.1", help="Serve's HTTP host in the config (0.0.0.0 on Kubernetes)."),
                 port: int = typer.Option(8000, help="Serve's HTTP port in the config."),
                 no_v2: bool = typer.Option(False, "--no-v2", help="Leave out the Open Inference Protocol app (/v2)."),
                 workspace: Optional[Path] = WorkspaceOpt) -> None:
    """A Ray Serve config file for a registered version (Ray's `serve deploy`, KubeRay RayService)."""
    from rayline.serve.export import export_config, write_config

    config, notes = export_config(open_workspace(workspace), name, version, cluster_workspace=cluster_workspace, host=host,
                                  port=port, with_v2=not no_v2)
    served = config["applications"][0]["args"]["version"]
    text = write_config(config, output, name, served)
    for note in notes:
        err_console.print(f"note: {note}")
    if output in (None, "-"):
        print(text, end="")
    else:
        err_console.print(f"wrote {output}: model {name} version {served}; deploy with: serve deploy {output} "
                          "--address http://HEAD:8265")
