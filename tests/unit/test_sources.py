"""Data sources without Ray: one reader per format for validate, training and `rayline predict`.

JSON is an array of row objects or JSON Lines; malformed files name the file, line and
column; `rayline validate` reads a Parquet file's footer and a bounded sample, never the file;
`--json` / `--input` rows with NaN or inf are one-line errors naming the row and column.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayline.data import json_files
from rayline.data.fingerprint import fingerprint
from rayline.data.sources import FORMAT_SUFFIXES, format_of, read_file, sample_table, source_schema
from rayline.errors import DataError, ServeError
from rayline.serve.request_rows import describe_error_body, load_instances, post_predict, prediction_rows
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"a": i, "b": i * 0.5, "c": f"x{i % 3}", "y": i % 2} for i in range(30)]
ROWS[3]["a"] = None


def _cli(*args, cwd):
    return rayline_in_process(*args, cwd=cwd)


def _write_array(path, rows=ROWS):
    path.write_text(json.dumps(rows, indent=1))
    return path


def _write_lines(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(tmp_path, fmt, data_path, extra="", features=("a", "b")):
    (tmp_path / "s.yaml").write_text(
        f"name: src\ndata:\n  source: {{format: {fmt}, path: {data_path}}}\n  label: y\n"
        f"  features: [{', '.join(features)}]\n"
        f"model: {{framework: xgboost, kind: gbdt}}\n{extra}")
    return tmp_path / "s.yaml"


class Src:
    name = None

    def __init__(self, fmt, path):
        self.format, self.path = fmt, str(path)


# ---------------------------------------------------------------- JSON: arrays and lines


@pytest.mark.parametrize("name", ["rows.json", "rows.jsonl", "rows.ndjson", "lines-named.json"])
def test_json_arrays_and_json_lines_read_to_the_same_table(tmp_path, name):
    path = (_write_array if name == "rows.json" else _write_lines)(tmp_path / name)
    table = read_file(path)
    assert table.num_rows == len(ROWS)
    assert table.to_pylist() == ROWS  # the null stays a null, ints stay ints
    assert [str(t) for t in table.schema.types] == ["int64", "double", "string", "int64"]


def test_a_json_array_spec_passes_validate(tmp_path):
    # Regression: pandas rejected nrows without lines=True, so `format: json` with an array never validated.
    _write_array(tmp_path / "rows.json")
    out = _cli("validate", str(_spec(tmp_path, "json", "rows.json")), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_json_lines_spec_passes_validate(tmp_path):
    _write_lines(tmp_path / "rows.jsonl")
    out = _cli("validate", str(_spec(tmp_path, "json", "rows.jsonl")), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name, text, where", [
    ("bad.json", '[\n {"a": 1, "y": 0},\n {"a": 2,, "y": 1}\n]\n', "bad.json: line 3 column 10: Expecting property name"),
    ("bad.json", '[\n {"a": 1, "y": 0}\n {"a": 2, "y": 1}\n]\n', "bad.json: line 3 column 2: expected ',' or ']'"),
    ("bad.jsonl", '{"a": 1, "y": 0}\n{"a": 2, "y": 1}\n\n{"a": 3, "y": }\n', "bad.jsonl: line 4 column 15: Expecting value"),
    ("bad.jsonl", '{"a": 1, "y": 0}\n[1, 2]\n', "bad.jsonl: line 2: not a JSON object (got list)"),
    ("bad.json", '[{"a": 1, "y": 0}, 5]', "bad.json: item 1: not a JSON object (got int"),
])
def test_malformed_json_names_file_and_line_through_validate(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match="line|item") as info:
        read_file(tmp_path / name)
    assert where in str(info.value)
    out = _cli("validate", str(_spec(tmp_path, "json", name, features=("a",))), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert where in " ".join(out.stderr.split()), out.stderr
    assert "Traceback" not in out.stderr


def test_the_json_sample_is_bounded_and_a_cut_row_is_not_an_error(tmp_path, monkeypatch):
    rows = [{"a": i, "y": i % 2, "pad": "z" * 100} for i in range(5000)]
    _write_array(tmp_path / "big.json", rows)
    _write_lines(tmp_path / "big.jsonl", rows)
    for name in ("big.json", "big.jsonl"):
        assert sample_table(Src("json", tmp_path / name), rows=100).num_rows == 100
    # A prefix that cuts row 3 mid-way: the sample is the rows before it, not a parse error.
    monkeypatch.setattr(json_files, "_JSON_PREFIX_BYTES", 400)
    table = sample_table(Src("json", tmp_path / "big.json"), rows=1000)
    assert 0 < table.num_rows < 10 and table.column("a").to_pylist() == list(range(table.num_rows))


# ---------------------------------------------------------------- validate reads a Parquet footer, not the file


def _big_parquet(path):
    """~55 MB of incompressible doubles in one row group (a full read would hold all of it)."""
    n, rng = 400_000, np.random.default_rng(0)
    table = pa.table({**{f"f{i}": rng.random(n) for i in range(16)}, "y": rng.integers(0, 3, n)})
    pq.write_table(table, path, compression="none", row_group_size=n)
    return path


_ROW = b'{"f0": 0.25, "f15": 1.5, "y": 2}'


def _big_file(tmp_path, kind):
    """~50 MB of data in `kind`'s format, written in well under a second."""
    if kind == "parquet":
        return _big_parquet(tmp_path / "big.parquet")
    n = 50_000_000 // len(_ROW)
    if kind == "csv":
        body = b"f0,f15,y\n" + b"0.25,1.5,2\n" * (n * 3)
    elif kind == "jsonl":
        body = (_ROW + b"\n") * n
    else:
        body = b"[" + (_ROW + b",\n") * n + _ROW + b"]"
    path = tmp_path / f"big.{kind}"
    path.write_bytes(body)
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv", "json", "jsonl"])
def test_validate_reads_a_footer_or_a_bounded_sample_not_the_file(tmp_path, kind):
    path = _big_file(tmp_path, kind)
    assert os.path.getsize(path) > 45e6
    fmt = "json" if kind == "jsonl" else kind
    # train.metric without task makes validate infer the task from the label's values (one column, bounded).
    spec = _spec(tmp_path, fmt, path.name, "train: {metric: accuracy}\n", features=("f0", "f15"))
    # What the process read (/proc's rchar: every byte read(2) and pread(2) returned, whether or not
    # the page cache had it) and how much it grew, not a time: a CI machine two to three times slower
    # than this one took 1.5 s where this one takes 0.1.
    script = (
        "import resource, sys\n"
        "import pyarrow.parquet, pyarrow.csv, pyarrow.json, pandas\n"
        "from rayline.spec import load_spec\n"
        "import rayline.data.schema_check, rayline.data.sources\n"
        "def read_bytes():\n"
        "    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar:')).split()[1])\n"
        "before, was_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, read_bytes()\n"
        "spec = load_spec(sys.argv[1])\n"
        "print((read_bytes() - was_read) / 2**20, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(spec)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    read_mb, grown_mb = map(float, out.stdout.split())
    # Measured (2026-12-03): parquet 0.2 MB read (its footer and two columns' pages of one row group;
    # pq.read_table(...).to_pandas() of that file grows by ~137 MB); csv 2 MB (a 1-MB prefix, twice:
    # the schema, then the label's values); a JSON array 8 MB (a 4-MB prefix, twice); JSON lines less.
    # With Arrow's streaming CSV reader, 58 MB of this 49-MB csv file were read (its readahead).
    assert read_mb < 12 and grown_mb < 25, (read_mb, grown_mb)


def test_parquet_schema_of_a_directory_and_columns_sample(tmp_path):
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"a": [1, None, 3], "y": ["p", "q", "p"]}), tmp_path / "d" / "part-0.pq")
    source = Src("parquet", tmp_path / "d")
    assert source_schema(source).names == ["a", "y"]
    assert sample_table(source, columns=["y"]).to_pylist() == [{"y": "p"}, {"y": "q"}, {"y": "p"}]


