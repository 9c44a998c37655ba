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
from typer.core import TyperGroup

from rayline.console import console, err_console, styled
from rayline.errors import RaylineError, SpecError

# Seconds between two lines of a long phase's progress in plain logs (a terminal shows every one).
TICK_LINE_S = 5.0

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
cache_app = typer.Typer(help="The workspace's data cache: data stages kept to be read back, not recomputed.",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")
jobs_app = typer.Typer(help="Ray Jobs on a cluster, through its Jobs API (the dashboard's address).", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


class _ListByDefault(TyperGroup):
    """A group whose `list` command is also its default: `rayline models [NAME] [-o json]` is
    `rayline models list [NAME] [-o json]`, as it was before `models` had subcommands, and
    `rayline models show NAME` runs `show`. The first argument that is not an option (nor an
    option's value) picks the command, so `rayline models -w WS show NAME` works too; a model
    named like a command is listed with `rayline models list NAME`."""

    default = "list"

    def parse_args(self, ctx, args):
        first = self._first_positional(args)
        if first is not None and args[first] in self.commands:
            args = [args[first], *args[:first], *args[first + 1:]]
        elif args != ["--help"]:
            args = [self.default, *args]
        return super().parse_args(ctx, args)

    def _first_positional(self, args) -> Optional[int]:
        takes_value = {opt for cmd in self.commands.values() for p in cmd.params
                       if p.param_type_name == "option" and not p.is_flag for opt in p.opts}
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                return None  # what follows is a NAME, whatever it reads
            if not arg.startswith("-") or arg == "-":
                return i
            i += 2 if arg in takes_value else 1
        return None


models_app = typer.Typer(
    cls=_ListByDefault,
    help="Registered models: `rayline models [NAME]` lists them with their versions and test metrics (the same as "
         "`rayline models list [NAME]`); `rayline models show NAME [--version N]` prints a version's lineage.")
app.add_typer(models_app, name="models")

WorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                            help="State directory (MLflow store, artifacts, runs), or an s3:// / gs:// URI for runs, "
                            "checkpoints and artifacts. Default ./.rayline.")


def _ws(path: Optional[Path]):
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
NoCacheOpt = typer.Option(False, "--no-cache", help="Recompute the data stage instead of reading it from the "
                          "workspace's data cache (`rayline cache list`); the result is stored anew.")
IngressOpt = typer.Option(None, "--ingress", help="Serve ingress of an embedded Ray: haproxy (default; "
                          "or RAYLINE_SERVE_INGRESS) or proxy (Ray's Python proxy).")


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
        from rayline.spec.pipeline_space import PipelineSpace

        families = PipelineSpace(spec).families if spec.tune else None
        what = " or ".join(f.label for f in families) if families else spec.model.framework
        console.print(styled(("✓", "green"), f" {path}: {spec.name} ({what}"
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
    address: Optional[str] = RunAddressOpt,
    workspace: Optional[Path] = WorkspaceOpt,
    host: str = ServeHostOpt,
    port: int = ServePortOpt,
    no_serve: bool = NoServeOpt,
    exit_after_deploy: bool = ExitAfterDeployOpt,
    verbose: bool = VerboseOpt,
    ingress: Optional[str] = IngressOpt,
    set_: List[str] = typer.Option([], "--set", metavar="PATH=VALUE",
                                   help="Override a spec key, e.g. --set train.epochs=2 --set tune.num_samples=2 (VALUE is YAML)."),
    no_cache: bool = NoCacheOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue this spec's newest interrupted run in the workspace "
                                "(Ctrl-C, or a driver that was killed; same spec and --set options): finished trials "
                                "are kept, the rest continue. See also `rayline resume RUN_ID`."),
) -> None:
    """Run every stage the spec names: data, train or tune, register, deploy."""
    import shlex

    from rayline.spec import load_spec, parse_set_options

    spec = load_spec(spec_path, overrides=parse_set_options(set_))
    # A read-only or unwritable workspace is one line now, not after Ray has started (the runner
    # asks again: it is the library's entry too).
    ws = _ws(workspace).ensure()
    from rayline.cluster import connect

    with console.status("connecting to Ray..."):
        conn = connect(ws, address, verbose=verbose, ingress=ingress)
    # Ctrl-C's message repeats this very command (same spec, workspace and --set options) with --resume.
    again = ["rayline", *sys.argv[1:]] + ([] if "--resume" in sys.argv else ["--resume"])
    _run_and_serve(conn, spec, ws, str(spec_path), not no_serve, host, port, exit_after_deploy,
                   resume=resume, resume_command=shlex.join(again), data_cache=not no_cache)


@app.command()
def resume(
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="The interrupted pipeline's MLflow run id "
                                 "(its interruption message names it)."),
    address: Optional[str] = RunAddressOpt,
    workspace: Optional[Path] = WorkspaceOpt,
    host: str = ServeHostOpt,
    port: int = ServePortOpt,
    no_serve: bool = NoServeOpt,
    exit_after_deploy: bool = ExitAfterDeployOpt,
    verbose: bool = VerboseOpt,
    ingress: Optional[str] = IngressOpt,
    no_cache: bool = NoCacheOpt,
    force: bool = typer.Option(False, "--force", help="Resume a run whose driver ran on another host (rayline cannot "
                               "check a pid there): only once you know that driver is gone. A driver alive on this "
                               "host is never overridden."),
) -> None:
    """Resume an interrupted run (Ctrl-C, a killed driver, a crash) by its MLflow run id, with the spec it
    recorded (no spec file needed): finished trials are kept, the rest continue from their checkpoints."""
    import shlex

    from rayline.runner import find_run
    from rayline.spec import parse_spec

    ws = _ws(workspace)
    record = find_run(ws, run_id, force)  # unknown, finished or still driven: one line, before Ray starts
    spec = parse_spec(record["spec_raw"], source=f"run {run_id}")
    from rayline.cluster import connect

    with console.status("connecting to Ray..."):
        conn = connect(ws, address, verbose=verbose, ingress=ingress)
    _run_and_serve(conn, spec, ws, record.get("spec_path") or None, not no_serve, host, port, exit_after_deploy,
                   resume=run_id, resume_command=shlex.join(["rayline", *sys.argv[1:]]), resume_force=force,
                   data_cache=not no_cache)


