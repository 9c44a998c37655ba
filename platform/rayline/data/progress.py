"""Live progress of a data-stage phase: rows so far, rows per second and the time left.

A phase that computes a Dataset into the object store (reading, transforming a split) runs
through `materialize`, which gives the same MaterializedDataset as `Dataset.materialize()`
but counts the rows of each block as it lands (Ray Data's `iter_internal_ref_bundles`) and
tells a `PhaseProgress`, which turns the counts into a line:

    data: transforming 4,120,334 of 8,000,695 rows, 1,702,114 rows/s, ~2 s left

The time left comes from the rows left at the phase's rate when the phase knows its rows in
advance (profiled splits), else from its blocks (a read's byte ranges or files: Ray plans them
before the first block lands). Lines go to `tick(text)`: the CLI shows each one on a terminal
and prints one every few seconds in plain logs (`rayline jobs logs`).
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PhaseProgress", "materialize"]


class PhaseProgress:
    """Counts of one phase -> a progress line for `tick`, at most every `every_s` seconds."""

    def __init__(self, tick: Callable[[str], None] | None, doing: str, *, total_rows: int | None = None,
                 total_blocks: int | None = None, every_s: float = 0.5, clock=time.monotonic):
        self.tick, self.doing = tick, doing
        self.total_rows, self.total_blocks = total_rows, total_blocks
        self.every_s, self.clock = every_s, clock
        self.started = clock()
        self.rows = self.blocks = 0
        self._last = self.started

    def add(self, rows: int, blocks: int = 1) -> None:
        self.rows += rows
        self.blocks += blocks
        now = self.clock()
        if self.tick is not None and now - self._last >= self.every_s:
            self._last = now
            self.tick(self.line(now))

    def seconds_left(self, now: float) -> float | None:
        elapsed = now - self.started
        if elapsed <= 0:
            return None
        if self.total_rows and self.rows:
            return max(0.0, (self.total_rows - self.rows) * elapsed / self.rows)
        if self.total_blocks and self.blocks:
            return max(0.0, (self.total_blocks - self.blocks) * elapsed / self.blocks)
        return None

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        of = f" of {self.total_rows:,}" if self.total_rows else ""
        blocks = f" ({self.blocks} of {self.total_blocks} blocks)" if self.total_blocks and not self.total_rows else ""
        left = self.seconds_left(now)
        eta = f", ~{left:,.0f} s left" if left is not None else ""
        return f"{self.doing} {self.rows:,}{of} rows{blocks}, {self.rows / elapsed:,.0f} rows/s{eta}"


def materialize(ds, progress: PhaseProgress | None):
    """`ds.materialize()`, telling `progress` of each block's rows as it lands.

    Without a progress, or where Ray Data's internals it rebuilds the result with are not there
    (another Ray), it is `ds.materialize()` itself."""
    if getattr(ds, "in_process", False):  # data/in_process.py's blocks: already here
        return ds.materialize(progress)
    if progress is None:
        return ds.materialize()
    try:
        from ray.data._internal.execution.interfaces import RefBundle
        from ray.data._internal.logical.interfaces import LogicalPlan
        from ray.data._internal.logical.operators.input_data_operator import InputData
        from ray.data.dataset import MaterializedDataset
    except ImportError:
        return ds.materialize()
    if progress.total_blocks is None:
        try:  # the blocks Ray Data's plan expects (the read's files or byte ranges), without running it
            progress.total_blocks = ds._logical_plan.dag.estimated_num_outputs()
        except Exception:  # not estimated by this Ray: rows and rate only
            pass
    bundles = []
    schema = None
    for bundle in ds.iter_internal_ref_bundles():
        bundles.append(bundle)
        schema = schema or bundle.schema
        progress.add(bundle.num_rows() or 0, len(bundle.blocks))
    # As Dataset.materialize does it (Ray 2.60): one bundle per block, over an InputData plan.
    single = [RefBundle(blocks=(entry,), owns_blocks=False, schema=schema) for b in bundles for entry in b.blocks]
    out = MaterializedDataset(LogicalPlan(InputData(input_data=single), ds.context), ds.context, ds._raw_stats())
    out._execute()  # populates the cache from the InputData, as materialize does
    return out
