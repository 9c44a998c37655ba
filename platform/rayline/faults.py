"""Failures of the environment rayline runs in, named for the user.

A vanished working directory (Ray's runtime-env agent garbage-collects a job's), a full disk, a
read-only or unwritable workspace, a Ray node or the connection to the cluster lost mid-run: none
is a bug in rayline, and "internal error ... please report it" sent users to the wrong place. Each
gets one line saying what happened and what to do; "internal error" stays for rayline's own bugs.
Where rayline catches an exception to say what failed (joining Ray), it raises
`rayline.errors.EnvironmentFault` with this text; the CLI's last resort asks here too.
"""

from __future__ import annotations

import errno
import os

__all__ = ["describe_fault"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _chain(exc: BaseException):
    """`exc` and every exception it was raised from or during, outermost first, each once."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [current.__cause__, current.__context__]


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
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - Ray is a dependency
        return None
    lost = tuple(getattr(rex, name) for name in ("NodeDiedError", "OwnerDiedError", "ObjectLostError",
                                                  "RaySystemError", "ActorUnavailableError") if hasattr(rex, name))
    if isinstance(exc, lost):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
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
        if isinstance(current, OSError) and current.errno in _NOT_WRITABLE:
            return (f"cannot write{_where(current)}: {os.strerror(current.errno)}; the workspace must be writable "
                    "by this user: point --workspace (RAYLINE_WORKSPACE) at a writable directory or URI, or fix "
                    "its permissions, and run again")
        lost = _ray_connection_lost(current)
        if lost:
            return lost
    return None
