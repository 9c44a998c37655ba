"""The data stage's cache: an unchanged data stage is read back, not recomputed.

An entry holds one preprocessing variant's output: the fitted preprocessing, the model-ready
train and valid splits and the raw test rows (Parquet files, written and read back by Ray
tasks: no split passes through the driver), and the probe rows. Its key is a hash of
everything the output depends on: the source's fingerprint
(data/sources.py: each file's name, size and modification time by default), the spec's
`data` section (source, label, features, split, preprocess) and `task`, and the rayline and
Ray versions. A changed file, a changed `data` key or another version is another key, never a
wrong hit; an entry with a missing or unreadable part is a miss (and is removed).

The splits' Parquet files are written by the Ray tasks that compute their blocks (`write_block`:
no second pass over the data to store it). A block's file is named by a digest of its rows' split
hashes: a task that Ray runs again (a worker lost mid-stage) rewrites the same file instead of
adding a second copy of its rows.

Entries live in the workspace, `<workspace>/data-cache/<key>/`, on its local disk or its object
storage (s3://, gs://: Ray's workers on every node read and write the files there, through
pyarrow's filesystems and the credentials the workspace's checkpoints use). A run killed while
writing leaves no entry that looks whole: on a disk the entry is written in a temporary folder
and renamed into place; on object storage, which has no rename, its `meta.json` (listing every
file and its size) is the last object written, and an entry without one is no entry (a miss;
`prune` removes what it left).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rayline.storage import exists, filesystem, is_uri, join, list_names, read_json

__all__ = ["DataCache", "CacheEntry", "EntryWriter", "cache_key", "write_block", "CACHE_FORMAT", "SPLIT_FOLDERS"]

CACHE_FORMAT = 3  # bumped when an entry's layout changes: older entries become misses (3: image runs' train split as read)
SPLIT_FOLDERS = ("train", "valid", "test_rows")  # PreparedData's datasets, a folder of Parquet files each
_META = "meta.json"


def cache_key(spec, fingerprint: str) -> str:
    """The key of `spec`'s data stage output over data with this fingerprint."""
    import ray

    from rayline.version import __version__

    payload = {
        "format": CACHE_FORMAT,
        "data": spec.data.model_dump(mode="json", exclude={"in_process"}),  # how it is read, not what
        "task": spec.task,
        "fingerprint": fingerprint,
        "rayline": __version__,
        "ray": ray.__version__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _read_parquet(location: str):
    import pyarrow.parquet as pq

    fs, path = filesystem(location)
    return pq.read_table(path, filesystem=fs)


def _block_metadata(file: str):
    """Ray Data's metadata of the block `file` holds, from its Parquet footer alone: rows, schema
    and the row groups' uncompressed size (Ray's memory accounting takes it as the block's)."""
    import pyarrow.parquet as pq
    from ray.data.block import BlockMetadataWithSchema

    fs, path = filesystem(file)
    with fs.open_input_file(path) as fh:
        footer = pq.read_metadata(fh)
    size = sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    return BlockMetadataWithSchema(num_rows=footer.num_rows, size_bytes=size, exec_stats=None,
                                   input_files=(file,), schema=footer.schema.to_arrow_schema())


def _read_many(files: list[str]):
    """One reading task's share of the files: each file's table, an object of its own."""
    tables = [_read_parquet(f) for f in files]
    return tables[0] if len(tables) == 1 else tables


def _groups(sizes: dict[str, int], count: int) -> list[list[str]]:
    """The files of `sizes` in at most `count` groups of about equal bytes (largest first onto
    the lightest group)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(count, len(sizes))))]
    loads = [0] * len(groups)
    for f in sorted(sizes, key=lambda f: -sizes[f]):
        i = loads.index(min(loads))
        groups[i].append(f)
        loads[i] += sizes[f]
    return [g for g in groups if g]


def _read_splits(location: str, sizes: dict[str, int]) -> dict:
    """Every split's Parquet files as materialized Datasets, without waiting for their rows.

    The files are read by one wave of Ray tasks, one per CPU of the cluster, each returning each
    of its files' tables as an object of its own; each split's Dataset is built at once from those
    (future) tables and the blocks' metadata from the files' footers, as Ray's `from_arrow_refs`
    builds one. The data stage returns at once and the reads go on while Ray Train starts its
    workers (a worker's first batch waits for them). The tasks reserve no CPU: Train's workers
    may take every CPU before they run (with 1 CPU each, a 2-worker run on 2 CPUs waited for them
    forever); their number bounds what they use.

    Not `ray.data.read_parquet`: it took 1.6 s per split of 35 small files, warm, on the 2-core
    machine; nor a Ray Data pass per split (0.15-0.3 s each even for a few files, one after the
    other); nor `from_arrow_refs`, which runs a task per block for its metadata and waits for
    every read (3M churn rows, 13 files: 0.65 s warm, 1.0 s in a fresh Ray, a quarter of the
    first run's data stage). The rows never pass through the driver.

    `sizes`: the entry's files (relative names, as its meta.json lists them) and their sizes."""
    import ray
    import ray.data

    files = {}
    for split in SPLIT_FOLDERS:
        files[split] = sorted(join(location, name) for name in sizes
                              if name.startswith(split + "/") and name.endswith(".parquet"))
        if not files[split]:
            raise FileNotFoundError(f"{join(location, split)}: no Parquet files")
    # Footers first, before any task: a bad one is a miss (raised here), never a failed training.
    metadata = {f: _block_metadata(f) for fs in files.values() for f in fs}
    by_location = {join(location, name): size for name, size in sizes.items()}
    read = ray.remote(num_cpus=0)(_read_many)
    refs = {}
    for group in _groups({f: by_location[f] for f in metadata}, int(ray.cluster_resources().get("CPU", 1))):
        out = read.options(num_returns=len(group)).remote(group)
        refs.update(zip(group, out if len(group) > 1 else [out]))
    try:
        from ray.data._internal.logical.interfaces import LogicalPlan
        from ray.data._internal.logical.operators.from_operators import FromArrow
        from ray.data._internal.stats import DatasetStats
        from ray.data.dataset import MaterializedDataset
    except ImportError:  # another Ray's internals: Ray's own from_arrow_refs, which waits for the reads
        return {split: ray.data.from_arrow_refs([refs[f] for f in fs]) for split, fs in files.items()}
    datasets = {}
    for split, fs in files.items():
        meta = [metadata[f] for f in fs]
        context = ray.data.DataContext.get_current().copy()
        plan = LogicalPlan(FromArrow([refs[f] for f in fs], meta), context)
        datasets[split] = MaterializedDataset(plan, context, DatasetStats(metadata={"FromArrow": meta}, parent=None))
    return datasets


def _files(location: str) -> dict[str, int]:
    """Every file under `location` (a folder or an object-storage prefix): relative name -> size."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError:
        return {}
    root = path.rstrip("/") + "/"
    return {i.path[len(root):]: i.size for i in infos if i.type == pyarrow.fs.FileType.File and i.path.startswith(root)}


def _remove(location: str | Path) -> None:
    """Remove the folder (prefix) at `location` and everything in it; gone already is fine."""
    if not is_uri(str(location)):
        shutil.rmtree(location, ignore_errors=True)
        return
    fs, path = filesystem(str(location))
    try:
        fs.delete_dir(path)
    except (FileNotFoundError, OSError):
        pass


def _write_bytes(location: str, data: bytes) -> None:
    fs, path = filesystem(location)
    with fs.open_output_stream(path) as fh:
        fh.write(data)


def _mtime(location: str) -> float:
    """Modification time of the file (object) at `location`; 0 when it is not there."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        info = fs.get_file_info(path)
    except OSError:
        return 0.0
    return info.mtime.timestamp() if info.type == pyarrow.fs.FileType.File and info.mtime else 0.0


# On object storage, where an object's time cannot be touched, `load` writes this one to say
# when the entry was last used (prune --older-than keeps what runs still read).
_LAST_USED = "last-used"


@dataclass
class CacheEntry:
    key: str
    path: Path | str  # a local folder, or the entry's URI on object storage
    meta: dict

    @property
    def bytes(self) -> int:
        if isinstance(self.path, str):
            return sum(_files(self.path).values())
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    @property
    def created(self) -> float:
        return float(self.meta.get("created", 0))

    @property
    def last_used(self) -> float:
        """When a run last read or wrote it (`load` touches its meta.json, or on object storage
        writes its last-used object); 0 when that is gone."""
        if isinstance(self.path, str):
            return max(_mtime(join(self.path, _LAST_USED)), _mtime(join(self.path, _META)))
        try:
            return (self.path / _META).stat().st_mtime
        except OSError:
            return 0.0


class DataCache:
    """The cache of one workspace."""

    def __init__(self, root: Path | str, read: bool = True):
        self.remote = is_uri(str(root))
        self.root: Path | str = str(root).rstrip("/") if self.remote else Path(root)
        self.read = read  # False (`--no-cache`): every load is a miss; what is computed is stored anew

    @classmethod
    def of(cls, ws, read: bool = True) -> "DataCache":
        """The workspace's cache: in its local folder, or under its URI on object storage."""
        return cls(join(ws.location, "data-cache") if ws.remote else ws.root / "data-cache", read=read)

    def location(self, key: str) -> Path | str:
        """Where entry `key` is (or would be)."""
        return join(self.root, key) if self.remote else self.root / key

    def has(self, key: str) -> bool:
        """Whether entry `key` is there, whole (its meta.json written)."""
        if self.remote:
            return exists(join(self.root, key, _META))
        return (self.root / key / _META).is_file()

    # ------------------------------------------------------------ reading

    def entries(self) -> list[CacheEntry]:
        out = []
        if self.remote:
            for name in list_names(self.root, folders_only=True):
                if name.startswith("."):
                    continue
                # none: being written, or what a killed run left
                meta = read_json(join(self.root, name, _META)) or {"broken": True}
                out.append(CacheEntry(name, join(self.root, name), meta))
            return sorted(out, key=lambda e: e.created)
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or not path.is_dir():
                continue
            try:
                meta = json.loads((path / _META).read_text())
            except (OSError, ValueError):
                meta = {"broken": True}
            out.append(CacheEntry(path.name, path, meta))
        return sorted(out, key=lambda e: e.created)

    def load(self, key: str):
        """(meta, fitted preprocessing, {split: materialized Dataset}, probe_frame), or None on a miss."""
        from rayline.data.preprocess import FittedPreprocessing

        if not self.read:
            return None
        if self.remote:
            return self._load_remote(key)
        path = self.root / key
        try:
            meta = json.loads((path / _META).read_text())
            if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
                raise ValueError("another layout")
            # Every file written, at its size: a split's directory missing one Parquet file would
            # still read, with fewer rows (a wrong hit).
            for name, size in meta["files"].items():
                if (path / name).stat().st_size != size:
                    raise ValueError(f"{name}: another size")
            preprocessing = FittedPreprocessing.load(path / "preprocessing.json")
            datasets = _read_splits(str(path), meta["files"])
            probe_file = path / "probe_frame.parquet"
            probe_frame = pd.read_parquet(probe_file) if probe_file.exists() else None
        except FileNotFoundError:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)  # a part is gone: recompute, and write it anew
            return None
        except Exception:  # unreadable (truncated, another format): a miss, never a wrong hit
            shutil.rmtree(path, ignore_errors=True)
            return None
        os.utime(path / _META)  # last used: prune --older-than keeps what runs still read
        return meta, preprocessing, datasets, probe_frame

    def _load_remote(self, key: str):
        """`load` on object storage: the same checks, against one listing of the entry's objects."""
        import pyarrow.parquet as pq

        from rayline.data.preprocess import FittedPreprocessing

        location = join(self.root, key)
        meta = read_json(join(location, _META))
        if meta is None:
            return None  # no entry, or one being written (its meta.json comes last)
        try:
            if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
                raise ValueError("another layout")
            present = _files(location)
            for name, size in meta["files"].items():
                if present.get(name) != size:
                    raise ValueError(f"{name}: missing or another size")
            preprocessing = FittedPreprocessing.from_dict(read_json(join(location, "preprocessing.json")))
            datasets = _read_splits(location, meta["files"])
            probe_frame = None
            if "probe_frame.parquet" in meta["files"]:
                fs, path = filesystem(join(location, "probe_frame.parquet"))
                probe_frame = pq.read_table(path, filesystem=fs).to_pandas()
        except Exception:  # a part gone or unreadable: a miss, never a wrong hit; written anew
            _remove(location)
            return None
        _write_bytes(join(location, _LAST_USED), str(time.time()).encode())
        return meta, preprocessing, datasets, probe_frame

    # ------------------------------------------------------------ writing

    def scratch(self, name: str) -> Path | str:
        """The location of a temporary folder in the cache (an entry being written, or files several
        entries share meanwhile); the caller removes it (`remove`), and `prune` removes one a
        killed run left."""
        name = f".{name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        if self.remote:
            return join(self.root, name)
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / name

    @staticmethod
    def remove(location: Path | str) -> None:
        """Remove a folder of the cache (a scratch folder, an entry) and all in it."""
        _remove(location)

    def writer(self, key: str) -> "EntryWriter":
        """An entry being written under `key` (see EntryWriter)."""
        return EntryWriter(self, key)

    def size(self) -> tuple[int, int]:
        """(entries, bytes) of the whole cache, so that its growth is seen where it happens."""
        entries = self.entries()
        return len(entries), sum(e.bytes for e in entries)

    # ------------------------------------------------------------ pruning

    def prune(self, older_than_s: float | None = None) -> list[CacheEntry]:
        """Remove entries last used more than `older_than_s` ago (all when None), and leftovers
        of interrupted writes; the removed entries."""
        removed = []
        now = time.time()
        for entry in self.entries():
            if older_than_s is None or now - entry.last_used > older_than_s or entry.meta.get("broken"):
                _remove(entry.path)
                removed.append(entry)
        if self.remote:
            for name in list_names(self.root, folders_only=True):
                if name.startswith(".") and ".tmp-" in name:
                    _remove(join(self.root, name))
        elif self.root.is_dir():
            for leftover in self.root.glob(".*.tmp-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        return removed


def write_block(table, folder: str, hashes) -> None:
    """Write one block of a split (an Arrow table) into `folder` of an entry being written; called
    in the Ray task that computed the block. `hashes`: its rows' split hashes, which name the file
    (the same block gives the same name, see the module docstring). Empty blocks write nothing."""
    import numpy as np
    import pyarrow.parquet as pq

    if not table.num_rows:
        return
    name = hashlib.sha256(np.ascontiguousarray(hashes).tobytes()).hexdigest()[:32]
    if is_uri(folder):  # an object appears whole when its upload completes: no temporary name
        fs, path = filesystem(join(folder, f"{name}.parquet"))
        pq.write_table(table, path, filesystem=fs, compression="zstd")
        return
    from rayline.files import atomic_path

    os.makedirs(folder, exist_ok=True)
    # zstd: the smallest files and the fastest to read back of snappy, lz4 and zstd, measured on
    # a block of 800,000 model-ready rows (0.26 s to write, 11 MiB).
    with atomic_path(os.path.join(folder, f"{name}.parquet")) as tmp:
        pq.write_table(table, str(tmp), compression="zstd")


class EntryWriter:
    """One entry being written: Ray tasks write the splits' blocks into `folder(split)`
    (`write_block`), then `commit` adds the rest and puts the entry in place; `abort` (or
    leaving a `with` block on an exception) removes it. On a disk it is written in a temporary
    folder and renamed; on object storage in place, with its meta.json written last."""

    def __init__(self, cache: DataCache, key: str):
        self.cache, self.key = cache, key
        self.committed = False
        if cache.remote:
            self.tmp = cache.location(key)
            _remove(self.tmp)  # a --no-cache rewrite, or what a killed run left: none of it is kept
            return
        self.tmp = cache.scratch(key)
        self.tmp.mkdir()

    def folder(self, split: str) -> str:
        return join(str(self.tmp), split)

    def link(self, split: str, folder: Path | str) -> None:
        """Put the Parquet files of `folder` (written once for several entries: the raw test rows
        every preprocessing variant shares) under `split`, hard-linked where the disk allows
        (copied on object storage)."""
        if self.cache.remote:
            fs, _ = filesystem(self.tmp)
            for name in _files(str(folder)):
                if name.endswith(".parquet"):
                    fs.copy_file(filesystem(join(str(folder), name))[1], filesystem(join(self.tmp, split, name))[1])
            return
        target = self.tmp / split
        target.mkdir(exist_ok=True)
        for f in Path(folder).glob("*.parquet"):
            try:
                os.link(f, target / f.name)
            except OSError:
                shutil.copyfile(f, target / f.name)

    def commit(self, data, meta: dict) -> None:
        """Complete the entry with `data`'s (a PreparedData) fitted preprocessing and probe rows."""
        if self.cache.remote:
            self._commit_remote(data, meta)
            return
        tmp = self.tmp
        try:
            for split in SPLIT_FOLDERS:
                (tmp / split).mkdir(exist_ok=True)  # a split of no rows has no files
            data.preprocessing.save(tmp / "preprocessing.json")
            if data.probe_frame is not None:
                data.probe_frame.to_parquet(tmp / "probe_frame.parquet", index=False)
            files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
            (tmp / _META).write_text(json.dumps({**meta, "key": self.key, "format": CACHE_FORMAT, "created": time.time(),
                                                 "files": files}, indent=1, default=str))
            target = self.cache.root / self.key
            if target.exists() and not self.cache.read:  # --no-cache: the recomputed entry replaces the old one
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(tmp, target)
            except OSError:  # another run wrote the same entry meanwhile: theirs is as good
                pass
        finally:
            self.abort()

    def _commit_remote(self, data, meta: dict) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        location = self.tmp
        try:
            _write_bytes(join(location, "preprocessing.json"), data.preprocessing.to_json().encode())
            if data.probe_frame is not None:
                fs, path = filesystem(join(location, "probe_frame.parquet"))
                pq.write_table(pa.Table.from_pandas(data.probe_frame, preserve_index=False), path, filesystem=fs)
            files = dict(sorted(_files(location).items()))
            document = {**meta, "key": self.key, "format": CACHE_FORMAT, "created": time.time(), "files": files}
            _write_bytes(join(location, _META), json.dumps(document, indent=1, default=str).encode())  # last
            self.committed = True
        finally:
            self.abort()

    def abort(self) -> None:
        if self.committed:
            return  # in place on object storage: what was committed stays
        _remove(self.tmp)

    def __enter__(self) -> "EntryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()  # after commit: nothing left to remove