def _run_and_serve(conn, spec, ws, spec_path, deploy, host, port, exit_after_deploy, **options) -> None:
    """Run the pipeline, print its summary, and with an embedded Ray serve until Ctrl-C; Ray is let go after."""
    try:
        summary = _run_with_progress(spec, ws, spec_path, deploy, host, port, **options)
        _print_summary(summary, spec)
        if summary.endpoint and conn.embedded and not exit_after_deploy:
            console.print(styled("\nServing ", (summary.endpoint, "bold"), " from an embedded Ray. Press Ctrl-C to stop."))
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt as exc:
                from rayline.signals import Terminated
                from rayline.spec import ServeSpec

                drain = (spec.serve or ServeSpec()).drain_timeout_s
                console.print(f"{'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'}: stopping {summary.endpoint} "
                              f"(in-flight requests get up to {drain:g} s, serve.drain_timeout_s), then Serve and Ray")
        elif summary.endpoint and not conn.embedded:
            console.print(f"\nThe endpoint stays up on the cluster at {conn.address}.")
    finally:
        conn.shutdown()


def _run_with_progress(spec, ws, spec_path, deploy, host, port, **options):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from rayline.runner import run_pipeline

    stages = ["data", "train", "register"] + (["deploy"] if deploy and spec.serve else [])
    if not console.is_terminal:
        # Not a terminal (a Ray job's driver, CI, a pipe): rich's live display would print only its
        # final frame, when the run is over, so `rayline jobs logs --follow` showed nothing for
        # minutes. One plain line per stage event instead, as it happens.
        started: dict[str, float] = {}
        ticked: dict[str, float] = {}

        def on_line(stage: str, event: str, detail: str = "") -> None:
            if stage not in stages:
                return
            detail = _shown(detail)
            if event == "tick":  # rows so far in a long phase: a line every TICK_LINE_S in logs
                now = time.monotonic()
                if now - ticked.get(stage, started.get(stage, now)) >= TICK_LINE_S:
                    ticked[stage] = now
                    console.print(f"{stage}: {detail}")
                return
            if event == "start":
                started[stage] = time.monotonic()
                console.print(f"{stage}: started {detail}".rstrip())
            elif event == "progress":
                console.print(f"{stage}: {detail}")
            else:
                took = time.monotonic() - started.get(stage, time.monotonic())
                console.print(f"{stage}: done in {took:.1f} s: {detail}".rstrip(": "))

        return run_pipeline(spec, ws, spec_path=spec_path, deploy=deploy, host=host, port=port, on_stage=on_line, **options)
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
            elif event in ("progress", "tick"):
                progress.update(task, description=f"{stage}: {detail}")
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
        families = len({t.family for t in summary.trials}) > 1
        trials.add_column("trial")
        if families:
            trials.add_column("family")
        trials.add_column("overrides")
        trials.add_column(summary.metric, justify="right")
        trials.add_column("epochs", justify="right")
        trials.add_column("status")
        for t in summary.trials:
            score = t.result.metrics.get(summary.metric) if t.result else None
            # A family's whole `model` mapping is in its own column, not repeated in the overrides.
            shown = {k: v for k, v in t.overrides.items() if not (families and k == "model")}
            trials.add_row(t.trial_id, *([t.family or "-"] if families else []), json.dumps(shown),
                           f"{score:.4f}" if score is not None else "-",
                           str(len(t.result.history)) if t.result else "-", t.status)
        console.print(trials)
    if summary.leaderboard:
        board = Table(title="model families (best trial of each)", show_header=True)
        for column, justify in (("family", "left"), (summary.metric, "right"), ("trial", "left"), ("trials", "right")):
            board.add_column(column, justify=justify)
        for row in summary.leaderboard:
            board.add_row(row.family, f"{row.value:.4f}", row.trial_id, str(row.trials))
        console.print(board)
    if summary.data_variants > 1:
        console.print(f"data stage: {summary.data_variants} preprocessing variants, prepared once each and shared by the trials")
    if summary.throughput:
        total, per_worker = summary.throughput
        console.print(f"training throughput: {total:,.0f} samples/s ({per_worker:,.0f} per worker), mean over the "
                      f"{'winning trial' if len(summary.trials) > 1 else 'run'}'s epochs")
    if summary.tensorboard:
        from rayline.event_files import tensorboard_command

        console.print(f"TensorBoard (metrics, throughput, learning rate per epoch): {tensorboard_command(summary.tensorboard)}")
    console.print(styled("registered: model ", (summary.name, "bold"), " version ", (str(summary.version), "bold"),
                         f" (MLflow run {summary.run_id})"))
    if getattr(summary, "report", None):
        console.print(f"sweep report: {summary.report} (also in the MLflow run's artifacts)")
    if summary.resumed_run:
        console.print(f"resumed the interrupted run {summary.resumed_run}"
                      + (f": training continued from the checkpoints of epochs {summary.resumed_from}"
                         if summary.resumed_from else ""))
    elif summary.resumed_from and _pbt(spec):
        # PBT pauses trials and restarts them from a checkpoint (their own, or a better trial's):
        # those restarts are in the winner's record beside any worker failure's.
        console.print(f"restarts (PBT pauses and exploits, or worker failures): the winner's training continued "
                      f"from the checkpoints of epochs {summary.resumed_from}")
    elif summary.resumed_from:
        console.print(f"worker failures: training restarted from the checkpoints of epochs {summary.resumed_from}")
    if summary.endpoint:
        example = _example_instance(spec)
        body = json.dumps({"instances": [example]})
        console.print(styled("endpoint: ", (summary.endpoint, "bold"), f"  (docs: {summary.endpoint}/docs)"))
        console.print("try:")
        print(f"  curl -s -X POST {summary.endpoint}/predict -H 'Content-Type: application/json' -d '{body}'")


