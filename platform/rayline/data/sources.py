"""Where rows come from: sklearn's bundled datasets, or CSV / Parquet / JSON files and URIs.

One reader per format, used everywhere rows are read, so `rayline validate`, training and
`rayline predict --input` parse a file the same way (same types, same missing values):

- csv: Arrow's CSV reader (what `ray.data.read_csv` runs), header row first; an empty cell
  is a missing value (null) in every column.
- parquet: Arrow's Parquet reader.
- json: either a JSON array of row objects (`[{"a": 1}, {"a": 2}]`) or JSON Lines (one object
  per line; `.jsonl` / `.ndjson` content is accepted under `format: json` too). Which one is
  decided per file by its first non-blank character: `[` is an array, anything else is lines.
  Ray 2.60's `read_json` (default `lines=False`) runs Arrow's JSON reader, which reads only
  JSON Lines, and falls back to `json.load` with a logged warning for arrays; its errors name
  a row counted from the start of a ~1 MB block. So local files are read by two small
  datasources below: arrays with `json` (errors name the file, line and column), lines with
  the same Arrow reader as Ray (on error, the first bad line is found and named).

`sample_frame` / `sample_table` read a bounded sample without Ray (for `rayline validate`):
at most `SAMPLE_ROWS` rows; Parquet's columns and types come from the footer alone
(`source_schema`). `read_dataset` reads everything as a Ray Dataset; `read_file` reads one
local file whole (for `rayline predict --input`).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pandas as pd

from rayline.data.json_files import (is_json_array, json_array_rows, json_array_table, json_error, json_lines_head,
                                     json_lines_table, rows_table)
from rayline.errors import DataError
from rayline.data.task_cpus import remote_args

__all__ = ["SAMPLE_ROWS", "FORMAT_SUFFIXES", "feature_columns", "is_uri", "format_of", "resolve_paths", "source_schema", "sample_table",
           "sample_frame", "read_file", "read_dataset", "csv_convert_options", "unwrap_data_error", "first_line"]

SAMPLE_ROWS = 2000


FORMAT_SUFFIXES = {
    "csv": (".csv", ".csv.gz"),
    "parquet": (".parquet", ".pq"),
    "json": (".json", ".jsonl", ".ndjson"),
}


def feature_columns(data_spec, columns: list[str]) -> list[str]:
    """The spec's features: `data.features`, else every column but the label (and, for an image
    folder, but the file's path, which names a row and predicts nothing)."""
    if data_spec.features:
        return list(data_spec.features)
    from rayline.data.image_folder import PATH_COLUMN

    skip = {data_spec.label} | ({PATH_COLUMN} if data_spec.source.format == "image_folder" else set())
    return [c for c in columns if c not in skip]


def is_uri(path: str) -> bool:
    return "://" in path


def format_of(path: str | Path) -> str:
    """The format a file's name says (csv, parquet or json); DataError listing the allowed suffixes."""
    name = str(path).lower()
    for fmt, suffixes in FORMAT_SUFFIXES.items():
        if name.endswith(suffixes):
            return fmt
    allowed = ", ".join(s for suffixes in FORMAT_SUFFIXES.values() for s in suffixes)
    raise DataError(f"{path}: unknown file type (got {Path(str(path)).suffix or 'no suffix'!r}; allowed: {allowed})")


def resolve_paths(source) -> list[str]:
    """The files a local path names (file, directory or glob); URIs are passed through."""
    path = source.path or ""
    if is_uri(path):
        return [path]
    if source.format == "image_folder":
        from rayline.data.image_folder import image_files

        return [file for file, _ in image_files(path, getattr(source, "labelled", True))]
    if any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
    elif os.path.isdir(path):
        files = sorted(
            str(p) for p in Path(path).rglob("*")
            if p.is_file() and p.name.lower().endswith(FORMAT_SUFFIXES[source.format])
        )
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DataError(f"data.source.path: no such file or directory (got {path!r})")
    if not files:
        raise DataError(
            f"data.source.path: matches no {source.format} files (got {path!r}; allowed: files ending in "
            f"{', '.join(FORMAT_SUFFIXES[source.format])})"
        )
    return files


def csv_convert_options():
    """An empty CSV cell is a missing value in every column: Arrow makes it null in numeric
    columns but '' in string ones unless told (pandas makes both NaN), so `impute` sees it
    and `rayline predict --input` sends null for it."""
    from pyarrow import csv

    return csv.ConvertOptions(strings_can_be_null=True)


_CSV_PREFIX_BYTES = 1 << 20


