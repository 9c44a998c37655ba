"""The data stage in the driver's process, for data that fits it (`data.in_process`).

Ray Data runs each read and map of the data stage as Ray tasks: half a dozen executions, each with
its executor's start, worker processes to start or wake and blocks to move through the object
store. For a small file that is nearly all of the stage: the 569 rows of breast_cancer as a CSV
took 7-17 s to read and hash on a loaded 2-core box (2026-12-06), for milliseconds of parsing.

`LocalBlocks` holds the blocks of a source read in this process and runs the same callables the
stage hands Ray Data (`map_batches` of whole blocks or of `batch_size` rows), converting batches
to and from blocks with Ray Data's own `BlockAccessor`, so a callable sees exactly the batch a
Ray task would give it. What the stage hands on (the splits for training, the test rows for
registration) becomes Ray Datasets of those blocks with `ray.data.from_blocks`, which runs no task.

Only what fits reads this way: local files (CSV, Parquet, JSON) or an image folder of at most
`IN_PROCESS_MAX_BYTES` in all, or a bundled sklearn dataset. URIs and larger data keep Ray Data's
parallel and streaming reads; so does a file Arrow's reader fails on (Ray's readers then name what
is wrong, as they always did).
"""

from __future__ import annotations

import os
import random
from typing import Callable, Iterator

__all__ = ["IN_PROCESS_MAX_BYTES", "LocalBlocks", "in_process_bytes", "read_in_process", "as_dataset"]

# Up to this many bytes of files the stage reads and maps in this process (in threads, one per core).
# Measured on the 2-core box (benchmarks/overhead.py --only xgboost): a 1M-row, 35-MB CSV's stage took
# 2.9-4.0 s in process against 5.3 s through Ray Data's tasks; the driver holds the parsed rows, a few
# times the file's size. Beyond this, Ray Data's parallel, streaming reads (and the data beyond RAM).
IN_PROCESS_MAX_BYTES = 64 << 20
# Rows per block of a file read here: Train's workers split a Dataset's blocks between them, and
# the train split's rows are permuted within a block (data/pipeline.py).
BLOCK_ROWS = 250_000


class LocalBlocks:
    """Arrow blocks in this process, with the part of `ray.data.Dataset`'s interface the data stage
    uses (map_batches, select_columns, take_batch, take_all, schema, num_blocks, materialize,
    randomize_block_order); `to_dataset` hands them to Ray."""

    in_process = True

    def __init__(self, blocks: list):
        self.blocks = list(blocks)

    def schema(self):
        import pyarrow as pa

        return pa.unify_schemas([b.schema for b in self.blocks], promote_options="permissive")

    def num_blocks(self) -> int:
        return len(self.blocks)

    def count(self) -> int:
        return sum(b.num_rows for b in self.blocks)

    def select_columns(self, columns: list[str], **_ray_args) -> "LocalBlocks":
        return LocalBlocks([b.select(columns) for b in self.blocks])

    def map_batches(self, fn: Callable, *, batch_format: str = "pyarrow", batch_size: int | None = None,
                    **_ray_args) -> "LocalBlocks":
        from ray.data.block import BlockAccessor

        def one(batch):
            return BlockAccessor.batch_to_block(fn(BlockAccessor.for_block(batch).to_batch_format(batch_format)))

        batches = [batch for block in self.blocks for batch in _batches(block, batch_size)]
        threads = min(len(batches), os.cpu_count() or 1)
        if threads < 2:
            return LocalBlocks([one(batch) for batch in batches])
        # Batches at once on the machine's cores, as Ray's tasks would run them: Arrow, numpy and
        # pandas do most of the work outside the GIL (1M rows' transform and cache write in a script on
        # the 2-core box: 1.1-1.5 s one block after another, 0.7-1.0 s in threads).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads, thread_name_prefix="rayline-data") as pool:
            return LocalBlocks(list(pool.map(one, batches)))

    def take_batch(self, batch_size: int, *, batch_format: str = "pyarrow"):
        import pyarrow as pa
        from ray.data.block import BlockAccessor

        tables = [BlockAccessor.for_block(b).to_arrow() for b in self.blocks]
        head = pa.concat_tables(tables, promote_options="permissive").slice(0, batch_size)
        return BlockAccessor.for_block(head).to_batch_format(batch_format)

    def take_all(self) -> list[dict]:
        from ray.data.block import BlockAccessor

        return [row for b in self.blocks for row in BlockAccessor.for_block(b).to_arrow().to_pylist()]

    def materialize(self, progress=None) -> "LocalBlocks":
        if progress is not None:
            for block in self.blocks:
                progress.add(block.num_rows, 1)
        return self

    def randomize_block_order(self, seed: int | None = None) -> "LocalBlocks":
        blocks = list(self.blocks)
        random.Random(seed).shuffle(blocks)
        return LocalBlocks(blocks)

    def to_dataset(self):
        """A Ray Dataset of these blocks (put in the object store from here: no task)."""
        import ray.data

        return ray.data.from_blocks(self.blocks)