def _pbt(spec) -> bool:
    scheduler = spec.tune.scheduler if spec is not None and spec.tune is not None else None
    return scheduler is not None and scheduler == "pbt"


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
    target: str = typer.Argument(..., metavar="ROUTE_OR_URL_OR_NAME", help="A /route on this machine's Serve or an "
                                 "http(s):// URL: query the served model online. A registered model NAME (no leading "
                                 "/): score --input offline (in this process, or with Ray Data on a cluster: --engine) into "
                                 "--output FILE.parquet."),
    json_body: Optional[str] = typer.Option(None, "--json", help='Instances as JSON: \'{"instances": [...]}\' or a list of rows.'),
    input_file: Optional[Path] = typer.Option(None, "--input", help="Rows from a file in any format training reads: .csv, .parquet/.pq, "
                                              ".json (an array of rows, or JSON Lines), .jsonl/.ndjson; offline also a "
                                              "directory of such files."),
    probabilities: bool = typer.Option(False, "--probabilities", help="Also return class probabilities."),
    output: str = typer.Option("table", "--output", "-o", help="table | json: print the answer; any other value is a file "
                               "to write the predictions to (online: .parquet, .csv, .json/.jsonl; offline: .parquet)."),
    version: Optional[str] = typer.Option(None, "--version", help="With a NAME: the registered version (default: the champion alias, else the newest). "
                                          "With a route or URL: ask that deployed version (ROUTE/v/N)."),
    keep: Optional[List[str]] = typer.Option(None, "--keep", help="Input column copied into an output file, e.g. an id "
                                             "(repeat for several; default: every input column)."),
    workspace: Optional[Path] = WorkspaceOpt,
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="RAYLINE_API_KEY", show_envvar=True,
                                          help="API key of a model served with serve.auth (sent as a Bearer token)."),
    host: str = typer.Option("127.0.0.1", help="Serve host when ROUTE_OR_URL is a route."),
    port: int = typer.Option(8000, help="Serve port when ROUTE_OR_URL is a route."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for each request to the endpoint."),
    retries: int = typer.Option(3, "--retries", min=0, help="Retries on 429 (after Retry-After), 502, 503, 504 and "
                                "connection failures, with exponential backoff and jitter."),
    engine: str = typer.Option("auto", "--engine", help="Offline scoring only: local (in this process), ray (Ray "
                               "Data on the cluster, or on an embedded Ray), or auto: ray when a cluster is configured "
                               "(RAY_ADDRESS or a `rayline cluster up` head) or the input is not local Parquet or CSV, "
                               "else local."),
) -> None:
    """Predictions from a served model (ROUTE or URL), or offline batch scoring of a dataset (NAME).

    Online, with a /route or URL: `rayline predict /digits --input rows.csv` prints a table; `-o json` prints the answer; `-o out.parquet` writes a file.

    Offline, with a registered model NAME: `rayline predict digits --input data.parquet --output scores.parquet` scores every row in bounded memory, rows in input order (in this process, or with Ray Data on a cluster: --engine).
    """
    online = target.startswith(("/", "http://", "https://"))
    to_file = output not in ("table", "json")
    if online and engine != "auto":
        raise RaylineError(f"--engine: applies to offline scoring of a registered model NAME (got --engine {engine} "
                           f"with {target}; allowed: leave it out when querying a served model)")
    if not online:
        _score_offline(target, json_body, input_file, output, to_file, version, keep, workspace, probabilities, engine)
        return
    from rayline.client import Client
    from rayline.serve.client import load_instances, prediction_rows

    if to_file and Path(output).suffix.lower() not in _ONLINE_WRITERS:
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json, or a file ending in "
                           f"{', '.join(_ONLINE_WRITERS)})")
    instances = load_instances(json_body, input_file)
    url = target if target.startswith(("http://", "https://")) else f"http://{host}:{port}{target}"
    url = url.rstrip("/")
    url = url[: -len("/predict")] if url.endswith("/predict") else url
    if version is not None:
        url = f"{url}/v/{version}"
    if to_file:
        _write_online(url, api_key, timeout, retries, instances, probabilities, keep, Path(output))
        return
    with Client(url, api_key=api_key, timeout=timeout, max_retries=retries) as client:
        result = client.predict_raw(instances, probabilities)
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


