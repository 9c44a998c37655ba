"""The tune stage: Ray Tune over dotted spec paths, each trial a full Ray Train run.

With Train V2, Tune runs a driver function per trial that builds and fits the trainer
(a relay, rayline/tune/relay.py, forwards each epoch's metrics for ASHA). Tune never receives the
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

from rayline.errors import InterruptedRun, RaylineError, TrainingError
from rayline.train.resources import ResourcePlan
from rayline.spec.pipeline_spec import PipelineSpec, metric_mode
from rayline.storage import join
from rayline.train.run import TrainResult, train
from rayline.tune.clock import clock_scale, total_units

__all__ = [
    "STOP_REASONS",
    "TrialOutcome",
    "TuneResult",
    "search_space",
    "tune_pipeline",
    "TRIAL_DRIVER_CPUS",
    "tune_dir",
    "reuses_trial_processes",
]

log = logging.getLogger(__name__)

# A trial's own driver only waits on its Train run; it gets a sliver of a CPU so that
# concurrent trials are limited by the plan, not by driver processes.
TRIAL_DRIVER_CPUS = 0.01


# Why a trial ended (TrialOutcome.stop_reason), for the summary, MLflow and the sweep report.
STOP_REASONS = ("completed", "early_stopped", "time_budget", "error")


@dataclass
class TrialOutcome:
    trial_id: str
    overrides: dict
    status: str  # terminated (finished or stopped early by the scheduler) | error
    result: TrainResult | None = None
    error: str | None = None
    # completed: trained every unit; early_stopped: the scheduler (ASHA, median stopping) cut
    # it; time_budget: tune.time_budget_s ran out; error.
    stop_reason: str = "completed"
    units_trained: int | None = None  # epochs (boosting rounds for xgboost) it trained
    # The scheduler's decisions about this trial, in order, e.g. PBT's
    # {"unit": 4, "kind": "exploit", "from_trial": "ab12_00001", "config": {path: value}}.
    events: list[dict] = field(default_factory=list)
    family: str | None = None  # "torch/mlp", "xgboost/gbdt": which model family it trained


@dataclass
class TuneResult:
    winner: TrainResult
    trials: list[TrialOutcome] = field(default_factory=list)
    winner_variant: int = 0  # which preprocessing variant (PipelineSpace.variants()) the winner trained on


def search_space(spec: PipelineSpec) -> dict[str, Any]:
    """Tune's param_space from `tune.space` (dotted paths stay flat keys).

    Preprocessing paths and a choice of model families become index keys (`data`, `model`,
    `model[i].params.<p>`: rayline.spec.pipeline_space); `PipelineSpace.overrides` maps a
    trial's config back to spec paths."""
    from ray import tune

    from rayline.spec.pipeline_space import PipelineSpace

    space = {}
    for path, dist in PipelineSpace(spec).flat().items():
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


