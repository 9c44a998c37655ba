"""`rayline cache list|prune` over a workspace's data cache (entries are directories; no Ray needed)."""

import json
import os
import time

import pytest

from rayline.data.cache import CACHE_FORMAT, DataCache
from tests.cli import rayline as rayline_in_process


def rayline(*args, cwd):
    return rayline_in_process(*args, cwd=cwd)


def _entry(root, key, age_s, rows=100, payload=b"x" * 2048):
    path = root / key
    (path / "train").mkdir(parents=True)
    (path / "train" / "part-0.parquet").write_bytes(payload)
    meta = path / "meta.json"
    meta.write_text(json.dumps({"key": key, "format": CACHE_FORMAT, "created": time.time() - age_s,
                                "pipeline": "churn", "source": "/data/churn.csv", "rows": {"train": rows}}))
    os.utime(meta, (time.time() - age_s,) * 2)  # last used
    return path


def test_list_shows_every_entry_and_the_total_and_prune_removes_only_old_ones(tmp_path):
    ws = tmp_path / "ws"
    root = ws / "data-cache"
    _entry(root, "oldkey", age_s=10 * 86400)
    _entry(root, "newkey", age_s=60, rows=7)
    (root / ".halfkey.tmp-1-2").mkdir()  # an interrupted write
    listed = rayline("cache", "list", "--workspace", str(ws), "-o", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    body = json.loads(listed.stdout)
    assert [e["key"] for e in body["entries"]] == ["oldkey", "newkey"]  # oldest first; the half-written one is not an entry
    assert [e["rows"] for e in body["entries"]] == [100, 7]
    assert body["bytes"] == sum(e["bytes"] for e in body["entries"]) >= 2 * 2048
    table = rayline("cache", "list", "--workspace", str(ws), cwd=tmp_path)
    assert "2 entries" in table.stdout and "oldkey" in table.stdout

    pruned = rayline("cache", "prune", "--older-than", "7d", "--workspace", str(ws), cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 entry" in pruned.stdout and "1 left" in pruned.stdout
    assert sorted(p.name for p in root.iterdir()) == ["newkey"]  # the old one and the leftover are gone

    everything = rayline("cache", "prune", "--workspace", str(ws), cwd=tmp_path)
    assert everything.returncode == 0 and "removed 1 entry" in everything.stdout
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("bad", ["7", "soon", "7w", "-1d"])
def test_a_bad_duration_is_one_line_naming_the_option(tmp_path, bad):
    out = rayline("cache", "prune", "--older-than", bad, "--workspace", str(tmp_path / "ws"), cwd=tmp_path)
    assert out.returncode == 2
    assert f"--older-than: not a duration (got {bad!r}; allowed:" in out.stderr and "Traceback" not in out.stderr


def test_an_entry_whose_listed_file_changed_is_a_miss_and_is_removed(tmp_path):
    root = tmp_path / "cache"
    path = _entry(root, "k", age_s=0)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"] = {"train/part-0.parquet": 2048}
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "train" / "part-0.parquet").write_bytes(b"x" * 10)  # truncated
    assert DataCache(root).load("k") is None
    assert not path.exists()


def test_the_cache_lives_where_the_workspace_does(tmp_path):
    """A local workspace's cache is its folder; an object-storage workspace's is under its URI
    (tests/integration/test_storage_s3.py writes, hits and prunes one in a real S3 server)."""
    import dataclasses

    from rayline.workspace import workspace

    local = DataCache.of(workspace(tmp_path / "ws"))
    assert not local.remote and local.root == (tmp_path / "ws").resolve() / "data-cache"
    remote = DataCache.of(dataclasses.replace(workspace(tmp_path / "ws"), storage_uri="s3://bucket/ws"))
    assert remote.remote and remote.root == "s3://bucket/ws/data-cache"
    assert remote.location("k1") == "s3://bucket/ws/data-cache/k1"


def test_a_block_written_again_replaces_its_file_and_an_empty_one_writes_nothing(tmp_path):
    """A Ray task run again (a worker lost mid-stage) writes the same block under the same name:
    the entry never holds its rows twice (data/cache.py's write_block)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayline.data.cache import write_block

    folder = tmp_path / "train"
    block = pa.table({"x": [1.0, 2.0, 3.0]})
    hashes = np.array([11, 12, 13], dtype=np.uint64)
    write_block(block, str(folder), hashes)
    write_block(block, str(folder), hashes)
    write_block(block.slice(0, 0), str(folder), hashes[:0])
    (only,) = list(folder.iterdir())
    assert only.suffix == ".parquet" and pq.read_table(only).equals(block)
    write_block(pa.table({"x": [4.0]}), str(folder), np.array([14], dtype=np.uint64))
    assert sorted(pq.read_table(f).num_rows for f in folder.glob("*.parquet")) == [1, 3]
    assert not list(folder.glob(".*"))  # no temporary file left
