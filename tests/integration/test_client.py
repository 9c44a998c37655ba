"""rayline.Client against the real digits endpoint (the session's `digits` fixture on real
Serve): DataFrame in, DataFrame out, equal to the offline Predictor; the server's 422 names the
field and is not retried; `rayline predict URL --output FILE` writes the Client's frame."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from .conftest import ROOT, serve_digits

# Queries the session's served digits endpoint, kept up from module to module (conftest.DIGITS_ENDPOINT).
pytestmark = pytest.mark.digits_endpoint


@pytest.fixture(scope="module")
def endpoint(digits, ws):
    return serve_digits(digits, ws)


@pytest.fixture(scope="module")
def predictor(digits, ws):
    import rayline

    return rayline.load_model("digits", digits.version, workspace=str(ws.root))


@pytest.fixture(scope="module")
def frame():
    from sklearn.datasets import load_digits

    data = load_digits(as_frame=True).frame.drop(columns="target").head(150)
    data.index = [f"img-{i}" for i in range(len(data))]  # not a RangeIndex: the answer must follow it
    return data


def test_dataframe_in_dataframe_out_equals_the_offline_predictor(endpoint, predictor, frame, digits):
    import rayline

    with rayline.Client(endpoint, batch_size=64) as client:  # 3 chunks: 64, 64, 22
        out = client.predict(frame, probabilities=True)
        assert client.version == digits.version and client.attempts == 1
        assert client.health()["status"] == "ok"
        assert [f["name"] for f in client.metadata()["features"]] == list(frame.columns)
    offline = predictor.predict(frame, probabilities=True)
    labels = [str(c) for c in predictor.preprocessing.label.classes]
    assert list(out.index) == list(frame.index)
    assert list(out.columns) == ["prediction"] + [f"probability_{c}" for c in labels]
    assert out["prediction"].tolist() == offline["predictions"]
    expected = np.array([[row[c] for c in labels] for row in offline["probabilities"]])
    assert np.array_equal(out[[f"probability_{c}" for c in labels]].to_numpy(), expected)
    rows_out = rayline.Client(endpoint).predict(frame.to_dict(orient="records"))  # a list of rows: RangeIndex
    assert rows_out["prediction"].tolist() == offline["predictions"] and list(rows_out.index) == list(range(150))


def test_a_missing_value_gets_the_servers_422_naming_the_field_without_retries(endpoint, frame):
    from rayline.client import Client, ServeRequestError

    bad = frame.head(3).copy()
    bad.iloc[1, bad.columns.get_loc("pixel_3_4")] = np.nan  # sent as null; digits imputes nothing
    with Client(endpoint, backoff_s=0.01) as client:
        with pytest.raises(ServeRequestError) as info:
            client.predict(bad)
    assert info.value.status == 422 and info.value.attempts == 1
    assert "answered 422: the model rejected the request: instances.1.pixel_3_4" in str(info.value)


def test_cli_online_output_file_and_a_bare_name_without_output(endpoint, frame, digits, tmp_path):
    rows = frame.head(20).reset_index(names="key")
    rows.to_parquet(tmp_path / "rows.parquet", index=False)
    env = {**os.environ, "COLUMNS": "1000"}
    proc = subprocess.run([sys.executable, "-m", "rayline.cli", "predict", endpoint, "--input", str(tmp_path / "rows.parquet"),
                           "--output", str(tmp_path / "out.parquet"), "--keep", "key", "--probabilities"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 20 predictions to {tmp_path / 'out.parquet'} (version {digits.version} answered)" in proc.stdout
    out = pq.read_table(tmp_path / "out.parquet").to_pandas()
    assert list(out.columns[:2]) == ["key", "prediction"] and len(out.columns) == 12
    assert out["key"].tolist() == rows["key"].tolist()
    proc = subprocess.run([sys.executable, "-m", "rayline.cli", "predict", "digits", "--json", json.dumps([{}])],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: digits: a registered model name scores a dataset offline: give --input DATA and --output "
        "FILE.parquet (got --json); to query the served model, give its route /digits or a URL"]
