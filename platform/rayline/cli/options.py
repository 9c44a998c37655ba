"""Options several commands share: the workspace, the Ray address, Serve's host and port, the Jobs API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


WorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                            help="State directory (MLflow store, artifacts, runs), or an s3:// / gs:// URI for runs, "
                            "checkpoints and artifacts. Default ./.rayline.")


def open_workspace(path: Optional[Path]):
    from rayline.workspace import workspace

    return workspace(path)


# The options `rayline run` and `rayline resume` share (both run a pipeline, then serve it).
RunAddressOpt = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, "
                             "a head from `rayline cluster up`, else an embedded Ray).")


ServeHostOpt = typer.Option("127.0.0.1", "--host", help="HTTP host for Ray Serve.")


ServePortOpt = typer.Option(8000, "--port", help="HTTP port for Ray Serve.")


NoServeOpt = typer.Option(False, "--no-serve", help="Train and register only.")


ExitAfterDeployOpt = typer.Option(False, "--exit-after-deploy",
                                  help="With an embedded Ray, stop after deploying instead of serving until Ctrl-C.")


VerboseOpt = typer.Option(False, "--verbose", "-v", help="Show Ray's own logs.")


TimingsOpt = typer.Option(False, "--timings", help="Print where the run's time went, phase by phase (Ray's start, "
                          "data, Train's start-up, epochs, checkpoints, register, deploy...; always kept in the run's "
                          "record).")
NoCacheOpt = typer.Option(False, "--no-cache", help="Recompute the data stage instead of reading it from the "
                          "workspace's data cache (`rayline cache list`); the result is stored anew.")


IngressOpt = typer.Option(None, "--ingress", help="Serve ingress of an embedded Ray: haproxy (default; "
                          "or RAYLINE_SERVE_INGRESS) or proxy (Ray's Python proxy).")


ServeAddressOpt = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, a head from "
                                "`rayline cluster up`, else the Ray running on this machine).")


JobsAddressOpt = typer.Option(None, "--address", help="The cluster's Jobs API, http://HEAD:8265 (default: "
                              "RAY_API_SERVER_ADDRESS, RAY_ADDRESS if an http(s) URL, else the head of `rayline cluster up`).")


HeadWorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                                help="Workspace where `rayline cluster up` recorded its head (used without --address).")


JobWorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                               help="The job's workspace on the cluster: an absolute path its nodes share or an "
                               "s3:// / gs:// URI (default: a `rayline cluster up` head's own; else RAYLINE_WORKSPACE "
                               "of the cluster's nodes, else ~/.rayline on the driver's node).")
