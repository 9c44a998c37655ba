"""TensorBoard event files of a run's training: per epoch, the validation metrics, the training
throughput (samples/s in total and per worker) and the learning rate, one directory per trial.

Written by the driver from the history every trial reported (the same rows MLflow gets), after
the train stage: that works the same for torch, tensorflow and xgboost, for one run or a sweep,
and for a workspace on object storage (written locally, then copied there). tensorboardX writes
them (no TensorFlow or tensorboard server needed); `tensorboard --logdir DIR` reads them.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from rayline.storage import is_uri, upload_dir
from rayline.train.loop import TRAINING_STATS

__all__ = ["write_event_files", "mean_throughput", "tensorboard_command"]

_NOT_SCALARS = ("epoch", "resumed")


def _tag(key: str) -> str:
    return f"train/{key}" if key in TRAINING_STATS else f"valid/{key}"


def write_event_files(location: str, trials: list) -> str | None:
    """One event file per trial with a history (TrialOutcome list), under `location`/<trial id>;
    returns `location`, or None when no trial reported anything."""
    from tensorboardX import SummaryWriter

    reported = [t for t in trials if t.result is not None and t.result.history]
    if not reported:
        return None
    local = tempfile.mkdtemp(prefix="rayline-tensorboard-") if is_uri(location) else location
    try:
        for trial in reported:
            writer = SummaryWriter(logdir=os.path.join(local, str(trial.trial_id)), flush_secs=3600)
            try:
                for row in trial.result.history:
                    step = int(row["epoch"])
                    for key, value in row.items():
                        if key not in _NOT_SCALARS and isinstance(value, (int, float)):
                            writer.add_scalar(_tag(key), float(value), global_step=step)
            finally:
                writer.close()
        if local != location:
            upload_dir(local, location)
    finally:
        if local != location:
            shutil.rmtree(local, ignore_errors=True)
    return location


def mean_throughput(history: list[dict]) -> tuple[float, float] | None:
    """(samples/s in total, per worker) averaged over a run's epochs, or None without them."""
    rows = [r for r in history if "samples_per_s" in r]
    if not rows:
        return None
    return (sum(r["samples_per_s"] for r in rows) / len(rows),
            sum(r["samples_per_s_per_worker"] for r in rows) / len(rows))


def tensorboard_command(location: str) -> str:
    """What to run to look at them."""
    return f"tensorboard --logdir {location}  (pip install tensorboard)"

