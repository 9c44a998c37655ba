"""The `rayline` command: parse, load the spec, call one library function, render.

Heavy imports (Ray, MLflow, frameworks) happen inside commands, so `rayline --help` is fast.
Every `RaylineError` is printed as a message with its exit code; never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from rayline.console import console, err_console, styled
from rayline.errors import RaylineError, SpecError

__all__ = ["app", "main"]

app = typer.Typer(
    name="rayline",
    help="One YAML spec to a served model: Ray Data -> Ray Train -> Ray Tune -> MLflow -> Ray Serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
cluster_app = typer.Typer(help="A local Ray head on this machine that outlives the CLI.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
serve_app = typer.Typer(help="Models served by Ray Serve on the connected cluster.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")

WorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                            help="State directory (MLflow store, artifacts, runs). Default ./.rayline.")


def _ws(path: Optional[Path]):
    from rayline.workspace import workspace

    return workspace(path)


@app.command()
def validate(specs: List[Path] = typer.Argument(..., help="Pipeline spec files.")) -> None:
    """Check specs (keys, types, values, search-space paths, data columns) without running anything."""
    from rayline.spec import load_spec

    failed = 0
    for path in specs:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            failed += 1
            err_console.print(styled(("✗", "red"), f" {exc}"))
            continue
        console.print(styled(("✓", "green"), f" {path}: {spec.name} ({spec.model.framework}"
                             f"{', tune ' + str(spec.tune.num_samples) + ' trials' if spec.tune else ''}"
                             f"{', served at ' + spec.route if spec.serve else ''})"))
    if failed:
        raise typer.Exit(2)


@app.command()
def schema() -> None:
    """Print the pipeline spec's JSON Schema (for editor completion)."""
    from rayline.spec import spec_json_schema

    print(json.dumps(spec_json_schema(), indent=2))


@app.command()
def run(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Pipeline spec file."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, "
                                          "a head from `rayline cluster up`, else an embedded Ray)."),
    workspace: Optional[Path] = WorkspaceOpt,
    host: str = typer.Option("127.0.0.1", help="HTTP host for Ray Serve."),
    port: int = typer.Option(8000, help="HTTP port for Ray Serve."),
    no_serve: bool = typer.Option(False, "--no-serve", help="Train and register only."),
    exit_after_deploy: bool = typer.Option(False, "--exit-after-deploy",
                                           help="With an embedded Ray, stop after deploying instead of serving until Ctrl-C."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Ray's own logs."),
    ingress: Optional[str] = typer.Option(None, "--ingress", help="Serve ingress of an embedded Ray: haproxy (default; "
                                          "or RAYLINE_SERVE_INGRESS) or proxy (Ray's Python proxy)."),
    set_: List[str] = typer.Option([], "--set", metavar="PATH=VALUE",
                                   help="Override a spec key, e.g. --set train.epochs=2 --set tune.num_samples=2 (VALUE is YAML)."),
    resume: bool = typer.Option(False, "--resume", help="Continue this spec's newest interrupted run in the workspace "
                                "(same spec and --set options): finished trials are kept, the rest continue."),
) -> None:
    """Run every stage the spec names: data, train or tune, register, deploy."""
    import shlex

    from rayline.spec import load_spec, parse_set_options

    spec = load_spec(spec_path, overrides=parse_set_options(set_))
    ws = _ws(workspace)
    from rayline.cluster import connect

    with console.status("connecting to Ray..."):
        conn = connect(ws, address, verbose=verbose, ingress=ingress)
    try:
        # Ctrl-C's message repeats this very command (same spec, workspace and --set options) with --resume.
        again = ["rayline", *sys.argv[1:]] + ([] if "--resume" in sys.argv else ["--resume"])
        summary = _run_with_progress(spec, ws, str(spec_path), not no_serve, host, port,
                                     resume=resume, resume_command=shlex.join(again))
        _print_summary(summary, spec)
        if summary.endpoint and conn.embedded and not exit_after_deploy:
            console.print(styled("\nServing ", (summary.endpoint, "bold"), " from an embedded Ray. Press Ctrl-C to stop."))
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                console.print("stopping...")
        elif summary.endpoint and not conn.embedded:
            console.print(f"\nThe endpoint stays up on the cluster at {conn.address}.")
    finally:
        conn.shutdown()


