"""SIGTERM handled like Ctrl-C: what `docker stop`, Kubernetes and `ray job stop` send.

The CLI installs the handler when it starts, and again right after each `ray.init` (cluster.connect),
because `ray.init` puts Ray's there (the driver's `sys.exit(15)`, an
embedded head's "kill every Ray process, exit 1"), and the core worker's C++ failure handler
printed a "SIGTERM received ... PC: @ ... clock_nanosleep" stack dump; nothing drained Serve, and
Ray's DashboardAgent and RuntimeEnvAgent outlived the command by about a minute. With ours, the
signal raises `Terminated` (a KeyboardInterrupt) in the main thread, so every command stops the way
Ctrl-C stops it: a run being trained is interrupted and resumable, a served endpoint drains its
in-flight requests (serve.drain_timeout_s), Serve and the embedded Ray stop, the command prints
one line and exits.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["Terminated", "stop_on_sigterm"]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as after Ctrl-C."""


_received = False


def _raise_terminated(signum, frame) -> None:
    global _received
    if _received:  # a second SIGTERM while stopping: the first one's shutdown is under way
        return
    _received = True
    raise Terminated()


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread (again after `ray.init`, which
    installs Ray's own handler). A no-op off the main thread, where signals cannot be handled."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)

