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
import hashlib
import io
import json
import os
import re
from pathlib import Path

import pandas as pd

from rayline.errors import DataError
from rayline.storage import URI_SCHEMES

__all__ = [
    "SAMPLE_ROWS",
    "FORMAT_SUFFIXES",
    "is_uri",
    "format_of",
    "resolve_paths",
    "source_schema",
    "sample_table",
    "sample_frame",
    "read_file",
    "read_dataset",
    "csv_convert_options",
    "unwrap_data_error",
    "fingerprint",
]

SAMPLE_ROWS = 2000
FORMAT_SUFFIXES = {
    "csv": (".csv", ".csv.gz"),
    "parquet": (".parquet", ".pq"),
    "json": (".json", ".jsonl", ".ndjson"),
}
# A JSON-array sample is decoded from a prefix of the file, so validating a 1 GB array costs
# a few MB: 2000 digits rows are ~1.3 MB of JSON. Doubled while not even one row fits.
_JSON_PREFIX_BYTES = 4 << 20


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


# ---------------------------------------------------------------- JSON (array or lines)


def _is_json_array(file: str) -> bool:
    """True when the first non-blank character of `file` is `[` (a UTF-8 BOM is skipped)."""
    with open(file, "rb") as fh:
        while True:
            chunk = fh.read(4096)
            if not chunk:
                return False
            chunk = chunk.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
            if chunk:
                return chunk[:1] == b"["


def _json_error(file: str, where: str, what: str) -> DataError:
    return DataError(f"{file}: {where}: {what} (allowed: a JSON array of row objects, or one JSON object per line)")


def _check_row(file: str, row, where: str) -> dict:
    if not isinstance(row, dict):
        raise _json_error(file, where, f"not a JSON object (got {type(row).__name__} {str(row)[:40]!r})")
    return row


def _json_array_rows(file: str, text: str, limit: int | None, complete: bool) -> list[dict]:
    """Row objects of the JSON array in `text` (the file, or a prefix of it when not `complete`)."""
    decoder = json.JSONDecoder()
    ws = " \t\n\r"
    pos = len(text) - len(text.lstrip(ws + "\ufeff"))
    if text[pos:pos + 1] != "[":
        raise _json_error(file, "line 1", "expected '[' to start a JSON array")
    pos += 1
    rows: list[dict] = []
    while limit is None or len(rows) < limit:
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if pos < len(text) and text[pos] == "]" and not rows:
            break
        try:
            row, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            if not complete:  # may be the prefix cutting a row: the full read reports real errors
                break
            raise _json_error(file, f"line {exc.lineno} column {exc.colno}", exc.msg) from exc
        rows.append(_check_row(file, row, f"item {len(rows)}"))
        pos = end
        while pos < len(text) and text[pos] in ws:
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        if pos < len(text) and text[pos] == "]":
            break
        if pos >= len(text) and not complete:
            break
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        raise _json_error(file, f"line {line} column {col}", "expected ',' or ']' after an array item")
    return rows


