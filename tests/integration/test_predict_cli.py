"""JSON sources through the data stage on a real Ray, and the real `rayline predict` CLI
against the served digits model: every training format as --input, NaN/inf rejected
client-side with one line naming the row and column, server and connection errors as one
line, --probabilities with missing values never crashing."""

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.cli import rayline

from .conftest import PORT, ROOT, serve_digits

# Queries the session's served digits endpoint, kept up from module to module (conftest.DIGITS_ENDPOINT).
pytestmark = pytest.mark.digits_endpoint

N_ROWS = 60


def _rows(n=N_ROWS, start=0):
    return [{"x1": float(i % 7), "x2": None if i % 10 == 3 else float(i % 5), "y": "yes" if (i % 7) > 3 else "no"}
            for i in range(start, start + n)]


def _spec(folder, path):
    spec = folder / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "jsonsrc",
        "data": {"source": {"format": "json", "path": path}, "label": "y",
                 "preprocess": [{"impute": {"columns": ["x2"], "strategy": "median"}}]},
        "model": {"framework": "xgboost", "kind": "gbdt"},
    }))
    return spec


@pytest.mark.parametrize("layout", ["array", "lines", "both"])
def test_json_arrays_and_lines_through_the_data_stage(ray_session, tmp_path, layout):
    from rayline.data.pipeline import prepare_data
    from rayline.spec import load_spec

    (tmp_path / "d").mkdir()
    if layout in ("array", "both"):
        (tmp_path / "d" / "a.json").write_text(json.dumps(_rows(), indent=1))
    if layout in ("lines", "both"):
        (tmp_path / "d" / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(start=N_ROWS)))
    data = prepare_data(load_spec(_spec(tmp_path, "d")))
    assert sum(data.rows.values()) == N_ROWS * (2 if layout == "both" else 1)
    assert [(f.name, f.kind) for f in data.preprocessing.features] == [("x1", "number"), ("x2", "number")]
    assert data.preprocessing.label.classes == ["no", "yes"]


def test_malformed_json_lines_after_the_sample_fail_the_data_stage_naming_the_line(ray_session, tmp_path):
    from rayline.data.pipeline import prepare_data
    from rayline.data.sources import SAMPLE_ROWS
    from rayline.errors import DataError
    from rayline.spec import load_spec

    rows = _rows(SAMPLE_ROWS + 10)
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"x1": 1, "x2": 2, "y": }\n'
    (tmp_path / "rows.jsonl").write_text(text)
    spec = load_spec(_spec(tmp_path, "rows.jsonl"))  # validate reads the first SAMPLE_ROWS lines only: passes
    with pytest.raises(DataError) as info:
        prepare_data(spec)
    assert str(info.value).startswith(f"{tmp_path / 'rows.jsonl'}: line {len(rows) + 1} column 25: Expecting value")
    assert "\n" not in str(info.value)


def test_a_malformed_csv_fails_the_data_stage_with_one_line_naming_the_file(ray_session, tmp_path):
    from rayline.data.sources import read_dataset
    from rayline.errors import DataError

    class Source:
        format, name, path = "csv", None, str(tmp_path / "rows.csv")

    (tmp_path / "rows.csv").write_text("x1,y\n1,no\n2,yes,3\n")
    with pytest.raises(DataError) as info:
        read_dataset(Source)
    assert "Failed to read CSV file: " + str(tmp_path / "rows.csv") in str(info.value)
    assert "\n" not in str(info.value) and "ray::" not in str(info.value)


def test_a_malformed_later_file_fails_the_data_stage_with_one_line_naming_it(ray_session, tmp_path):
    """Only the first block is read up front; a bad file after it fails at the data stage's
    materialize, and that too is one line naming the file, not Ray's remote traceback."""
    from rayline.data.pipeline import prepare_data
    from rayline.errors import DataError
    from rayline.spec import load_spec

    (tmp_path / "d").mkdir()
    good = "x1,x2,y\n" + "".join(f"{i % 7},{i % 5},{'yes' if i % 7 > 3 else 'no'}\n" for i in range(40))
    (tmp_path / "d" / "a.csv").write_text(good)
    (tmp_path / "d" / "b.csv").write_text(good + "1,2,no,extra\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "csvsrc", "data": {"source": {"format": "csv", "path": "d"}, "label": "y"},
                                    "model": {"framework": "xgboost", "kind": "gbdt"}}))
    with pytest.raises(DataError) as info:
        prepare_data(load_spec(spec))
    assert "b.csv" in str(info.value)
    assert "\n" not in str(info.value) and "ray::" not in str(info.value) and "Traceback" not in str(info.value)


# ---------------------------------------------------------------- the real CLI against the digits endpoint


