"""Where rows come from: sklearn's bundled datasets, or CSV / Parquet / JSON files and URIs.

`sample_frame` reads a small pandas sample without Ray (for `rayline validate`);
`read_dataset` reads everything as a Ray Dataset.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path

import pandas as pd

from rayline.errors import DataError
from rayline.spec import SourceSpec

__all__ = ["resolve_paths", "sample_frame", "read_dataset", "fingerprint", "is_uri"]

_SAMPLE_ROWS = 2000
_SUFFIXES = {"csv": (".csv", ".csv.gz"), "parquet": (".parquet", ".pq"), "json": (".json", ".jsonl", ".ndjson")}


def is_uri(path: str) -> bool:
    return "://" in path


def resolve_paths(source: SourceSpec) -> list[str]:
    """The files a local path names (file, directory or glob); URIs are passed through."""
    path = source.path or ""
    if is_uri(path):
        return [path]
    if any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
    elif os.path.isdir(path):
        files = sorted(
            str(p) for p in Path(path).rglob("*") if p.is_file() and p.name.endswith(_SUFFIXES[source.format])
        )
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DataError(f"data.source.path: no such file or directory (got {path!r})")
    if not files:
        raise DataError(
            f"data.source.path: matches no {source.format} files (got {path!r}; allowed: files ending in "
            f"{', '.join(_SUFFIXES[source.format])})"
        )
    return files


def _sklearn_frame(name: str) -> pd.DataFrame:
    import sklearn.datasets as skd

    loader = getattr(skd, f"load_{name}")
    frame = loader(as_frame=True).frame
    # sklearn's digits names are 'pixel_0_0'..; keep them; targets stay numeric.
    return frame


def _read_pandas(fmt: str, file: str, nrows: int | None) -> pd.DataFrame:
    try:
        if fmt == "csv":
            return pd.read_csv(file, nrows=nrows)
        if fmt == "parquet":
            frame = pd.read_parquet(file)
            return frame.head(nrows) if nrows else frame
        return pd.read_json(file, lines=not file.endswith(".json") or _looks_like_lines(file), nrows=nrows)
    except Exception as exc:  # pandas raises many types; name the file and the reason
        raise DataError(f"data.source.path: cannot read {fmt} file {file!r}: {exc}") from None


def _looks_like_lines(file: str) -> bool:
    with open(file, "rb") as fh:
        head = fh.read(1).strip()
    return head != b"["


def sample_frame(source: SourceSpec) -> pd.DataFrame | None:
    """A pandas sample of the data (whole sklearn sets), or None for remote URIs."""
    if source.format == "sklearn":
        return _sklearn_frame(source.name)
    files = resolve_paths(source)
    if is_uri(files[0]):
        return None
    return _read_pandas(source.format, files[0], _SAMPLE_ROWS)


def read_dataset(source: SourceSpec):
    """All rows as a Ray Dataset."""
    import ray.data

    if source.format == "sklearn":
        return ray.data.from_pandas(_sklearn_frame(source.name))
    files = resolve_paths(source)
    try:
        if source.format == "csv":
            return ray.data.read_csv(files)
        if source.format == "parquet":
            return ray.data.read_parquet(files)
        if all(f.endswith((".jsonl", ".ndjson")) or _looks_like_lines(f) for f in files if not is_uri(f)):
            return ray.data.read_json(files, lines=True)
        return ray.data.read_json(files)
    except Exception as exc:
        raise DataError(f"data.source.path: cannot read {source.format} data {source.path!r}: {exc}") from None


def fingerprint(source: SourceSpec) -> str:
    """A content hash of the data: local file bytes, or the sklearn set's name and version."""
    digest = hashlib.sha256()
    if source.format == "sklearn":
        import sklearn

        digest.update(f"sklearn:{source.name}:{sklearn.__version__}".encode())
        return "sha256:" + digest.hexdigest()
    for file in resolve_paths(source):
        digest.update(file.encode() if is_uri(file) else Path(file).name.encode())
        if not is_uri(file):
            with open(file, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return "sha256:" + digest.hexdigest()
