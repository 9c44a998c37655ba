"""JSON sources: an array of row objects or JSON Lines (.json, .jsonl, .ndjson), read with a clear
error naming the file, the line and what is wrong.
"""

from __future__ import annotations

import io
import json
import re

from rayline.errors import DataError

__all__ = ["is_json_array", "json_error", "json_array_rows", "json_array_table", "rows_table", "json_lines_table",
           "json_lines_head"]

# A JSON-array sample is decoded from a prefix of the file, so validating a 1 GB array costs
# a few MB: 2000 digits rows are ~1.3 MB of JSON. Doubled while not even one row fits.
_JSON_PREFIX_BYTES = 4 << 20


def is_json_array(file: str) -> bool:
    """True when the first non-blank character of `file` is `[` (a UTF-8 BOM is skipped)."""
    with open(file, "rb") as fh:
        while True:
            chunk = fh.read(4096)
            if not chunk:
                return False
            chunk = chunk.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
            if chunk:
                return chunk[:1] == b"["


def json_error(file: str, where: str, what: str) -> DataError:
    return DataError(f"{file}: {where}: {what} (allowed: a JSON array of row objects, or one JSON object per line)")


def _check_row(file: str, row, where: str) -> dict:
    if not isinstance(row, dict):
        raise json_error(file, where, f"not a JSON object (got {type(row).__name__} {str(row)[:40]!r})")
    return row


def json_array_rows(file: str, text: str, limit: int | None, complete: bool) -> list[dict]:
    """Row objects of the JSON array in `text` (the file, or a prefix of it when not `complete`)."""
    decoder = json.JSONDecoder()
    ws = " \t\n\r"
    pos = len(text) - len(text.lstrip(ws + "\ufeff"))
    if text[pos:pos + 1] != "[":
        raise json_error(file, "line 1", "expected '[' to start a JSON array")
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
            raise json_error(file, f"line {exc.lineno} column {exc.colno}", exc.msg) from exc
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
        raise json_error(file, f"line {line} column {col}", "expected ',' or ']' after an array item")
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
        raise json_error(file, f"line {line}", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def json_array_table(file: str, limit: int | None):
    if limit is None:
        text, _ = _read_text(file)
        rows = json_array_rows(file, text, None, True)
    else:
        size = _JSON_PREFIX_BYTES
        while True:
            text, complete = _read_text(file, size)
            rows = json_array_rows(file, text, limit, complete)
            if rows or complete:
                break
            size *= 2
    return rows_table(file, rows)


def rows_table(file: str, rows: list[dict]):
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise json_error(file, "rows", f"values of one key have incompatible types: {exc}") from exc


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
            return json_error(file, where, getattr(err, "msg", None) or str(err))
        if not isinstance(row, dict):
            return json_error(file, f"line {i}", f"not a JSON object (got {type(row).__name__})")
    return json_error(file, "lines", re.sub(r"\s*in row \d+\s*$", "", str(exc).splitlines()[0]))


def json_lines_table(file: str, data: bytes):
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


def json_lines_head(file: str, limit: int | None) -> bytes:
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
