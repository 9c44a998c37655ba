"""The split by row hash: a function of the seed and the row alone."""

import numpy as np
import pandas as pd
import pyarrow as pa

from rayline.data.split import HASH_COLUMN, TEST, TRAIN, VALID, AddRowHash, Thresholds, row_hashes
from tests.cli import rayline as rayline_in_process


def _frame(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": np.arange(n), "x": rng.normal(size=n).round(3), "n": rng.integers(0, 9, n),
                         "s": rng.choice(["a", "b", "c"], n), "y": rng.integers(0, 2, n)})


def test_a_rows_hash_does_not_depend_on_the_types_a_reader_inferred():
    frame = _frame()
    cols = ["x", "n", "s", "y"]
    other = frame.copy()
    other["n"] = other["n"].astype("float64")  # a file or block where the column had a gap
    other["s"] = other["s"].astype(object)
    other["y"] = other["y"].astype("int32")
    assert (row_hashes(frame, cols, 7) == row_hashes(other, cols, 7)).all()


def test_a_rows_hash_does_not_depend_on_its_block():
    frame = _frame()
    cols = ["x", "n", "s", "y"]
    whole = row_hashes(frame, cols, 7)
    parts = np.concatenate([row_hashes(frame.iloc[a:b], cols, 7) for a, b in ((0, 1), (1, 400), (400, 1000))])
    assert (whole == parts).all()
    shuffled = frame.sample(frac=1.0, random_state=1)
    assert (row_hashes(shuffled, cols, 7) == whole[shuffled.index.to_numpy()]).all()


def test_the_seed_changes_the_split_and_the_key_alone_decides_it():
    frame = _frame()
    assert (row_hashes(frame, ["id"], 1) != row_hashes(frame, ["id"], 2)).mean() > 0.99
    changed = frame.assign(x=0.0, s="z")
    assert (row_hashes(frame, ["id"], 1) == row_hashes(changed, ["id"], 1)).all()
    assert (row_hashes(frame, ["id", "x"], 1) != row_hashes(changed, ["id", "x"], 1)).mean() > 0.99


def test_thresholds_partition_the_rows_in_the_asked_proportions():
    hashes = row_hashes(pd.DataFrame({"id": np.arange(100_000)}), ["id"], 0)
    thresholds = Thresholds(0.2, 0.1)
    masks = {s: thresholds.mask(hashes, s) for s in (TRAIN, VALID, TEST)}
    assert (sum(m.astype(int) for m in masks.values()) == 1).all()  # every row in exactly one split
    counts = thresholds.counts(hashes)
    assert counts == {s: int(m.sum()) for s, m in masks.items()}
    for split, fraction in ((VALID, 0.2), (TEST, 0.1), (TRAIN, 0.7)):
        sigma = (100_000 * fraction * (1 - fraction)) ** 0.5
        assert abs(counts[split] - 100_000 * fraction) < 5 * sigma, (split, counts)


def test_the_arrow_callable_appends_the_hash_and_keeps_the_other_columns_as_they_were():
    frame = _frame(50)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    out = AddRowHash(["id"], 3)(table)
    assert out.column_names == table.column_names + [HASH_COLUMN]
    assert out.select(table.column_names).equals(table)
    assert (out.column(HASH_COLUMN).to_numpy() == row_hashes(frame, ["id"], 3)).all()


def test_any_int_seed_gives_its_own_split():
    """Negative and large seeds (the spec allows any int) salt the hash too, each differently."""
    frame = _frame(200)
    hashes = {seed: row_hashes(frame, ["id"], seed) for seed in (0, 123, -5, 10**17)}
    assert all(len(h) == 200 for h in hashes.values())
    seeds = list(hashes)
    for i, a in enumerate(seeds):
        for b in seeds[i + 1:]:
            assert (hashes[a] != hashes[b]).mean() > 0.99, (a, b)


def test_validate_names_a_split_key_the_data_lacks(tmp_path):

    (tmp_path / "rows.csv").write_text("id,a,y\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(20)))
    spec = ("name: keyed\ndata:\n  source: {format: csv, path: rows.csv}\n  label: y\n  split: {key: %s}\n"
            "model: {framework: xgboost, kind: gbdt}\n")
    (tmp_path / "bad.yaml").write_text(spec % "row_id")
    (tmp_path / "good.yaml").write_text(spec % "id")
    bad = rayline_in_process("validate", "bad.yaml", cwd=tmp_path)
    assert bad.returncode == 2
    assert "data.split.key: no such column in the data (got 'row_id'; allowed: id, a, y)" in bad.stderr, bad.stderr
    good = rayline_in_process("validate", "good.yaml", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