def tune_dir(storage_path: str, experiment: str) -> str:
    """Where Tune keeps the sweep's state (what `Tuner.restore` reads)."""
    return join(storage_path, f"{experiment}-tune")


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

    from rayline.spec.loading import parse_spec
    from rayline.spec.pipeline_space import PipelineSpace

    sweep = parse_spec(spec_raw)
    space = PipelineSpace(sweep)
    from rayline.spec.overrides import apply_overrides

    spec = apply_overrides(sweep, space.overrides({k: _plain(v) for k, v in config.items()}))
    # Trials share the data stage's output: one prepared dataset per preprocessing variant.
    data = data[space.variant_index(config)] if isinstance(data, list) else data
    scale = clock_scale(sweep, spec)

    trial_id = tune.get_context().get_trial_id()
    if sweep.tune.scheduler.scheduler.hands_off_checkpoints:
        # PBT: the trial reports Tune checkpoints that restart it from another trial's Train
        # checkpoint under a new Train run (rayline/tune/handoff.py).
        from rayline.tune.handoff import train_with_handoff

        train_with_handoff(spec, data, storage_path=storage_path, trial_id=trial_id, plan=plan,
                           search_paths=search_paths, scale=scale)
        return
    from rayline.train.in_process import runs_in_process
    from rayline.tune.relay import CHECKPOINT_PATH_KEY, train_relaying_reports

    # The Train run's name is the trial's id: a trial resumed after an interruption
    # (`Tuner.restore`) runs under the same id, so Train restores its latest checkpoint.
    in_process = runs_in_process(spec, plan)  # decided once: the relay and the Train run must agree

    def run_train(callbacks):
        train(spec, data, storage_path=storage_path, run_name=f"trial-{trial_id}", plan=plan,
              search_paths=search_paths, callbacks=callbacks, in_process=in_process)

    reports: list[dict] = []

    def report(metrics: dict, path: str | None) -> None:
        # Metrics only, as Tune's own TuneReportCallback reports them (with the checkpoint's path):
        # the winner's checkpoint is found in the trial's Train run directory.
        reports.append(metrics)
        tune.report({**metrics, CHECKPOINT_PATH_KEY: path} if path else metrics)

    # Not Tune's TuneReportCallback: its last report can deadlock the trial (rayline/tune/relay.py).
    train_relaying_reports(run_train, scale=scale, report=report, name=trial_id, in_process=in_process)
    if not reports:
        _report_finished_checkpoint(join(storage_path, f"trial-{trial_id}"), scale, report)


def _report_finished_checkpoint(run_dir: str, scale: float, report) -> None:
    """A resumed trial whose Train run had checkpointed its last epoch before the sweep was killed
    (Tune had not yet recorded the trial's end) restores there, trains nothing and reports nothing;
    Tune then ends it with a result that lacks the sweep's metric and the whole resume failed ("Trial
    returned a result which did not include the specified metric(s)", seen once in the suite's
    kill-then-resume test). Its newest complete checkpoint's metrics are reported again instead."""
    from rayline.train.run import newest_complete_checkpoint
    from rayline.tune.relay import with_clock

    newest = newest_complete_checkpoint(run_dir)
    if newest and newest[1].get("metrics"):
        report(with_clock(dict(newest[1]["metrics"]), scale), newest[0])


