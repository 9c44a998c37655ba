"""The data stage's in-process reads (rayline/data/in_process.py): which sources qualify, blocks as
Ray's readers parse them, and map_batches giving each callable the batch a Ray task would."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rayline.data import in_process
from rayline.data.in_process import LocalBlocks, in_process_bytes, read_in_process
from rayline.data.sources import read_file
from rayline.spec.data_spec import SourceSpec


def _frame(rows=300):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"x": rng.normal(size=rows), "n": rng.integers(0, 9, rows),
                         "plan": rng.choice(["a", "b", None], rows), "y": rng.integers(0, 2, rows)})


def _source(fmt, path):
    return SourceSpec(format=fmt, path=str(path))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_a_small_local_file_is_read_here_as_the_readers_parse_it(tmp_path, fmt):
    frame = _frame()
    path = tmp_path / f"rows.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    blocks = read_in_process(_source(fmt, path))
    assert isinstance(blocks, LocalBlocks) and blocks.count() == len(frame)
    assert blocks.blocks[0].equals(read_file(path, fmt))  # the one reader every command uses
    assert blocks.schema().names == list(frame.columns)


def test_a_folder_of_files_is_one_block_each_and_big_files_are_sliced(tmp_path, monkeypatch):
    frame = _frame(300)
    folder = tmp_path / "parts"
    folder.mkdir()
    frame.iloc[:100].to_csv(folder / "a.csv", index=False)
    frame.iloc[100:].to_csv(folder / "b.csv", index=False)
    assert [b.num_rows for b in read_in_process(_source("csv", folder)).blocks] == [100, 200]
    monkeypatch.setattr(in_process, "BLOCK_ROWS", 64)
    assert [b.num_rows for b in read_in_process(_source("csv", folder)).blocks] == [64, 36, 64, 64, 64, 8]


def test_what_does_not_fit_or_is_not_local_stays_with_ray_data(tmp_path, monkeypatch):
    path = tmp_path / "rows.csv"
    _frame().to_csv(path, index=False)
    size = path.stat().st_size
    assert in_process_bytes(_source("csv", path)) == size
    monkeypatch.setattr(in_process, "IN_PROCESS_MAX_BYTES", size - 1)
    assert in_process_bytes(_source("csv", path)) is None and read_in_process(_source("csv", path)) is None
    assert read_in_process(_source("csv", "s3://bucket/rows.csv")) is None
    assert read_in_process(SourceSpec(format="image_folder", path="s3://bucket/images")) is None
    digits = read_in_process(SourceSpec(format="sklearn", name="digits"))
    assert digits.count() == 1797 and "target" in digits.schema().names


def test_an_image_folder_is_read_here_in_read_image_folders_order(tmp_path, monkeypatch):
    import random

    from PIL import Image

    root = tmp_path / "images"
    files = []
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (4, 4), color=40 * i).save(root / label / f"{i}.png")
            files.append(str(root / label / f"{i}.png"))
    source = SourceSpec(format="image_folder", path=str(root))
    table = pa.concat_tables(read_in_process(source).blocks)
    random.Random(0).shuffle(files)  # read_image_folder's fixed order: classes mixed in every block
    assert table.column("path").to_pylist() == [f.removeprefix(str(root) + "/") for f in files]
    assert table.column("label").to_pylist() == [f.split("/")[-2] for f in files]
    assert table.column("image").to_pylist() == [open(f, "rb").read() for f in files]
    monkeypatch.setattr(in_process, "IN_PROCESS_MAX_BYTES", sum(len(open(f, "rb").read()) for f in files) - 1)
    assert read_in_process(source) is None


def test_a_file_arrow_cannot_read_goes_to_ray_data_which_names_the_problem(tmp_path):
    """In-process reading never decides an error message: a malformed file is read by Ray's
    readers as before, whose one-line errors the data tests check."""
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n1,2\n3,4,5\n")
    assert in_process_bytes(_source("csv", path)) is not None
    assert read_in_process(_source("csv", path)) is None


def test_map_batches_gives_each_batch_format_and_size_as_ray_data_would():
    table = pa.table({"a": np.arange(10), "s": ["x", None] * 5})
    blocks = LocalBlocks([table, table.slice(0, 3)])
    seen = []

    def record(batch):
        seen.append((type(batch).__name__, len(batch["a"])))
        return batch

    out = blocks.map_batches(record, batch_format="pandas", batch_size=4)
    # Batches run in threads (in any order); the blocks come back in the batches' order.
    assert sorted(seen) == [("DataFrame", 2), ("DataFrame", 3), ("DataFrame", 4), ("DataFrame", 4)]
    assert out.num_blocks() == 4 and out.count() == 13
    assert [b.num_rows for b in out.blocks] == [4, 4, 2, 3] and out.take_all()[8]["a"] == 8
    seen.clear()
    blocks.map_batches(record, batch_format="numpy", batch_size=None)
    assert sorted(seen) == [("dict", 3), ("dict", 10)]
    as_dicts = blocks.map_batches(lambda b: {"twice": b["a"] * 2}, batch_format="numpy")
    assert as_dicts.take_batch(12, batch_format="pandas")["twice"].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 0, 2]
    assert [r["a"] for r in blocks.take_all()] == list(range(10)) + [0, 1, 2]
    assert blocks.select_columns(["s"]).schema().names == ["s"]


def test_block_order_is_shuffled_by_its_seed_alone():
    blocks = LocalBlocks([pa.table({"a": [i]}) for i in range(8)])
    first = [b["a"][0].as_py() for b in blocks.randomize_block_order(seed=3).blocks]
    assert first == [b["a"][0].as_py() for b in blocks.randomize_block_order(seed=3).blocks]
    assert sorted(first) == list(range(8)) and first != list(range(8))