def test_validate_kinds_are_the_training_readers_kinds(tmp_path):
    # An integer column with a gap is an integer column for Ray's (Arrow's) CSV reader; the
    # pandas sample validate used before called it a float ('number') column.
    (tmp_path / "rows.csv").write_text("a,y\n1,0\n,1\n3,0\n")
    assert str(source_schema(Src("csv", tmp_path / "rows.csv")).field("a").type) == "int64"


# ---------------------------------------------------------------- predict: files and --json


def test_format_of_names_every_allowed_suffix():
    assert [format_of(p) for p in ("x.CSV", "x.csv.gz", "x.pq", "x.parquet", "x.json", "x.jsonl", "x.ndjson")] == [
        "csv", "csv", "parquet", "parquet", "json", "json", "json"]
    with pytest.raises(DataError) as info:
        format_of("rows.txt")
    assert str(info.value) == ("rows.txt: unknown file type (got '.txt'; allowed: "
                               + ", ".join(s for group in FORMAT_SUFFIXES.values() for s in group) + ")")


@pytest.mark.parametrize("name", ["rows.csv", "rows.parquet", "rows.json", "rows.jsonl"])
def test_predict_input_reads_every_training_format(tmp_path, name):
    rows = [{"a": 1, "b": 0.5, "c": "p"}, {"a": None, "b": 2.0, "c": None}]
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text("a,b,c\n1,0.5,p\n,2.0,\n")
    elif name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        (_write_array if name.endswith(".json") else _write_lines)(path, rows)
    assert load_instances(None, path) == rows


