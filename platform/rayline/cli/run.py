"""`rayline validate`, `schema`, `run` and `resume`: a pipeline run, its progress and its summary."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from rayline.cli.apps import app
from rayline.cli.options import (ExitAfterDeployOpt, IngressOpt, NoCacheOpt, NoServeOpt, RunAddressOpt, ServeHostOpt,
                                 ServePortOpt, TimingsOpt, VerboseOpt, WorkspaceOpt, open_workspace)
from rayline.cli.render import shown
from rayline.console import console, err_console, styled
from rayline.errors import SpecError


# Seconds between two lines of a long phase's progress in plain logs (a terminal shows every one).
TICK_LINE_S = 5.0


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
    timings: bool = TimingsOpt,
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
    ws = open_workspace(workspace).ensure()
    from rayline.cluster.connection import connect
    from rayline.train.preload import preload_framework

    startup, connecting = _started_s(), time.monotonic()
    preload_framework(spec.model.framework)  # its import while Ray connects and the data stage runs
    with console.status("connecting to Ray..."):
        conn = connect(ws, address, verbose=verbose, ingress=ingress)
    startup["ray_start"] = time.monotonic() - connecting
    # Ctrl-C's message repeats this very command (same spec, workspace and --set options) with --resume.
    again = ["rayline", *sys.argv[1:]] + ([] if "--resume" in sys.argv else ["--resume"])
    _run_and_serve(conn, spec, ws, str(spec_path), not no_serve, host, port, exit_after_deploy, timings,
                   resume=resume, resume_command=shlex.join(again), data_cache=not no_cache, startup=startup)


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
    timings: bool = TimingsOpt,
    force: bool = typer.Option(False, "--force", help="Resume a run whose driver ran on another host (rayline cannot "
                               "check a pid there): only once you know that driver is gone. A driver alive on this "
                               "host is never overridden."),
) -> None:
    """Resume an interrupted run (Ctrl-C, a killed driver, a crash) by its MLflow run id, with the spec it
    recorded (no spec file needed): finished trials are kept, the rest continue from their checkpoints."""
    import shlex

    from rayline.pipeline.record import find_run
    from rayline.spec import parse_spec

    ws = open_workspace(workspace)
    record = find_run(ws, run_id, force)  # unknown, finished or still driven: one line, before Ray starts
    spec = parse_spec(record["spec_raw"], source=f"run {run_id}")
    from rayline.cluster.connection import connect
    from rayline.train.preload import preload_framework

    startup, connecting = _started_s(), time.monotonic()
    preload_framework(spec.model.framework)
    with console.status("connecting to Ray..."):
        conn = connect(ws, address, verbose=verbose, ingress=ingress)
    startup["ray_start"] = time.monotonic() - connecting
    _run_and_serve(conn, spec, ws, record.get("spec_path") or None, not no_serve, host, port, exit_after_deploy, timings,
                   resume=run_id, resume_command=shlex.join(["rayline", *sys.argv[1:]]), resume_force=force,
                   data_cache=not no_cache, startup=startup)


# A process that began more than this long before `main` was started for something else (a test
# session, a notebook): the CLI's start is counted from `main` then, not from the process's start.
_OWN_PROCESS_S = 30.0


def _started_s() -> dict[str, float]:
    """{"cli_start": seconds from this command's start to now}: Python's and rayline's imports, the spec's
    checks; from the process's start when it was started for this command, else from `main`'s."""
    import psutil

    from rayline.cli import apps

    began, entered = psutil.Process().create_time(), apps.ENTERED_AT
    start = began if not entered or entered - began < _OWN_PROCESS_S else entered
    return {"cli_start": max(0.0, time.time() - start)}


def _run_and_serve(conn, spec, ws, spec_path, deploy, host, port, exit_after_deploy, timings=False, **options) -> None:
    """Run the pipeline, print its summary, and with an embedded Ray serve until Ctrl-C; Ray is let go after.
    `timings`: the run's phases printed at the end, Ray's stop included (always kept in its record)."""
    summary = None
    try:
        summary = _run_with_progress(spec, ws, spec_path, deploy, host, port, serve_early=conn.embedded, **options)
        print_summary(summary, spec)
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
        stopping = time.monotonic()
        conn.shutdown()
        if summary is not None:
            _record_ray_stop(summary, time.monotonic() - stopping, timings)


def _record_ray_stop(summary, seconds: float, show: bool) -> None:
    """Ray's stop joins the run's phases in its record (written after the summary: the run is over);
    `--timings` prints them all."""
    from rayline.pipeline.phases import format_phases
    from rayline.pipeline.record import RECORD_FILE, write_record
    from rayline.storage import join, read_json

    summary.phases["ray_stop"] = seconds
    summary.phases["total"] = sum(v for k, v in summary.phases.items() if k in (
        "cli_start", "ray_start", "data", "train", "register", "report", "deploy", "ray_stop"))
    if summary.record_folder:
        record = read_json(join(summary.record_folder, RECORD_FILE))
        if isinstance(record, dict):
            write_record(summary.record_folder, {**record, "phases": summary.phases})
    if show:
        table = Table(title="where the time went", show_header=True)
        table.add_column("phase")
        table.add_column("seconds", justify="right")
        for phase, shown_s in format_phases(summary.phases):
            table.add_row(phase, shown_s)
        console.print(table)
        if summary.phases.get("trials", 1) > 1:
            console.print(f"(a sweep of {summary.phases['trials']} trials: its train stage is one figure; "
                          "a single training run splits it)")


def _run_with_progress(spec, ws, spec_path, deploy, host, port, **options):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from rayline.pipeline.run import run_pipeline

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
            detail = shown(detail)
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
            detail = shown(detail)  # data paths may be presigned URLs or carry user:token@
            if event == "start":
                progress.start_task(task)
                progress.update(task, description=f"{stage} {detail}")
            elif event in ("progress", "tick"):
                progress.update(task, description=f"{stage}: {detail}")
            else:
                progress.update(task, completed=1, description=f"✓ {stage} {detail}")
                progress.stop_task(task)

        return run_pipeline(spec, ws, spec_path=spec_path, deploy=deploy, host=host, port=port, on_stage=on_stage, **options)


def print_summary(summary, spec) -> None:
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
    if summary.trained_on:
        console.print(f"trained on: {summary.trained_on}")
    if summary.throughput:
        total, per_worker = summary.throughput
        console.print(f"training throughput: {total:,.0f} samples/s ({per_worker:,.0f} per worker), mean over the "
                      f"{'winning trial' if len(summary.trials) > 1 else 'run'}'s epochs")
    if summary.tensorboard:
        from rayline.train.event_files import tensorboard_command

        console.print(f"TensorBoard (metrics, throughput, learning rate per epoch): {tensorboard_command(summary.tensorboard)}")
    console.print(styled("registered: model ", (summary.name, "bold"), " version ", (str(summary.version), "bold"),
                         f" (MLflow run {summary.run_id})"))
    if getattr(summary, "judgement", None):
        console.print(f"judged: {summary.judgement}", markup=False, soft_wrap=True)
    if getattr(summary, "retrain", None):
        console.print(summary.retrain, markup=False, soft_wrap=True)
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
    """One real row of the spec's data, as a request instance (an image as base64 text)."""
    import base64

    try:
        from rayline.data.sources import feature_columns, sample_table

        frame = sample_table(spec.data.source, rows=1).to_pandas()  # one row: an image folder's sample reads files
        features = feature_columns(spec.data, list(frame.columns))
        row = frame[features].iloc[0].to_dict()
        return {k: (base64.b64encode(v).decode() if isinstance(v, (bytes, bytearray)) else
                    None if v != v else (v.item() if hasattr(v, "item") else v)) for k, v in row.items()}
    except Exception:
        return {}