def _run_with_progress(spec, ws, spec_path, deploy, host, port, **options):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from rayline.runner import run_pipeline

    stages = ["data", "train", "register"] + (["deploy"] if deploy and spec.serve else [])
    # markup=False: stage details hold user text (spec names, paths, routes) printed as written.
    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                  console=console) as progress:
        tasks = {s: progress.add_task(s, total=1, start=False) for s in stages}

        def on_stage(stage: str, event: str, detail: str = "") -> None:
            task = tasks.get(stage)
            if task is None:
                return
            detail = _shown(detail)  # data paths may be presigned URLs or carry user:token@
            if event == "start":
                progress.start_task(task)
                progress.update(task, description=f"{stage} {detail}")
            else:
                progress.update(task, completed=1, description=f"✓ {stage} {detail}")
                progress.stop_task(task)

        return run_pipeline(spec, ws, spec_path=spec_path, deploy=deploy, host=host, port=port, on_stage=on_stage, **options)


def _print_summary(summary, spec) -> None:
    table = Table(title=f"{summary.name} v{summary.version} ({summary.task})", show_header=True)
    table.add_column("metric")
    table.add_column("valid (best epoch)", justify="right")
    table.add_column("test", justify="right")
    for key in sorted(summary.test_metrics):
        valid = summary.valid_metrics.get(key)
        table.add_row(key + (" *" if key == summary.metric else ""), f"{valid:.4f}" if valid is not None else "",
                      f"{summary.test_metrics[key]:.4f}")
    console.print(table)
    if len(summary.trials) > 1:
        trials = Table(title="trials", show_header=True)
        trials.add_column("trial")
        trials.add_column("overrides")
        trials.add_column(summary.metric, justify="right")
        trials.add_column("epochs", justify="right")
        trials.add_column("status")
        for t in summary.trials:
            score = t.result.metrics.get(summary.metric) if t.result else None
            trials.add_row(t.trial_id, json.dumps(t.overrides), f"{score:.4f}" if score is not None else "-",
                           str(len(t.result.history)) if t.result else "-", t.status)
        console.print(trials)
    console.print(styled("registered: model ", (summary.name, "bold"), " version ", (str(summary.version), "bold"),
                         f" (MLflow run {summary.run_id})"))
    if summary.resumed_run:
        console.print(f"resumed the interrupted run {summary.resumed_run}"
                      + (f": training continued from the checkpoints of epochs {summary.resumed_from}"
                         if summary.resumed_from else ""))
    elif summary.resumed_from:
        console.print(f"worker failures: training restarted from the checkpoints of epochs {summary.resumed_from}")
    if summary.endpoint:
        example = _example_instance(spec)
        body = json.dumps({"instances": [example]})
        console.print(styled("endpoint: ", (summary.endpoint, "bold"), f"  (docs: {summary.endpoint}/docs)"))
        console.print("try:")
        print(f"  curl -s -X POST {summary.endpoint}/predict -H 'Content-Type: application/json' -d '{body}'")


def _example_instance(spec) -> dict:
    """One real row of the spec's data, as a request instance."""
    try:
        from rayline.data.sources import sample_frame

        frame = sample_frame(spec.data.source)
        features = spec.data.features or [c for c in frame.columns if c != spec.data.label]
        row = frame[features].iloc[0].to_dict()
        return {k: (None if v != v else (v.item() if hasattr(v, "item") else v)) for k, v in row.items()}
    except Exception:
        return {}


