"""The train/valid/test split by a hash of each row, never by its position.

Why a hash: a split from `random_shuffle` + `split_proportionately` depends on the block
layout (file sizes, read parallelism, the cluster's nodes), and the shuffle holds a second
full copy of the data. A row's split here is a function of the seed and the row alone, so the
same data gives the same split on one node or many, in one pass that streams.

The row key is `data.split.key` when the data has a stable id column, otherwise the row's own
values (every column the spec reads). Keying on the values rather than on a file position
keeps the split independent of how the rows are laid out in files, and puts duplicate rows in
one split, so no row of the test split is also a training row.

Each row gets a 64-bit hash (pandas' `hash_pandas_object` of its key columns, mixed with the seed); rows with
hash < VALID go to valid, then test up to VALID + TEST, the rest to train. The split's sizes
are the fractions in expectation, not exactly (a binomial draw per split).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["HASH_COLUMN", "TRAIN", "VALID", "TEST", "SPLITS", "row_hashes", "Thresholds", "AddRowHash"]

HASH_COLUMN = "__rayline_row_hash"
TRAIN, VALID, TEST = "train", "valid", "test"
SPLITS = (TRAIN, VALID, TEST)
_SPAN = float(2**64)


def _mix(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit flips about half the output bits (wraps mod 2^64)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _canonical(column: pd.Series) -> np.ndarray:
    """One representation per value, whatever type a reader inferred for the column in one
    file or block: numbers (and booleans) as float64, everything else as Python objects."""
    if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
        return column.to_numpy(dtype="float64", na_value=np.nan)
    if isinstance(column.dtype, pd.StringDtype) and column.dtype.na_value is np.nan:
        return column  # pandas' `str` columns hash as the same strings in an object array do (tested), 2x faster
    values = column.to_numpy(dtype=object, copy=True)
    values[pd.isna(values)] = None
    return values


def row_hashes(frame: pd.DataFrame, columns: list[str], seed: int) -> np.ndarray:
    """uint64 hash of each row's `columns` (in that order), keyed by `seed`.

    pandas hashes each column (its hash of numbers ignores the hash key, so the seed is mixed
    in afterwards) and combines the columns' hashes per row."""
    keyed = pd.DataFrame({c: _canonical(frame[c]) for c in columns})
    hashes = pd.util.hash_pandas_object(keyed, index=False, categorize=True).to_numpy(dtype=np.uint64)
    salt = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        return _mix(hashes ^ salt)


class Thresholds:
    """Hash ranges of the splits: valid [0, a), test [a, b), train [b, 2^64)."""

    def __init__(self, valid: float, test: float):
        self.a = np.uint64(min(int(valid * _SPAN), 2**64 - 1))
        self.b = np.uint64(min(int((valid + test) * _SPAN), 2**64 - 1))

    def mask(self, hashes: np.ndarray, split: str) -> np.ndarray:
        if split == VALID:
            return hashes < self.a
        if split == TEST:
            return (hashes >= self.a) & (hashes < self.b)
        return hashes >= self.b

    def counts(self, hashes: np.ndarray) -> dict[str, int]:
        valid = int((hashes < self.a).sum())
        below_b = int((hashes < self.b).sum())
        return {VALID: valid, TEST: below_b - valid, TRAIN: len(hashes) - below_b}


class AddRowHash:
    """A picklable map_batches callable (pyarrow batches): the raw columns plus HASH_COLUMN.

    Only the key columns go through pandas; the others pass through as Arrow, untouched."""

    def __init__(self, key_columns: list[str], seed: int):
        self.key_columns, self.seed = key_columns, seed

    def __call__(self, table):
        import pyarrow as pa

        frame = table.select(self.key_columns).to_pandas()
        return table.append_column(HASH_COLUMN, pa.array(row_hashes(frame, self.key_columns, self.seed), pa.uint64()))
