"""Failures of the environment rayline runs in, named for the user.

A vanished working directory (Ray's runtime-env agent garbage-collects a job's), a full disk, a
read-only or unwritable workspace, a Ray node or the connection to the cluster lost mid-run: none
is a bug in rayline, and "internal error ... please report it" sent users to the wrong place. Each
gets one line saying what happened and what to do; "internal error" stays for rayline's own bugs.
Where rayline catches an exception to say what failed (joining Ray), it raises
`rayline.errors.EnvironmentFault` with this text; the CLI asks here for every error it reports,
its own (a TrainingError or DataError raised from a lost node or a full disk) included.

The fault is looked for in the whole chain: `__cause__` and `__context__`, and where Ray keeps an
inner exception in an attribute instead (a RayTaskError's `cause`, Ray Train V2's
`ControllerError.controller_failure`, `WorkerGroupError.worker_failures` (rank -> the worker's own
exception) and `WorkerHealthCheckFailedError.health_check_failure`, an ExceptionGroup's
`exceptions`): a worker's OSError(ENOSPC) or a worker actor lost with its node reaches the driver
only that way.
"""

from __future__ import annotations

import errno
import os
import sys

__all__ = ["describe_fault"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM)
# Ray's text when an actor (a Train worker, a Data actor) died with its node (gcs_actor_manager).
_NODE_DIED = "because its node has died"


def _chain(exc: BaseException):
    """`exc` and every exception it was raised from or during, or holds (`_inner`), outermost first, each once."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        # `raise X from None` hid the context on purpose (rayline's own one-line errors do): so does this.
        context = None if current.__suppress_context__ else current.__context__
        stack += [current.__cause__, context, *_inner(current)]


def _inner(exc: BaseException) -> list:
    """Exceptions Ray keeps inside `exc` as attributes rather than as its cause (see the module's doc)."""
    found = []
    for name in ("cause", "controller_failure", "health_check_failure"):
        try:
            value = getattr(exc, name, None)  # a RayTaskError(X) forwards unknown names to X: may raise
        except Exception:
            value = None
        if isinstance(value, BaseException):
            found.append(value)
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict):
        found += [value for value in failures.values() if isinstance(value, BaseException)]
    if isinstance(exc, BaseExceptionGroup):
        found += list(exc.exceptions)
    return found


def _cwd_gone() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _where(exc: OSError) -> str:
    name = exc.filename if exc.filename is not None else exc.filename2
    return f" ({name})" if name else ""


def _ray_connection_lost(exc: BaseException) -> str | None:
    # No Ray imported, no Ray error to find: a spec error must not wait for Ray's import (~1 s) to be shown.
    rex = sys.modules.get("ray.exceptions")
    if rex is None:
        return None
    lost = tuple(getattr(rex, name) for name in ("NodeDiedError", "OwnerDiedError", "ObjectLostError",
                                                  "RaySystemError", "ActorUnavailableError") if hasattr(rex, name))
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    died_with_node = isinstance(exc, rex.RayActorError) and (
        getattr(exc, "preempted", False) or any(_NODE_DIED in line for line in lines))
    if isinstance(exc, lost) or died_with_node:
        first = next((line.strip() for line in lines if _NODE_DIED in line), lines[0])[:200]
        return (f"lost a Ray node or the connection to the Ray cluster mid-run ({type(exc).__name__}: {first}); "
                "check the cluster (`rayline cluster status`, `ray status`), then run again: an interrupted run "
                "resumes from its last checkpoint with `rayline resume RUN_ID` or `rayline run SPEC --resume`")
    return None


def describe_fault(exc: BaseException) -> str | None:
    """One line for an environment failure anywhere in `exc`'s chain; None when it is not one."""
    for current in _chain(exc):
        if isinstance(current, FileNotFoundError) and _cwd_gone():
            return ("the working directory was removed while rayline ran (in a Ray job, Ray's runtime-env agent "
                    "may have garbage-collected the job's directory); cd to an existing directory, or submit the "
                    "job again, and run again")
        if isinstance(current, OSError) and current.errno in _NO_SPACE:
            return (f"no space left on the disk{_where(current)}: {os.strerror(current.errno)}; free space there, "
                    "or point --workspace (RAYLINE_WORKSPACE) at a disk with room, and run again")
        if isinstance(current, OSError) and current.errno == errno.EROFS:
            return (f"cannot write{_where(current)}: {os.strerror(current.errno)}; the workspace must be writable "
                    "by this user: point --workspace (RAYLINE_WORKSPACE) at a writable directory or URI, or fix "
                    "its permissions, and run again")
        if isinstance(current, OSError) and current.errno in _DENIED:  # a read (the data) or a write (the workspace)
            return (f"permission denied{_where(current)}: {os.strerror(current.errno)}; rayline must be able to read "
                    "its data and write its workspace as this user: fix the permissions, or point --workspace "
                    "(RAYLINE_WORKSPACE) at a directory or URI this user can write, and run again")
        lost = _ray_connection_lost(current)
        if lost:
            return lost
    return None
