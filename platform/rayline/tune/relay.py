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

import threading
from typing import Callable

from rayline.tune.schedulers import TIME_ATTR

__all__ = ["train_relaying_reports", "relay_callback", "CHECKPOINT_PATH_KEY"]

# The key Tune's own TuneReportCallback gives a report's Train checkpoint path (ray.tune.integration.ray_train).
CHECKPOINT_PATH_KEY = "checkpoint_path"
_DONE = "__rayline_train_done__"


def relay_callback(queue, scale: float):
    """A Train callback (it runs in the Train controller) passing each report, (metrics with the
    scheduler's clock `TIME_ATTR` added, Train checkpoint path or None), to the trial function."""
    from ray.train.v2.api.callback import UserCallback

    class Relay(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            row = dict(metrics[0]) if metrics else {}
            if "epoch" in row:
                units = int(row["epoch"]) + 1
                row[TIME_ATTR] = units * scale if scale != 1 else units
            # Blocks while the trial function is still reporting the previous one.
            queue.put((row, checkpoint.path if checkpoint else None))

    return Relay()


def train_relaying_reports(run_train: Callable[[list], object], *, scale: float,
                           report: Callable[[dict, str | None], None], name: str) -> None:
    """`run_train(callbacks)` (a Train run given these Train callbacks) on a helper thread;
    `report(metrics, train_checkpoint_path)` called on this thread for each of its reports, in
    order; returns after the last, raising what the Train run raised. A stop from Tune ends this
    thread inside `report` (SystemExit); the Train run then ends with the trial's actor."""
    from ray.util.queue import Empty, Queue

    queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
    failures: list[BaseException] = []

    def fit():
        try:
            run_train([relay_callback(queue, scale)])
        except BaseException as exc:  # raised on the trial function's thread below
            failures.append(exc)
        finally:
            queue.put(_DONE)

    thread = threading.Thread(target=fit, name=f"rayline-train-{name}", daemon=True)
    thread.start()
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
    thread.join()
    if failures:
        raise failures[0]
