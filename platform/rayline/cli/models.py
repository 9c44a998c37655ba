"""`rayline models [list|show|compare]` and `rayline report`: registered models, their lineage, a sweep's report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rayline.cli.apps import app, models_app
from rayline.cli.options import ServeAddressOpt, WorkspaceOpt, open_workspace
from rayline.console import console
from rayline.errors import RaylineError


@models_app.command("list")
def models(name: Optional[str] = typer.Argument(None, help="A model name; default: every model."),
           workspace: Optional[Path] = WorkspaceOpt,
           output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """Registered models, their versions and metrics (also `rayline models [NAME]`)."""
    # MLflow logs its store set-up at INFO ("Creating initial MLflow database tables...")
    # into the table's output; it reads this when first imported.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from rayline.redact import redact_uri
    from rayline.registry import Registry

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    versions = Registry(open_workspace(workspace)).list_models(name)
    if output == "json":  # an artifact source may hold credentials (https://user:token@host/...)
        print(json.dumps([{**v.__dict__, "source": redact_uri(v.source)} for v in versions], indent=2, default=str))
        return
    table = Table(title="registered models")
    for col in ("model", "version", "framework", "created", "test metrics"):
        table.add_column(col)
    for v in versions:
        test = ", ".join(f"{k[5:]}={val:.4f}" for k, val in sorted(v.metrics.items()) if k.startswith("test_") and k != "test_log_loss")
        table.add_row(v.name, v.version, v.framework, v.created, test)
    if not versions:
        console.print("no registered models yet: run `rayline run SPEC`")
        return
    console.print(table)


@models_app.command("show")
def models_show(name: str = typer.Argument(..., help="A registered model name."),
                version: Optional[str] = typer.Option(None, "--version", help="The version (default: the newest)."),
                workspace: Optional[Path] = WorkspaceOpt,
                output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """A version's lineage: the data (source, fingerprint, data cache entry), the pipeline run, the winning
    trial and its checkpoint, the version's metrics, and the deployments that gave it traffic."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no store set-up chatter in the output
    from rayline.registry.lineage import lineage, lineage_lines

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    item = lineage(open_workspace(workspace), name, version)
    if output == "json":
        print(json.dumps(item.to_dict(), indent=2, default=str))
        return
    for line in lineage_lines(item):
        console.print(line)


@models_app.command("compare")
def models_compare(name: str = typer.Argument(..., help="A registered model name."),
                   challenger: str = typer.Argument(..., help="The version to judge."),
                   data: Path = typer.Option(..., "--data", help="Labelled raw rows to judge on (CSV or Parquet): the "
                                             "features and the label column, as the pipeline's data has them."),
                   champion: Optional[str] = typer.Option(None, "--champion", help="The version to beat (default: the "
                                                          "one the `champion` alias names, i.e. the one serving)."),
                   metric: Optional[str] = typer.Option(None, "--metric", help="Default: the metric the challenger "
                                                        "was trained for (train.metric)."),
                   min_delta: float = typer.Option(0.0, "--min-delta", help="How much better the challenger must "
                                                   "score to qualify, in the metric's own direction (0: no worse)."),
                   workspace: Optional[Path] = WorkspaceOpt,
                   output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """Judge a version against the champion on the same labelled rows; the judgement is recorded on the
    version (`rayline models show`). Exit 0 when it qualifies, 4 when it does not."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from rayline.retrain import judge, read_rows

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    ws = open_workspace(workspace)
    result = judge(ws, name, challenger, read_rows(str(data)), data=str(data), champion=champion, metric=metric,
                   min_delta=min_delta)
    if output == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        console.print(result.line(), soft_wrap=True)
    if not result.qualifies:
        raise typer.Exit(4)


@app.command()
def report(target: str = typer.Argument(..., metavar="RUN_ID|NAME", help="The MLflow run id `rayline run` printed "
                                        "(a trial's run id names its sweep), or a pipeline name: its newest run with "
                                        "tuning trials. With --live: a served model's name."),
           workspace: Optional[Path] = WorkspaceOpt,
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default: "
                                                 "<workspace>/reports/<name>-<run id>.html; with --live "
                                                 "<workspace>/reports/<name>-live-<time>.html)."),
           live: bool = typer.Option(False, "--live", help="The drift of a served model's live window (every "
                                     "monitored version, or --version), read from the connected cluster: a panel "
                                     "per feature, training against live traffic."),
           versions: Optional[list[str]] = typer.Option(None, "--version", help="With --live: only this version "
                                                        "(repeat for several)."),
           address: Optional[str] = ServeAddressOpt) -> None:
    """A sweep's report as one self-contained HTML file: learning curves, parameters against the metric,
    the scheduler's decisions, model families, the winner and its test metrics. With --live, a served
    model's drift over its live window instead."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no store set-up chatter in the output
    if not live:
        if versions or address:
            raise RaylineError(f"{'--version' if versions else '--address'}: only with --live (got a sweep "
                               f"report of {target!r}; allowed: --live NAME --version N)")
        from rayline.report import open_store, write_report

        result = write_report(open_store(open_workspace(workspace)), target, output)
        sweep = result.sweep
        console.print(f"wrote {result.path} ({result.bytes / 1e6:.1f} MB, {result.seconds:.1f} s): sweep of "
                      f"{sweep.name}, run {sweep.run_id}, {len(sweep.trials)} trials, "
                      f"winner {sweep.winner.trial_id if sweep.winner else '-'}")
        return
    path, summaries = write_live_report(open_workspace(workspace), target, versions, output, address)
    for s in summaries:
        console.print(f"{target} v{s['version']}: {s['status']}, {s['window_rows']:,} rows in the live window"
                      + (f"; flagged: {', '.join(s['flagged'])}" if s["flagged"] else ""), soft_wrap=True)
    console.print(f"wrote {path}")


def write_live_report(ws, model: str, versions: Optional[list[str]], output: Optional[Path],
                      address: Optional[str] = None) -> tuple[Path, list[dict]]:
    """`rayline report NAME --live`: the page of the model's live windows, joined from the cluster
    that serves it; (where it was written, a summary per version)."""
    import time

    from rayline.monitoring.report import live_report_html
    from rayline.report import make_reports_dir
    from rayline.report.page import write_html
    from rayline.serve.status import connect_existing

    if output is not None and not output.parent.is_dir():  # before joining the cluster, not after
        raise RaylineError(f"--output: no such directory {str(output.parent)!r} (got {str(output)!r})")
    conn = connect_existing(ws, address)
    try:
        text, summaries = live_report_html(model, [str(v) for v in versions] if versions else None)
    finally:
        conn.shutdown()
    path = output or Path(ws.root) / "reports" / f"{model}-live-{time.strftime('%Y%m%d-%H%M%S')}.html"
    if output is None:
        make_reports_dir(path)
    write_html(text, path)
    return path, summaries