def tune_pipeline(
    spec: PipelineSpec,
    data,
    *,
    storage_path: str,
    experiment: str,
    plan: ResourcePlan,
    search_paths: list[str] = (),
    resume: bool = False,
) -> TuneResult:
    """Run the sweep; return every trial's outcome and the winner by the spec's metric.

    `resume`: continue the interrupted sweep saved under `tune_dir(storage_path, experiment)`
    (finished trials keep their results; unfinished and errored ones continue from their
    latest Train checkpoint). Raises InterruptedRun when Ctrl-C stopped the sweep.
    """
    from ray import tune
    import time

    from rayline.tune.decisions import trial_decisions
    from rayline.tune.handoff import locate_trial_best
    from rayline.tune.searchers import SEARCHERS

    from rayline.cluster.orphans import ReleaseOrphansCallback
    from rayline.tune.resume import SaveOnTrialEnd

    from rayline.spec.pipeline_space import PipelineSpace, family_label

    space = PipelineSpace(spec)
    # `data`: one PreparedData, or a list of them, one per preprocessing variant (in
    # `space.variants()` order); every variant has the same task and rows.
    metric = spec.resolved_metric((data[0] if isinstance(data, list) else data).task)
    mode = metric_mode(metric)
    runs_dir = join(storage_path, experiment)  # a path or a URI: rayline.storage reads both
    trainable = tune.with_parameters(
        _trial,
        spec_raw=spec.model_dump(by_alias=True, exclude_none=True),
        data=data,
        storage_path=runs_dir,
        plan=plan,
        search_paths=list(search_paths),
    )
    trainable = tune.with_resources(trainable, {"CPU": TRIAL_DRIVER_CPUS})
    path = tune_dir(storage_path, experiment)
    reuse = reuses_trial_processes(spec, plan)
    if resume:
        if not tune.Tuner.can_restore(path):
            raise RaylineError(f"--resume: no saved sweep state in {path} (allowed: run without --resume to start over)")
        # Tune restores its own scheduler, searcher and trial list from the saved state;
        # the trainable (fresh datasets and plan) and the unchanged space are ours to give.
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                   param_space=search_space(spec))
    else:
        # tune.scheduler and tune.search: one class each (rayline/tune/schedulers.py, searchers.py).
        scheduler = spec.tune.scheduler.scheduler.build(spec, spec.tune.scheduler.params, max_units=total_units(spec),
                                                        metric=metric, mode=mode)
        tuner = tune.Tuner(
            trainable,
            param_space=search_space(spec),
            tune_config=tune.TuneConfig(
                metric=metric,
                mode=mode,
                num_samples=_num_samples(spec),
                scheduler=scheduler,
                # The limit goes to the search algorithm itself: Tune ignores `max_concurrent_trials`
                # (with only a warning) when the search algorithm is a BasicVariantGenerator.
                search_alg=SEARCHERS[spec.tune.search].build(spec, metric=metric, mode=mode,
                                                             concurrency=plan.concurrent_trials),
                # Tune stops every trial when it runs out (TimeoutStopper); not an interruption.
                time_budget_s=spec.tune.time_budget_s,
                # Trials that train in their own process hand it on to the next trial: its imports
                # (rayline, Ray Train, the framework) are paid once, not once a trial.
                reuse_actors=reuse,
            ),
            # ReleaseOrphansCallback: a killed trial's Train placement group is freed for the next.
            # SaveOnTrialEnd: a trial's end is saved before the next trial starts, so a killed
            # driver's sweep never runs a finished trial again on resume (rayline/tune/resume.py).
            run_config=tune.RunConfig(name=os.path.basename(path), storage_path=storage_path, verbose=0,
                                      callbacks=[SaveOnTrialEnd(), ReleaseOrphansCallback()]),
        )
    if resume:
        scheduler = None  # Tune's restored one: its record of decisions is not ours to read
    started = time.monotonic()
    grid, interrupted = _fit_watching_sigint(tuner)
    budget_hit = bool(spec.tune.time_budget_s) and time.monotonic() - started >= spec.tune.time_budget_s
    unfinished = len(grid) - grid.num_terminated - grid.num_errors
    if interrupted or unfinished:
        # Tune's SIGINT handler ends fit() normally, with the cut-off trials' results looking
        # final: their best so far is no winner. Tune saved the sweep's state on the way out.
        # (Counting them is no use: Tune marks the cut-off trials TERMINATED in memory; its
        # saved state, which resume reads, has them RUNNING.)
        raise InterruptedRun(f"tuning interrupted: the sweep's state ({len(grid)} trials) is saved in {path}")

    trials: list[TrialOutcome] = []
    variant_of: dict[str, int] = {}
    max_units = total_units(spec)  # the scheduler's clock at its end: a trial there trained every unit
    for result in grid:
        trial_id = _trial_id(result) or "unknown"
        config = {k: _plain(v) for k, v in (result.config or {}).items()}
        overrides = space.overrides(config)  # by spec path: what the trial trained, as MLflow records it
        try:
            # Its own Train run, and any PBT restarted it under (rayline/tune/handoff.py).
            best = locate_trial_best(runs_dir, trial_id, metric, mode)
            best.overrides = overrides
        except TrainingError:
            best = None
        if result.error is not None:
            status, error = "error", str(result.error).strip().splitlines()[-1][:300]
        else:
            status, error = "terminated", None  # finished, or stopped early by the scheduler
        trials.append(TrialOutcome(trial_id=trial_id, overrides=overrides, status=status, result=best, error=error,
                                   family=family_label(overrides.get("model", spec.model)),
                                   # stop_reason, units_trained, events: what the scheduler decided
                                   **trial_decisions(scheduler, result, best, trial_id=trial_id, runs_dir=runs_dir,
                                                     max_units=max_units, budget_hit=budget_hit)))
        variant_of[trial_id] = space.variant_index(config)

    scored = [t for t in trials if t.result is not None and metric in t.result.metrics]
    if not scored and budget_hit:
        raise TrainingError(f"tune.time_budget_s: the sweep's {spec.tune.time_budget_s:g} s ran out before any trial "
                            "reported a metric (allowed: a longer budget; a trial's first report comes after its "
                            "Train run starts and one epoch or round trains)")
    if not scored:
        errors = "; ".join(f"trial {t.trial_id}: {t.error}" for t in trials if t.error) or "no trial reported a metric"
        raise TrainingError(f"every tuning trial failed: {errors}")
    sign = 1 if mode == "max" else -1
    winner = max(scored, key=lambda t: sign * t.result.metrics[metric])
    log.info("tune winner %s with %s=%s", winner.trial_id, metric, winner.result.metrics[metric])
    return TuneResult(winner=winner.result, trials=trials, winner_variant=variant_of.get(winner.trial_id, 0))


