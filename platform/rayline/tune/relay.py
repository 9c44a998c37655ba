"""A Tune trial's Train run, its reports relayed to Tune by the trial function's own thread.

Ray 2.60's `TuneReportCallback` hands each Train report to the trial actor's *main* thread
(through a queue actor), which reports it to Tune as if the trial function had. When the Train
run ends with its last report still in that queue -- the Tune driver slow to ask the trial for its
next result, as on a loaded machine -- the trial function returns first and Tune's end-of-function
report fills the session's one-slot result queue; the main thread then blocks forever putting the
last report behind it, and the sweep waits forever for a trial that never reports again
(`ray/train/_internal/session.py`, `_get_result_from_queues`). Seen in CI: an xgboost ASHA sweep
of 2 trials hung until the test's 900-s timeout; reproduced at will with a Tune callback that
sleeps 4 s before a trial's last result (tests/integration/test_interrupts.py, the ASHA test).

Here the Train run runs on a helper thread and a relay callback in the Train controller passes each
report through a queue of ours to the trial function's thread, which alone reports to Tune, in
order, and returns only after the last one: Tune's end-of-function report can never overtake it.
The queue holds one report: the controller waits while the trial function is still reporting the
previous one, so training stays in step with Tune's decisions (ASHA, median stopping), as before.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

from rayline.tune.schedulers import TIME_ATTR

__all__ = ["train_relaying_reports", "relay_callback", "with_clock", "CHECKPOINT_PATH_KEY"]

# The key Tune's own TuneReportCallback gives a report's Train checkpoint path (ray.tune.integration.ray_train).
CHECKPOINT_PATH_KEY = "checkpoint_path"
_DONE = "__rayline_train_done__"
# How long a stopped trial waits for its in-process training thread (within Tune's 2 s for a reused
# process's previous trial function: TUNE_FUNCTION_THREAD_TIMEOUT_S), and how often that thread looks.
_STOP_JOIN_S = 1.5
_STOP_POLL_S = 0.1


def relay_callback(put: Callable[[tuple], None], scale: float):
    """A Train callback (it runs in the Train controller, or in this process for a run in process)
    passing each report, (metrics with the scheduler's clock `TIME_ATTR` added, Train checkpoint path
    or None), to `put`."""
    from ray.train.v2.api.callback import UserCallback

    class Relay(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            put((with_clock(dict(metrics[0]) if metrics else {}, scale), checkpoint.path if checkpoint else None))

    return Relay()


def with_clock(row: dict, scale: float) -> dict:
    """`row` (a report) with the scheduler's clock `TIME_ATTR` for its epoch added, when it has one."""
    if "epoch" in row:
        units = int(row["epoch"]) + 1
        row[TIME_ATTR] = units * scale if scale != 1 else units
    return row


def train_relaying_reports(run_train: Callable[[list], object], *, scale: float,
                           report: Callable[[dict, str | None], None], name: str, in_process: bool = False) -> None:
    """`run_train(callbacks)` (a Train run given these Train callbacks) on a helper thread;
    `report(metrics, train_checkpoint_path)` called on this thread for each of its reports, in
    order; returns after the last, raising what the Train run raised. A stop from Tune ends this
    thread inside `report` (SystemExit); the Train run then ends with the trial's actor.

    `in_process`: the Train run trains in this process, on the helper thread
    (rayline/train/in_process.py): its reports come through a queue of this process, and training
    goes on only once Tune took the report (`report` returned: Tune did not stop the trial), so a
    stopped trial trains no epoch past the one Tune stopped it at; a stop from Tune also stops that
    training (Tune may reuse this actor for another trial)."""
    stop = threading.Event()
    taken = threading.Semaphore(0)  # in process: one release per report the trial function made
    if in_process:
        import queue as queue_module

        queue, Empty = queue_module.Queue(maxsize=1), queue_module.Empty
        put = functools.partial(_put_until_taken, queue, stop, taken)
    else:
        from ray.util.queue import Empty, Queue

        queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
        put = queue.put  # blocks while the trial function is still reporting the previous one
    failures: list[BaseException] = []

    def fit():
        try:
            run_train([relay_callback(put, scale)])
        except BaseException as exc:  # raised on the trial function's thread below
            failures.append(exc)
        finally:
            if not stop.is_set():
                queue.put(_DONE)

    thread = threading.Thread(target=fit, name=f"rayline-train-{name}", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = queue.get(timeout=1.0)
            except Empty:
                if not thread.is_alive() and queue.empty():
                    break
                continue
            if item == _DONE:
                break
            metrics, path = item
            report(metrics, path)
            taken.release()
    except BaseException:
        stop.set()  # a stop from Tune (SystemExit), or Ctrl-C: the training in this process ends too
        if in_process:
            # Tune may hand this process to the next trial (reuse_actors) once this function returns:
            # the training thread must be gone by then. It waits in `_put_until_taken`, which sees the
            # stop within a poll, or is mid-epoch and stops at its next report.
            thread.join(_STOP_JOIN_S)
        raise
    thread.join()
    if failures:
        raise failures[0]


def _put_until_taken(queue, stop: threading.Event, taken: threading.Semaphore, item) -> None:
    """Hand `item` to the trial function through this process's queue and wait until it has reported
    it to Tune; raise InProcessAborted once the trial function is gone (`stop`: Tune stopped the trial)."""
    from rayline.train.in_process import InProcessAborted

    queue.put(item)  # the trial function takes every item before it acknowledges the previous: never full here
    while not taken.acquire(timeout=_STOP_POLL_S):
        if stop.is_set():
            raise InProcessAborted("the trial stopped")
