"""Batch scoring's pure decisions (no Ray): how many scoring actors for the free CPUs, which
files --input names, and the one-line errors checked before Ray starts."""

import pytest

from rayline.batch import input_files, plan_scorers
from rayline.batch.scorer import check_columns
from rayline.errors import DataError, ResourceError


@pytest.mark.parametrize("free, read, expected", [
    (2.0, 1.0, (1, 1.0)),      # an embedded Ray on 2 cores, CSV: 1 CPU reads, 1 scores
    (1.75, 1.0, (1, 0.75)),    # beside a served model's 0.25-CPU replica
    (1.1, 1.0, (1, 0.1)),
    (1.0, 0.25, (1, 0.75)),    # Parquet row groups read with a quarter CPU
    (0.35, 0.25, (1, 0.1)),
    (4.0, 1.0, (3, 1.0)),
    (64.0, 1.0, (8, 1.0)),     # at most 8 actors: each holds a model copy
])
def test_plan_scorers(free, read, expected):
    assert plan_scorers(free, read) == expected


def test_plan_scorers_fails_fast_without_a_cpu_to_read_and_score():
    with pytest.raises(ResourceError, match=r"^batch scoring: needs at least 1.1 free logical CPUs, 1 to read and some "
                                            r"to score \(got 0.5 free; allowed: "):
        plan_scorers(0.5)
    with pytest.raises(ResourceError, match=r"needs at least 0.35 free logical CPUs, 0.25 to read"):
        plan_scorers(0.2, 0.25)


def test_input_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.parquet").write_bytes(b"")
    (tmp_path / "d" / "a.pq").write_bytes(b"")
    (tmp_path / "d" / "_SUCCESS").write_bytes(b"")  # Spark's and Ray's markers are not data
    assert input_files(str(tmp_path / "d")) == ("parquet", [str(tmp_path / "d" / "a.pq"), str(tmp_path / "d" / "b.parquet")])
    (tmp_path / "d" / "c.csv").write_text("x\n1\n")
    with pytest.raises(DataError, match=r"^--input: directory mixes formats \(got csv, parquet files in "):
        input_files(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"^--input: no such file or directory \(got "):
        input_files(str(tmp_path / "nope"))
    (tmp_path / "rows.txt").write_text("")
    with pytest.raises(DataError, match=r"^--input: .*rows.txt: unknown file type \(got '.txt'; allowed: .csv"):
        input_files(str(tmp_path / "rows.txt"))
    (tmp_path / "e").mkdir()
    with pytest.raises(DataError, match=r"^--input: directory holds no data files"):
        input_files(str(tmp_path / "e"))


def test_columns_checked_before_scoring():
    out = ["prediction", "probability_0"]
    assert check_columns(["id", "a", "b"], ["a", "b"], None, "model 'm' v1", out) == ["id", "a", "b"]
    assert check_columns(["id", "a", "b"], ["a", "b"], ["id", "id"], "model 'm' v1", out) == ["id"]
    with pytest.raises(DataError, match=r"^--input: missing feature columns 'b', 'c' that model 'm' v1 needs \(got columns: id, a\)$"):
        check_columns(["id", "a"], ["a", "b", "c"], None, "model 'm' v1", out)
    with pytest.raises(DataError, match=r"^--keep: column 'prediction' would clash with an output column"):
        check_columns(["prediction", "a"], ["a"], ["prediction"], "model 'm' v1", out)
