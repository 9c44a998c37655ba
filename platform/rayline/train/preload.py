"""A framework's import on a thread of its own, started by `rayline run` before it connects to Ray.

Importing xgboost (with the sklearn, scipy and pandas it pulls in) took 1.6 s of a 1M-row job's
train stage on the 2-core box, while the driver mostly waited before it: on Ray's start or connection
and on the data stage's tasks. Started first, the import runs in those waits; the training's own
`import xgboost` then finds the module (or waits for the rest of it under Python's import lock).
Which framework preloads is measured, per framework: `rayline.frameworks.BackendInfo.preload`.
"""

from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["preload_framework"]


def preload_framework(framework: str) -> threading.Thread | None:
    """Start importing `framework`'s library in the background (a daemon thread), when the catalog says
    it pays and it is not imported yet; the thread, or None. Never raises: an import that fails here
    fails again where the run imports it, with the run's own message."""
    from rayline.frameworks import BACKENDS

    info = BACKENDS.get(framework)
    library = info.preload if info is not None else ""
    if not library or library in sys.modules:
        return None
    # Ray first, in this thread: both threads would otherwise import the packages they share (asyncio,
    # pyarrow, pandas) at once, each waiting on the other's module locks.
    import ray  # noqa: F401

    def load() -> None:
        try:
            importlib.import_module(library)
        except BaseException:  # noqa: BLE001 - said where the run imports it
            pass

    thread = threading.Thread(target=load, name=f"rayline-import-{library}", daemon=True)
    thread.start()
    return thread
