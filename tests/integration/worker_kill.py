"""A training worker SIGKILLed mid-run, and the checks that training resumed from the checkpoint
registered before the kill: used by the runs that pay for a worker group anyway (test_csv_and_faults'
churn run, torch FSDP; test_frameworks' tensorflow MultiWorkerMirroredStrategy run), rather than by a
run of their own (a tensorflow worker group's start costs the suite about a minute)."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time

__all__ = ["run_killing_a_worker", "assert_resumed_from_the_kill"]


def _alive_train_workers():
    import ray
    from ray.util.state import list_actors

    # This session's own Ray, named: with other Rays on the machine the state API refused to guess.
    return list_actors(address=ray.get_runtime_context().gcs_address, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])


def _registered_epoch(pattern):
    """The epoch of the latest checkpoint Ray Train has registered, or None."""
    for path in glob.glob(pattern):
        try:
            with open(path) as fh:
                latest = json.load(fh).get("latest_checkpoint_result")
        except (OSError, ValueError):
            return None  # being written
        if latest and "epoch" in latest.get("metrics", {}):
            return int(latest["metrics"]["epoch"])
    return None


def run_killing_a_worker(spec, ws, copies_dir):
    """Run `spec` in a thread and SIGKILL one training worker once Ray Train has *registered* a
    checkpoint of epoch >= 1 (its manager snapshot names one: a checkpoint directory that exists but
    is not registered yet is not resumed from). (summary, {"killed": pid, "registered": epoch,
    "copies": the run's checkpoints copied at the kill}); asserts the kill happened and the run finished."""
    from .conftest import run
    from .restore_evidence import copy_checkpoints

    outcome = {}

    def target():
        try:
            outcome["summary"] = run(spec, ws)
        except BaseException as exc:  # surfaced below with the test's own assertion
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    # This run's folder (NAME-YYYYMMDD-...), not another pipeline's whose name starts with this one's.
    snapshots = os.path.join(ws.runs_dir, f"{spec.name}-[0-9]*", "train", "checkpoint_manager_snapshot.json")
    killed = registered = copies = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and thread.is_alive():
        registered = _registered_epoch(snapshots)
        if registered is not None and registered >= 1:
            workers = _alive_train_workers()
            if workers:
                killed = workers[-1].pid
                os.kill(killed, signal.SIGKILL)
                # No report completes without the dead worker, so no checkpoint registers (and none
                # is deleted) until the restarted attempt has restored: the one it restores is here.
                (run_dir,) = glob.glob(os.path.dirname(snapshots))
                copies = copy_checkpoints(run_dir, str(copies_dir))
                break
        time.sleep(0.05)
    assert killed, f"no training worker was found to kill before training ended: {outcome}"
    thread.join(600)
    assert not thread.is_alive(), "training did not finish within 10 minutes of the kill"
    assert "error" not in outcome, f"the run failed after the kill: {outcome.get('error')!r}"
    return outcome["summary"], {"killed": killed, "registered": registered, "copies": copies}


def assert_resumed_from_the_kill(summary, fault, epochs: int) -> int:
    """Training resumed from a checkpoint, not from epoch 0: every epoch exactly once, those up to the
    checkpoint trained before the restart, and the restarted workers' live state before their first
    step was that checkpoint's (restore_evidence), not a fresh model's. The epoch resumed at."""
    from .restore_evidence import assert_restored, latest_checkpoint

    assert summary.resumed_from, "training did not resume from a checkpoint"
    resumed_at = summary.resumed_from[0]
    assert resumed_at >= fault["registered"]  # from the checkpoint registered before the kill, or a later one
    history = summary.trials[0].result.history
    assert [row["epoch"] for row in history] == list(range(epochs))
    assert [row["resumed"] for row in history] == [0] * (resumed_at + 1) + [1] * (epochs - resumed_at - 1)
    result = summary.trials[0].result
    (restore,) = assert_restored(result.starts, result.resumed_from, fault["copies"], latest_checkpoint(result.run_dir))
    assert restore["epoch"] == resumed_at
    return resumed_at