def reuses_trial_processes(spec: PipelineSpec, plan: ResourcePlan) -> bool:
    """Whether the sweep's trials share their processes (Tune's `reuse_actors`): when every trial trains
    in its trial's process (one worker, in process). A trial with a Train worker group of its own
    keeps a fresh process: a stopped trial's Train controller is that process's child and ends with it,
    which frees its workers for the next trial. PBT restarts trials from checkpoints under new Train
    runs (rayline/tune/handoff.py): fresh processes too."""
    from rayline.train.in_process import runs_in_process, space_keeps_process

    if spec.tune.scheduler.scheduler.hands_off_checkpoints:
        return False
    return runs_in_process(spec, plan) and space_keeps_process(spec)


def _trial_id(result) -> str | None:
    metrics = result.metrics or {}
    if metrics.get("trial_id"):
        return metrics["trial_id"]
    df = getattr(result, "metrics_dataframe", None)
    if df is not None and "trial_id" in df.columns and len(df):
        return str(df["trial_id"].iloc[-1])
    return None


def _drop_restore_advice(record: logging.LogRecord) -> bool:
    return "Tuner.restore(" not in record.getMessage()


def _fit_watching_sigint(tuner):
    """`tuner.fit()` -> (ResultGrid, whether Ctrl-C interrupted it); SIGINT handlers restored after.

    Tune installs its own SIGINT (and SIGUSR1) handler inside fit ("Stop signal received,
    ending Ray Tune run"): the first signal stops the trials, saves the sweep's state and
    puts back the handler that was there before fit, then fit returns normally. Nothing
    public says it was interrupted, so we install a handler of ours first: Tune hands the
    signal back to it only after its own handler ran, which is how we know. A second Ctrl-C
    while Tune is stopping reaches ours, which stops at once (KeyboardInterrupt). Tune also
    leaves its handler in place after a normal end; without the restore, Ctrl-C on
    `rayline run` serving after the sweep would be swallowed.
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit(), False  # no signal handlers off the main thread (Tune's neither)
    signals = [signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    previous = {sig: signal.getsignal(sig) for sig in signals}
    received = threading.Event()

    def ours(signum, frame):
        received.set()
        raise KeyboardInterrupt

    for sig in signals:
        signal.signal(sig, ours)
    # Tune's own "Resume experiment with: Tuner.restore(...)" is Python users' advice;
    # rayline's message names `rayline run ... --resume` instead.
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addFilter(_drop_restore_advice)
    tune_handles = not int(os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") or 0)
    try:
        grid = tuner.fit()
        handed_back = signal.getsignal(signal.SIGINT) is ours or (
            hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) is ours)
    except KeyboardInterrupt as exc:
        raise InterruptedRun("tuning interrupted (stopped at once by a second Ctrl-C)") from exc
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        tune_log.removeFilter(_drop_restore_advice)
    return grid, received.is_set() or (tune_handles and handed_back)

