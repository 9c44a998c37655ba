"""Column statistics combined from per-block partials equal the statistics of the whole column."""

import numpy as np
import pandas as pd
import pytest

from rayline.data.partials import combine_numeric, moments_of

NAMES = ("mean", "median", "std", "min", "max")


def _whole(series):
    return {"mean": series.mean(), "median": series.median(), "std": series.std(ddof=0), "min": series.min(), "max": series.max()}


@pytest.mark.parametrize("splits", [[400], [1, 399], [100, 100, 100, 100], [0, 7, 0, 393], [3] * 133 + [1]])
def test_partials_combine_to_the_whole_column(splits):
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"x": rng.normal(1e4, 3.0, 400), "n": rng.integers(0, 9, 400).astype(float)})
    frame.loc[rng.random(400) < 0.2, "n"] = np.nan  # gaps are skipped, as pandas does
    edges = np.cumsum([0] + splits)
    blocks = [frame.iloc[a:b] for a, b in zip(edges[:-1], edges[1:])]
    stats = combine_numeric([moments_of(["x", "n"], keep_values=True)(b) for b in blocks], NAMES, ["x", "n"])
    for col in ("x", "n"):
        expected = _whole(frame[col])
        for name in NAMES:
            assert stats[name][col] == pytest.approx(expected[name], rel=1e-12, abs=1e-12), (col, name)


def test_a_column_with_no_values_gives_none():
    block = pd.DataFrame({"x": [np.nan, np.nan]})
    stats = combine_numeric([moments_of(["x"])(block)], ("mean", "std", "min"), ["x"])
    assert stats == {"mean": {"x": None}, "std": {"x": None}, "min": {"x": None}}
