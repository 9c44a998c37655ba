"""Runs a pipeline's stages in a straight line: data -> train or tune -> register -> deploy.

The runner owns resource planning, the MLflow pipeline run and cleanup; each stage is a
function with typed input and output. Progress goes to an `on_stage` callback so the CLI
can draw it and tests can record it.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable

from rayline.errors import InterruptedRun, SpecError, TrainingError
from rayline.event_files import mean_throughput
from rayline.pipeline.plan import plan_when_settled
from rayline.pipeline.record import interrupted_run, training_spec, write_record
from rayline.pipeline.summary import RunSummary
from rayline.spec import PipelineSpec
from rayline.train.loop import TRAINING_STATS
from rayline.workspace import Workspace

__all__ = ["search_paths", "run_pipeline"]

log = logging.getLogger(__name__)


_BOOKKEEPING = ("epoch", "resumed", *TRAINING_STATS)  # in each history row, but not model metrics


def _noop(stage: str, event: str, detail: str = "") -> None:
    pass


def search_paths(spec_path: str | None) -> list[str]:
    """Where `model.import` modules are looked up: the spec's folder, its parent, the cwd."""
    paths = [os.getcwd()]
    if spec_path:
        folder = Path(spec_path).resolve().parent
        paths = [str(folder), str(folder.parent)] + paths
    return paths


def _end_run(registry, run_id: str, status: str) -> None:
    registry.fail_run(run_id, status)


