"""Where a retrain loop runs on a multi-node cluster, and whether a process it started on some node
still runs.

The loop's actor runs on the head node, as Serve's controller does, and by the same means: a sliver
of the resource Ray gives the head only (ray/serve/_private/default_impl.py, get_controller_impl).
A worker node can die or be scaled down by the autoscaler at any time (a zero-CPU actor does not
keep a node busy, so an autoscaler removes its node like an idle one), and the loop would restart
elsewhere, abandoning a retrain in flight. A resource, not a node id: a GCS fault-tolerant head that
comes back with a new node id has it too, so the restarted loop finds its place. (Not a soft
NodeAffinitySchedulingStrategy: for a detached actor Ray 2.60 placed it on a worker node, measured
on a head with no CPUs; the driver that created it ran on the head.)

A retrain is a subprocess of the loop's actor, on the actor's node. A loop restarted on another
node cannot ask its own kernel about that pid (a pid is only meaningful on its node; on another
machine the same number is some other process or none), so it asks the pid's node, with a zero-CPU
task pinned there; a node that is gone took the process with it.
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["HEAD_RESOURCE", "ON_THE_HEAD", "here", "pid_alive", "process_alive"]

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node only (ray._common.constants)
ON_THE_HEAD = {"resources": {HEAD_RESOURCE: 0.001}}  # an actor's options that place it there
_ASK_TIMEOUT_S = 60.0


def here() -> str:
    """The id of the node this process runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs on this machine as a process of this user (one of another user's is not a
    retrain this loop started: the number was reused)."""
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def process_alive(pid: int, node_id: Optional[str]) -> bool:
    """Whether process `pid` of node `node_id` still runs. None for the node: this one (a record
    written before nodes were recorded). An unanswered question (the node too busy to run a task
    within a minute) counts as alive: the caller asks again at its next look, and never starts a
    second retrain beside a running one."""
    if node_id is None or node_id == here():
        return pid_alive(pid)
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not _node_alive(node_id):
        return False  # the node is gone, and its processes with it
    ask = ray.remote(num_cpus=0, max_retries=0)(pid_alive).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), name="rayline-retrain-pid-check")
    ref = ask.remote(pid)
    try:
        return bool(ray.get(ref, timeout=_ASK_TIMEOUT_S))
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        return True
    except Exception:  # noqa: BLE001 - the node died while asked (the task's failure says so)
        return _node_alive(node_id)


def _node_alive(node_id: str) -> bool:
    import ray

    return any(n.get("Alive") and n["NodeID"] == node_id for n in ray.nodes())
