"""What native libraries write straight to file descriptor 2, moved from the terminal to rayline's log.

TensorFlow 2.21 prints absl lines when it is imported and when its devices are first listed
("WARNING: All log messages before absl::InitializeLog() ...", "oneDNN custom operations are on",
"Could not find cuda drivers", "failed call to cuInit", the CPU feature guard): eight lines on the
terminal of a `rayline run` that registers a TensorFlow model, and of every `rayline predict` of
one. They are written before absl's log is set up, so TF_CPP_MIN_LOG_LEVEL does not silence them
(measured: the same lines with it at 3), and Python's sys.stderr never sees them. Only the process's
fd 2 does: `native_stderr_to_log` points fd 2 at a temporary file for the block and logs every
line it caught, so nothing is lost (an error TensorFlow prints there is in the log, and the
exception it raises still propagates).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["native_stderr_to_log"]


@contextlib.contextmanager
def native_stderr_to_log(logger: str, what: str) -> Iterator[None]:
    """Within the block, whatever is written to fd 2 (native code's and Python's stderr alike) goes
    to the logger named `logger` at INFO, each line prefixed with `what`, once the block ends."""
    _flush(sys.stderr)
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                _flush(sys.stderr)
                os.dup2(saved, 2)
                sink.seek(0)
                caught = sink.read().decode("utf-8", errors="replace")
                log = logging.getLogger(logger)
                for line in caught.splitlines():
                    if line.strip():
                        log.info("%s: %s", what, line)
    finally:
        os.close(saved)


def _flush(stream) -> None:
    try:
        stream.flush()
    except (AttributeError, OSError, ValueError):  # closed or replaced: nothing of ours is buffered there
        pass
