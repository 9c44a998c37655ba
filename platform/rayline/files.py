"""Writing a local file so that readers see the old one or the new one, never half of one.

Every file rayline writes for someone else to read (run records, the cluster record, reports,
prediction outputs, exported configs, cache blocks, test metrics) goes through here: the data
is written to a temporary sibling (`.NAME.partial-PID`: hidden, in the same directory so the
rename is atomic, named by process so two writers never share one), which then replaces the
target in one `os.replace`. On any error, Ctrl-C included, the temporary file is removed and the
target keeps what it had. Objects on s3:// / gs:// need none of this: an upload appears whole
(rayline.storage).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Union

__all__ = ["atomic_path", "atomic_write"]

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path beside `path` to write to; when the block ends, what is there replaces
    `path`. If the block raises, the temporary file is removed and the error goes on."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(path: PathLike, data: Union[str, bytes], encoding: str = "utf-8") -> None:
    """Write `data` (text or bytes) to `path` through `atomic_path`."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding=encoding)
