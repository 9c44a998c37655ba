"""Byte ranges of a CSV file hold every line exactly once, whatever the range size (data/csv_ranges.py)."""

from __future__ import annotations

import pytest

from rayline.data.csv_ranges import MIN_RANGE_BYTES, RANGE_BYTES, _range_bytes, byte_ranges, range_size, use_ranges


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_ranges_of_any_size_hold_every_line_once(tmp_path, newline, trailing):
    lines = [b"a,b,c"] + [f"{i},{'x' * (i % 13)},{i * 0.5}".encode() for i in range(300)]
    content = newline.join(lines) + (newline if trailing else b"")
    path = tmp_path / "f.csv"
    path.write_bytes(content)
    for size in (1, 2, 7, 64, 1000, len(content) - 1, len(content), 10 * len(content)):
        parts = [_range_bytes(str(path), start, end) for start, end in byte_ranges(len(content), size)]
        assert b"".join(parts) == content, size
        # each part is whole lines: it starts where a line starts, and ends a line or the file
        offset = 0
        for part in parts:
            assert not part or offset == 0 or content[offset - 1:offset] == b"\n", (size, offset)
            offset += len(part)
            assert not part or part.endswith(newline) or offset == len(content), (size, offset)


def test_only_large_local_uncompressed_files_use_ranges(tmp_path):
    small, large, packed = tmp_path / "s.csv", tmp_path / "l.csv", tmp_path / "l.csv.gz"
    small.write_bytes(b"a\n1\n")
    large.write_bytes(b"a\n" + b"1\n" * 5000)
    packed.write_bytes(large.read_bytes())
    assert not use_ranges([str(small)], range_bytes=1000)
    assert use_ranges([str(small), str(large)], range_bytes=1000)
    assert not use_ranges([str(packed)], range_bytes=1000)  # compressed: no byte ranges
    assert not use_ranges(["s3://bucket/l.csv"], range_bytes=1000)


def test_a_file_is_cut_into_two_ranges_per_cpu_within_the_bounds():
    assert range_size(400 * 2**20, cpus=2) == 64 * 2**20 == RANGE_BYTES  # 100 MB each would be too large
    assert range_size(35 * 2**20, cpus=2) == 35 * 2**20 // 4  # the 1M-row benchmark file: 4 ranges on 2 CPUs
    assert range_size(10 * 2**20, cpus=16) == MIN_RANGE_BYTES  # not 320 KB ranges