def _csv_head(file: str, limit: int):
    """The first `limit` rows of a CSV file, reading only a prefix of it: 1 MB, four times more
    while that holds fewer rows (or cuts a quoted field that spans lines), the whole file at most.
    Not Arrow's streaming reader: it reads up to 32 blocks ahead in the background whatever is
    consumed (measured: 58 MB read of a 49-MB file for two 2,000-row samples)."""
    import pyarrow as pa
    from pyarrow import csv

    data, size = b"", _CSV_PREFIX_BYTES
    with open(file, "rb") as fh:
        while True:
            data += fh.read(size + 1 - len(data))  # a byte past the prefix: does the file go on?
            whole = len(data) <= size
            lines = data if whole else data[:data.rfind(b"\n") + 1]  # whole lines only
            if lines or whole:
                try:
                    table = csv.read_csv(pa.py_buffer(lines), convert_options=csv_convert_options())
                    if whole or table.num_rows >= limit:
                        return table.slice(0, limit)
                except pa.ArrowInvalid:
                    if whole:
                        raise
                    # else a row the cut split (a quoted field over lines): read more
            size *= 4


def _read_local(fmt: str, file: str, limit: int | None):
    """An Arrow table of `file` (at most `limit` rows), parsed as the Ray readers parse it."""
    import pyarrow as pa

    try:
        if fmt == "csv":
            from pyarrow import csv

            if limit is None:
                return csv.read_csv(file, convert_options=csv_convert_options())
            return _csv_head(file, limit)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            if limit is None:
                return pq.read_table(file)
            with pq.ParquetFile(file) as pf:
                batch = next(pf.iter_batches(batch_size=limit), None)
                return pa.Table.from_batches([batch]) if batch is not None else pf.schema_arrow.empty_table()
        if fmt == "json":
            if is_json_array(file):
                return json_array_table(file, limit)
            return json_lines_table(file, json_lines_head(file, limit))
    except DataError:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:  # Arrow's messages name the row/column
        raise DataError(f"{file}: cannot read as {fmt} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from exc
    raise DataError(f"{file}: unknown format (got {fmt!r}; allowed: {', '.join(FORMAT_SUFFIXES)})")


def read_file(path: str | Path, fmt: str | None = None):
    """Every row of one local file as an Arrow table; the format from its suffix unless given."""
    path = str(path)
    fmt = fmt or format_of(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    return _read_local(fmt, path, None)


def _sklearn_frame(name: str) -> pd.DataFrame:
    import sklearn.datasets as skd

    loader = getattr(skd, f"load_{name}")
    # sklearn's digits names are 'pixel_0_0'..; keep them; targets stay numeric.
    return loader(as_frame=True).frame


def source_schema(source):
    """The Arrow schema of the data, cheaply: Parquet's footer, else a bounded sample; None for URIs."""
    import pyarrow as pa

    if source.format == "sklearn":
        return pa.Schema.from_pandas(_sklearn_frame(source.name), preserve_index=False)
    if source.format == "image_folder":
        return sample_table(source, rows=1).schema
    files = resolve_paths(source)
    if is_uri(files[0]):
        return None
    if source.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_schema(files[0])  # the footer only: a 50 MB file costs ~1 ms
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{files[0]}: cannot read as parquet ({str(exc).splitlines()[0]})") from exc
    return sample_table(source).schema


def sample_table(source, columns: list[str] | None = None, rows: int = SAMPLE_ROWS):
    """At most `rows` rows of the first file as an Arrow table (only `columns` where given); None for URIs."""
    import pyarrow as pa

    if source.format == "sklearn":
        frame = _sklearn_frame(source.name)
        return pa.Table.from_pandas(frame[columns] if columns else frame, preserve_index=False)
    if source.format == "image_folder" and not is_uri(source.path):
        from rayline.data.image_folder import sample_images

        table = sample_images(source.path, rows, getattr(source, "labelled", True))
        return table.select(columns) if columns is not None else table
    files = resolve_paths(source)
    if is_uri(files[0]):
        return None
    if source.format == "parquet" and columns is not None:
        import pyarrow.parquet as pq

        try:  # only these columns' chunks of the first row group are read
            with pq.ParquetFile(files[0]) as pf:
                batch = next(pf.iter_batches(batch_size=rows, columns=columns), None)
                return pa.Table.from_batches([batch]) if batch is not None else pf.schema_arrow.empty_table().select(columns)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{files[0]}: cannot read as parquet ({str(exc).splitlines()[0]})") from exc
    table = _read_local(source.format, files[0], rows)
    return table.select(columns) if columns is not None else table


def sample_frame(source) -> pd.DataFrame | None:
    """A pandas sample of the data (whole sklearn sets, `SAMPLE_ROWS` rows of files), or None for URIs."""
    if source.format == "sklearn":
        return _sklearn_frame(source.name)
    table = sample_table(source)
    return None if table is None else table.to_pandas()


def _json_datasources():
    """The two JSON datasources; defined on first use so importing this module never imports Ray."""
    from ray.data.datasource import FileBasedDatasource

    class _JSONArrayDatasource(FileBasedDatasource):
        """Files holding one JSON array of row objects."""

        def _read_stream(self, f, path: str):
            data = f.read_buffer().to_pybytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise json_error(path, "text", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
            rows = json_array_rows(path, text, None, True)
            if rows:
                yield rows_table(path, rows)

    class _JSONLinesDatasource(FileBasedDatasource):
        """Files holding one JSON object per line."""

        def _read_stream(self, f, path: str):
            table = json_lines_table(path, f.read_buffer().to_pybytes())
            if table.num_rows:
                yield table

    return _JSONArrayDatasource, _JSONLinesDatasource


def read_dataset(source):
    """All rows as a Ray Dataset (lazy: read errors surface when it is first consumed)."""
    import ray.data

    if source.format == "sklearn":
        import pyarrow as pa

        # One block, its metadata computed here (`from_blocks`): `from_pandas` runs a Ray task for a
        # block's metadata, which asks for a whole CPU and waited forever with 0.95 of 2 CPUs free
        # while Serve replicas held the rest (the pipeline's own tasks ask for what is free).
        return ray.data.from_blocks([pa.Table.from_pandas(_sklearn_frame(source.name), preserve_index=False)])
    if source.format == "image_folder":
        from rayline.data.image_folder import read_image_folder

        try:
            labelled = getattr(source, "labelled", True)  # batch scoring: unlabelled images too, in path order
            ds = read_image_folder(source.path, labelled=labelled, shuffled=labelled)
            ds.schema()
            return ds
        except Exception as exc:
            error = unwrap_data_error(exc, source)
            if error is exc:
                raise
            raise error from exc
    files = resolve_paths(source)
    try:
        # resolve_paths already chose the files: Ray's suffix filters would drop .pq / .ndjson
        if source.format == "csv":
            from rayline.data.csv_ranges import read_csv_ranges, use_ranges

            # A large local file in parallel byte ranges (data/csv_ranges.py); else Ray's reader, a task per file.
            ds = (read_csv_ranges(files, csv_convert_options()) if use_ranges(files)
                  else ray.data.read_csv(files, file_extensions=None, convert_options=csv_convert_options(),
                                        ray_remote_args=remote_args()))
        elif source.format == "parquet":
            ds = ray.data.read_parquet(files, file_extensions=None, ray_remote_args=remote_args())
        elif any(is_uri(f) for f in files):
            ds = ray.data.read_json(files, file_extensions=None, ray_remote_args=remote_args())  # Arrow for lines, json.load for arrays
        else:
            array_ds, lines_ds = _json_datasources()
            arrays = [f for f in files if is_json_array(f)]
            lines = [f for f in files if f not in set(arrays)]
            parts = [ray.data.read_datasource(cls(group, file_extensions=None), ray_remote_args=remote_args())
                     for cls, group in ((array_ds, arrays), (lines_ds, lines)) if group]
            ds = parts[0] if len(parts) == 1 else parts[0].union(*parts[1:])
        # Reads the first block now, so a malformed (first) file fails here with a one-line
        # message rather than as a Ray task traceback wherever the Dataset is first consumed.
        ds.schema()
        return ds
    except Exception as exc:  # a RayTaskError(DataError) is a DataError too, with a traceback for text
        error = unwrap_data_error(exc, source)
        if error is exc:
            raise
        raise error from exc


def unwrap_data_error(exc: BaseException, source=None) -> DataError:
    """The DataError a Ray read task raised (Ray wraps it in a RayTaskError whose text is a
    remote traceback), else a DataError with the first line of `exc`."""
    seen = exc
    while seen is not None:
        if isinstance(seen, DataError) and not type(seen).__name__.startswith("RayTaskError"):
            if seen is exc:
                return seen
            # Ray Data appends its retry advice to the message's args ("Failed to read stream
            # iteratively after 1/10 attempts ..."): keep our first line only.
            return type(seen)(str(seen).splitlines()[0])
        seen = getattr(seen, "cause", None) or seen.__cause__
    if isinstance(exc, DataError):  # RayTaskError(DataError) without the original at hand
        text = str(exc)
        marker = "rayline.errors.DataError: "
        if marker in text:
            return DataError(text.split(marker, 1)[1].strip().splitlines()[0])
    # A Ray task's own error (e.g. "Failed to read CSV file: x.csv ...") and what caused it
    # (Arrow's "CSV parse error: Expected 2 columns, got 3: ..."), first lines only.
    inner = getattr(exc, "cause", None) or exc
    parts = [first_line(inner)] + ([first_line(inner.__cause__)] if inner.__cause__ is not None else [])
    where = f"data.source.path: cannot read {source.format} data {source.path!r}" if source is not None else "data"
    return DataError(f"{where}: " + ": ".join(parts))


def first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return text or type(exc).__name__
