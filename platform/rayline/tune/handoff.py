"""PBT's checkpoint handoff between the Ray Train runs of Ray Tune trials.

Tune's population based training exploits by restarting a worse trial from a better
trial's Tune checkpoint. With Train V2 inside Tune, a trial is a driver function running a
Train run, and Tune's own `TuneReportCallback` forwards metrics only, so a trial under a
scheduler that hands off checkpoints (`Scheduler.hands_off_checkpoints`) reports to Tune
itself: a relay callback in the Train controller passes each report (metrics and the Train
checkpoint's path) to the trial function, which reports it to Tune with a tiny Tune
checkpoint, `rayline_handoff.json`, that points at that Train checkpoint.

A restarted trial reads `tune.get_checkpoint()`:
- its own handoff (Tune paused it): it continues its own Train run by name, and Ray Train
  restores that run's latest checkpoint;
- another trial's (PBT exploited it): it starts a NEW Train run,
  `trial-<id>-from-<donor>-u<units>`, whose workers start from the donor's Train checkpoint
  (weights and optimizer state; `EpochReporter(initial_checkpoint)`), with the trial's new
  config (its lr etc. override the optimizer state's saved ones). Train V2 restores a run's
  own latest checkpoint by name, so reusing `trial-<id>` would silently continue the
  trial's own weights. The name is deterministic: a sweep resumed mid-restart continues
  that same run.

The donor's Train checkpoint must outlive the exploit: under such a scheduler every Train
checkpoint is kept (`train(keep_all_checkpoints=True)`); a trial's best is found across all
of its runs (`locate_trial_best`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from rayline.errors import TrainingError
from rayline.storage import join, list_names
from rayline.train.run import TrainResult, locate_best

__all__ = ["HANDOFF_FILE", "run_for", "train_with_handoff", "trial_runs", "locate_trial_best", "exploits_from_runs"]

HANDOFF_FILE = "rayline_handoff.json"
_FROM = re.compile(r"^-from-(?P<donor>.+)-u(?P<units>\d+)$")


def run_for(trial_id: str, handoff: dict | None) -> tuple[str, str | None]:
    """(Train run name, Train checkpoint to start from) for a trial (re)started with `handoff`."""
    own = f"trial-{trial_id}"
    if not handoff or not handoff.get("train_checkpoint"):
        return own, None
    if handoff.get("trial_id") == trial_id:
        return handoff.get("run_name") or own, None  # continue its own run: Train restores it by name
    return f"{own}-from-{handoff['trial_id']}-u{int(handoff['epoch']) + 1}", handoff["train_checkpoint"]


def _restored_handoff() -> dict | None:
    from ray import tune

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as local:
        try:
            with open(os.path.join(local, HANDOFF_FILE)) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None


def train_with_handoff(spec, data, *, storage_path: str, trial_id: str, plan, search_paths: list[str], scale: float = 1.0):
    """A trial's training under a scheduler that hands off checkpoints (PBT): see the module doc.
    Its reports reach Tune from this thread (rayline/tune/relay.py)."""
    from ray import tune

    from rayline.train.run import train
    from rayline.train.in_process import runs_in_process
    from rayline.tune.relay import train_relaying_reports

    handoff = _restored_handoff()
    run_name, initial = run_for(trial_id, handoff)

    in_process = runs_in_process(spec, plan)  # decided once: the relay and the Train run must agree

    def run_train(callbacks):
        train(spec, data, storage_path=storage_path, run_name=run_name, plan=plan, search_paths=search_paths,
              callbacks=callbacks, initial_checkpoint=initial, keep_all_checkpoints=True, in_process=in_process)

    def report(metrics: dict, path: str | None) -> None:
        if path is None or int(metrics.get("epoch", -1)) + 1 >= spec.train.epochs:
            # The last epoch's report carries no handoff: PBT would restart a finished trial
            # from it (a new Train run that trains nothing) or copy it into a trial that has
            # no epochs left either.
            tune.report(metrics)
            return
        tmp = tempfile.mkdtemp(prefix="rayline-handoff-")
        try:
            with open(os.path.join(tmp, HANDOFF_FILE), "w") as fh:
                json.dump({"trial_id": trial_id, "run_name": run_name, "train_checkpoint": path,
                           "epoch": int(metrics.get("epoch", -1))}, fh)
            # A stop or pause from Tune ends this thread here (SystemExit); the Train run
            # ends with this trial's actor, as any trial Tune stops.
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    train_relaying_reports(run_train, scale=scale, report=report, name=trial_id, in_process=in_process)


def trial_runs(runs_dir: str, trial_id: str) -> list[tuple[str, int]]:
    """(run dir, epoch it started at) of each Train run of a trial: its own, then those PBT restarted."""
    own = f"trial-{trial_id}"
    runs = [(join(runs_dir, own), 0)]
    later = []
    for name in list_names(runs_dir):
        if name.startswith(own):
            m = _FROM.match(name[len(own):])
            if m:
                later.append((int(m["units"]), name))
    runs += [(join(runs_dir, name), units) for units, name in sorted(later)]
    return runs


def exploits_from_runs(runs_dir: str, trial_id: str) -> list[dict]:
    """The exploits a trial's run names record (for a sweep whose scheduler's record is gone: resumed)."""
    own = f"trial-{trial_id}"
    events = []
    for run_dir, units in trial_runs(runs_dir, trial_id)[1:]:
        m = _FROM.match(os.path.basename(run_dir)[len(own):])
        events.append({"unit": units, "kind": "exploit", "from_trial": m["donor"], "config": {}})
    return events


def locate_trial_best(runs_dir: str, trial_id: str, metric: str, mode: str) -> TrainResult:
    """A trial's best checkpoint across all of its Train runs.

    Its history: each run's own epochs, from the epoch it started at (a run PBT restarted
    from a donor inherits the donor's earlier history in its checkpoints; the trial's curve
    shows its own first run up to the exploit, then the new run).
    """
    runs = trial_runs(runs_dir, trial_id)
    found = []
    for run_dir, start in runs:
        try:
            found.append((start, locate_best(run_dir, metric, mode)))
        except TrainingError:
            continue
    if not found:
        raise TrainingError(f"no checkpoint with metric {metric!r} for trial {trial_id} under {runs_dir}")
    if len(found) == 1:
        return found[0][1]
    sign = 1 if mode == "max" else -1
    _, best = max(found, key=lambda f: (sign * f[1].metrics[metric], -f[1].metrics.get("epoch", 0)))
    history: list[dict] = []
    for i, (start, result) in enumerate(found):
        end = found[i + 1][0] if i + 1 < len(found) else float("inf")
        history += [row for row in result.history if start <= row.get("epoch", 0) < end]
    return TrainResult(checkpoint_dir=best.checkpoint_dir, metrics=best.metrics, history=history,
                       resumed_from=best.resumed_from, run_dir=best.run_dir)