@pytest.mark.parametrize("body, where", [
    ('[{"a": NaN}]', "--json: row 0, column 'a': not a finite number (got nan;"),
    ('{"instances": [{"a": 1}, {"a": -Infinity}]}', "--json: row 1, column 'a': not a finite number (got -inf;"),
    ('[{"a": 1e999}]', "--json: row 0, column 'a': not a finite number (got inf;"),
])
def test_json_that_is_not_strict_json_is_rejected_naming_row_and_column(body, where):
    with pytest.raises(DataError) as info:
        load_instances(body, None)
    assert str(info.value).startswith(where)


def test_csv_inf_is_rejected_and_missing_cells_become_null(tmp_path):
    (tmp_path / "inf.csv").write_text("a,b\n1,2\n3,inf\n")
    with pytest.raises(DataError, match=r"row 1, column 'b': not a finite number \(got inf"):
        load_instances(None, tmp_path / "inf.csv")
    (tmp_path / "gaps.csv").write_text("a,b\n1,\nnan,2\n")
    assert load_instances(None, tmp_path / "gaps.csv") == [{"a": 1, "b": None}, {"a": None, "b": 2}]


def test_input_errors_are_one_line(tmp_path):
    for args, expected in [((None, tmp_path / "rows.txt"), "unknown file type (got '.txt'"),
                           ((None, tmp_path / "none.csv"), "none.csv: no such file"),
                           (("[1, 2]", None), "--json: expected"),
                           (("{", None), "--json: not valid JSON"),
                           ((None, None), "give exactly one of --json or --input (got neither)")]:
        with pytest.raises(DataError) as info:
            load_instances(*args)
        assert expected in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------- predict: answers of any shape


@pytest.mark.parametrize("result, rows, with_probabilities", [
    ({"predictions": [1, None]}, [("0", "1", "-"), ("1", "-", "-")], False),
    ({"predictions": [1, 0], "probabilities": [{"0": 0.2, "1": 0.8}, {"1": 0.3}]},
     [("0", "1", "0.8000"), ("1", "0", "0.3000")], True),  # class 0 missing: the largest shown
    ({"predictions": [True], "probabilities": [{"true": 0.9, "false": 0.1}]}, [("0", "True", "0.9000")], True),
    ({"predictions": [1, 2], "probabilities": [None]}, [("0", "1", "-"), ("1", "2", "-")], True),
    ({"predictions": ["a"], "probabilities": [{"a": None, "b": "x"}]}, [("0", "a", "-")], True),
    ({"predictions": [0.5], "probabilities": []}, [("0", "0.5", "-")], False),
])
def test_prediction_rows_never_crash_on_missing_values(result, rows, with_probabilities):
    assert prediction_rows(result) == (rows, with_probabilities)


def test_an_answer_without_predictions_is_a_serve_error():
    with pytest.raises(ServeError, match="no list of predictions"):
        prediction_rows({"detail": "x"})


@pytest.mark.parametrize("status, body, expected", [
    (422, {"detail": [{"loc": ["body", "instances", 0, "a"], "msg": "Input should be a valid number"}]},
     "instances.0.a: Input should be a valid number"),
    (500, {"detail": "internal error (ValueError); the server log has the details"},
     "internal error (ValueError); the server log has the details"),
    (503, "Service\nUnavailable", "Service Unavailable"),
    (429, {"other": 1}, '{"other": 1}'),
])
def test_error_bodies_are_one_line(status, body, expected):
    response = httpx.Response(status, **({"json": body} if not isinstance(body, str) else {"text": body}))
    assert describe_error_body(response) == expected


