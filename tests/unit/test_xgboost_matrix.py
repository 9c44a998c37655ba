"""How an xgboost worker holds its train shard (rayline/train/xgboost_backend.py): the plan from
the shard's size and the worker's memory budget, and the external-memory matrix itself, built
from batches like a Ray Train shard's and trained on with xgboost (no Ray needed)."""

import os

import numpy as np
import pytest

from rayline.train.xgboost_backend import matrix_plan, train_matrix


@pytest.mark.parametrize("setting, tree_method, reserved, available, kind", [
    ("auto", "hist", None, 10**10, "quantile"),  # 6,500 bytes of bin indices in 5 GB: RAM
    ("auto", "hist", 10_000, 10**10, "external"),  # in 10 KB reserved: more than half of it
    ("auto", "hist", None, 10_000, "external"),  # 5 KB of node memory per local worker
    ("auto", "hist", 20_000, 10**10, "quantile"),  # the reservation decides, not the node
    ("always", "hist", None, 10**10, "external"),
    ("never", "hist", 1, 10**10, "quantile"),
    ("always", "exact", None, 10**10, "dmatrix"),  # external memory is hist-only in xgboost
])
def test_matrix_plan(setting, tree_method, reserved, available, kind):
    plan = matrix_plan(setting, tree_method, train_rows=1000, world_size=2, num_features=13, max_bin=256,
                       reserved_bytes=reserved, available_bytes=available, local_workers=2)
    assert plan.kind == kind
    assert plan.shard_rows == 500 and plan.estimated_bytes == 500 * 13
    assert plan.budget_source == ("reserved" if reserved else "available")
    assert plan.budget_bytes == (reserved if reserved else available // 2)


def test_two_byte_bins_count_double():
    small = matrix_plan("auto", "hist", 1000, 1, 4, 256, None, 10**10, 1)
    large = matrix_plan("auto", "hist", 1000, 1, 4, 1024, None, 10**10, 1)
    assert large.estimated_bytes == 2 * small.estimated_bytes


def test_external_matrix_pages_on_disk_and_trains_as_the_in_memory_one(tmp_path):
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12_000, 5)).astype(np.float32)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int64)
    passes = []

    def batches():
        passes.append(1)
        return ((x[i:i + 2500], y[i:i + 2500]) for i in range(0, len(x), 2500))

    params = {"nthread": 1, "objective": "binary:logistic", "seed": 0}
    external, rows = train_matrix(batches, params, 5, kind="external", cache_dir=str(tmp_path))
    assert isinstance(external, xgb.ExtMemQuantileDMatrix) and rows == len(x)
    assert [f for f in os.listdir(tmp_path) if f.startswith("shard")], "no page was written to the cache folder"
    in_memory, _ = train_matrix(batches, params, 5, kind="quantile")
    assert isinstance(in_memory, xgb.QuantileDMatrix) and not isinstance(in_memory, xgb.ExtMemQuantileDMatrix)
    a = xgb.train(params, external, 8).inplace_predict(x)
    b = xgb.train(params, in_memory, 8).inplace_predict(x)
    np.testing.assert_allclose(a, b, rtol=1e-6)  # the same quantile cuts and trees
    assert ((a > 0.5) == y).mean() > 0.95


def test_external_needs_a_cache_folder():
    with pytest.raises(ValueError, match="cache_dir"):
        train_matrix(lambda: iter([(np.zeros((2, 1), np.float32), np.zeros(2))]), {"nthread": 1}, 1, kind="external")