_ONLINE_WRITERS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}


def _write_online(url, api_key, timeout, retries, instances, probabilities, keep, path: Path) -> None:
    """The served model's predictions for `instances` (beside the kept input columns) written to `path`."""
    import pandas as pd

    from rayline.client import Client

    kind = _ONLINE_WRITERS[path.suffix.lower()]
    if not path.parent.is_dir():
        raise RaylineError(f"--output: no such directory {str(path.parent)!r} (got {str(path)!r})")
    inputs = pd.DataFrame(instances)
    absent = [k for k in (keep or []) if k not in inputs.columns]
    if absent:
        raise RaylineError(f"--keep: no such input column {', '.join(map(repr, absent))} "
                           f"(allowed: {', '.join(map(str, inputs.columns[:20]))})")
    with Client(url, api_key=api_key, timeout=timeout, max_retries=retries) as client:
        # Only the model's features are sent: other input columns (an id) are kept in the file, not refused.
        features = [f.get("name") for f in client.metadata().get("features") or [] if isinstance(f, dict)]
        sent = [{k: row[k] for k in features if k in row} for row in instances] if features else instances
        predicted = client.predict(sent, probabilities)
        answered = client.version
    kept = inputs[list(dict.fromkeys(keep))] if keep else inputs.drop(columns=[c for c in predicted.columns if c in inputs.columns])
    frame = pd.concat([kept.reset_index(drop=True), predicted.reset_index(drop=True)], axis=1)
    from rayline.files import atomic_path

    with atomic_path(path) as tmp:
        if kind == "parquet":
            frame.to_parquet(tmp, index=False)
        elif kind == "csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_json(tmp, orient="records", lines=True)
    console.print(f"wrote {len(frame):,} predictions to {path} (version {answered or '?'} answered)")


