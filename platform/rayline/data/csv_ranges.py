"""Large CSV files read in parallel byte ranges.

Ray Data reads a CSV file in one task (files are its unit of parallelism), so one 3 GB file
is parsed by one core while the others wait, and every later step starts from its ~1 MB blocks
(hundreds of tiny tasks). Here a file is cut into byte ranges, each parsed by its own Ray task
into one block: about two ranges per CPU of the cluster, each between MIN_RANGE_BYTES and
RANGE_BYTES (`range_size`).

A row belongs to the range its line starts in: a task skips the partial line at its start and
reads past its end to the end of the line it is in. That is exact because Arrow's CSV parser, as
rayline configures it (the default `newlines_in_values=False`), never lets a value span lines.
The column names come from the file's header; the column types are inferred from the file's
first block by the same Arrow reader Ray uses (`pyarrow.csv.open_csv`, which also infers from
the first block and refuses a later value that does not fit), so every range parses to the
same schema, as Ray's own read of the file does.

Used when a local, uncompressed file is larger than MIN_RANGE_BYTES; other sources go through
Ray's readers unchanged.
"""

from __future__ import annotations

import os

from rayline.data.task_cpus import map_args

__all__ = ["RANGE_BYTES", "MIN_RANGE_BYTES", "byte_ranges", "range_size", "read_csv_ranges", "use_ranges"]

RANGE_BYTES = 64 * 2**20  # the most a task reads: ~2M rows of a 6-column CSV, one block
MIN_RANGE_BYTES = 8 * 2**20  # the least: below it a task's start-up is a fair share of its time


def range_size(total_bytes: int, cpus: float) -> int:
    """Bytes per range for `total_bytes` of CSV on a cluster of `cpus` CPUs: two ranges per CPU
    (a slow range is not the whole read's tail), within [MIN_RANGE_BYTES, RANGE_BYTES]."""
    return int(min(RANGE_BYTES, max(MIN_RANGE_BYTES, total_bytes / max(2 * cpus, 1))))


def use_ranges(files: list[str], range_bytes: int | None = None) -> bool:
    """Whether `files` are read in ranges: local, uncompressed, and one of them larger than the
    smallest range."""
    from rayline.storage import is_uri

    range_bytes = range_bytes or MIN_RANGE_BYTES
    if any(is_uri(f) or not f.lower().endswith(".csv") for f in files):
        return False
    return any(os.path.getsize(f) > range_bytes for f in files)


def byte_ranges(size: int, range_bytes: int | None = None) -> list[tuple[int, int]]:
    """[start, end) byte ranges covering a file of `size` bytes."""
    range_bytes = range_bytes or RANGE_BYTES
    return [(start, min(start + range_bytes, size)) for start in range(0, max(size, 1), range_bytes)]


def read_csv_ranges(files: list[str], convert_options, range_bytes: int | None = None):
    """A Ray Dataset of `files`' rows, one block per byte range of each file (`range_bytes`
    each; default: `range_size` for the connected cluster's CPUs)."""
    import ray
    import ray.data
    from pyarrow import csv

    if range_bytes is None:
        range_bytes = range_size(sum(os.path.getsize(f) for f in files), ray.cluster_resources().get("CPU", 1))
    items = []
    for path in files:
        # The header's names and the first block's types (Arrow's streaming reader infers them
        # from its first block, as Ray's read does).
        with csv.open_csv(path, convert_options=convert_options) as reader:
            schema = reader.schema
        for start, end in byte_ranges(os.path.getsize(path), range_bytes):
            items.append({"path": path, "start": start, "end": end, "schema": schema.serialize().to_pybytes()})
    return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        _ReadRange(convert_options), batch_size=1, batch_format="pandas", **map_args())


class _ReadRange:
    """A picklable map_batches callable: one [start, end) range of a CSV file -> its rows (Arrow)."""

    def __init__(self, convert_options):
        self.convert_options = convert_options  # sources.py's, as Ray's reader gets them

    def __call__(self, item):
        import pickle

        import pyarrow as pa
        from pyarrow import csv

        (path,), (start,), (end,), (raw_schema,) = (item[k].tolist() for k in ("path", "start", "end", "schema"))
        schema = pa.ipc.read_schema(pa.py_buffer(raw_schema))
        data = _range_bytes(path, int(start), int(end))
        options = pickle.loads(pickle.dumps(self.convert_options))  # a copy: the same options, plus the file's types
        options.column_types = {f.name: f.type for f in schema}
        if not data.strip():
            return schema.empty_table()
        return csv.read_csv(pa.BufferReader(data), convert_options=options,
                            read_options=csv.ReadOptions(column_names=schema.names, skip_rows=1 if start == 0 else 0))


def _range_bytes(path: str, start: int, end: int) -> bytes:
    """The lines that start in [start, end) of the file, whole."""
    with open(path, "rb") as fh:
        if start > 0:
            fh.seek(start - 1)
            fh.readline()  # the rest of the line before: the previous range's
        begin = fh.tell()
        if begin >= end:
            return b""
        data = fh.read(end - begin)
        if not data.endswith(b"\n"):
            data += fh.readline()  # the line that straddles `end` is this range's
        return data
