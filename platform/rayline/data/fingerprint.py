"""A source's fingerprint: how rayline tells whether the data changed (resume refuses changed data):
each file's path, size and modification time, or object storage's ETag/version, or a SHA-256 of
every byte.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rayline.data.sources import first_line, is_uri, resolve_paths
from rayline.errors import DataError
from rayline.storage import URI_SCHEMES

__all__ = ["fingerprint"]

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
    return first_line(exc).split("; Details:", 1)[0]


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
