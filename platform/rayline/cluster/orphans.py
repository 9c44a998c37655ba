"""Placement groups whose creator actor is dead: found and removed.

Ray keeps a placement group made by a (non-detached) actor until its creator actor *and* its
job are both dead (GcsPlacementGroup::IsPlacementGroupLifetimeDone in Ray's GCS). Ray Train's
controller actor makes each worker group's placement group and removes it when it shuts
down; when the controller is killed instead (an early-stopped Tune trial under ASHA or
median stopping, a PBT pause, a time budget, a failure), nothing removes it and it keeps
its CPUs for as long as the driver lives. In one driver that runs a sweep and then serves,
or runs many pipelines (a notebook, a test session), the leaked CPUs starve everything
after: a fresh run's Ray Data read task waited for a CPU that never came (seen in a CI run:
0.99 of 2 CPUs held by the placement group of a trial ASHA stopped as the sweep ended).

A placement group whose creator actor is dead can be used by nobody (its workers were that
actor's children and died with it), so removing it is always safe. Only this driver's job's
placement groups are looked at: another job's are not ours to touch.

Ray has no public API that names a placement group's creator: the GCS table read here is
Ray's own (ray._private.state, the data behind ray.util.placement_group_table); it is kept to
this one module.
"""

from __future__ import annotations

import logging
import threading
import time

from ray.tune import Callback

__all__ = ["ReleaseOrphansCallback", "orphaned_placement_groups", "release_orphaned_placement_groups", "without_train_cleaner",
           "sweep_in_background"]

log = logging.getLogger(__name__)

_LIVE_STATES = ("PENDING", "PREPARED", "CREATED", "RESCHEDULING")


def orphaned_placement_groups() -> list[str]:
    """Hex ids of this job's placement groups, not removed, whose creator actor is dead."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    if not ray.is_initialized():
        return []
    job = ray.get_runtime_context().get_job_id()
    accessor = state._connect_and_get_accessor()
    orphans = []
    for raw in accessor.get_placement_group_table():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        if pg.is_detached or pg.creator_job_id.hex() != job:
            continue
        if gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(pg.state) not in _LIVE_STATES:
            continue
        creator = pg.creator_actor_id.hex()
        if not creator or set(creator) == {"f"}:  # made by the driver itself (Tune's trial groups): not an orphan
            continue
        # The GCS marks creator_actor_dead only for groups registered before the actor died; a
        # group the dying controller registered a moment after has it unset, so ask the actor table.
        if pg.creator_actor_dead or _actor_dead(creator):
            orphans.append(pg.placement_group_id.hex())
    return orphans


def _actor_dead(actor_id: str) -> bool:
    from ray._private.state import state

    info = state.actor_table(actor_id)
    return not info or info.get("State") == "DEAD"


def release_orphaned_placement_groups() -> list[str]:
    """Remove this job's orphaned placement groups; returns their ids. Never raises: a failure
    to look is logged and the run goes on (the worst case is the leak this exists to fix)."""
    try:
        import ray
        from ray.util.placement_group import PlacementGroup

        removed = []
        for pg_id in orphaned_placement_groups():
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
            removed.append(pg_id)
        if removed:
            log.info("removed %d placement group(s) left by killed Ray Train runs: %s", len(removed), ", ".join(removed))
        return removed
    except Exception as exc:  # noqa: BLE001 - best effort, see above
        log.debug("could not look for orphaned placement groups: %s", exc)
        return []


def sweep_in_background(seconds: float = 10.0, every: float = 0.5) -> threading.Thread:
    """Keep releasing orphans for `seconds` in a daemon thread: a controller killed as a sweep
    ends registers its group a moment after Tune returns (and a little later still on a busy
    machine), and the run should not wait for that before registering and serving."""

    def sweep() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            release_orphaned_placement_groups()
            time.sleep(every)

    thread = threading.Thread(target=sweep, name="rayline-orphan-sweep", daemon=True)
    thread.start()
    return thread


def without_train_cleaner(trainer):
    """`trainer` (a Ray Train V2 trainer) without Ray's PlacementGroupCleaner, which this module does.

    Ray Train 2.60 starts, beside every run's controller, a detached PlacementGroupCleaner actor that
    asks the state API every second whether the controller lives, to remove its placement group if it
    dies: one more Python process per run (per trial in a sweep), ~2.7 s of CPU each on the 2-core
    machine (three 2-worker runs: 8.0 s of 84 s), and a synchronous call to it as the worker group
    starts and another as the controller stops. rayline frees those groups itself (this module: at each
    run's start, after a failure or Ctrl-C, and from a sweep's ReleaseOrphansCallback), and a driver that
    dies takes its job's groups with it. Ray has no option for it: the trainer's default callbacks are
    filtered; a Ray that renames either leaves the trainer as it is."""
    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:
        return trainer
    defaults = getattr(trainer, "_create_default_callbacks", None)
    if defaults is None:
        return trainer
    trainer._create_default_callbacks = lambda: [c for c in defaults() if not isinstance(c, PlacementGroupCleanerCallback)]
    return trainer


class ReleaseOrphansCallback(Callback):
    """A sweep's Tune callback: frees the placement group of a trial's Train run when Tune kills
    the trial (an early stop, a PBT pause, the time budget), so the trials after it get its
    CPUs. Looked for when a trial ends and, as a dying controller registers its group a moment
    later, at most every 2 s while the sweep runs (one GCS read)."""

    EVERY_S = 2.0

    def __init__(self):
        self._last = 0.0

    def __getstate__(self):  # pickled with the Tuner's saved state
        return {"_last": 0.0}

    def _release(self) -> None:
        self._last = time.monotonic()
        release_orphaned_placement_groups()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._release()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._release()

    def on_step_begin(self, iteration, trials, **info):
        if time.monotonic() - self._last >= self.EVERY_S:
            self._release()
