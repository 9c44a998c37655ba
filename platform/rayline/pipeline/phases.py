"""Where a run's time went, phase by phase: kept in the run record (`phases`) and printed by
`rayline run --timings`.

The driver times its own stages (the CLI's start, Ray's start, data, train, register, report,
deploy, Ray's stop). Inside the train stage, the latest attempt's rank 0 keeps a timeline
(rayline/train/loop.py's EpochReporter: when its worker began, its first step, each epoch's
training loop and report), which splits the stage into:

- train_startup: from the stage's start to the worker's loop: Ray Train's controller, worker
  group, process group and dataset setup;
- train_worker_setup: the worker's model build, restore, valid rows and shard fetch, to its first epoch;
- train_first_step: the first epoch's first step (its first batch, the model's warm-up);
- train_epochs: the training loops of every epoch, the first step excepted;
- train_between_epochs: validation, the probe, checkpoints and reports;
- train_shutdown: from the last report to the stage's end: the last checkpoint's registration,
  Train's teardown, finding the best checkpoint.

Only for a run of one training (no sweep): in a sweep the trials overlap, so the stage is kept
whole, with the number of trials beside it. Wall-clock times from the worker and the driver are
compared, so on a multi-node cluster the split is as good as the nodes' clocks agree.
"""

from __future__ import annotations

__all__ = ["PHASES", "train_phases", "format_phases"]

# In the order a run goes through them; a run has those that applied to it.
PHASES = ("cli_start", "ray_start", "data", "train", "train_startup", "train_worker_setup", "train_first_step", "train_epochs",
          "train_between_epochs", "train_shutdown", "register", "report", "deploy", "ray_stop")


def train_phases(stage_started_at: float, stage_ended_at: float, timeline: dict) -> dict[str, float]:
    """The train stage split by the latest attempt's timeline (wall-clock `time.time()` values);
    {} when the timeline is missing (a checkpoint from an older rayline)."""
    timeline = timeline or {}
    reports, started, loop_at = timeline.get("reports") or [], timeline.get("started_at"), timeline.get("loop_at")
    if not (started and loop_at and reports):
        return {}
    trained = sum(r.get("train_s") or 0.0 for r in reports)
    first_step = float(timeline.get("first_step_s") or 0.0)
    return {
        "train_startup": max(0.0, started - stage_started_at),
        "train_worker_setup": max(0.0, loop_at - started),
        "train_first_step": first_step,
        "train_epochs": max(0.0, trained - first_step),
        "train_between_epochs": max(0.0, reports[-1]["at"] - loop_at - trained),
        "train_shutdown": max(0.0, stage_ended_at - reports[-1]["at"]),
    }


def format_phases(phases: dict[str, float]) -> list[tuple[str, str]]:
    """(phase, seconds) rows in run order for a table; train's parts indented under it."""
    rows = []
    for name in PHASES:
        if name not in phases:
            continue
        label = ("  " + name.removeprefix("train_").replace("_", " ")) if name.startswith("train_") else name.replace("_", " ")
        rows.append((label, f"{phases[name]:.1f}"))
    if "total" in phases:
        rows.append(("total", f"{phases['total']:.1f}"))
    return rows
