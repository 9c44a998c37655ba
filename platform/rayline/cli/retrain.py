"""`rayline retrain status|stop NAME`: the retrain loop of a served model (rayline/retrain/loop.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rayline.cli.apps import retrain_app
from rayline.cli.options import ServeAddressOpt, WorkspaceOpt, open_workspace
from rayline.console import console
from rayline.errors import RaylineError, ServeError

_DECISIONS_SHOWN = 5


def loop_line(status: dict) -> str:
    """One line: the loop's state, what it waits for, and its last decision."""
    record = status.get("record") or {}
    line = f"{status['model']} retrain loop: {record.get('state', '?')}"
    if status.get("waiting"):
        line += f" ({status['waiting']})"
    last = (record.get("decisions") or [None])[-1]
    if last:
        line += (f"; last decision {last['at']}: {last['decision']}"
                 + (f" version {last['version']}" if last.get("version") else "") + f": {last['why']}")
    if status.get("error"):
        line += f"; last look failed: {status['error']}"
    return line


def _connected(workspace, address, action):
    from rayline.serve.status import connect_existing

    ws = open_workspace(workspace)
    conn = connect_existing(ws, address)
    try:
        return action(ws)
    finally:
        conn.shutdown()


@retrain_app.command("status")
def retrain_status(name: str = typer.Argument(..., help="Registered model name (the spec's name)."),
                   address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt,
                   output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """The loop's state, what it waits for, and its recent decisions (each with why)."""
    from rayline.retrain.loop import loop_status

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    status = _connected(workspace, address, lambda ws: loop_status(name))
    if status is None:
        raise ServeError(f"model {name}: no retrain loop runs on this cluster (got {name!r}; a loop starts with "
                         "`rayline run SPEC` when the spec has a retrain section)")
    if output == "json":
        print(json.dumps(status, indent=2))
        return
    console.print(loop_line(status), soft_wrap=True)
    for entry in (status["record"].get("decisions") or [])[-_DECISIONS_SHOWN:]:
        version = f" version {entry['version']}" if entry.get("version") else ""
        console.print(f"  {entry['at']} {entry['decision']}{version}: {entry['why']}", soft_wrap=True)


@retrain_app.command("stop")
def retrain_stop(name: str = typer.Argument(..., help="Registered model name (the spec's name)."),
                 address: Optional[str] = ServeAddressOpt, workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Stop the loop for good (a retrain it runs is terminated; the champion keeps serving)."""
    from rayline.retrain.loop import stop_loop

    if not _connected(workspace, address, lambda ws: stop_loop(name, "stopped by `rayline retrain stop`")):
        raise ServeError(f"model {name}: no retrain loop runs on this cluster (got {name!r})")
    console.print(f"model {name}: retrain loop stopped; the champion keeps serving", soft_wrap=True)