def _score_offline(name, json_body, input_file, output, to_file, version, keep, workspace, probabilities,
                   engine="auto") -> None:
    """`rayline predict NAME --input DATA --output FILE.parquet`: batch scoring (rayline/batch.py)."""
    if json_body is not None or input_file is None or not to_file:
        got = "--json" if json_body is not None else "no --input" if input_file is None else f"--output {output}"
        raise RaylineError(f"{name}: a registered model name scores a dataset offline: give --input DATA and "
                           f"--output FILE.parquet (got {got}); to query the served model, give its route "
                           f"/{name} or a URL")
    from rayline.batch import score

    with _progress_reporter() as report:
        result = score(name, str(input_file), output, version=version, workspace=_ws(workspace),
                       probabilities=probabilities, keep=keep, progress=report, engine=engine)
    where = "in this process" if result.engine == "local" else "on Ray"
    console.print(f"wrote {result.rows:,} rows to {result.output} (model {result.model} v{result.version}, {where}; "
                  f"{result.seconds:.1f} s, {result.rows_per_s:,.0f} rows/s)")


class _progress_reporter:
    """A rich progress bar on a terminal; otherwise a plain line at most every 5 s (logs, CI)."""

    def __enter__(self):
        self.bar = None
        self.task = None
        self.last = 0.0
        self.pending = None  # (rows, total) not printed yet
        if err_console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                                TimeElapsedColumn(), console=err_console, transient=True)
            self.bar.start()
        return self

    def __call__(self, rows: int, total) -> None:
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task("scoring", total=total)
            self.bar.update(self.task, completed=rows, total=total)
            return
        now = time.monotonic()
        self.pending = (rows, total)
        if now - self.last >= 5.0 or (total and rows >= total):
            self._line()

    def _line(self) -> None:
        rows, total = self.pending
        self.last, self.pending = time.monotonic(), None
        of = f" of {total:,}" if total else ""
        err_console.print(f"scored {rows:,}{of} rows")

    def __exit__(self, exc_type, *exc):
        if self.bar is not None:
            self.bar.stop()
        elif exc_type is None and self.pending is not None:
            self._line()  # the last count, whenever the run ends between two lines


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