def _read_text(file: str, limit_bytes: int | None = None) -> tuple[str, bool]:
    """(text, complete): the file (or its first `limit_bytes` bytes) as UTF-8."""
    with open(file, "rb") as fh:
        data = fh.read() if limit_bytes is None else fh.read(limit_bytes + 1)
    complete = limit_bytes is None or len(data) <= limit_bytes
    if not complete:
        data = data[:limit_bytes]
    try:
        return data.decode("utf-8"), complete
    except UnicodeDecodeError as exc:
        if not complete and exc.start >= len(data) - 3:  # the prefix cut a multi-byte character
            return data[:exc.start].decode("utf-8"), False
        line = data.count(b"\n", 0, exc.start) + 1
        raise _json_error(file, f"line {line}", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _json_array_table(file: str, limit: int | None):
    if limit is None:
        text, _ = _read_text(file)
        rows = _json_array_rows(file, text, None, True)
    else:
        size = _JSON_PREFIX_BYTES
        while True:
            text, complete = _read_text(file, size)
            rows = _json_array_rows(file, text, limit, complete)
            if rows or complete:
                break
            size *= 2
    return _rows_table(file, rows)


def _rows_table(file: str, rows: list[dict]):
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise _json_error(file, "rows", f"values of one key have incompatible types: {exc}") from exc


def _lines_error(file: str, data: bytes, exc: Exception) -> DataError:
    """The first line of `data` that is not a JSON object, else Arrow's message (its row numbers
    count from the start of a ~1 MB block, not of the file, so they are dropped)."""
    for i, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:  # JSONDecodeError, or a UnicodeDecodeError
            where = f"line {i} column {err.colno}" if isinstance(err, json.JSONDecodeError) else f"line {i}"
            return _json_error(file, where, getattr(err, "msg", None) or str(err))
        if not isinstance(row, dict):
            return _json_error(file, f"line {i}", f"not a JSON object (got {type(row).__name__})")
    return _json_error(file, "lines", re.sub(r"\s*in row \d+\s*$", "", str(exc).splitlines()[0]))


def _json_lines_table(file: str, data: bytes):
    """JSON Lines bytes -> Arrow table, with Arrow's JSON reader (the reader behind Ray's read_json)."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not data.strip():
        return pa.table({})
    block = 1 << 20
    while True:
        try:
            return pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=block))
        except pa.ArrowInvalid as exc:
            if "straddl" in str(exc) and block < len(data):  # one row longer than a block
                block *= 4
                continue
            raise _lines_error(file, data, exc) from exc


def _json_lines_head(file: str, limit: int | None) -> bytes:
    """The file's bytes, or only its first `limit` non-blank lines."""
    with open(file, "rb") as fh:
        if limit is None:
            return fh.read()
        lines, rows = [], 0
        for line in fh:
            lines.append(line)
            rows += bool(line.strip())
            if rows >= limit:
                break
        return b"".join(lines)


# ---------------------------------------------------------------- one local file, every format


def csv_convert_options():
    """An empty CSV cell is a missing value in every column: Arrow makes it null in numeric
    columns but '' in string ones unless told (pandas makes both NaN), so `impute` sees it
    and `rayline predict --input` sends null for it."""
    from pyarrow import csv

    return csv.ConvertOptions(strings_can_be_null=True)



def _read_local(fmt: str, file: str, limit: int | None):
    """An Arrow table of `file` (at most `limit` rows), parsed as the Ray readers parse it."""
    import pyarrow as pa

    try:
        if fmt == "csv":
            from pyarrow import csv

            if limit is None:
                return csv.read_csv(file, convert_options=csv_convert_options())
            # streaming: reads blocks of ~1 MB, stops at `limit` rows
            reader = csv.open_csv(file, convert_options=csv_convert_options())
            batches, rows = [], 0
            for batch in reader:
                batches.append(batch)
                rows += batch.num_rows
                if rows >= limit:
                    break
            return pa.Table.from_batches(batches, schema=reader.schema).slice(0, limit)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            if limit is None:
                return pq.read_table(file)
            with pq.ParquetFile(file) as pf:
                batch = next(pf.iter_batches(batch_size=limit), None)
                return pa.Table.from_batches([batch]) if batch is not None else pf.schema_arrow.empty_table()
        if fmt == "json":
            if _is_json_array(file):
                return _json_array_table(file, limit)
            return _json_lines_table(file, _json_lines_head(file, limit))
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


# ---------------------------------------------------------------- Ray Data


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
                raise _json_error(path, "text", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
            rows = _json_array_rows(path, text, None, True)
            if rows:
                yield _rows_table(path, rows)

    class _JSONLinesDatasource(FileBasedDatasource):
        """Files holding one JSON object per line."""

        def _read_stream(self, f, path: str):
            table = _json_lines_table(path, f.read_buffer().to_pybytes())
            if table.num_rows:
                yield table

    return _JSONArrayDatasource, _JSONLinesDatasource


def read_dataset(source):
    """All rows as a Ray Dataset (lazy: read errors surface when it is first consumed)."""
    import ray.data

    if source.format == "sklearn":
        return ray.data.from_pandas(_sklearn_frame(source.name))
    files = resolve_paths(source)
    try:
        # resolve_paths already chose the files: Ray's suffix filters would drop .pq / .ndjson
        if source.format == "csv":
            from rayline.data.csv_ranges import read_csv_ranges, use_ranges

            # A large local file in parallel byte ranges (data/csv_ranges.py); else Ray's reader, a task per file.
            ds = (read_csv_ranges(files, csv_convert_options()) if use_ranges(files)
                  else ray.data.read_csv(files, file_extensions=None, convert_options=csv_convert_options()))
        elif source.format == "parquet":
            ds = ray.data.read_parquet(files, file_extensions=None)
        elif any(is_uri(f) for f in files):
            ds = ray.data.read_json(files, file_extensions=None)  # Arrow for lines, json.load for arrays
        else:
            array_ds, lines_ds = _json_datasources()
            arrays = [f for f in files if _is_json_array(f)]
            lines = [f for f in files if f not in set(arrays)]
            parts = [ray.data.read_datasource(cls(group, file_extensions=None))
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
    parts = [_first_line(inner)] + ([_first_line(inner.__cause__)] if inner.__cause__ is not None else [])
    where = f"data.source.path: cannot read {source.format} data {source.path!r}" if source is not None else "data"
    return DataError(f"{where}: " + ": ".join(parts))


def _first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return text or type(exc).__name__


# Objects (s3://, gs://) are fingerprinted through storage.py's pyarrow filesystems, whose
# listing drops the ETags a LIST answer carries: one HEAD per object, this many in flight.
_HEAD_THREADS = 16
# What identifies one write of an object, as pyarrow names it in an object's metadata (S3:
# ETag, VersionId on a versioned bucket; GCS: etag, generation); the last-modified time only
# where a store gives none of them.
_OBJECT_IDS = ("etag", "versionid", "generation")
_OBJECT_TIMES = ("last-modified", "updated")


def fingerprint(source) -> str:
    """What identifies the data, for resume's "the data changed" check and the data cache's key.

    `stat` (the default) never reads the data (hashing every byte costs the driver seconds per
    GB, every run): each local file's name, size and modification time; each object on s3:// or
    gs:// its URI, size, ETag and version (S3's version id on a versioned bucket, GCS's
    generation), from one listing of the prefix plus one HEAD per object. A Parquet file's footer
    is not read: any rewrite of a local file changes its modification time (nanoseconds), and
    an object's ETag. `content`: SHA-256 of every byte, streamed, of local files and objects
    alike. sklearn: the set's name and scikit-learn's version."""
    digest = hashlib.sha256()
    if source.format == "sklearn":
        import sklearn

        digest.update(f"sklearn:{source.name}:{sklearn.__version__}".encode())
        return "sha256:" + digest.hexdigest()
    content = getattr(source, "fingerprint", "stat") == "content"
    for file in resolve_paths(source):
        if is_uri(file) and file.split("://", 1)[0].lower() in URI_SCHEMES:
            _digest_objects(digest, file, content)
            continue
        digest.update(file.encode() if is_uri(file) else Path(file).name.encode())
        if is_uri(file):
            continue  # other URIs (hdfs://, ...): the name only
        if content:
            with open(file, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
        else:
            stat = os.stat(file)
            digest.update(f":{stat.st_size}:{stat.st_mtime_ns}".encode())
    return ("sha256:" if content else "stat:") + digest.hexdigest()


def _digest_objects(digest, uri: str, content: bool) -> None:
    """Add the object `uri` names, or every object under it, to `digest` (all of them: Ray's
    reader skips names starting with '.' or '_', so a change there is a miss, never a wrong hit)."""
    import pyarrow.fs

    from rayline.redact import redact_uri
    from rayline.storage import filesystem

    scheme = URI_SCHEMES[uri.split("://", 1)[0].lower()]  # gcs:// is gs://
    fs, path = filesystem(uri)
    try:
        # A HEAD first, as Ray's reader does: an object at `uri` is read alone even where a
        # prefix of that name holds objects too.
        heads = [(path, _head(fs, path))]
    except OSError as exc:  # FileNotFoundError; "not a regular file" for a bucket
        heads, missing = [], exc
    if not heads:
        try:  # one LIST (in pages of 1000 keys): names and sizes, no object opened
            infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise DataError(f"data.source.path: cannot list {redact_uri(uri)}: {_error_line(exc)}") from exc
        paths = sorted(info.path for info in infos if info.type == pyarrow.fs.FileType.File)
        if not paths:
            why = "" if isinstance(missing, FileNotFoundError) or "/" not in path else f": {_error_line(missing)}"
            raise DataError(f"data.source.path: no object there or under it{why} (got {redact_uri(uri)!r}; "
                            "allowed: an object, or a prefix with objects under it)")
        if content:
            heads = [(p, "") for p in paths]
        else:
            from concurrent.futures import ThreadPoolExecutor

            try:
                with ThreadPoolExecutor(max_workers=min(_HEAD_THREADS, len(paths))) as pool:
                    heads = list(zip(paths, pool.map(lambda p: _head(fs, p), paths)))
            except OSError as exc:  # e.g. an object deleted since the listing
                raise DataError(f"data.source.path: cannot read the objects' metadata under {redact_uri(uri)}: "
                                f"{_error_line(exc)}") from exc
    for obj, head in heads:
        digest.update(f"{scheme}://{obj}".encode())
        if not content:
            digest.update(f":{head}".encode())
            continue
        try:
            with fs.open_input_stream(obj) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise DataError(f"data.source.path: cannot read {redact_uri(f'{scheme}://{obj}')}: {_error_line(exc)}") from exc


def _error_line(exc: BaseException) -> str:
    """The first line of a pyarrow error, without the "; Details:" its S3 errors append."""
    return _first_line(exc).split("; Details:", 1)[0]


def _head(fs, path: str) -> str:
    """`size:id` of one object from its metadata alone (a HEAD; opening reads no byte): its ETag
    and version or generation, else its last-modified time."""
    with fs.open_input_file(path) as fh:
        size = fh.size()
        meta = {_text(k).lower(): _text(v) for k, v in (fh.metadata() or {}).items()}
    ids = [f"{k}={meta[k]}" for k in _OBJECT_IDS if meta.get(k)]
    if not ids:
        ids = [f"{k}={meta[k]}" for k in _OBJECT_TIMES if meta.get(k)]
    return f"{size}:{','.join(ids)}"


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
