"""The train stage: one Ray Train run of the spec's backend, and finding its best checkpoint."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from rayline.errors import TrainingError
from rayline.resources import ResourcePlan
from rayline.spec import PipelineSpec, metric_mode
from rayline.train.catalog import load_backend
from rayline.train.loop import read_state

__all__ = ["TrainResult", "train", "loop_config", "locate_best", "checkpoint_keep"]

# Keep the best checkpoint by the metric plus the latest (Ray Train never deletes the
# latest: resume needs it). Older, worse checkpoints are removed as training goes.
checkpoint_keep = 2


@dataclass
class TrainResult:
    """The best checkpoint of one training run and how it got there."""

    checkpoint_dir: str
    metrics: dict  # validation metrics of the best epoch
    history: list[dict]  # validation metrics of every epoch
    resumed_from: list[int]  # epochs whose checkpoint training resumed from after a failure
    run_dir: str
    overrides: dict = field(default_factory=dict)


def loop_config(spec: PipelineSpec, data, plan: ResourcePlan, search_paths: list[str]) -> dict:
    """Everything a training worker needs, as plain data."""
    task = data.task
    return {
        "task": task,
        "epochs": spec.train.epochs,
        "batch_size": spec.train.batch_size,
        "optimizer": spec.train.optimizer.model_dump(),
        "metric": spec.resolved_metric(task),
        "seed": spec.data.split.seed,
        "threads": plan.threads_per_worker,
        "arch": {
            "num_features": len(data.preprocessing.output_columns),
            "num_outputs": data.preprocessing.num_outputs,
            "task": task,
            "model": {"kind": spec.model.kind, "import": spec.model.import_, "params": spec.model.params},
            "search_paths": search_paths,
        },
    }


def train(
    spec: PipelineSpec,
    data,
    *,
    storage_path: str,
    run_name: str,
    plan: ResourcePlan,
    search_paths: list[str] = (),
    callbacks: list = (),
) -> TrainResult:
    """Train `spec` on `data` with Ray Train; return the best checkpoint by the spec's metric."""
    import ray.train

    backend = load_backend(spec.model.framework)
    metric = spec.resolved_metric(data.task)
    mode = metric_mode(metric)
    run_config = ray.train.RunConfig(
        name=run_name,
        storage_path=storage_path,
        failure_config=ray.train.FailureConfig(max_failures=spec.train.max_failures),
        checkpoint_config=ray.train.CheckpointConfig(
            num_to_keep=checkpoint_keep, checkpoint_score_attribute=metric, checkpoint_score_order=mode
        ),
        callbacks=list(callbacks),
        worker_runtime_env={"env_vars": backend.worker_env()} if backend.worker_env() else None,
    )
    scaling = ray.train.ScalingConfig(
        num_workers=spec.train.workers,
        use_gpu=spec.train.use_gpu,
        resources_per_worker=plan.worker_resources(),
    )
    trainer = backend.make_trainer(
        loop_config=loop_config(spec, data, plan, list(search_paths)),
        scaling_config=scaling,
        run_config=run_config,
        datasets={"train": data.train, "valid": data.valid},
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as exc:
        raise TrainingError(f"training failed after {spec.train.max_failures} retries (train.max_failures): {_root(exc)}") from None
    return locate_best(os.path.join(storage_path, run_name), metric, mode)


def locate_best(run_dir: str, metric: str, mode: str) -> TrainResult:
    """The best checkpoint under a Ray Train run directory, read from our state files.

    File-based on purpose: with Train V2 inside Tune the checkpoint is not handed to
    Tune, and a trial stopped early by ASHA never returns a Result; its checkpoints are
    still in storage. Only checkpoints Ray Train registered count: a worker that dies
    between writing a checkpoint and its registration leaves an orphan directory that the
    restarted attempt never resumes from nor deletes.
    """
    states = []
    for ckpt in _registered_checkpoints(run_dir):
        state = read_state(ckpt)
        if state and metric in state["metrics"]:
            states.append((ckpt, state))
    if not states:
        raise TrainingError(f"no checkpoint with metric {metric!r} under {run_dir}: training reported nothing")
    sign = 1 if mode == "max" else -1
    best_dir, best = max(states, key=lambda s: (sign * s[1]["metrics"][metric], -s[1]["epoch"]))
    _, latest = max(states, key=lambda s: s[1]["epoch"])
    return TrainResult(
        checkpoint_dir=best_dir,
        metrics=best["metrics"],
        history=latest["history"],
        resumed_from=latest["resumed_from"],
        run_dir=run_dir,
    )


_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train V2's record of registered checkpoints


def _registered_checkpoints(run_dir: str) -> list[str]:
    """The checkpoint dirs Ray Train's checkpoint manager kept; every checkpoint_* if it left no record."""
    try:
        with open(os.path.join(run_dir, _SNAPSHOT)) as fh:
            names = [r["checkpoint_dir_name"] for r in json.load(fh)["checkpoint_results"]]
        return [os.path.join(run_dir, name) for name in names]
    except (OSError, ValueError, KeyError, TypeError):
        # An older or newer Ray may name or shape this record differently: fall back to
        # scanning, which is right whenever no attempt died mid-checkpoint.
        return glob.glob(os.path.join(run_dir, "checkpoint_*"))


def _root(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    tail = [line for line in text if "Error" in line]
    return (tail[-1] if tail else (text[-1] if text else repr(exc)))[:500]
