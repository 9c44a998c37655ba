"""Column statistics of a Ray Dataset from per-block partials, combined on the driver.

Why not `Dataset.aggregate`/`unique`/`groupby`: in Ray 2.60 each of those runs a hash
shuffle with aggregator actors, 3-4 s per call on a 2-core machine even for 400 rows, and
the data stage needs several. A partial per block is one task-pool pass (~0.1-0.3 s),
and the partials are small: counts, moments, distinct values. Only an exact median needs
the column's values on the driver, as Ray's own Quantile aggregation does.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from typing import Any, Callable

import numpy as np
import pandas as pd

__all__ = ["block_partials", "numeric_stats", "combine_numeric", "moments_of", "distinct_values", "value_counts", "label_summary"]


class _PerBlock:
    """A picklable map_batches callable: one pickled partial per block."""

    def __init__(self, fn: Callable[[pd.DataFrame], Any]):
        self.fn = fn

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"partial": [pickle.dumps(self.fn(batch))]})


def block_partials(ds, fn: Callable[[pd.DataFrame], Any]) -> list:
    """`fn(block as pandas)` for every block of `ds`, in one pass."""
    rows = ds.map_batches(_PerBlock(fn), batch_format="pandas", batch_size=None).take_all()
    return [pickle.loads(row["partial"]) for row in rows]


def _present(series: pd.Series) -> pd.Series:
    return series[series.notna()]


def _plain(values) -> list:
    """Python scalars (not numpy ones), NaN and None dropped."""
    out = []
    for value in values:
        value = value.item() if hasattr(value, "item") else value
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        out.append(value)
    return out


class _Moments:
    def __init__(self, cols: list[str], keep_values: bool):
        self.cols, self.keep_values = cols, keep_values

    def __call__(self, batch: pd.DataFrame) -> dict:
        out = {}
        for col in self.cols:
            x = _present(batch[col]).to_numpy(dtype=np.float64)
            n = len(x)
            mean = float(x.mean()) if n else 0.0
            out[col] = {
                "n": n,
                "mean": mean,
                "m2": float(((x - mean) ** 2).sum()) if n else 0.0,
                "min": float(x.min()) if n else None,
                "max": float(x.max()) if n else None,
                "values": [x] if self.keep_values else None,  # joined once, at the end
            }
        return out


def moments_of(cols: list[str], keep_values: bool = False) -> Callable[[pd.DataFrame], dict]:
    """The per-block partial `numeric_stats` computes (exposed for tests)."""
    return _Moments(cols, keep_values)


def _combine(a: dict, b: dict) -> dict:
    """Chan et al.'s parallel update of count, mean and sum of squared deviations."""
    if not a["n"]:
        return b
    if not b["n"]:
        return a
    n = a["n"] + b["n"]
    delta = b["mean"] - a["mean"]
    values = None if a["values"] is None else a["values"] + b["values"]
    return {
        "n": n,
        "mean": a["mean"] + delta * b["n"] / n,
        "m2": a["m2"] + b["m2"] + delta * delta * a["n"] * b["n"] / n,
        "min": min(a["min"], b["min"]),
        "max": max(a["max"], b["max"]),
        "values": values,
    }


def numeric_stats(ds, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
    """`{stat: {col: value}}` for stats among mean, median, std (ddof=0), min, max; None when a column has no values."""
    if not cols:
        return {name: {} for name in names}
    return combine_numeric(block_partials(ds, _Moments(cols, keep_values="median" in names)), names, cols)


def combine_numeric(partials: list[dict], names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
    """The statistics of the whole column from each block's `_Moments` partial."""
    merged: dict[str, dict] = {}
    for partial in partials:
        for col, moments in partial.items():
            merged[col] = _combine(merged[col], moments) if col in merged else moments
    out: dict[str, dict[str, float | None]] = {name: {} for name in names}
    for col in cols:
        m = merged.get(col)
        empty = m is None or not m["n"]
        for name in names:
            if empty:
                value = None
            elif name == "mean":
                value = m["mean"]
            elif name == "std":
                value = math.sqrt(m["m2"] / m["n"])
            elif name == "median":
                value = float(np.median(np.concatenate(m["values"])))
            else:
                value = m[name]
            out[name][col] = value
    return out


class _Distinct:
    def __init__(self, col: str):
        self.col = col

    def __call__(self, batch: pd.DataFrame) -> list:
        return _plain(pd.unique(_present(batch[self.col])))


def _union(value_lists) -> list:
    """The distinct values of several lists; 1, 1.0 and True stay apart."""
    seen: dict = {}
    for values in value_lists:
        for value in values:
            seen.setdefault((type(value).__name__, value), value)
    return list(seen.values())


def distinct_values(ds, col: str) -> list:
    """The distinct non-null values of `col` (unordered)."""
    return _union(block_partials(ds, _Distinct(col)))


class _Counts:
    def __init__(self, col: str):
        self.col = col

    def __call__(self, batch: pd.DataFrame) -> list:
        counts = _present(batch[self.col]).value_counts()
        return list(zip(_plain(counts.index), (int(c) for c in counts.to_numpy())))


def value_counts(ds, col: str) -> list[tuple[Any, int]]:
    """(value, count) for every non-null value of `col`."""
    total: Counter = Counter()
    for pairs in block_partials(ds, _Counts(col)):
        for value, count in pairs:
            total[value] += count
    return list(total.items())


class _LabelSummary:
    def __init__(self, col: str):
        self.col = col

    def __call__(self, batch: pd.DataFrame) -> dict:
        column = batch[self.col]
        return {"nulls": int(column.isna().sum()), "values": _plain(pd.unique(_present(column)))}


def label_summary(ds, col: str) -> tuple[int, list]:
    """(rows with no value in `col`, its distinct values), in one pass."""
    parts = block_partials(ds, _LabelSummary(col))
    return sum(p["nulls"] for p in parts), _union(p["values"] for p in parts)