def test_an_unreachable_endpoint_is_one_line_within_the_timeout():
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(ServeError) as info:
        post_predict(f"http://127.0.0.1:{port}/x", [{"a": 1}], timeout=5)
    assert time.monotonic() - t < 5
    assert str(info.value).startswith(f"cannot reach http://127.0.0.1:{port}/x/predict") and "\n" not in str(info.value)


def test_a_silent_endpoint_times_out_with_one_line():
    import socket
    import time

    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(ServeError, match=r"no answer within 1 s"):
            post_predict(f"http://127.0.0.1:{port}/x", [{"a": 1}], timeout=1)
        assert time.monotonic() - t < 3


def test_the_stat_fingerprint_follows_size_and_mtime_and_the_content_one_the_bytes(tmp_path):
    from rayline.spec.pipeline_spec import SourceSpec

    path = tmp_path / "d.csv"
    path.write_text("x,y\n1,2\n")
    stat = SourceSpec(format="csv", path=str(path))
    content = SourceSpec(format="csv", path=str(path), fingerprint="content")
    before = fingerprint(stat), fingerprint(content)
    assert before[0].startswith("stat:") and before[1].startswith("sha256:")
    os.utime(path, ns=(0, 10**9))  # touched: same bytes, another modification time
    assert fingerprint(stat) != before[0] and fingerprint(content) == before[1]
    path.write_text("x,y\n1,3\n")  # same size, other bytes
    os.utime(path, ns=(0, 10**9))
    assert fingerprint(stat) == fingerprint(stat)
    assert fingerprint(content) != before[1]
    with pytest.raises(Exception, match="fingerprint"):
        SourceSpec(format="csv", path=str(path), fingerprint="md5")


# ---------------------------------------------------------------- objects: ETag and version, never the bytes


class _S3Server:
    """moto's S3 app on a free loopback port, behind a WSGI layer that logs every request
    (method, path, query) and the body bytes each answer served."""

    def __init__(self):
        import threading

        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self.log: list[tuple[str, str, str, int]] = []

        def logged(environ, start_response):
            body = b"".join(app(environ, start_response))
            self.log.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                             environ.get("QUERY_STRING", ""), 0 if environ["REQUEST_METHOD"] == "HEAD" else len(body)))
            return [body]

        self._server = make_server("127.0.0.1", 0, logged, threaded=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self):
        self._server.shutdown()
        self._thread.join()


@pytest.fixture(scope="module")
def s3_server():
    import logging

    werkzeug_log = logging.getLogger("werkzeug")
    level = werkzeug_log.level
    werkzeug_log.setLevel(logging.ERROR)  # one line per request otherwise
    server = _S3Server()
    try:
        yield server
    finally:
        server.stop()
        werkzeug_log.setLevel(level)


