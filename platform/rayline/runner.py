"""Runs a pipeline's stages in a straight line: data -> train or tune -> register -> deploy.

The runner owns resource planning, the MLflow pipeline run and cleanup; each stage is a
function with typed input and output. Progress goes to an `on_stage` callback so the CLI
can draw it and tests can record it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rayline.spec import PipelineSpec
from rayline.workspace import Workspace

__all__ = ["RunSummary", "run_pipeline", "STAGES"]

STAGES = ("data", "train", "register", "deploy")
_BOOKKEEPING = ("epoch", "resumed")  # in each history row, but not model metrics


@dataclass
class RunSummary:
    name: str
    version: str
    task: str
    metric: str
    valid_metrics: dict
    test_metrics: dict
    trials: list = field(default_factory=list)  # TrialOutcome
    endpoint: str | None = None
    run_id: str = ""
    rows: dict = field(default_factory=dict)
    resumed_from: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)


def _noop(stage: str, event: str, detail: str = "") -> None:
    pass


def search_paths(spec_path: str | None) -> list[str]:
    """Where `model.import` modules are looked up: the spec's folder, its parent, the cwd."""
    paths = [os.getcwd()]
    if spec_path:
        folder = Path(spec_path).resolve().parent
        paths = [str(folder), str(folder.parent)] + paths
    return paths


def run_pipeline(
    spec: PipelineSpec,
    ws: Workspace,
    *,
    spec_path: str | None = None,
    deploy: bool = True,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_stage: Callable[[str, str, str], None] = _noop,
) -> RunSummary:
    """Run every stage the spec names on the connected Ray cluster."""
    import ray

    from rayline.data import prepare_data
    from rayline.model import Predictor, write_artifact
    from rayline.registry import Registry
    from rayline.resources import plan_resources
    from rayline.train.catalog import load_backend
    from rayline.tune import TRIAL_DRIVER_CPUS, TrialOutcome, tune_pipeline
    from rayline.train.run import train

    ws.ensure()
    seconds: dict[str, float] = {}
    experiment = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    paths = search_paths(spec_path)

    on_stage("data", "start", f"{spec.data.source.format} {spec.data.source.name or spec.data.source.path}")
    t0 = time.monotonic()
    data = prepare_data(spec)
    seconds["data"] = time.monotonic() - t0
    on_stage("data", "done", f"{data.rows['train']}/{data.rows['valid']}/{data.rows['test']} rows, "
             f"{len(data.preprocessing.output_columns)} features, {data.task}")

    available = dict(ray.available_resources())
    concurrency = spec.tune.max_concurrent if spec.tune else 1
    if spec.tune:
        available["CPU"] = available.get("CPU", 0) - TRIAL_DRIVER_CPUS * concurrency
    plan = plan_resources(spec.train, available, concurrency)
    metric = spec.resolved_metric(data.task)

    registry = Registry(ws)
    run_id = registry.start_pipeline_run(spec, spec_path)
    try:
        t0 = time.monotonic()
        if spec.tune:
            on_stage("train", "start", f"tuning: {spec.tune.num_samples} trials, {plan.concurrent_trials} at once, "
                     f"{spec.train.workers} workers x {plan.cpus_per_worker:g} CPU")
            outcome = tune_pipeline(spec, data, storage_path=ws.runs_dir, experiment=experiment, plan=plan, search_paths=paths)
            winner, trials = outcome.winner, outcome.trials
        else:
            on_stage("train", "start", f"{spec.train.workers} workers x {plan.cpus_per_worker:g} CPU, {spec.train.epochs} epochs")
            winner = train(spec, data, storage_path=os.path.join(ws.runs_dir, experiment), run_name="train", plan=plan,
                           search_paths=paths)
            trials = [TrialOutcome(trial_id="train", overrides={}, status="terminated", result=winner)]
        seconds["train"] = time.monotonic() - t0
        on_stage("train", "done", f"best {metric}={winner.metrics[metric]:.4f} (epoch {winner.metrics['epoch']:g})")

        on_stage("register", "start", ws.tracking_uri)
        t0 = time.monotonic()
        for trial in trials:
            registry.log_trial(run_id, spec.name, trial.trial_id, trial.overrides, trial.status,
                               trial.result.history if trial.result else [], winner=trial.result is winner)
        winning_spec = spec
        if winner.overrides:
            from rayline.spec import apply_overrides

            winning_spec = apply_overrides(spec, winner.overrides)
        staging = tempfile.mkdtemp(prefix="rayline-artifact-", dir=ws.root)
        try:
            artifact = write_artifact(
                os.path.join(staging, "model"),
                checkpoint_dir=winner.checkpoint_dir,
                preprocessing=data.preprocessing,
                spec=winning_spec,
                metrics={k: v for k, v in winner.metrics.items() if k not in _BOOKKEEPING},
                fingerprint=data.fingerprint,
                versions=load_backend(spec.model.framework).versions(),
            )
            test_metrics = Predictor(artifact).evaluate(data.test_frame)
            _add_test_metrics(artifact, test_metrics)
            mv = registry.register(
                run_id, spec.name, artifact,
                metrics={**{f"valid_{k}": v for k, v in winner.metrics.items() if k not in _BOOKKEEPING},
                         **{f"test_{k}": v for k, v in test_metrics.items()}},
                tags={"framework": spec.model.framework, "task": data.task, "metric": metric,
                      f"valid_{metric}": winner.metrics[metric], "data_fingerprint": data.fingerprint},
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        seconds["register"] = time.monotonic() - t0
        on_stage("register", "done", f"model {spec.name} version {mv.version}")
    except BaseException:
        registry.fail_run(run_id)
        raise

    endpoint = None
    if deploy and spec.serve is not None:
        from rayline.serve.app import deploy as deploy_app

        on_stage("deploy", "start", f"{spec.route} on {host}:{port}")
        t0 = time.monotonic()
        endpoint = deploy_app(spec, mv.version, ws, host, port)
        seconds["deploy"] = time.monotonic() - t0
        on_stage("deploy", "done", endpoint)

    return RunSummary(
        name=spec.name, version=mv.version, task=data.task, metric=metric,
        valid_metrics=winner.metrics, test_metrics=test_metrics, trials=trials, endpoint=endpoint,
        run_id=run_id, rows=data.rows, resumed_from=winner.resumed_from, seconds=seconds,
    )


def _add_test_metrics(artifact: str, test_metrics: dict) -> None:
    import json

    from rayline.model import META_FILE

    path = os.path.join(artifact, META_FILE)
    with open(path) as fh:
        meta = json.load(fh)
    meta["test_metrics"] = test_metrics
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(meta, fh, indent=1)
    os.replace(tmp, path)