@app.command()
def predict(
    target: str = typer.Argument(..., metavar="ROUTE_OR_URL", help="/route on this machine's Serve, or a full URL."),
    json_body: Optional[str] = typer.Option(None, "--json", help='Instances as JSON: \'{"instances": [...]}\' or a list of rows.'),
    input_file: Optional[Path] = typer.Option(None, "--input", help="Rows from a file in any format training reads: .csv, .parquet/.pq, "
                                              ".json (an array of rows, or JSON Lines), .jsonl/.ndjson."),
    probabilities: bool = typer.Option(False, "--probabilities", help="Also return class probabilities."),
    output: str = typer.Option("table", "--output", "-o", help="table | json"),
    host: str = typer.Option("127.0.0.1", help="Serve host when ROUTE_OR_URL is a route."),
    port: int = typer.Option(8000, help="Serve port when ROUTE_OR_URL is a route."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the endpoint."),
) -> None:
    """Send rows to a served model and show its predictions."""
    from rayline.serve.client import load_instances, post_predict, prediction_rows

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    instances = load_instances(json_body, input_file)
    url = target if target.startswith(("http://", "https://")) else f"http://{host}:{port}{target if target.startswith('/') else '/' + target}"
    result = post_predict(url, instances, probabilities, timeout)
    if output == "json":
        print(json.dumps(result, indent=2))
        return
    rows, with_probabilities = prediction_rows(result)
    table = Table(title=f"{result.get('model', '?')} v{result.get('version', '?')}")
    table.add_column("#", justify="right")
    table.add_column("prediction")
    if with_probabilities:
        table.add_column("probability", justify="right")
    for row in rows:
        table.add_row(*(row if with_probabilities else row[:2]))
    console.print(table)


@app.command()
def models(name: Optional[str] = typer.Argument(None, help="A model name; default: every model."),
           workspace: Optional[Path] = WorkspaceOpt,
           output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """Registered models, their versions and metrics."""
    # MLflow logs its store set-up at INFO ("Creating initial MLflow database tables...")
    # into the table's output; it reads this when first imported.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from rayline.redact import redact_uri
    from rayline.registry import Registry

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    versions = Registry(_ws(workspace)).list_models(name)
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
    from rayline.cluster import cluster_up as up
    from rayline.cluster import token_auth_on

    if host == "0.0.0.0" and not token_auth_on():
        err_console.print("warning: --host 0.0.0.0 opens the head's GCS, dashboard (its Jobs API runs any code) and "
                          "Ray Client ports to the network with Ray token auth off; anyone who reaches them controls "
                          "this machine. Turn it on first: `ray get-auth-token --generate` (or RAY_AUTH_MODE=token "
                          "with RAY_AUTH_TOKEN), then `rayline cluster up --host 0.0.0.0` again.", soft_wrap=True)
    info = up(_ws(workspace), port, num_cpus, dashboard_port, ingress=ingress, host=host, client_port=client_port)
    verb = "started" if info["started"] else "already running"
    where = "this machine only" if info.get("loopback", True) else f"{info.get('host')}, token auth {'on' if info.get('token_auth') else 'OFF'}"
    console.print(f"Ray head {verb} at {info['address']} (bound to {where}); `rayline run` will use it.", soft_wrap=True)
    if info.get("loopback"):  # Ray resolves 127.0.0.1 to the external address unless told (rayline/cluster.py)
        console.print(f"Ray's own clients (`ray status --address {info['address']}`, ray.init) reach it with "
                      "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 set.", soft_wrap=True)


@cluster_app.command("down")
def cluster_down(workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Stop the local Ray head started by `rayline cluster up` (and no other Ray on this machine)."""
    from rayline.cluster import cluster_down as down

    console.print("stopped the local Ray head" if down(_ws(workspace)) else "no local Ray head recorded")


@cluster_app.command("status")
def cluster_status(workspace: Optional[Path] = WorkspaceOpt) -> None:
    """Whether the local Ray head is up, and its resources."""
    from rayline.cluster import cluster_status as status

    info = status(_ws(workspace))
    if not info["alive"]:
        console.print("no local Ray head is running" + (f" (recorded {info['address']} is unreachable)" if info["address"] else ""))
        raise typer.Exit(1)
    console.print(f"Ray head at {info['address']}\n{info.get('detail', '')}")


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
    ws = _ws(workspace)
    conn = connect_existing(ws, address)
    try:
        report = gather_status(name)
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
    if report.metrics_note:
        console.print(styled((report.metrics_note, "yellow")))


def _debug() -> bool:
    """RAYLINE_DEBUG=1 (or true/yes): print the full exception chain before the one-line error."""
    return os.environ.get("RAYLINE_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _known_uris() -> list[str | None]:
    return [os.environ.get(k) for k in ("RAYLINE_TRACKING_URI", "MLFLOW_TRACKING_URI", "RAY_ADDRESS")]


def _shown(text: str) -> str:
    """Text from an exception as the terminal may show it: credentials in any URI masked."""
    from rayline.redact import redact_text

    return redact_text(text, *_known_uris())


def _print_chain(exc: BaseException) -> None:
    import traceback

    err_console.print(_shown("".join(traceback.format_exception(exc)).rstrip()))


def main() -> None:
    try:
        app()
    except RaylineError as exc:
        if _debug():
            _print_chain(exc)
        err_console.print(styled(("error:", "red"), " " + _shown(str(exc))))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        if _debug():
            _print_chain(exc)
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug in rayline or a library it calls: one line, the chain on request
        if _debug():
            _print_chain(exc)
            err_console.print(styled(("internal error:", "red"), _shown(f" {type(exc).__name__}: {exc}")))
        else:
            err_console.print(styled(("internal error:", "red"), _shown(f" {type(exc).__name__}: {exc}"),
                                     " (set RAYLINE_DEBUG=1 for the traceback, and please report it)"))
        sys.exit(1)


if __name__ == "__main__":
    main()
