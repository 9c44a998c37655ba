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


def _summary_writer():
    """tensorboardX's SummaryWriter, imported without importing torch where torch is not loaded yet.

    tensorboardX imports torch, when installed, only so that it can take torch tensors as values
    (`numpy_compatible`); we give it floats. For an xgboost or tensorflow run that import was 1.3-2.3 s
    of the train stage on the 2-core machine (py-spy, 2026-12-06). With `sys.modules["torch"] = None`
    for the import, its `import torch` raises ImportError, which tensorboardX handles; the entry is
    removed afterwards, so a later `import torch` in this process imports it as usual."""
    import sys

    if "torch" in sys.modules or "tensorboardX.writer" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


def write_event_files(location: str, trials: list) -> str | None:
    """One event file per trial with a history (TrialOutcome list), under `location`/<trial id>;
    returns `location`, or None when no trial reported anything."""
    SummaryWriter = _summary_writer()

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

