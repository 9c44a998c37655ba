"""Per-block partials of a Ray Dataset, gathered in one pass (data/profile.py merges them).

Why not `Dataset.aggregate`/`unique`/`groupby`: in Ray 2.60 each of those runs a hash
shuffle with aggregator actors, 3-4 s per call on a 2-core machine even for 400 rows, and
the data stage needs several. A partial per block is one task-pool pass, and the partials
are small: counts, moments, sketches, capped value counts.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import pandas as pd

from rayline.data.task_cpus import map_args

__all__ = ["block_partials"]


class _PerBlock:
    """A picklable map_batches callable: one pickled partial per block."""

    def __init__(self, fn: Callable[[pd.DataFrame], Any]):
        self.fn = fn

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"partial": [pickle.dumps(self.fn(batch))]})


def block_partials(ds, fn: Callable[[pd.DataFrame], Any]) -> list:
    """`fn(block as pandas)` for every block of `ds`, in one pass."""
    rows = ds.map_batches(_PerBlock(fn), batch_format="pandas", batch_size=None, **map_args()).take_all()
    return [pickle.loads(row["partial"]) for row in rows]
