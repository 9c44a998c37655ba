"""Runs a pipeline's stages in a straight line: data -> train or tune -> register -> deploy.

A conveyor: each stage is a function in its own module (`prepare`, `training`, `register`,
`deploy`) with typed input and output; this module hands each what it needs, keeps the run's
record and its MLflow run up to date (resume bookkeeping, `record`) and cleans up after an
interruption. Progress goes to an `on_stage` callback so the CLI can draw it and tests can
record it.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from rayline.errors import InterruptedRun
from rayline.pipeline.summary import RunSummary
from rayline.spec import PipelineSpec
from rayline.workspace import Workspace

__all__ = ["search_paths", "run_pipeline"]


def _noop(stage: str, event: str, detail: str = "") -> None:
    pass


def search_paths(spec_path: str | None) -> list[str]:
    """Where `model.import` modules are looked up: the spec's folder, its parent, the cwd."""
    paths = [os.getcwd()]
    if spec_path:
        folder = Path(spec_path).resolve().parent
        paths = [str(folder), str(folder.parent)] + paths
    return paths


def _in_background(make: Callable[[], object], *, name: str) -> Callable[[], object]:
    """Start `make()` on a daemon thread; the returned function waits for it and returns its result or
    raises what it raised. A caller that fails first never waits (the thread dies with the process)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = make()
        except BaseException as exc:  # handed to the waiting caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def wait():
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return wait


def _start_serve_quietly(host: str, port: int) -> None:
    from rayline.serve.applications import ensure_serve

    try:
        ensure_serve(host, port)
    except Exception as exc:  # noqa: BLE001 - the deploy stage starts it again and reports its own failure
        import logging

        logging.getLogger(__name__).debug("rayline: Serve's early start failed (the deploy stage retries): %s", exc)


def run_pipeline(
    spec: PipelineSpec,
    ws: Workspace,
    *,
    spec_path: str | None = None,
    deploy: bool = True,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_stage: Callable[[str, str, str], None] = _noop,
    resume: bool | str = False,
    resume_command: str | None = None,
    resume_force: bool = False,
    data_cache: bool = True,
    startup: dict[str, float] | None = None,
    serve_early: bool = False,
) -> RunSummary:
    """Run every stage the spec names on the connected Ray cluster.

    Ctrl-C raises InterruptedRun (exit 130): while training, nothing is registered, the
    MLflow run is marked KILLED and the message says how to resume (`resume=True`
    continues the newest interrupted run of this spec, or one whose driver was killed;
    `resume=RUN_ID` that pipeline run: finished trials keep their results, the others
    continue from their checkpoints); while deploying, the version stays
    registered and the cut-off Serve app is deleted. `data_cache=False` recomputes the data
    stage instead of reading it from the workspace's data cache (and stores it anew).
   
    `startup`: the caller's own phases before this (the CLI's start, Ray's start), kept with the
    run's phases in its record and summary (rayline/pipeline/phases.py).

    `serve_early`: start Serve (its controller and HTTP ingress, which reserve no CPUs) while the data
    stage and training run, instead of in the deploy stage: for a Ray this run owns (`rayline run`'s
    embedded Ray), where Serve ends with the run anyway. On a shared cluster a run that fails in
    training must not leave Serve started there, so it starts in the deploy stage as before.
    """
    from rayline.train.event_files import mean_throughput
    from rayline.train.hardware import trained_on
    from rayline.cluster.orphans import release_orphaned_placement_groups, sweep_in_background
    from rayline.pipeline.prepare import prepare_stage
    from rayline.pipeline.phases import train_phases
    from rayline.pipeline.record import check_same_data, interrupted_run, new_record, write_record
    from rayline.pipeline.register import register_stage
    from rayline.pipeline.training import plan_training, train_stage
    from rayline.registry import Registry
    from rayline.storage import check_shared, join

    ws.ensure()
    seconds: dict[str, float] = {}
    phases: dict[str, float] = dict(startup or {})
    # resume: True for the newest interrupted run of this spec, or a run id (`rayline resume RUN_ID`).
    previous = interrupted_run(ws, spec, resume if isinstance(resume, str) else None, force=resume_force) if resume else None
    experiment = previous["experiment"] if previous else f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    resume_command = resume_command or shlex.join(
        ["rayline", "run", spec_path or f"<{spec.name} spec>", "--workspace", ws.location, "--resume"])
    if deploy and spec.serve is not None:
        from rayline.serve.address import serve_address

        serve_address(host, port)  # a port another process holds fails now, not after training
    serving = None
    if deploy and spec.serve is not None and serve_early:
        # 3.6-5.3 s of the quick start's deploy stage on the 2-core machine, now beside the data stage.
        # Best effort: whatever stopped it, the deploy stage starts Serve itself (versions.deploy) and
        # says what fails there, as without this.
        serving = _in_background(lambda: _start_serve_quietly(host, port), name="rayline-start-serve")
    # On a multi-node cluster a node-local workspace path would lose checkpoints written on
    # other nodes: fail now, before any work, naming a node that does not see it.
    check_shared(ws.location)
    # A Train run killed earlier in this driver (a stopped trial of a previous sweep) may have
    # left its placement group holding CPUs: this run's reads and plan get them back first.
    release_orphaned_placement_groups()

    # MLflow's store opens while the data stage runs (the stage mostly waits on Ray): its imports and
    # the store's open cost 4.4 s of a small run's 27 s here, one after the other, before training.
    opening = _in_background(lambda: Registry(ws), name="rayline-open-registry")
    t0 = time.monotonic()
    prepared = prepare_stage(spec, ws, data_cache=data_cache, on_stage=on_stage)
    if previous:
        check_same_data(previous, prepared[0].fingerprint)
    seconds["data"] = time.monotonic() - t0
    plan = plan_training(spec)

    registry = opening()
    run_id = registry.start_pipeline_run(spec, spec_path)
    if previous:
        _continue_from(registry, run_id, previous)
    folder = join(ws.runs_dir, experiment)
    record = new_record(spec, experiment=experiment, spec_path=spec_path, ws=ws, prepared=prepared, run_id=run_id,
                        previous=previous)
    write_record(folder, record)
    try:
        t0, train_started_at = time.monotonic(), time.time()
        trained = train_stage(spec, prepared, plan=plan, folder=folder, runs_dir=ws.runs_dir, experiment=experiment,
                              search_paths=search_paths(spec_path), resume=bool(previous), on_stage=on_stage)
        seconds["train"] = time.monotonic() - t0
        if len(trained.trials) == 1:  # a sweep's trials overlap: its stage stays whole (phases.py)
            phases.update(train_phases(train_started_at, time.time(), trained.winner.timeline))
        t0 = time.monotonic()
        registered = register_stage(registry, run_id, spec, trained, ws=ws, experiment=experiment, on_stage=on_stage)
        seconds["register"] = time.monotonic() - t0
    except (InterruptedRun, KeyboardInterrupt) as exc:
        sweep_in_background()  # the cut-off Train runs' groups, in a driver that lives on
        registry.fail_run(run_id, "KILLED")
        # A sweep or a training run resumes from its saved state (Tune's, or Train's checkpoints).
        write_record(folder, {**record, "status": "interrupted"})
        what = str(exc) if isinstance(exc, InterruptedRun) else (
            "interrupted while " + ("training" if "train" not in seconds else "registering"))
        raise InterruptedRun(f"{what}; nothing registered; MLflow run {run_id} marked KILLED; "
                             f"resume with: {resume_command} (or: {shlex.join(['rayline', 'resume', run_id, '--workspace', ws.location])})"
                             ) from exc
    except BaseException:
        sweep_in_background()
        registry.fail_run(run_id, "FAILED")
        write_record(folder, {**record, "status": "failed"})
        raise
    write_record(folder, {**record, "status": "registered", "version": registered.version})

    report = None
    if spec.tune:  # the sweep report, also logged to the MLflow run; a failure is a warning, never a failed run
        from rayline.report import report_after_sweep

        t0 = time.monotonic()
        report = report_after_sweep(registry, run_id)
        seconds["report"] = time.monotonic() - t0

    endpoint = None
    if deploy and spec.serve is not None:
        from rayline.pipeline.deploy import deploy_stage

        t0 = time.monotonic()
        if serving is not None:
            try:
                serving()  # Serve's start, begun with the data stage
            except KeyboardInterrupt as exc:
                raise InterruptedRun(f"interrupted while deploying: model {spec.name} version {registered.version} "
                                     f"stays registered (MLflow run {run_id}); no Serve app was started") from exc
        endpoint = deploy_stage(spec.name, registered.version, spec.serve.model_copy(update={"route": spec.route}),
                                ws=ws, host=host, port=port, run_id=run_id, on_stage=on_stage)
        seconds["deploy"] = time.monotonic() - t0
    retrain = None
    if endpoint and spec.retrain is not None:
        from rayline.retrain.loop import start_loop_line

        retrain = start_loop_line(spec, ws)  # the model is served: a loop that cannot start is said, not a failed run

    winner, data = trained.winner, trained.data
    phases.update(seconds)
    phases["trials"] = len(trained.trials)
    device = trained_on(winner.starts)  # what the winner's workers found, said once for the record and the summary
    write_record(folder, {**record, "status": "registered", "version": registered.version, "phases": phases,
                          "trained_on": device})
    return RunSummary(
        name=spec.name, version=registered.version, task=data.task, metric=spec.resolved_metric(data.task),
        valid_metrics=winner.metrics, test_metrics=registered.test_metrics, trials=trained.trials, endpoint=endpoint,
        run_id=run_id, rows=data.rows, resumed_from=winner.resumed_from, seconds=seconds,
        resumed_run=experiment if previous else None, leaderboard=registered.leaderboard,
        data_variants=len(prepared), report=report, tensorboard=trained.tensorboard,
        throughput=mean_throughput(winner.history), phases=phases, record_folder=folder,
        trained_on=device, judgement=registered.judgement, retrain=retrain,
    )


def _continue_from(registry, run_id: str, previous: dict) -> None:
    """Tag the new MLflow run with the interrupted one it continues; a killed driver left that one
    RUNNING: it ends here, as a Ctrl-C'd one does."""
    try:
        registry.client.set_tag(run_id, "rayline.resumed_from", previous.get("run_id", ""))
        if previous.get("run_id") and registry.client.get_run(previous["run_id"]).info.status == "RUNNING":
            registry.fail_run(previous["run_id"], "KILLED")
    except Exception:  # noqa: BLE001 - a missing tag must not stop the run
        pass