def _delete_app(name: str) -> bool:
    """Remove a Serve app whose deploy was cut off; True when there was one."""
    try:
        from ray import serve

        if name in serve.status().applications:
            serve.delete(name)
            return True
    except Exception:  # noqa: BLE001 - best effort on the way out of an interruption
        pass
    return False


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
) -> RunSummary:
    """Run every stage the spec names on the connected Ray cluster.

    Ctrl-C raises InterruptedRun (exit 130): while training, nothing is registered, the
    MLflow run is marked KILLED and the message says how to resume (`resume=True`
    continues the newest interrupted run of this spec, or one whose driver was killed;
    `resume=RUN_ID` that pipeline run: finished trials keep their results, the others
    continue from their checkpoints); while deploying, the version stays
    registered and the cut-off Serve app is deleted. `data_cache=False` recomputes the data
    stage instead of reading it from the workspace's data cache (and stores it anew).
    """
    import ray

    from rayline.artifact import write_artifact
    from rayline.data import prepare_variants
    from rayline.model import Predictor
    from rayline.offline_metrics import evaluate_rows
    from rayline.registry import Registry
    from rayline.resources import plan_resources
    from rayline.train.backend import load_backend
    from rayline.tune.clock import max_workers
    from rayline.tune.sweep import TRIAL_DRIVER_CPUS, TrialOutcome, tune_pipeline
    from rayline.train.run import train

    ws.ensure()
    seconds: dict[str, float] = {}
    # resume: True for the newest interrupted run of this spec, or a run id (`rayline resume RUN_ID`).
    previous = interrupted_run(ws, spec, resume if isinstance(resume, str) else None, force=resume_force) if resume else None
    experiment = previous["experiment"] if previous else f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    paths = search_paths(spec_path)
    resume_command = resume_command or shlex.join(
        ["rayline", "run", spec_path or f"<{spec.name} spec>", "--workspace", ws.location, "--resume"])

    if deploy and spec.serve is not None:
        from rayline.serve.address import serve_address

        serve_address(host, port)  # a port another process holds fails now, not after training

    from rayline.storage import check_shared, download_dir, is_uri, join

    # On a multi-node cluster a node-local workspace path would lose checkpoints written on
    # other nodes: fail now, before any work, naming a node that does not see it.
    check_shared(ws.location)
    from rayline.orphans import release_orphaned_placement_groups, sweep_in_background

    # A Train run killed earlier in this driver (a stopped trial of a previous sweep) may have
    # left its placement group holding CPUs: this run's reads and plan get them back first.
    release_orphaned_placement_groups()
    on_stage("data", "start", f"{spec.data.source.format} {spec.data.source.name or spec.data.source.path}")
    t0 = time.monotonic()
    from rayline.spec.pipeline_space import PipelineSpace

    # A sweep over preprocessing: one data stage per distinct configuration, before the trials,
    # which share them (the read and the split happen once for all).
    variants = PipelineSpace(spec).variants() if spec.tune else [{}]
    try:
        from rayline.spec import apply_overrides as _with

        from rayline.data.cache import DataCache

        prepared = prepare_variants(spec, [_with(spec, v) if v else spec for v in variants],
                                    progress=lambda detail: on_stage("data", "progress", detail),
                                    tick=lambda detail: on_stage("data", "tick", detail),
                                    cache=DataCache.of(ws, read=data_cache))
        data = prepared[0]
    except KeyboardInterrupt as exc:
        raise InterruptedRun("interrupted while preparing data: nothing was trained or registered") from exc
    if previous and previous.get("fingerprint") != data.fingerprint:
        raise SpecError([f"--resume: the data changed since the interrupted run {experiment} (fingerprint "
                         f"{previous.get('fingerprint')} then, {data.fingerprint} now) (allowed: the same data, "
                         "or run without --resume to start over)"])
    seconds["data"] = time.monotonic() - t0
    on_stage("data", "done", f"{data.rows['train']}/{data.rows['valid']}/{data.rows['test']} rows, "
             f"{len(data.preprocessing.output_columns)} features, {data.task}"
             + (f", {len(prepared)} preprocessing variants" if len(prepared) > 1 else "")
             + (f", cached ({data.cache_key})" if all(p.cached for p in prepared) else ""))

    concurrency = spec.tune.max_concurrent if spec.tune else 1

    def for_training(resources: dict) -> dict:
        resources = dict(resources)
        if spec.tune:
            resources["CPU"] = resources.get("CPU", 0) - TRIAL_DRIVER_CPUS * concurrency
        return resources

    # Sized for the largest train.workers a trial can draw: every draw then fits, and one
    # that never could fails here, before anything starts, naming the resource.
    plan = plan_when_settled(lambda available: plan_resources(spec.train, available, concurrency, max_workers=max_workers(spec)),
                             lambda: for_training(ray.available_resources()), lambda: for_training(ray.cluster_resources()))
    metric = spec.resolved_metric(data.task)

    registry = Registry(ws)
    run_id = registry.start_pipeline_run(spec, spec_path)
    if previous:
        try:
            registry.client.set_tag(run_id, "rayline.resumed_from", previous.get("run_id", ""))
            # A killed driver left its MLflow run RUNNING: it ends here, as a Ctrl-C'd one does.
            if previous.get("run_id") and registry.client.get_run(previous["run_id"]).info.status == "RUNNING":
                _end_run(registry, previous["run_id"], "KILLED")
        except Exception:  # noqa: BLE001 - a missing tag must not stop the run
            pass
    folder = join(ws.runs_dir, experiment)
    from rayline.resume import driver_info

    # driver: who runs it (host, pid, start time), so a later --resume can tell a killed run from
    # a live one; spec_raw: the whole spec as parsed, for `rayline resume RUN_ID` without the file.
    record = {"experiment": experiment, "spec_name": spec.name, "spec_path": spec_path or "", "spec": training_spec(spec),
              "spec_raw": spec.model_dump(by_alias=True, exclude_none=True), "driver": driver_info(),
              "workspace": ws.location,
              "fingerprint": data.fingerprint, "data_cache_keys": [p.cache_key for p in prepared], "run_id": run_id, "created": (previous or {}).get("created", time.time()),
              "status": "running", "resumed_runs": (previous or {}).get("resumed_runs", []) + ([previous["run_id"]] if previous else [])}
    write_record(folder, record)
    try:
        t0 = time.monotonic()
        if spec.tune:
            on_stage("train", "start", f"{'resuming ' if previous else ''}tuning: {spec.tune.num_samples} trials, "
                     f"{plan.concurrent_trials} at once, {plan.workers_text()} x {plan.cpus_per_worker:g} CPU"
                     f"{_technique_text(spec)}")
            outcome = tune_pipeline(spec, prepared if len(prepared) > 1 else data, storage_path=ws.runs_dir, experiment=experiment, plan=plan, search_paths=paths,
                                    resume=bool(previous))
            winner, trials = outcome.winner, outcome.trials
            data = prepared[outcome.winner_variant]  # the winner's own preprocessing is the one registered
        else:
            on_stage("train", "start", f"{'resuming: ' if previous else ''}{plan.workers_text()} x "
                     f"{plan.cpus_per_worker:g} CPU, {spec.train.epochs} epochs{_technique_text(spec)}")
            # Same storage path and name as the interrupted run: Ray Train restores its latest checkpoint.
            winner = train(spec, data, storage_path=folder, run_name="train", plan=plan, search_paths=paths)
            trials = [TrialOutcome(trial_id="train", overrides={}, status="terminated", result=winner)]
        seconds["train"] = time.monotonic() - t0
        tensorboard = _event_files(join(folder, "tensorboard"), trials)
        # Trials Tune stopped as the sweep ended: their groups appear a moment after fit()
        # returns; freed in the background while the winner is registered and served.
        sweep_in_background()
        on_stage("train", "done", f"best {metric}={winner.metrics[metric]:.4f} (epoch {winner.metrics['epoch']:g})")

        from rayline.redact import redact_uri

        on_stage("register", "start", redact_uri(ws.tracking_uri))
        t0 = time.monotonic()
        for trial in trials:
            registry.log_trial(run_id, spec.name, trial.trial_id, trial.overrides, trial.status,
                               trial.result.history if trial.result else [], winner=trial.result is winner,
                               stop_reason=trial.stop_reason, units_trained=trial.units_trained,
                               events=trial.events, family=trial.family)
        from rayline.tune.leaderboard import family_leaderboard
        from rayline.spec import metric_mode

        leaderboard = family_leaderboard(trials, metric, metric_mode(metric)) if spec.tune else []
        if len(leaderboard) > 1:  # a sweep over model families
            registry.log_leaderboard(run_id, metric, leaderboard)
        winning_spec = spec
        if winner.overrides:
            from rayline.spec import apply_overrides

            winning_spec = apply_overrides(spec, winner.overrides)
        staging = ws.temp_dir("artifact")  # <ws>/tmp; a killed run's is removed by the next run
        try:
            checkpoint_dir = winner.checkpoint_dir
            if is_uri(checkpoint_dir):  # on object storage: the artifact is assembled from a local copy
                checkpoint_dir = download_dir(checkpoint_dir, os.path.join(staging, "checkpoint"))
            artifact = write_artifact(
                os.path.join(staging, "model"),
                checkpoint_dir=checkpoint_dir,
                preprocessing=data.preprocessing,
                spec=winning_spec,
                metrics={k: v for k, v in winner.metrics.items() if k not in _BOOKKEEPING},
                fingerprint=data.fingerprint,
                versions=load_backend(winning_spec.model.framework).versions(),
            )
            predictor = Predictor(artifact)
            _check_probe(predictor, data)  # training/serving skew fails the run here, before registering
            # Offline, through the serving Predictor (the same code as the endpoint's answers),
            # where the test rows are: no test split in this process.
            test_metrics = evaluate_rows(artifact, data.test_rows)
            _add_test_metrics(artifact, test_metrics)
            mv = registry.register(
                run_id, spec.name, artifact,
                metrics={**{f"valid_{k}": v for k, v in winner.metrics.items() if k not in _BOOKKEEPING},
                         **{f"test_{k}": v for k, v in test_metrics.items()}},
                tags={"framework": winning_spec.model.framework, "task": data.task, "metric": metric,
                      f"valid_{metric}": winner.metrics[metric], "data_fingerprint": data.fingerprint,
                      **({"data_cache_key": data.cache_key} if data.cache_key else {}),
                      # Lineage (`rayline models show`): the data, the trial and the checkpoint it came from.
                      "data_source": redact_uri(spec.data.source.path or spec.data.source.name or ""),
                      "experiment": experiment,
                      "trial_id": next((t.trial_id for t in trials if t.result is winner), ""),
                      "checkpoint": redact_uri(winner.checkpoint_dir)},
                input_example=data.probe_frame,  # raw test rows, bounded (PROBE_ROWS)
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        seconds["register"] = time.monotonic() - t0
        on_stage("register", "done", f"model {spec.name} version {mv.version}")
    except (InterruptedRun, KeyboardInterrupt) as exc:
        sweep_in_background()  # the cut-off Train runs' groups, in a driver that lives on
        _end_run(registry, run_id, "KILLED")
        # A sweep or a training run resumes from its saved state (Tune's, or Train's checkpoints).
        write_record(folder, {**record, "status": "interrupted"})
        what = str(exc) if isinstance(exc, InterruptedRun) else (
            "interrupted while " + ("training" if "train" not in seconds else "registering"))
        raise InterruptedRun(f"{what}; nothing registered; MLflow run {run_id} marked KILLED; "
                             f"resume with: {resume_command} (or: {shlex.join(['rayline', 'resume', run_id, '--workspace', ws.location])})"
                             ) from exc
    except BaseException:
        sweep_in_background()
        _end_run(registry, run_id, "FAILED")
        write_record(folder, {**record, "status": "failed"})
        raise
    write_record(folder, {**record, "status": "registered", "version": mv.version})
    report = None
    if spec.tune:  # the sweep report, also logged to the MLflow run; a failure is a warning, never a failed run
        from rayline.report import report_after_sweep

        t0 = time.monotonic()
        report = report_after_sweep(registry, run_id)
        seconds["report"] = time.monotonic() - t0

    endpoint = None
    if deploy and spec.serve is not None:
        from rayline.serve import versions

        t0 = time.monotonic()
        created: list = []
        canary = spec.serve.canary
        try:
            on_stage("deploy", "start", f"{spec.route} on {host}:{port}")
            # The winner becomes the champion (all of the route's traffic), or a canary beside it
            # when the spec asks; its own route ROUTE/v/N answers either way (rayline/serve/versions.py).
            rollout = versions.deploy(spec.name, mv.version, ws=ws, serve_spec=spec.serve.model_copy(update={"route": spec.route}),
                                      canary_percent=canary.percent if canary else None,
                                      gate=canary.gate() if canary else None, host=host, port=port, created=created)
            endpoint = rollout.url
        except KeyboardInterrupt as exc:
            deleted = [app for app in reversed(created) if _delete_app(app)]
            raise InterruptedRun(
                f"interrupted while deploying: model {spec.name} version {mv.version} stays registered "
                f"(MLflow run {run_id}); "
                + (f"the half-deployed Serve app {spec.name!r} was deleted ({', '.join(deleted)})" if deleted
                   else "no Serve app was started")
            ) from exc
        seconds["deploy"] = time.monotonic() - t0
        role = (f"version {mv.version} canary ({canary.percent}%), version {rollout.champion} champion" if rollout.canary
                else f"version {mv.version} champion")
        on_stage("deploy", "done", f"{endpoint} ({role}; this version alone: {endpoint}/v/{mv.version})")

    return RunSummary(
        name=spec.name, version=mv.version, task=data.task, metric=metric,
        valid_metrics=winner.metrics, test_metrics=test_metrics, trials=trials, endpoint=endpoint,
        run_id=run_id, rows=data.rows, resumed_from=winner.resumed_from, seconds=seconds,
        resumed_run=experiment if previous else None, leaderboard=leaderboard if len(leaderboard) > 1 else [],
        data_variants=len(prepared), report=report, tensorboard=tensorboard,
        throughput=mean_throughput(winner.history),
    )


def _event_files(location: str, trials: list) -> str | None:
    """TensorBoard event files of every trial's history; a failure is a warning, never a failed run."""
    from rayline.event_files import write_event_files

    try:
        return write_event_files(location, trials)
    except Exception as exc:  # noqa: BLE001 - the model is trained either way
        log.warning("rayline: TensorBoard event files were not written to %s: %s", location, exc)
        return None


def _technique_text(spec: PipelineSpec) -> str:
    """', bf16, effective batch 256 (64 x 4 micro-batches), fp16 gradient compression' for the train
    stage's start line; '' when plain."""
    train = spec.train
    parts = ["fsdp (sharded)"] if train.strategy == "fsdp" else []
    parts += [train.precision] if train.precision != "fp32" else []
    if train.grad_accumulation > 1:
        parts.append(f"effective batch {train.effective_batch_size} ({train.batch_size} x {train.grad_accumulation} micro-batches)")
    if train.grad_compression.name != "none":
        parts.append(f"{train.grad_compression} gradient compression")
    return "".join(f", {p}" for p in parts)


def _check_probe(predictor, data) -> None:
    """The artifact, loaded as a Serve replica loads it, must reproduce on the raw probe rows the
    outputs the model being trained gave at its checkpoint (rayline/train/probe.py)."""
    from rayline.model import artifact_root
    from rayline.train.probe import check_probe, read_probe

    record = read_probe(artifact_root(predictor.model_dir))
    if record is None or data.probe_frame is None:
        return  # a checkpoint from before the probe (a resumed older run)
    outputs = predictor.infer(predictor.preprocessing.transform(data.probe_frame))
    problem = check_probe(record, outputs, f"register: model {predictor.name}")
    if problem:
        raise TrainingError(problem)


def _add_test_metrics(artifact: str, test_metrics: dict) -> None:
    import json

    from rayline.model import META_FILE

    path = os.path.join(artifact, META_FILE)
    with open(path) as fh:
        meta = json.load(fh)
    meta["test_metrics"] = test_metrics
    from rayline.files import atomic_write

    atomic_write(path, json.dumps(meta, indent=1))