@models_app.command("show")
def models_show(name: str = typer.Argument(..., help="A registered model name."),
                version: Optional[str] = typer.Option(None, "--version", help="The version (default: the newest)."),
                workspace: Optional[Path] = WorkspaceOpt,
                output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """A version's lineage: the data (source, fingerprint, data cache entry), the pipeline run, the winning
    trial and its checkpoint, the version's metrics, and the deployments that gave it traffic."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no store set-up chatter in the output
    from rayline.lineage import lineage, lineage_lines

    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    item = lineage(_ws(workspace), name, version)
    if output == "json":
        print(json.dumps(item.to_dict(), indent=2, default=str))
        return
    for line in lineage_lines(item):
        console.print(line)


@app.command()
def report(target: str = typer.Argument(..., metavar="RUN_ID|NAME", help="The MLflow run id `rayline run` printed "
                                        "(a trial's run id names its sweep), or a pipeline name: its newest run with "
                                        "tuning trials."),
           workspace: Optional[Path] = WorkspaceOpt,
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default: "
                                                 "<workspace>/reports/<name>-<run id>.html).")) -> None:
    """A sweep's report as one self-contained HTML file: learning curves, parameters against the metric,
    the scheduler's decisions, model families, the winner and its test metrics."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no store set-up chatter in the output
    from rayline.report import open_store, write_report

    result = write_report(open_store(_ws(workspace)), target, output)
    sweep = result.sweep
    console.print(f"wrote {result.path} ({result.bytes / 1e6:.1f} MB, {result.seconds:.1f} s): sweep of "
                  f"{sweep.name}, run {sweep.run_id}, {len(sweep.trials)} trials, "
                  f"winner {sweep.winner.trial_id if sweep.winner else '-'}")


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
            console.print(_rollout_line(a.name, a.rollout), soft_wrap=True)
    if report.metrics_note:
        console.print(styled((report.metrics_note, "yellow")))


def _rollout_line(name: str, rollout: dict) -> str:
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


ServeAddressOpt = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, a head from "
                                "`rayline cluster up`, else the Ray running on this machine).")


def _rollout(workspace: Optional[Path], address: Optional[str], action) -> None:
    """Connect the way `serve status` does, run one rollout action, print its one line."""
    from rayline.serve.status import connect_existing

    ws = _ws(workspace)
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
    address: Optional[str] = ServeAddressOpt,
    workspace: Optional[Path] = WorkspaceOpt,
    host: str = typer.Option("127.0.0.1", help="HTTP host for Ray Serve, if it is not running yet."),
    port: int = typer.Option(8000, help="HTTP port for Ray Serve, if it is not running yet."),
) -> None:
    """Deploy a registered version: the new champion, or a canary beside it (--canary PERCENT)."""
    from pydantic import ValidationError

    from rayline.serve import versions
    from rayline.spec.models import CanarySpec

    limits = {"max_error_rate": max_error_rate, "max_p99_ms": max_p99_ms, "min_requests": min_requests}
    given = [f"--{k.replace('_', '-')}" for k, v in limits.items() if v is not None]
    if given and canary is None:
        raise RaylineError(f"{given[0]}: only with --canary (got {' '.join(given)} without --canary; allowed: "
                           f"--canary PERCENT {' '.join(given)})")
    gate = None
    if canary is not None:
        versions._percent(canary)
        try:
            spec = CanarySpec.model_validate({"percent": canary, **{k: v for k, v in limits.items() if v is not None}})
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]).replace("_", "-")
            raise RaylineError(f"--{field}: {error['msg']} (got {error.get('input')})") from exc
        if min_requests is not None and spec.gate() is None:
            raise RaylineError(f"--min-requests: only with --max-error-rate or --max-p99-ms (got --min-requests {min_requests})")
        gate = spec.gate()
    _rollout(workspace, address, lambda ws: versions.deploy(name, version, ws=ws, canary_percent=canary, gate=gate,
                                                            host=host, port=port).message)


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

    config, notes = export_config(_ws(workspace), name, version, cluster_workspace=cluster_workspace, host=host,
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


JobsAddressOpt = typer.Option(None, "--address", help="The cluster's Jobs API, http://HEAD:8265 (default: "
                              "RAY_API_SERVER_ADDRESS, RAY_ADDRESS if an http(s) URL, else the head of `rayline cluster up`).")
HeadWorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                                help="Workspace where `rayline cluster up` recorded its head (used without --address).")
JobWorkspaceOpt = typer.Option(None, "--workspace", "-w", envvar="RAYLINE_WORKSPACE",
                               help="The job's workspace on the cluster: an absolute path its nodes share or an "
                               "s3:// / gs:// URI (default: a `rayline cluster up` head's own; else RAYLINE_WORKSPACE "
                               "of the cluster's nodes, else ~/.rayline on the driver's node).")


