"""How many CPUs each of the data stage's Ray tasks asks for, fitted to what is free.

Ray Data gives every read and map task 1 CPU unless told otherwise. On a cluster whose CPUs
are mostly held by served models (their replicas, routers and V2 applications), fewer than one
CPU is free: such a task waits for a whole CPU that serving never gives back, and the run hangs
at `data: started` with a pending `{'CPU': 1.0}` (issue 38). Before the data stage (and the
register stage) starts, `fitted_to_free_cpus` reads what is free:

- one CPU or more: tasks keep Ray Data's 1 CPU (nothing changes);
- less, but at least `MIN_TASK_CPUS`: every task asks for what is free (rounded down to a
  twentieth), so they run, one at a time, on the share serving leaves;
- less than that: a ResourceError at once, naming what holds the CPUs (the actors by class, Serve's
  replicas among them) and how to free them.

Every call site that starts a Ray Data read or map passes `remote_args()` / `map_args()` (the same
value everywhere, so Ray Data still fuses a read with the maps after it).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Iterator

from rayline.errors import ResourceError

__all__ = ["MIN_TASK_CPUS", "fitted_to_free_cpus", "map_args", "remote_args", "task_cpus"]

MIN_TASK_CPUS = 0.05  # below this a task would crawl: fail and say who holds the CPUs
_task_cpus: float | None = None  # None: Ray Data's default (1 CPU a task)


def task_cpus() -> float | None:
    """The CPUs each data task asks for now; None: Ray Data's default."""
    return _task_cpus


def remote_args() -> dict:
    """`ray_remote_args` for ray.data.read_* (empty when the default fits)."""
    return {} if _task_cpus is None else {"num_cpus": _task_cpus}


def map_args() -> dict:
    """Keyword arguments for Dataset.map_batches (empty when the default fits)."""
    return remote_args()


def fitted_cpus(free: float) -> float | None:
    """What each task asks for when `free` CPUs are free: None (Ray's 1) from one CPU up, else the free
    share rounded down to a twentieth; raises below MIN_TASK_CPUS."""
    if free >= 1.0:
        return None
    share = math.floor(free * 20 + 1e-9) / 20
    return share if share >= MIN_TASK_CPUS else 0.0


@contextlib.contextmanager
def fitted_to_free_cpus(stage: str, *, required: bool = True) -> Iterator[float | None]:
    """Within the block, data tasks ask for what is free (see the module doc); `stage` names the stage
    in the error. `required=False` (the register stage, which predicts a small test split in the
    driver and needs no task then): never raises, its tasks ask for MIN_TASK_CPUS at the least."""
    import ray

    global _task_cpus
    free = float(ray.available_resources().get("CPU", 0.0))
    share = fitted_cpus(free)
    if share == 0.0 and not required:
        share = MIN_TASK_CPUS
    if share == 0.0:
        total = float(ray.cluster_resources().get("CPU", 0.0))
        raise ResourceError(
            f"{stage}: {free:.2f} of the cluster's {total:g} CPUs are free; its tasks need at least "
            f"{MIN_TASK_CPUS:g}. Held by: {holders() or 'tasks or actors outside rayline (see `ray status`)'}. "
            "Free some: `rayline serve delete NAME` (`rayline serve status` lists the applications), lower "
            "their serve.replicas / serve.resources, or start Ray with more CPUs")
    previous, _task_cpus = _task_cpus, share
    try:
        yield share
    finally:
        _task_cpus = previous


def holders(limit: int = 4) -> str:
    """'3 ServeReplica:churn:ChurnModel (1.5 CPU), 1 CpuHolder (1 CPU)': live actors by class, most CPUs
    first (Ray's state API, on this Ray's own dashboard); without the state API, the live actors' classes
    from the GCS's actor table (no amounts); '' when neither answers."""
    cpus: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    try:
        from ray.util.state import list_actors

        actors = list_actors(address=_dashboard(), filters=[("state", "=", "ALIVE")], limit=1000, detail=True,
                             raise_on_missing_output=False)
        for actor in actors:
            name = actor.class_name or "actor"
            cpus[name] += float((actor.required_resources or {}).get("CPU", 0.0))
            counts[name] += 1
        ranked = sorted((c for c in cpus if cpus[c] > 0), key=lambda c: -cpus[c])
        return ", ".join(f"{counts[c]} {c} ({cpus[c]:g} CPU)" for c in ranked[:limit])
    except Exception:  # noqa: BLE001 - the GCS's table still names the actors
        pass
    try:
        import ray._private.state as gcs_state

        for actor in gcs_state.actors().values():
            if actor.get("State") == "ALIVE":
                counts[actor.get("ActorClassName") or "actor"] += 1
    except Exception:  # noqa: BLE001 - the message is still useful without the list
        return ""
    ranked = sorted(counts, key=lambda c: -counts[c])
    return "live actors " + ", ".join(f"{counts[c]} {c}" for c in ranked[:limit * 2]) if ranked else ""


def _dashboard() -> str | None:
    """This Ray's dashboard (the state API's server): asked by address, not found by a search of the
    machine's processes, which fails where two Rays run side by side."""
    try:
        import ray

        url = ray._private.worker.global_worker.node.address_info.get("webui_url")
    except Exception:  # noqa: BLE001 - a driver without a node: the state API's own default
        return None
    return url if not url or url.startswith("http") else f"http://{url}"