def _batches(block, batch_size: int | None) -> Iterator:
    from ray.data.block import BlockAccessor

    rows = BlockAccessor.for_block(block).num_rows()
    if batch_size is None or rows <= batch_size:
        yield block
        return
    accessor = BlockAccessor.for_block(block)
    for start in range(0, rows, batch_size):
        yield accessor.slice(start, min(start + batch_size, rows), copy=False)


def as_dataset(data):
    """`data` as a Ray Dataset: LocalBlocks handed to Ray, a Dataset as it is."""
    return data.to_dataset() if isinstance(data, LocalBlocks) else data


def in_process_bytes(source) -> int | None:
    """The bytes of `source`'s files when the stage may read them in this process (local CSV,
    Parquet or JSON files, or an image folder's images, of at most IN_PROCESS_MAX_BYTES in all; 0
    for a bundled sklearn dataset), else None."""
    from rayline.data.sources import is_uri, resolve_paths

    if source.format == "sklearn":
        return 0
    if source.format == "image_folder":
        from rayline.data.image_folder import image_files

        if is_uri(source.path or ""):
            return None
        files = [file for file, _ in image_files(source.path)]
    else:
        files = resolve_paths(source)
    if not files or any(is_uri(f) for f in files):
        return None
    # A compressed file counted at ten times its size: about what CSV compresses to.
    total = sum(os.path.getsize(f) * (10 if f.lower().endswith(".gz") else 1) for f in files)
    return total if total <= IN_PROCESS_MAX_BYTES else None


def read_in_process(source) -> LocalBlocks | None:
    """Every row of `source` read in this process, as Ray's readers parse it, or None when it is
    not one to read here (`in_process_bytes`) or a file is one Arrow's reader fails on (Ray's
    readers then read it, and name what is wrong)."""
    from rayline.data.sources import read_file, resolve_paths, sample_table
    from rayline.errors import DataError

    if in_process_bytes(source) is None:
        return None
    if source.format == "sklearn":
        return LocalBlocks([sample_table(source)])  # the whole bundled set
    if source.format == "image_folder":
        from rayline.data.image_folder import image_folder_tables

        # A file that is not an image fails here as in Ray's read (the same check, the same message).
        return LocalBlocks(image_folder_tables(source.path))
    blocks = []
    for file in resolve_paths(source):
        try:
            table = read_file(file, source.format)
        except DataError:
            return None
        if source.format == "json" and not table.num_rows:
            continue  # as Ray's JSON datasources (data/sources.py) yield no block for an empty file
        blocks.extend(table.slice(start, BLOCK_ROWS) for start in range(0, max(table.num_rows, 1), BLOCK_ROWS))
    return LocalBlocks(blocks) if blocks else None
