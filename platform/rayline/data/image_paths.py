"""Image columns that hold file paths: read into the files' bytes where rows are read.

A table may name its images instead of holding them: `photo: imgs/cat_01.png`, relative to the
table's folder (or absolute, or a URI such as s3://bucket/imgs/cat_01.png). Such a column is
read into the files' bytes as the rows are read (the data stage, batch scoring), so everything
after sees an ordinary binary image column: the split, the image step's statistics, training and
the saved model, which takes encoded images on requests as before. Requests never name files: a
path sent to an endpoint is not base64 and is refused with a 422, nothing on the replica is read.

Which string columns hold paths is unambiguous: base64 text has no '.' and a `data:` URL starts
with "data:", so a value with a '.' that is not a data URL is a path. A column is a path column
when every sampled value is one; a column of both kinds is an error naming the row.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from rayline.errors import DataError

__all__ = ["looks_like_path", "path_columns", "base_of", "read_image_file", "ReadImageFiles"]

_SAMPLED = 20  # values looked at per column to decide whether it holds paths


def looks_like_path(value) -> bool:
    """Whether a string value names a file rather than holding an image (base64 or a data: URL)."""
    return isinstance(value, str) and "." in value and not value.lstrip().startswith("data:")


def path_columns(table, columns: list[str], where: str = "data") -> list[str]:
    """The string columns among `columns` of the Arrow `table` (a sample) whose values name files;
    DataError naming the row when a column mixes file names with encoded images."""
    import pyarrow as pa

    found = []
    for col in columns:
        field = table.schema.field(col) if col in table.column_names else None
        if field is None or not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        values = [(i, v) for i, v in enumerate(table.column(col).to_pylist()) if v is not None][:_SAMPLED]
        paths = [looks_like_path(v) for _, v in values]
        if any(paths) and not all(paths):
            i, value = values[paths.index(False) if paths[0] else paths.index(True)]
            raise DataError(f"{where}: column {col!r} mixes image file paths with encoded images (row {i}: "
                            f"{str(value)[:40]!r}; allowed: one or the other in a column)")
        if values and all(paths):
            found.append(col)
    return found


def base_of(path: str) -> str:
    """The folder relative paths in a table resolve against: the table file's folder, a folder
    source itself, or a glob's fixed part (a URI's likewise)."""
    if "://" in path:
        head = path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
        return head.rstrip("/") if head != path else posixpath.dirname(path)
    fixed = path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    if fixed != path:  # absolute: Ray's workers may run in another directory
        return str((Path(fixed).parent if not fixed.endswith(("/", "\\")) else Path(fixed)).resolve())
    p = Path(path).resolve()
    return str(p if p.is_dir() else p.parent)


def read_image_file(value: str, base: str, column: str) -> bytes:
    """The bytes of the file `value` names (relative to `base`); DataError naming the column and file."""
    import pyarrow.fs as pafs

    from rayline.data.images import MAX_IMAGE_BYTES

    name = value.strip()
    if "://" in name:
        target = name
    elif "://" in base:
        target = name if name.startswith("/") else posixpath.join(base, name)
    else:
        target = str(Path(name) if Path(name).is_absolute() else Path(base) / name)
    try:
        if "://" in target:
            fs, inner = pafs.FileSystem.from_uri(target)
        else:
            fs, inner = pafs.LocalFileSystem(), target
        info = fs.get_file_info(inner)
        if info.type != pafs.FileType.File:
            raise DataError(f"column {column!r}: no such image file {name!r} (looked for {target})")
        if info.size > MAX_IMAGE_BYTES:
            raise DataError(f"column {column!r}: image file {name!r} is larger than "
                            f"{MAX_IMAGE_BYTES // 2**20} MiB ({info.size:,} bytes)")
        with fs.open_input_stream(inner) as stream:
            return stream.read()
    except DataError:
        raise
    except Exception as exc:  # pyarrow's OSError / ArrowInvalid: unreadable, bad URI
        raise DataError(f"column {column!r}: cannot read image file {name!r} ({str(exc).splitlines()[0]})") from None


class ReadImageFiles:
    """A picklable map_batches callable (and a plain function of Arrow tables): each path column
    replaced by a binary column of the files' bytes, in place. A missing value stays missing."""

    def __init__(self, columns: list[str], base: str):
        self.columns, self.base = list(columns), base

    def __call__(self, table):
        import pyarrow as pa

        for col in self.columns:
            values = [None if v is None else read_image_file(v, self.base, col)
                      for v in table.column(col).to_pylist()]
            table = table.set_column(table.column_names.index(col), pa.field(col, pa.binary()),
                                     pa.array(values, pa.binary()))
        return table
