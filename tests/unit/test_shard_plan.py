"""train.in_memory: how a torch or tensorflow worker holds its train shard (rayline/train/loop.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rayline.train.loop import epoch_order, fewest_rows, shard_plan

GIB = 2**30


def _plan(setting="auto", rows=100_000, world=2, features=13, streamed=False, reserved=None, available=8 * GIB, local=2):
    return shard_plan(setting, rows, world, features, streamed=streamed, reserved_bytes=reserved,
                      available_bytes=available, local_workers=local)


def test_auto_holds_a_shard_in_memory_up_to_half_the_workers_share_of_the_node():
    plan = _plan()
    # 50,000 rows of 13 float32 features and an int64 label each
    assert (plan.kind, plan.shard_rows, plan.estimated_bytes) == ("memory", 50_000, 50_000 * (13 * 4 + 8))
    assert (plan.budget_bytes, plan.budget_source) == (4 * GIB, "available")
    # 2 workers on a node with 1 GB free: 0.5 GB each, half of it for the shard
    just_fits = _plan(rows=2 * (GIB // 4) // 60, available=GIB)
    assert just_fits.kind == "memory" and just_fits.estimated_bytes <= GIB // 4
    assert _plan(rows=2 * (GIB // 4) // 60 + 2, available=GIB).kind == "stream"


def test_a_reserved_memory_is_the_budget_and_the_setting_overrides_auto():
    reserved = _plan(rows=10_000, reserved=1e6)  # 5,000 x 60 bytes = 300 kB <= half of 1 MB
    assert (reserved.kind, reserved.budget_bytes, reserved.budget_source) == ("memory", 1_000_000, "reserved")
    assert _plan(rows=20_000, reserved=1e6).kind == "stream"  # 600 kB > 500 kB
    assert _plan("always", rows=10**9, available=GIB).kind == "memory"
    assert _plan("never", rows=10).kind == "stream"


def test_rows_as_read_are_held_decoded_when_they_fit_and_the_plan_records_what_decided_it():
    # Images' bytes: the estimate is of the decoded rows (13 float32 features here), held once decoded.
    plan = _plan(streamed=True)
    assert plan.as_dict() == {"kind": "memory", "shard_rows": 50_000, "estimated_bytes": 3_000_000,
                              "budget_bytes": 4 * GIB, "budget_source": "available", "setting": "auto",
                              "handed_off": False, "decoded": True}
    # Decoded rows over half the budget, or `never`: decoded per batch at every epoch.
    too_big = _plan(streamed=True, rows=2 * (GIB // 4) // 60 + 2, available=GIB)
    assert (too_big.kind, too_big.decoded) == ("stream", False)
    assert (_plan("never", streamed=True).kind, _plan("never", streamed=True).decoded) == ("stream", False)
    assert _plan("always", streamed=True, rows=10**9, available=GIB).decoded
    assert not _plan().decoded  # model-ready rows: nothing to decode
    # Arrays the driver handed over are in memory already, whatever the budget.
    assert shard_plan("auto", 10**9, 2, 13, streamed=False, reserved_bytes=1e6, available_bytes=GIB, local_workers=2,
                      handed_off=True).kind == "memory"


def test_each_epoch_trains_a_fresh_permutation_the_same_for_the_same_seed():
    first, again = epoch_order(1000, 0, 3, 1), epoch_order(1000, 0, 3, 1)
    assert sorted(first) == list(range(1000)) and (first == again).all()
    others = [epoch_order(1000, 0, 4, 1), epoch_order(1000, 0, 3, 0), epoch_order(1000, 1, 3, 1)]
    assert all((first != other).mean() > 0.9 for other in others)


@pytest.mark.parametrize("rows, expected", [([5, 5, 5], 5), ([7, 5, 6], 5), ([0, 3], 0)])
def test_every_worker_keeps_the_fewest_rows_any_holds(rows, expected):
    world = len(rows)
    # What a collective's sum gives every worker: the tables each one contributes, added.
    tables = []

    def allreduce_sum(table):
        tables.append(np.asarray(table))
        return sum(_table(r, i, world) for i, r in enumerate(rows))

    assert [fewest_rows(r, i, world, allreduce_sum) for i, r in enumerate(rows)] == [expected] * world
    assert [list(t) for t in tables] == [list(_table(r, i, world)) for i, r in enumerate(rows)]
    assert fewest_rows(9, 0, 1, lambda _: pytest.fail("one worker needs no collective")) == 9


def _table(rows, rank, world):
    table = np.zeros(world, dtype=np.int64)
    table[rank] = rows
    return table


def test_a_handed_off_train_split_is_each_workers_equal_share_and_valid_is_whole():
    from rayline.train.splits import ArrayShard

    arrays = {"features": np.arange(22, dtype=np.float32).reshape(11, 2), "label": np.arange(11)}
    shares = [ArrayShard(arrays, rank=r, world=3, split=True) for r in range(3)]
    assert [len(s.labels) for s in shares] == [3, 3, 3]  # 11 rows: 3 each, as Ray's equal split
    assert [list(next(s.iter_batches())["label"]) for s in shares] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    whole = ArrayShard(arrays, rank=1, world=3)  # valid, probe: every worker reads all rows
    batches = list(whole.iter_batches(batch_size=4))
    assert [len(b["label"]) for b in batches] == [4, 4, 3] and batches[2]["features"].tolist() == [[16, 17], [18, 19], [20, 21]]
    with pytest.raises(ValueError, match="numpy batches"):
        next(whole.iter_batches(batch_format="pandas"))


def test_only_small_model_ready_splits_are_handed_off():
    from types import SimpleNamespace

    from rayline.train.splits import HANDOFF_BYTES, hand_off, handed_off_bytes

    big = SimpleNamespace(train_streamed=False, rows={"train": HANDOFF_BYTES // 60 + 1, "valid": 0, "test": 0},
                          preprocessing=SimpleNamespace(output_columns=["f"] * 13), probe=None, task="classification")
    assert handed_off_bytes(big.rows["train"], 13) > HANDOFF_BYTES
    assert hand_off(big, "auto", {"train": None, "valid": None}) is None  # data beyond the limit keeps streaming through Ray Data
    small = SimpleNamespace(**{**vars(big), "rows": {"train": 100, "valid": 20, "test": 20}})
    assert hand_off(small, "never", {"train": None, "valid": None}) is None  # the spec asks to stream
    assert hand_off(SimpleNamespace(**{**vars(small), "train_streamed": True}), "auto", {"train": None}) is None  # images as read
