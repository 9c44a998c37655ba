"""What the scheduler decided about each trial of a finished sweep: why it ended, how many units it
trained, and its events (PBT's exploits), from what Tune and the scheduler recorded."""

from __future__ import annotations

from rayline.tune.handoff import exploits_from_runs
from rayline.tune.schedulers import TIME_ATTR

__all__ = ["stop_reason", "trial_decisions"]


def stop_reason(*, error: bool, done: bool, units_reported: float | None, max_units: int | None,
                stopped_by_scheduler: bool, budget_hit: bool) -> str:
    """Why a trial ended (rayline.tune.sweep.STOP_REASONS), from what Tune and the scheduler recorded.

    `done`: Tune's last result has done=True: the trial's function returned, or a scheduler
    stopped it there (Tune marks that result done too). ASHA also stops a trial that reached
    max_t, so a trial whose clock reached the most units any trial trains counts as completed
    whoever stopped it.
    """
    if error:
        return "error"
    if units_reported is not None and max_units is not None and units_reported >= max_units - 1e-9:
        return "completed"
    if stopped_by_scheduler:
        return "early_stopped"
    if done:  # Tune also sets done on a result the scheduler stopped the trial at: checked after
        return "completed"
    if budget_hit:
        return "time_budget"
    return "early_stopped"  # stopped before an interruption, in a resumed sweep: the scheduler's doing


def trial_decisions(scheduler, result, best, *, trial_id: str, runs_dir: str, max_units: int, budget_hit: bool) -> dict:
    """TrialOutcome's stop_reason, units_trained and events for one trial of a finished sweep.

    `scheduler`: the Ray scheduler `build` made (None for a resumed sweep, whose decisions
    before the interruption were not recorded here); `result`: the trial's Tune Result;
    `best`: its TrainResult (None when it reported nothing).
    """
    last = result.metrics or {}
    history = best.history if best is not None else []
    units = max((int(row["epoch"]) + 1 for row in history if "epoch" in row), default=None)
    if units is None and last.get("epoch") is not None:
        units = int(last["epoch"]) + 1
    stopped = getattr(scheduler, "rayline_stopped", {})
    events = list(getattr(scheduler, "rayline_events", {}).get(trial_id, []))
    if not events and scheduler is None:
        events = exploits_from_runs(runs_dir, trial_id)
    reason = stop_reason(error=result.error is not None, done=bool(last.get("done")), units_reported=last.get(TIME_ATTR),
                         max_units=max_units, stopped_by_scheduler=trial_id in stopped, budget_hit=budget_hit)
    return {"stop_reason": reason, "units_trained": units if units is not None else 0, "events": events}
