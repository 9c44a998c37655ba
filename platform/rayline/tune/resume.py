"""What resuming an interrupted run needs: who drives a run, whether that driver is gone,
and a sweep state that never forgets a finished trial.

A run record (rayline.pipeline.record.RECORD_FILE) names its driver: host, pid and the process's start time.
A run whose record still says "running" was cut off without a word (SIGKILL, the OOM killer,
a crash of the machine) when its driver is gone; resuming it while the driver still runs
would have two processes writing the same checkpoints, so "gone" is decided conservatively:

- same host: gone when the pid does not exist, is a zombie, or belongs to a process started
  at another time (the pid was reused); alive otherwise;
- another host: unknown. A pid says nothing across machines, so rayline refuses and says to
  resume on that host (or, once sure the driver is gone, there with `rayline resume`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys

from ray.tune import Callback

__all__ = ["driver_info", "driver_state", "SaveOnTrialEnd"]

log = logging.getLogger(__name__)

# psutil's create_time has a resolution of a clock tick (10 ms); the same process reads the
# same value every time, so a small tolerance only absorbs float rounding in the JSON.
_SAME_START_S = 0.5


def driver_info() -> dict:
    """This process as a run record's driver: {"host", "pid", "started"} (start time, epoch seconds)."""
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def driver_state(driver: dict | None) -> tuple[str, str]:
    """("gone" | "alive" | "unknown", a phrase naming the driver) for a record's `driver`."""
    import psutil

    if not isinstance(driver, dict) or "pid" not in driver:
        return "unknown", "a driver this version of rayline did not record"
    host, pid, started = driver.get("host", "?"), int(driver["pid"]), float(driver.get("started", 0))
    who = f"pid {pid} on {host}"
    if host != socket.gethostname():
        return "unknown", who
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or abs(proc.create_time() - started) > _SAME_START_S:
            return "gone", who
    except psutil.NoSuchProcess:
        return "gone", who
    except psutil.Error:
        return "alive", who  # exists but cannot be read (another user's): not provably gone
    return "alive", who


class SaveOnTrialEnd(Callback):
    """Saves the sweep's state, and waits for it to reach storage, in the controller step
    in which a trial finished or failed, before the next trial is asked for or started.

    Tune 2.60 saves its experiment state (trial statuses, searcher and scheduler state) at
    the end of a controller step at most every TUNE_GLOBAL_CHECKPOINT_S ("auto": at least
    10 s, growing to 19x the time a save takes), and copies it to the storage path in the
    background (tune/execution/experiment_state.py). A driver killed in that window left
    a finished trial RUNNING in the saved state, and `Tuner.restore(resume_unfinished=True)`
    started it again (an ASHA-stopped trial then trained on past its rung). Saving after
    every step (TUNE_GLOBAL_CHECKPOINT_S=0) copies every trial's result files ~10 times a
    second; a forced save once per trial end costs one copy per trial.

    The controller is not handed to callbacks; it is the `self` of the frame that calls
    `setup` (TuneController.setup_experiments). Without it (another Ray version) this
    warns once and Tune's own period applies.
    """

    def __init__(self):
        self._controller = None
        self._due = False

    def __getstate__(self):  # pickled with the Tuner and its saved state: never the live controller
        return {"_controller": None, "_due": False}

    def setup(self, **info):
        from ray.tune.execution.tune_controller import TuneController

        frame = sys._getframe(1)
        while frame is not None and self._controller is None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, TuneController):
                self._controller = candidate
            frame = frame.f_back
        if self._controller is None:
            log.warning("rayline: Tune's controller was not found; a trial that finishes just before the "
                        "driver is killed may run again on resume")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._due = True

    def on_trial_error(self, iteration, trials, trial, **info):
        self._due = True

    def on_step_end(self, iteration, trials, **info):
        # After the step's own (throttled) save: the trial is TERMINATED/ERROR by now, and the
        # next step is the one that asks the searcher for a new trial and starts it.
        if self._due and self._controller is not None:
            self._due = False
            self._controller.checkpoint(force=True, wait=True)