@pytest.fixture
def bucket(s3_server, monkeypatch):
    """(boto3 client, a fresh bucket's name) on the loopback server; pyarrow reaches it through
    the environment only, as a user's run would."""
    import uuid

    import boto3

    from rayline import storage

    for key, value in {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    name = f"rayline-src-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    yield client, name
    storage._filesystem.cache_clear()  # its endpoint is this server's


OBJECT_BYTES = 256 << 10


def _object_requests(log, bucket_name):
    """(LIST requests, HEADs of objects, GETs of objects, body bytes served) in `log`."""
    lists = [r for r in log if r[0] == "GET" and r[1].rstrip("/") == f"/{bucket_name}" and "list-type=2" in r[2]]
    heads = [r for r in log if r[0] == "HEAD" and r[1].startswith(f"/{bucket_name}/")]
    gets = [r for r in log if r[0] == "GET" and r[1].startswith(f"/{bucket_name}/") and r[1] != f"/{bucket_name}/"]
    return lists, heads, gets, sum(r[3] for r in log)


def test_an_s3_prefix_is_fingerprinted_by_etag_from_one_listing_without_reading_an_object(s3_server, bucket):
    from rayline.spec.pipeline_spec import SourceSpec

    client, name = bucket
    rng = np.random.default_rng(0)
    bodies = {f"data/part-{i}.csv": rng.bytes(OBJECT_BYTES) for i in range(3)}
    for key, body in bodies.items():
        client.put_object(Bucket=name, Key=key, Body=body)
    stat = SourceSpec(format="csv", path=f"s3://{name}/data")
    content = SourceSpec(format="csv", path=f"s3://{name}/data", fingerprint="content")

    fingerprint(stat)  # the first opens the bucket's filesystem (pyarrow asks for its region)
    s3_server.log.clear()
    first = fingerprint(stat)
    lists, heads, gets, served = _object_requests(s3_server.log, name)
    assert first.startswith("stat:") and fingerprint(stat) == first
    # One LIST, one HEAD per object (plus one of the prefix itself: an object of that name would
    # be what Ray reads), and not one byte of any object.
    assert len(lists) == 1 and sorted(h[1] for h in heads) == [f"/{name}/data"] + [f"/{name}/{k}" for k in bodies], s3_server.log
    assert gets == [] and served < OBJECT_BYTES // 4, s3_server.log
    # The same log catches a body read: `content` GETs every byte.
    s3_server.log.clear()
    hashed = fingerprint(content)
    _, _, gets, served = _object_requests(s3_server.log, name)
    assert hashed.startswith("sha256:") and gets and served >= len(bodies) * OBJECT_BYTES

    # One object rewritten with other bytes of the same size: a new ETag, another fingerprint.
    key = "data/part-1.csv"
    client.put_object(Bucket=name, Key=key, Body=rng.bytes(OBJECT_BYTES))
    assert fingerprint(stat) != first and fingerprint(content) != hashed
    # Its old bytes back (an unversioned bucket: the same ETag): the same fingerprints as before.
    client.put_object(Bucket=name, Key=key, Body=bodies[key])
    assert fingerprint(stat) == first and fingerprint(content) == hashed
    # An object added or removed under the prefix changes it too.
    client.put_object(Bucket=name, Key="data/more/part-3.csv", Body=b"x")
    assert fingerprint(stat) != first
    client.delete_object(Bucket=name, Key="data/more/part-3.csv")
    assert fingerprint(stat) == first
    client.delete_object(Bucket=name, Key="data/part-0.csv")
    assert fingerprint(stat) != first


def test_on_a_versioned_bucket_a_rewrite_with_the_same_bytes_is_a_new_version(bucket):
    from rayline.spec.pipeline_spec import SourceSpec

    client, name = bucket
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    client.put_object(Bucket=name, Key="d/rows.parquet", Body=b"PAR1 same bytes PAR1")
    stat = SourceSpec(format="parquet", path=f"s3://{name}/d")
    content = SourceSpec(format="parquet", path=f"s3://{name}/d", fingerprint="content")
    before = fingerprint(stat), fingerprint(content)
    assert fingerprint(stat) == before[0]
    client.put_object(Bucket=name, Key="d/rows.parquet", Body=b"PAR1 same bytes PAR1")  # same ETag, new version id
    assert fingerprint(stat) != before[0] and fingerprint(content) == before[1]


def test_one_s3_object_is_fingerprinted_by_one_head(s3_server, bucket):
    from rayline.spec.pipeline_spec import SourceSpec

    client, name = bucket
    client.put_object(Bucket=name, Key="d/rows.csv", Body=b"a,y\n1,0\n")
    # A prefix of the same name holds an object too: Ray reads the object alone, and so does this.
    client.put_object(Bucket=name, Key="d/rows.csv/other.csv", Body=b"a,y\n2,1\n")
    stat = SourceSpec(format="csv", path=f"s3://{name}/d/rows.csv")
    first = fingerprint(stat)
    s3_server.log.clear()
    assert fingerprint(stat) == first
    lists, heads, gets, _ = _object_requests(s3_server.log, name)
    assert lists == [] and gets == [] and [h[1] for h in heads] == [f"/{name}/d/rows.csv"], s3_server.log
    client.put_object(Bucket=name, Key="d/rows.csv/other.csv", Body=b"a,y\n3,1\n")
    assert fingerprint(stat) == first
    client.put_object(Bucket=name, Key="d/rows.csv", Body=b"a,y\n1,1\n")
    assert fingerprint(stat) != first


def test_an_s3_path_with_no_object_is_a_one_line_data_error(bucket):
    from rayline.spec.pipeline_spec import SourceSpec

    _, name = bucket
    with pytest.raises(DataError) as info:
        fingerprint(SourceSpec(format="csv", path=f"s3://{name}/nothing/here"))
    assert str(info.value) == (f"data.source.path: no object there or under it (got 's3://{name}/nothing/here'; "
                               "allowed: an object, or a prefix with objects under it)")
