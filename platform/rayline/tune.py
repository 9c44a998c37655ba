"""The tune stage: Ray Tune over dotted spec paths, each trial a full Ray Train run.

With Train V2, Tune runs a driver function per trial that builds and fits the trainer
(`TuneReportCallback` forwards each epoch's metrics for ASHA). Tune never receives the
Train checkpoint, so the winner's checkpoint is located from the trial's own Train run
directory (`train.run.locate_best`), which also works for trials ASHA stopped early.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from rayline.errors import TrainingError
from rayline.resources import ResourcePlan
from rayline.spec import PipelineSpec, apply_overrides, metric_mode
from rayline.train.run import TrainResult, locate_best, train

__all__ = ["TrialOutcome", "TuneResult", "search_space", "tune_pipeline", "TRIAL_DRIVER_CPUS"]

log = logging.getLogger(__name__)

# A trial's own driver only waits on its Train run; it gets a sliver of a CPU so that
# concurrent trials are limited by the plan, not by driver processes.
TRIAL_DRIVER_CPUS = 0.01


@dataclass
class TrialOutcome:
    trial_id: str
    overrides: dict
    status: str  # terminated (finished or stopped early by the scheduler) | error
    result: TrainResult | None = None
    error: str | None = None


@dataclass
class TuneResult:
    winner: TrainResult
    trials: list[TrialOutcome] = field(default_factory=list)


def search_space(spec: PipelineSpec) -> dict[str, Any]:
    """Tune's param_space from `tune.space` (dotted paths stay flat keys)."""
    from ray import tune

    space = {}
    for path, dist in spec.tune.space.items():
        (kind, args), = dist.items()
        if spec.tune.search == "grid" or kind == "grid":
            space[path] = tune.grid_search(list(args))
        elif kind == "loguniform":
            space[path] = tune.loguniform(*args)
        elif kind == "uniform":
            space[path] = tune.uniform(*args)
        elif kind == "randint":
            space[path] = tune.randint(args[0], args[1] + 1)  # rayline's bounds are inclusive
        else:
            space[path] = tune.choice(list(args))
    return space


def _num_samples(spec: PipelineSpec) -> int:
    # A grid is complete in one pass; repeat it only when the user asked for repeats.
    if spec.tune.search == "grid" and "num_samples" not in spec.tune.model_fields_set:
        return 1
    return spec.tune.num_samples


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _trial(config: dict, *, spec_raw: dict, data, storage_path: str, plan: ResourcePlan, search_paths: list[str]):
    """One trial: the spec with this trial's overrides, trained by Ray Train."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from rayline.spec import parse_spec

    trial_id = tune.get_context().get_trial_id()
    spec = apply_overrides(parse_spec(spec_raw), {k: _plain(v) for k, v in config.items()})
    train(
        spec,
        data,
        storage_path=storage_path,
        run_name=f"trial-{trial_id}",
        plan=plan,
        search_paths=search_paths,
        callbacks=[TuneReportCallback()],
    )


def tune_pipeline(
    spec: PipelineSpec,
    data,
    *,
    storage_path: str,
    experiment: str,
    plan: ResourcePlan,
    search_paths: list[str] = (),
) -> TuneResult:
    """Run the sweep; return every trial's outcome and the winner by the spec's metric."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    metric = spec.resolved_metric(data.task)
    mode = metric_mode(metric)
    runs_dir = os.path.join(storage_path, experiment)
    trainable = tune.with_parameters(
        _trial,
        spec_raw=spec.model_dump(by_alias=True, exclude_none=True),
        data=data,
        storage_path=runs_dir,
        plan=plan,
        search_paths=list(search_paths),
    )
    trainable = tune.with_resources(trainable, {"CPU": TRIAL_DRIVER_CPUS})
    scheduler = (
        ASHAScheduler(time_attr="training_iteration", max_t=max(1, spec.train.epochs), grace_period=1, reduction_factor=2)
        if spec.tune.scheduler == "asha"
        else FIFOScheduler()
    )
    tuner = tune.Tuner(
        trainable,
        param_space=search_space(spec),
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=_num_samples(spec),
            scheduler=scheduler,
            # The limit goes to the generator itself: Tune ignores `max_concurrent_trials`
            # (with only a warning) when the search algorithm is a BasicVariantGenerator.
            search_alg=BasicVariantGenerator(max_concurrent=plan.concurrent_trials, random_state=spec.data.split.seed),
        ),
        run_config=tune.RunConfig(name=f"{experiment}-tune", storage_path=storage_path, verbose=0),
    )
    grid = _fit_keeping_sigint(tuner)

    trials: list[TrialOutcome] = []
    for result in grid:
        trial_id = _trial_id(result) or "unknown"
        overrides = {k: _plain(v) for k, v in (result.config or {}).items()}
        run_dir = os.path.join(runs_dir, f"trial-{trial_id}")
        try:
            best = locate_best(run_dir, metric, mode)
            best.overrides = overrides
        except TrainingError:
            best = None
        if result.error is not None:
            status, error = "error", str(result.error).strip().splitlines()[-1][:300]
        else:
            status, error = "terminated", None  # finished, or stopped early by the scheduler
        trials.append(TrialOutcome(trial_id=trial_id, overrides=overrides, status=status, result=best, error=error))

    scored = [t for t in trials if t.result is not None and metric in t.result.metrics]
    if not scored:
        errors = "; ".join(f"trial {t.trial_id}: {t.error}" for t in trials if t.error) or "no trial reported a metric"
        raise TrainingError(f"every tuning trial failed: {errors}")
    sign = 1 if mode == "max" else -1
    winner = max(scored, key=lambda t: sign * t.result.metrics[metric])
    log.info("tune winner %s with %s=%s", winner.trial_id, metric, winner.result.metrics[metric])
    return TuneResult(winner=winner.result, trials=trials)


def _trial_id(result) -> str | None:
    metrics = result.metrics or {}
    if metrics.get("trial_id"):
        return metrics["trial_id"]
    df = getattr(result, "metrics_dataframe", None)
    if df is not None and "trial_id" in df.columns and len(df):
        return str(df["trial_id"].iloc[-1])
    return None


def _fit_keeping_sigint(tuner):
    """`tuner.fit()`, then give SIGINT back to whoever had it.

    Tune installs its own SIGINT handler ("Stop signal received, ending Ray Tune run") and
    leaves it there, so Ctrl-C on `rayline run`, serving after the sweep, would be swallowed.
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit()  # Tune cannot install signal handlers off the main thread either
    previous = signal.getsignal(signal.SIGINT)
    try:
        return tuner.fit()
    finally:
        signal.signal(signal.SIGINT, previous)