def _local_ws_for(workspace: Optional[str]):
    """The local workspace where `rayline cluster up` records its head (None for a URI)."""
    return None if workspace and "://" in workspace else _ws(Path(workspace) if workspace else None)


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
    line = f"job {job_id} {status}" + (f": {_shown(message[0])}" if code and message else "")
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
    console.print(f"  runs:    {_shown(submission.entrypoint)}")
    console.print(f"  workspace on the cluster: {_shown(submission.workspace)}")
    console.print(f"  dashboard: {url}/#/jobs/{job_id}")
    where = "" if source.startswith("the head of") else f" --address {url}"
    if not follow:
        console.print(f"  follow:  rayline jobs logs {job_id} --follow{where}")
        console.print(f"  stop:    rayline jobs stop {job_id}{where}")
        return
    _follow_job(client, job_id)


def _when(ms) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _duration_s(text: str) -> float:
    """'30m', '12h', '7d' or '90s' -> seconds; SpecError naming the option otherwise."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not match:
        raise SpecError([f"--older-than: not a duration (got {text!r}; allowed: a number and a unit s, m, h or d, "
                         "e.g. 12h or 7d)"])
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


@cache_app.command("list")
def cache_list(workspace: Optional[Path] = WorkspaceOpt,
               output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """The data cache's entries, oldest first: key, pipeline, source, rows, size, last used; and their total size."""
    from rayline.data.cache import DataCache

    if output not in ("table", "json"):
        raise SpecError([f"--output: unknown format (got {output!r}; allowed: table, json)"])
    ws = _ws(workspace)
    cache = DataCache.of(ws)
    entries = cache.entries()
    rows = []
    for entry in entries:
        meta = entry.meta
        rows.append({"key": entry.key, "pipeline": meta.get("pipeline", "?"), "source": str(meta.get("source", "?")),
                     "rows": sum((meta.get("rows") or {}).values()), "bytes": entry.bytes,
                     "created": _when(entry.created * 1000), "last_used": _when(entry.last_used * 1000),
                     "broken": bool(meta.get("broken"))})
    total = sum(r["bytes"] for r in rows)
    if output == "json":
        print(json.dumps({"root": str(cache.root), "entries": rows, "bytes": total}, indent=1))
        return
    table = Table(title=f"data cache {cache.root}", show_header=True)
    for col in ("key", "pipeline", "source", "rows", "size", "created", "last used"):
        table.add_column(col, justify="right" if col in ("rows", "size") else "left")
    for r in rows:
        table.add_row(r["key"] + (" (broken)" if r["broken"] else ""), r["pipeline"], r["source"], f"{r['rows']:,}",
                      _mib(r["bytes"]), r["created"], r["last_used"])
    console.print(table)
    console.print(f"{len(rows)} entries, {_mib(total)} in all; `rayline cache prune --older-than 7d` removes "
                  "entries not used for a week")


