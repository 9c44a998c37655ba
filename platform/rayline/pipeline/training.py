"""The train stage: one Ray Train run, or a Ray Tune sweep whose trials each train one, sized by
a resource plan made before anything starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from rayline.spec import PipelineSpec

__all__ = ["Trained", "plan_training", "train_stage"]

log = logging.getLogger(__name__)


@dataclass
class Trained:
    winner: object  # TrainResult: the best trial's (or the one run's) result
    trials: list  # TrialOutcome, every trial (one for a plain training run)
    data: object  # PreparedData: the winner's own preprocessing variant
    tensorboard: str | None  # the run's TensorBoard event files, one directory per trial


def plan_training(spec: PipelineSpec):
    """The ResourcePlan for the spec's training on the connected cluster, sized for the largest
    train.workers a trial can draw: every draw then fits, and one that never could fails here,
    before anything starts, naming the resource."""
    import ray

    from rayline.pipeline.plan import plan_when_settled
    from rayline.train.resources import plan_resources
    from rayline.tune.clock import max_workers
    from rayline.tune.sweep import TRIAL_DRIVER_CPUS

    concurrency = spec.tune.max_concurrent if spec.tune else 1

    def for_training(resources: dict) -> dict:
        resources = dict(resources)
        if spec.tune:
            resources["CPU"] = resources.get("CPU", 0) - TRIAL_DRIVER_CPUS * concurrency
        return resources

    return plan_when_settled(
        lambda available: plan_resources(spec.train, available, concurrency, max_workers=max_workers(spec)),
        lambda: for_training(ray.available_resources()), lambda: for_training(ray.cluster_resources()))


def _units_text(spec: PipelineSpec) -> str:
    """What the run trains at most, in its framework's units: "8 epochs", or xgboost's "500
    boosting rounds" (model.params.num_boost_round; train.epochs only when that is not set)."""
    from rayline.frameworks import BACKENDS, total_units

    units = total_units(spec.model.framework, spec.model.params, spec.train.epochs)
    return f"{units} {BACKENDS[spec.model.framework].units}"


def train_stage(spec: PipelineSpec, prepared: list, *, plan, folder: str, runs_dir: str, experiment: str,
                search_paths: list[str], resume: bool, on_stage: Callable[[str, str, str], None]) -> Trained:
    """Train (or sweep) on the prepared data; `resume`: continue the interrupted run saved under the
    same names (Tune's state, or Train's latest checkpoint)."""
    import ray

    from rayline.cluster.orphans import sweep_in_background
    from rayline.storage import join
    from rayline.train.hardware import cluster_accelerators, plan_text
    from rayline.train.in_process import as_one_process, one_process_reason, runs_in_process
    from rayline.train.run import datasets_of, train
    from rayline.train.splits import hand_off
    from rayline.tune.sweep import TrialOutcome, tune_pipeline

    # Small splits go to the workers as arrays, put once here for every trial (rayline/train/splits.py).
    for variant in prepared:
        variant.split_arrays = hand_off(variant, spec.train.in_memory, datasets_of(variant))
    data = prepared[0]
    # N CPU workers of a small run train as one process of N threads (rayline/train/in_process.py).
    one_process = one_process_reason(spec, plan, data.rows["train"])
    if one_process:
        spec, plan = as_one_process(spec, plan)
    resources = plan_text(plan, cluster_accelerators(ray.cluster_resources()) if plan.gpus_per_worker else ())
    if runs_in_process(spec, plan):  # no Train worker group (rayline/train/in_process.py): said where it trains
        resources += ", each in its trial's process" if spec.tune else ", in this process"
        if one_process:
            resources += f" ({one_process})"
    if spec.tune:
        on_stage("train", "start", f"{'resuming ' if resume else ''}tuning: {spec.tune.num_samples} trials, "
                 f"{plan.concurrent_trials} at once, {resources}{technique_text(spec, plan)}")
        outcome = tune_pipeline(spec, prepared if len(prepared) > 1 else data, storage_path=runs_dir,
                                experiment=experiment, plan=plan, search_paths=search_paths, resume=resume)
        winner, trials = outcome.winner, outcome.trials
        data = prepared[outcome.winner_variant]  # the winner's own preprocessing is the one registered
    else:
        on_stage("train", "start", f"{'resuming: ' if resume else ''}{resources}, {_units_text(spec)}"
                 f"{technique_text(spec, plan)}")
        # Same storage path and name as the interrupted run: Ray Train restores its latest checkpoint.
        winner = train(spec, data, storage_path=folder, run_name="train", plan=plan, search_paths=search_paths)
        trials = [TrialOutcome(trial_id="train", overrides={}, status="terminated", result=winner)]
    tensorboard = _event_files(join(folder, "tensorboard"), trials)
    # Trials Tune stopped as the sweep ended: their groups appear a moment after fit()
    # returns; freed in the background while the winner is registered and served.
    sweep_in_background()
    metric = spec.resolved_metric(data.task)
    on_stage("train", "done", f"best {metric}={winner.metrics[metric]:.4f} (epoch {winner.metrics['epoch']:g})")
    return Trained(winner, trials, data, tensorboard)


def _event_files(location: str, trials: list) -> str | None:
    """TensorBoard event files of every trial's history; a failure is a warning, never a failed run."""
    from rayline.train.event_files import write_event_files

    try:
        return write_event_files(location, trials)
    except Exception as exc:  # noqa: BLE001 - the model is trained either way
        log.warning("rayline: TensorBoard event files were not written to %s: %s", location, exc)
        return None


def technique_text(spec: PipelineSpec, plan) -> str:
    """', DDP, bf16, effective batch 256 (64 x 4 micro-batches), fp16 gradient compression' for the
    train stage's start line: how the workers train together and in which precision, always, and
    the techniques that are on."""
    from rayline.train.hardware import spec_strategy_text

    train = spec.train
    parts = [spec_strategy_text(spec, max(plan.max_workers, plan.start_workers, plan.min_workers))]
    if train.grad_accumulation > 1:
        parts.append(f"effective batch {train.effective_batch_size} ({train.batch_size} x {train.grad_accumulation} micro-batches)")
    if train.grad_compression.name != "none":
        parts.append(f"{train.grad_compression} gradient compression")
    return "".join(f", {p}" for p in parts)
