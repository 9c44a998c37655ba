"""The train stage: one Ray Train run of the spec's backend, and finding its best checkpoint."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from rayline.errors import InterruptedRun, TrainingError
from rayline.train.resources import ResourcePlan
from rayline.spec.pipeline_spec import PipelineSpec, metric_mode
from rayline.train.backend import load_backend
from rayline.train.in_process import fit_in_process, runs_in_process
from rayline.storage import join, list_names, read_json
from rayline.train.loop import STREAMED, read_state
from rayline.train.splits import ARRAYS_KEY

__all__ = ["TrainResult", "train", "scaling_config", "loop_config", "datasets_of", "locate_best", "set_aside_unreadable_snapshot",
           "snapshot_checkpoints", "checkpoint_keep", "START_RETRIES", "START_TIMEOUT_ENV"]

# Keep the best checkpoint by the metric plus the latest (Ray Train never deletes the
# latest: resume needs it). Older, worse checkpoints are removed as training goes.
checkpoint_keep = 2

# Placing the worker group is bounded: Ray Train V2 gives up waiting for the workers'
# placement group after RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (default 60 s) and, by
# default, retries that without limit (FailureConfig.controller_failure_limit=-1): a trial
# that cannot be placed waited forever. One retry covers resources still being released
# (an earlier trial's placement group, a Serve replica shutting down); then the run fails,
# naming what it waited for, after at most (START_RETRIES + 1) x the timeout.
START_RETRIES = 1
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
_DEFAULT_START_TIMEOUT_S = 60.0


@dataclass
class TrainResult:
    """The best checkpoint of one training run and how it got there."""

    checkpoint_dir: str
    metrics: dict  # validation metrics of the best epoch
    history: list[dict]  # validation metrics of every epoch
    resumed_from: list[int]  # epochs whose checkpoint training resumed from after a failure
    run_dir: str
    overrides: dict = field(default_factory=dict)
    # The state each attempt of the latest checkpoint's lineage started from (rayline/train/loop.py):
    # epoch, source checkpoint and digests of the live weights and optimizer state.
    starts: list[dict] = field(default_factory=list)
    # When the latest attempt's rank 0 began and reported (rayline/train/loop.py): the run's train phases.
    timeline: dict = field(default_factory=dict)


def loop_config(spec: PipelineSpec, data, plan: ResourcePlan, search_paths: list[str]) -> dict:
    """Everything a training worker needs, as plain data."""
    task = data.task
    return {
        "task": task,
        "epochs": spec.train.epochs,
        "batch_size": spec.train.batch_size,
        "precision": spec.train.precision,
        "grad_accumulation": spec.train.grad_accumulation,
        "grad_compression": spec.train.grad_compression.model_dump(),
        "strategy": spec.train.strategy,
        "optimizer": spec.train.optimizer.model_dump(),
        "metric": spec.resolved_metric(task),
        "seed": spec.data.split.seed,
        "threads": plan.threads_per_worker,
        "use_gpu": spec.train.use_gpu,  # xgboost: device cuda (torch and TF take the device Ray Train gives)
        "in_memory": spec.train.in_memory,  # how a worker holds its train shard (loop.py's shard_plan)
        "train_rows": data.rows["train"],  # xgboost: whether a worker's shard can be empty
        # xgboost: a worker's memory budget, when it reserves one (train.resources_per_worker.memory)
        "memory_per_worker": plan.worker_resources().get("memory"),
        # The fitted preprocessing when the train split comes as read (images: decoded in the workers,
        # never stored decoded by the data stage): rayline/train/loop.py's streamed_preprocessing.
        STREAMED: data.preprocessing.to_dict() if getattr(data, "train_streamed", False) else None,
        "arch": {
            "num_features": len(data.preprocessing.output_columns),
            "num_outputs": data.preprocessing.num_outputs,
            # Where image pixels and text token ids lie in a row, which positions are tabular: rayline/inference/torch_combined.py
            "input_schema": data.preprocessing.input_schema(),
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
    initial_checkpoint: str | None = None,
    keep_all_checkpoints: bool = False,
    in_process: bool | None = None,
) -> TrainResult:
    """Train `spec` on `data` with Ray Train; return the best checkpoint by the spec's metric.

    `initial_checkpoint`: a Train checkpoint (path or URI) that a NEW run starts from (weights
    and optimizer state; PBT's exploit, rayline.tune.handoff); a run that has checkpoints of its
    own restores its latest instead. `keep_all_checkpoints`: keep every checkpoint, not only
    the best and the latest (another trial may still start from one: PBT). `in_process`: whether
    it trains in this process (rayline.train.in_process), when the caller decided it already (a
    sweep's trial, whose relay of reports depends on it); None decides it here."""
    import ray.train

    from rayline.cluster.orphans import without_train_cleaner
    from rayline.train.splits import without_dataset_manager

    backend = load_backend(spec.model.framework)
    metric = spec.resolved_metric(data.task)
    mode = metric_mode(metric)
    run_config = ray.train.RunConfig(
        name=run_name,
        storage_path=storage_path,
        failure_config=ray.train.FailureConfig(max_failures=spec.train.max_failures, controller_failure_limit=START_RETRIES),
        checkpoint_config=ray.train.CheckpointConfig(
            num_to_keep=None if keep_all_checkpoints else checkpoint_keep, checkpoint_score_attribute=metric,
            checkpoint_score_order=mode
        ),
        callbacks=list(callbacks),
        worker_runtime_env={"env_vars": backend.worker_env()} if backend.worker_env() else None,
    )
    scaling = scaling_config(spec, plan)
    config = loop_config(spec, data, plan, list(search_paths))
    newest = set_aside_unreadable_snapshot(join(storage_path, run_name))
    if newest is not None:  # the run's record was lost mid-write: it goes on from its newest checkpoint
        initial_checkpoint = newest
    if initial_checkpoint:
        config["initial_checkpoint"] = initial_checkpoint  # Train V2 has no resume_from_checkpoint: the loop reads it
    # Small splits come as arrays the driver put in the object store (rayline/train/splits.py); the rest as datasets.
    arrays = getattr(data, "split_arrays", None) or {}
    if arrays:
        config[ARRAYS_KEY] = arrays
    datasets = {name: split for name, split in datasets_of(data).items() if name not in arrays}
    if in_process if in_process is not None else runs_in_process(spec, plan):
        # One CPU worker on a one-node Ray: here, without Train's controller and worker processes.
        os.environ.update(backend.worker_env())  # what the worker group's runtime_env sets (before the framework's import)
        stop = threading.Event()  # set on Ctrl-C: the loop stops at its next report
        _fit_interruptible(lambda: fit_in_process(
            backend.train_loop, config, datasets=datasets, storage_path=storage_path, run_name=run_name,
            checkpoint_config=run_config.checkpoint_config, callbacks=callbacks, max_failures=spec.train.max_failures,
            stop=stop), join(storage_path, run_name), on_interrupt=stop.set)
        return locate_best(join(storage_path, run_name), metric, mode)
    trainer = without_train_cleaner(without_dataset_manager(backend.make_trainer(
        loop_config=config,
        scaling_config=scaling,
        run_config=run_config,
        datasets=datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"] if "train" in datasets else []),
    )))
    try:
        _fit_interruptible(trainer.fit, join(storage_path, run_name))
    except ray.train.ControllerError as exc:
        if _is_start_timeout(exc):
            raise TrainingError(_placement_message(spec.train.workers, plan)) from exc
        raise TrainingError(f"training failed: {_root(exc)}") from exc
    except ray.train.TrainingFailedError as exc:
        raise TrainingError(f"training failed after {spec.train.max_failures} retries (train.max_failures): {_root(exc)}") from exc
    return locate_best(join(storage_path, run_name), metric, mode)


def datasets_of(data) -> dict:
    """The trainer's datasets: "train" (split over the workers), "valid" and, when the data stage
    took one, "probe" (unsplit: rayline/train/probe.py), which every backend predicts at each
    checkpoint with its live model."""
    from rayline.train.probe import PROBE_DATASET

    datasets = {"train": data.train, "valid": data.valid}
    if getattr(data, "probe", None) is not None:
        datasets[PROBE_DATASET] = data.probe
    return datasets


def scaling_config(spec: PipelineSpec, plan: ResourcePlan):
    """Ray Train V2's ScalingConfig for `spec.train` (one trial's, in a sweep) and the plan.

    Elastic `train.workers: {min, max}` is `num_workers=(min, max)`: Ray's
    ElasticScalingPolicy (ray/train/v2/_internal/execution/scaling_policy/elastic.py) starts
    with as many workers as the cluster's nodes hold (at least min), checks every
    `elastic_resize_monitor_interval_s` (60 s) whether more fit, and after a worker or node
    failure restarts with what still fits; each (re)start resumes from the latest checkpoint.
    `accelerator_type` makes every worker ask for 0.001 of the node resource
    `accelerator_type:<type>` (ray/air/config.py), so workers land only on such nodes.
    """
    import ray.train

    train_spec = spec.train
    workers = (train_spec.workers.min, train_spec.workers.max) if train_spec.elastic else train_spec.workers
    options: dict = {}
    if train_spec.accelerator_type is not None:
        options["accelerator_type"] = train_spec.accelerator_type
    if train_spec.use_tpu:
        options.update(use_tpu=True, topology=train_spec.tpu_topology)
    return ray.train.ScalingConfig(
        num_workers=workers,
        use_gpu=train_spec.use_gpu,
        resources_per_worker=plan.worker_resources(),
        **options,
    )


def _fit_interruptible(fit: Callable[[], object], run_dir: str, on_interrupt: Callable[[], None] | None = None):
    """`fit()` (a trainer's, or an in-process run's), raising InterruptedRun on Ctrl-C instead of
    returning as if it finished; `on_interrupt` is called first (an in-process run's stop).

    On the main thread Ray Train installs a SIGINT handler that aborts the run and then
    exits the process with status 0 (`sys.exit(0)` in its handler), or lets fit return;
    either way `rayline run` went on or "succeeded". Train skips that handler off the main
    thread (as inside a Tune trial), so fit runs on a helper thread and Ctrl-C stays a
    KeyboardInterrupt here. The Train controller is an actor owned by this driver: it and
    its workers end when the driver shuts Ray down or disconnects (the CLI does, at once).
    """
    if threading.current_thread() is not threading.main_thread():
        return fit()  # inside a Tune trial (Tune handles Ctrl-C) or a caller's thread
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = fit()
        except BaseException as exc:  # handed to the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="rayline-train-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except KeyboardInterrupt as exc:
        if on_interrupt is not None:
            on_interrupt()
        raise InterruptedRun(f"training interrupted; its latest checkpoint is saved in {run_dir}") from exc
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _is_start_timeout(exc) -> bool:
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError  # the only place Ray defines it

    return isinstance(getattr(exc, "controller_failure", None), WorkerGroupStartupTimeoutError)


def _placement_message(workers, plan: ResourcePlan) -> str:
    import ray

    timeout = float(os.environ.get(START_TIMEOUT_ENV) or _DEFAULT_START_TIMEOUT_S)
    if not isinstance(workers, int):
        # Elastic: Ray Train sized the group from its nodes' total resources, not what is free
        # now (ElasticScalingPolicy), so resources held by others can leave it short.
        workers = max(plan.start_workers, plan.min_workers, 1)
    need = {k: v for k, v in plan.worker_resources().items() if v}
    if plan.accelerator_type:
        need[f"accelerator_type:{plan.accelerator_type}"] = 0.001
    try:
        available, total = ray.available_resources(), ray.cluster_resources()
    except Exception:  # noqa: BLE001 - only for the message
        available, total = {}, {}
    have = ", ".join(f"{k} {available.get(k, 0):g} of {total.get(k, 0):g}" for k in need)
    asks = " + ".join(f"{v:g} {k}" for k, v in need.items())
    return (f"train.workers: the {workers} training workers ({asks} each) could not be placed: waited "
            f"{START_RETRIES + 1} x {timeout:g} s for {', '.join(f'{v * workers:g} {k}' for k, v in need.items())}; "
            f"the cluster has {have} available now (allowed: fewer workers or concurrent trials, free resources "
            f"held by other jobs or Serve apps, or raise {START_TIMEOUT_ENV} for a cluster that is still scaling up)")


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
        starts=latest.get("starts", []),
        timeline=latest.get("timeline", {}),
    )


_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train V2's record of registered checkpoints


def set_aside_unreadable_snapshot(run_dir: str) -> str | None:
    """Ray Train V2 writes its checkpoint manager's snapshot in place, not through a temporary
    file: a run interrupted while writing it left an empty file, and resuming the run then failed
    inside Train's controller ("CheckpointManagerInitializationError: Expecting value: line 1
    column 1"). Such a snapshot is renamed aside (SNAPSHOT + ".unreadable", kept for a look) and
    the run's newest complete checkpoint (one whose rayline state file reads) is returned, for the
    run to go on from as its initial checkpoint; None when the snapshot reads, or there is none."""
    from rayline.storage import exists, filesystem

    location = join(run_dir, _SNAPSHOT)
    if read_json(location) is not None or not exists(location):  # one read for a snapshot that reads
        return None
    fs, path = filesystem(location)
    fs.move(path, path + ".unreadable")
    # With no snapshot, every checkpoint_* of the run (the registered ones' fallback scan).
    newest = newest_complete_checkpoint(run_dir)
    return newest[0] if newest else None


def newest_complete_checkpoint(run_dir: str) -> tuple[str, dict] | None:
    """(path, rayline state) of the run's checkpoint with the highest epoch among those whose state
    file reads (one being written when the run was killed has none); None when there is none."""
    states = [(ckpt, read_state(ckpt)) for ckpt in _registered_checkpoints(run_dir)]
    complete = [(ckpt, state) for ckpt, state in states if state and "epoch" in state]
    return max(complete, key=lambda c: c[1]["epoch"]) if complete else None


def snapshot_checkpoints(run_dir: str) -> list[str] | None:
    """The checkpoint dirs Ray Train's controller has registered, from its snapshot only; None when
    the snapshot is missing, half-written or shaped otherwise (an older or newer Ray). The workers
    write a checkpoint's folder before the controller registers it: a folder is not a registration."""
    try:
        names = [r["checkpoint_dir_name"] for r in read_json(join(run_dir, _SNAPSHOT))["checkpoint_results"]]
    except (KeyError, TypeError):
        return None
    return [join(run_dir, name) for name in names]


def _registered_checkpoints(run_dir: str) -> list[str]:
    """The checkpoint dirs Ray Train's checkpoint manager kept; every checkpoint_* if it left no record.

    `run_dir` is a local path or a URI (the run's storage): read through rayline.storage."""
    registered = snapshot_checkpoints(run_dir)
    if registered is not None:
        return registered
    # Missing, or an older or newer Ray names or shapes this record differently: fall
    # back to scanning, which is right whenever no attempt died mid-checkpoint.
    return [join(run_dir, name) for name in list_names(run_dir) if name.startswith("checkpoint_")]


def _root(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    tail = [line for line in text if "Error" in line]
    return (tail[-1] if tail else (text[-1] if text else repr(exc)))[:500]