@cache_app.command("prune")
def cache_prune(workspace: Optional[Path] = WorkspaceOpt,
                older_than: Optional[str] = typer.Option(None, "--older-than", help="Remove entries last used longer "
                                                         "ago than this (30m, 12h, 7d); without it, every entry."),
                ) -> None:
    """Remove data cache entries (all, or those not used for a while); runs that need them recompute them."""
    from rayline.data.cache import DataCache

    seconds = _duration_s(older_than) if older_than is not None else None
    ws = _ws(workspace)
    cache = DataCache.of(ws)
    sizes = {e.key: e.bytes for e in cache.entries()}  # before: removed entries have no size after
    removed = cache.prune(seconds)
    left = cache.entries()
    console.print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} "
                  f"({_mib(sum(sizes.get(e.key, 0) for e in removed))}); {len(left)} left, "
                  f"{_mib(sum(sizes.get(e.key, 0) for e in left))}")


@jobs_app.command("list")
def jobs_list(address: Optional[str] = JobsAddressOpt, workspace: Optional[str] = HeadWorkspaceOpt,
              output: str = typer.Option("table", "--output", "-o", help="table | json")) -> None:
    """Jobs on the cluster, newest first: id, status, pipeline, start and end."""
    if output not in ("table", "json"):
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json)")
    client, _ = _jobs_client(address, workspace)
    jobs = sorted(client.list(), key=lambda j: j.start_time or 0, reverse=True)
    rows = [{"job": j.submission_id or j.job_id, "status": str(getattr(j.status, "value", j.status)),
             "pipeline": (j.metadata or {}).get("rayline_spec", ""), "start": _when(j.start_time), "end": _when(j.end_time),
             "entrypoint": _shown(j.entrypoint or "")} for j in jobs]
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
        console.print(f"message:    {_shown(message[0])}")
    if getattr(info, "driver_exit_code", None) is not None:
        console.print(f"exit code:  {info.driver_exit_code}")
    console.print(f"started:    {_when(info.start_time)}\nended:      {_when(info.end_time)}\n"
                  f"entrypoint: {_shown(info.entrypoint or '')}\ndashboard:  {client.url}/#/jobs/{info.submission_id or job}")


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


def _environment_fault(exc: RaylineError) -> str | None:
    """The one-line environment message (rayline.faults) for a fault anywhere in a rayline error's
    chain: a TrainingError raised from a worker lost with its node or a full disk says that and what
    to do, not "training failed: <Ray's text>". An EnvironmentFault already is that line; an
    interrupted run is the user's doing."""
    from rayline.errors import EnvironmentFault, InterruptedRun

    if isinstance(exc, (EnvironmentFault, InterruptedRun)):
        return None
    from rayline.faults import describe_fault

    return describe_fault(exc)


def main() -> None:
    from rayline.signals import stop_on_sigterm

    stop_on_sigterm()  # SIGTERM (docker stop, Kubernetes, `ray job stop`) stops every command as Ctrl-C does
    try:
        app()
    except RaylineError as exc:
        if _debug():
            _print_chain(exc)
        fault = _environment_fault(exc)
        if fault is not None:
            from rayline.errors import EnvironmentFault

            err_console.print(styled(("error:", "red"), " " + _shown(fault)))
            sys.exit(EnvironmentFault.exit_code)
        err_console.print(styled(("error:", "red"), " " + _shown(str(exc))))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        if _debug():
            _print_chain(exc)
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug in rayline or a library it calls: one line, the chain on request
        from rayline.faults import describe_fault

        fault = describe_fault(exc)
        if fault is not None:  # the machine or the cluster failed, not rayline: what happened, what to do
            if _debug():
                _print_chain(exc)
            err_console.print(styled(("error:", "red"), " " + _shown(fault)))
            sys.exit(1)
        if _debug():
            _print_chain(exc)
            err_console.print(styled(("internal error:", "red"), _shown(f" {type(exc).__name__}: {exc}")))
        else:
            err_console.print(styled(("internal error:", "red"), _shown(f" {type(exc).__name__}: {exc}"),
                                     " (set RAYLINE_DEBUG=1 for the traceback, and please report it)"))
        sys.exit(1)


if __name__ == "__main__":
    main()
