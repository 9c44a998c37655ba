"""`rayline cluster up|down|status`: a local Ray head that outlives the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rayline.cli.apps import cluster_app
from rayline.cli.options import WorkspaceOpt, open_workspace
from rayline.console import console, err_console


@cluster_app.command("up")
def cluster_up(workspace: Optional[Path] = WorkspaceOpt,
               port: int = typer.Option(6379, help="GCS port of the head."),
               num_cpus: Optional[int] = typer.Option(None, help="Logical CPUs (default: all cores)."),
               dashboard_port: int = typer.Option(8265, help="Port of the Ray dashboard."),
               ingress: Optional[str] = typer.Option(None, "--ingress", help="Serve ingress: haproxy (default; "
                                                     "or RAYLINE_SERVE_INGRESS) or proxy (Ray's Python proxy)."),
               host: str = typer.Option("127.0.0.1", "--host", help="Bind address of the head's ports: 127.0.0.1 "
                                        "(default: this machine only) or 0.0.0.0 (every interface; turn on Ray token auth)."),
               client_port: int = typer.Option(10001, "--client-port", help="Port of Ray's client server (ray://).")) -> None:
    """Start a local Ray head that outlives this command."""
    from rayline.cluster.head import cluster_up as up
    from rayline.cluster.connection import token_auth_on

    if host == "0.0.0.0" and not token_auth_on():
        err_console.print("warning: --host 0.0.0.0 opens the head's GCS, dashboard (its Jobs API runs any code) and "
                          "Ray Client ports to the network with Ray token auth off; anyone who reaches them controls "
                          "this machine. Turn it on first: `ray get-auth-token --generate` (or RAY_AUTH_MODE=token "
                          "with RAY_AUTH_TOKEN), then `rayline cluster up --host 0.0.0.0` again.", soft_wrap=True)
    info = up(open_workspace(workspace), port, num_cpus, dashboard_port, ingress=ingress, host=host, client_port=client_port)
    verb = "started" if info["started"] else "already running"
    where = "this machine only" if info.get("loopback", True) else f"{info.get('host')}, token auth {'on' if info.get('token_auth') else 'OFF'}"
    console.print(f"Ray head {verb} at {info['address']} (bound to {where}); `rayline run` will use it.", soft_wrap=True)
    if info.get("loopback"):  # Ray resolves 127.0.0.1 to the external address unless told (rayline/cluster/env.py)
        console.print(f"Ray's own clients (`ray status --address {info['address']}`, ray.init) reach it with "
                      "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 set.", soft_wrap=True)


@cluster_app.command("down")
def cluster_down(workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Stop the local Ray head started by `rayline cluster up` (and no other Ray on this machine)."""
    from rayline.cluster.head import cluster_down as down

    console.print("stopped the local Ray head" if down(open_workspace(workspace)) else "no local Ray head recorded")


@cluster_app.command("status")
def cluster_status(workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Whether the local Ray head is up, and its resources."""
    from rayline.cluster.head import cluster_status as status

    info = status(open_workspace(workspace))
    if not info["alive"]:
        if info.get("unreachable"):  # recorded, and nothing answers there now: what was seen, what to do
            console.print(f"no local Ray head is running: the head recorded at {info['address']} does not answer "
                          f"({info['unreachable']}); `rayline cluster up` starts it again (it replaces a head that "
                          "died), or check what holds that port on this machine", soft_wrap=True)
        elif info["address"]:  # its GCS answered, `ray status` did not report a running cluster
            said = (info.get("detail") or "").strip().splitlines()
            console.print(f"no local Ray head is running: `ray status --address={info['address']}` reported none"
                          f"{' (' + said[-1][:200] + ')' if said else ''}; `rayline cluster down`, then `rayline "
                          "cluster up`, starts it again", soft_wrap=True)
        else:
            console.print("no local Ray head is running (start one with `rayline cluster up`)")
        raise typer.Exit(1)
    console.print(f"Ray head at {info['address']}\n{info.get('detail', '')}")