def _predict(*args):
    """`rayline predict ARGS` in this process (tests/cli.py: the same entry point, exit code and output;
    the command's own process is tested in test_client.py). A wide terminal, so that "one line" means
    the message, not rich's wrapping at 80 columns."""
    return rayline("predict", *args, cwd=ROOT, extra_env={"COLUMNS": "1000"})


def _one_line_error(proc, code, *parts):
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for part in parts:
        assert part in lines[0], lines[0]


@pytest.fixture(scope="module")
def endpoint(digits, ws):
    return serve_digits(digits, ws)


@pytest.fixture(scope="module")
def digit_rows():
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame.drop(columns="target").head(3)
    return frame.to_dict(orient="records")


@pytest.mark.parametrize("name", ["rows.csv", "rows.parquet", "rows.json", "rows.jsonl"])
def test_predict_input_in_every_training_format(endpoint, digit_rows, tmp_path, name):
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text(",".join(digit_rows[0]) + "\n" + "".join(",".join(map(str, r.values())) + "\n" for r in digit_rows))
    elif name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(digit_rows), path)
    elif name.endswith(".json"):
        path.write_text(json.dumps(digit_rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in digit_rows))
    proc = _predict(endpoint, "--input", str(path), "--probabilities", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert len(answer["predictions"]) == 3 and len(answer["probabilities"]) == 3


def test_predict_table_with_probabilities(endpoint, digit_rows, digits, ws):
    """The table's rows are the served model's answers: each row's class and the probability of that
    class, to the 4 places shown, are what `rayline.load_model` computes offline for the same row."""
    from rayline import load_model

    rows = digit_rows[:3]
    proc = _predict(endpoint, "--json", json.dumps(rows), "--probabilities")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"digits v{digits.version}" in proc.stdout, proc.stdout
    table = [line.replace("│", " ").split() for line in proc.stdout.splitlines()]
    shown = [cells for cells in table if len(cells) == 3 and cells[0].isdigit()]
    offline = load_model("digits", digits.version, workspace=str(ws.root)).predict(rows, probabilities=True)
    expected = [[str(i), str(label), f"{(probs[label] if label in probs else probs[str(label)]):.4f}"]
                for i, (label, probs) in enumerate(zip(offline["predictions"], offline["probabilities"]))]
    assert shown == expected, (proc.stdout, offline)


@pytest.mark.parametrize("make, parts", [
    (lambda rows, tmp: ["--json", json.dumps([{**rows[0], "pixel_0_3": float("nan")}])],
     ["--json: row 0, column 'pixel_0_3': not a finite number (got nan;"]),
    (lambda rows, tmp: ["--json", '{"instances": [{"pixel_0_0": 1}, {"pixel_0_0": Infinity}]}'],
     ["--json: row 1, column 'pixel_0_0': not a finite number (got inf;"]),
    (lambda rows, tmp: ["--input", _csv_with(tmp, rows, row=1, column="pixel_2_2", cell="inf")],
     ["rows.csv: row 1, column 'pixel_2_2': not a finite number (got inf;"]),
    (lambda rows, tmp: ["--input", str(tmp / "rows.txt")], ["unknown file type (got '.txt'; allowed: .csv"]),
])
def test_bad_rows_are_one_line_exit_2_before_sending(endpoint, digit_rows, tmp_path, make, parts):
    _one_line_error(_predict(endpoint, *make(digit_rows, tmp_path)), 2, *parts)


def _csv_with(tmp, rows, row, column, cell):
    lines = [",".join(rows[0])]
    for i, r in enumerate(rows):
        lines.append(",".join(cell if (i == row and k == column) else str(v) for k, v in r.items()))
    (tmp / "rows.csv").write_text("\n".join(lines) + "\n")
    return str(tmp / "rows.csv")


def test_missing_values_with_probabilities_get_the_servers_answer_on_one_line(endpoint, digit_rows, tmp_path):
    # digits imputes nothing, so the server answers 422 for the empty cell, sent as null
    path = _csv_with(tmp_path, digit_rows, row=2, column="pixel_3_4", cell="")
    _one_line_error(_predict(endpoint, "--input", path, "--probabilities"), 1,
                    "answered 422: the model rejected the request:", "instances.2.pixel_3_4")


def test_server_errors_and_unreachable_endpoints_are_one_line(endpoint, digit_rows):
    row = json.dumps(digit_rows[:1])
    _one_line_error(_predict(f"http://127.0.0.1:{PORT}/no-such-route", "--json", row), 1, "answered 404")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    _one_line_error(_predict(f"http://127.0.0.1:{free}/digits", "--json", row, "--timeout", "5"), 1,
                    f"cannot reach http://127.0.0.1:{free}/digits/predict")
