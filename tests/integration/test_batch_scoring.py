"""Batch scoring (`rayline predict NAME --input DATA --output OUT.parquet`, rayline/batch/) of the
session's digits model: 20,000 rows in 5 row groups, scored in process on the session Ray
(equal to the offline Predictor for every row and to the served endpoint for a sample, rows in
input order, the `id` column kept to join on), one real CLI run in a subprocess (its own
embedded Ray), and the errors: one line, non-zero exit, no traceback, no output left behind."""

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli import rayline

from .conftest import ROOT, serve_digits

# Queries the session's served digits endpoint, kept up from module to module (conftest.DIGITS_ENDPOINT).
pytestmark = pytest.mark.digits_endpoint
from .test_predict_cli import _one_line_error

ROWS = 20_000


@pytest.fixture(scope="module")
def frame():
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True).frame.drop(columns="target")
    rng = np.random.default_rng(0)
    data = digits.iloc[rng.integers(0, len(digits), ROWS)].reset_index(drop=True)
    data = data + rng.normal(0.0, 0.5, data.shape)  # not only the training images
    data.insert(0, "id", np.arange(ROWS, dtype=np.int64) * 7 + 3)  # not the row number: a real key
    return data


@pytest.fixture(scope="module")
def data_file(frame, tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / "rows.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=4_000)
    assert pq.ParquetFile(path).num_row_groups == 5
    return path


@pytest.fixture(scope="module")
def predictor(digits, ws):
    import rayline

    return rayline.load_model("digits", digits.version, workspace=str(ws.root))


def _cli(*args, timeout=180, in_process=True):
    """`rayline predict ARGS`: in this process (tests/cli.py; a command needing Ray joins the session's),
    or with in_process=False in a process of its own with no cluster configured, as a user runs it."""
    if in_process:
        return rayline("predict", *args, cwd=ROOT, extra_env={"COLUMNS": "1000"})
    return subprocess.run([sys.executable, "-m", "rayline.cli", "predict", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                                                          "COLUMNS": "1000"})




@pytest.mark.parametrize("engine", ["ray", "local"])
def test_in_process_scoring_equals_the_predictor_for_every_row_and_the_endpoint_for_a_sample(
        digits, ws, frame, data_file, predictor, tmp_path, engine):
    """Both engines: Ray Data's actors on the session Ray, and the local engine in this process."""
    import rayline
    from rayline.batch import score

    out = tmp_path / "scores.parquet"
    seen = []
    result = score("digits", str(data_file), str(out), version=digits.version, workspace=ws, probabilities=True,
                   keep=["id"], progress=lambda rows, total: seen.append((rows, total)), engine=engine)
    labels = [str(c) for c in predictor.preprocessing.label.classes]
    scored = pq.read_table(out).to_pandas()
    assert result.engine == engine
    assert result.rows == ROWS and len(scored) == ROWS and result.version == digits.version
    assert list(scored.columns) == ["id", "prediction"] + [f"probability_{c}" for c in labels]
    assert scored["id"].tolist() == frame["id"].tolist()  # input order kept; `id` to join on as well
    assert seen[-1] == (ROWS, ROWS)
    features = frame.drop(columns="id")
    offline = predictor.predict(features, probabilities=True)
    assert scored["prediction"].tolist() == offline["predictions"]
    expected = np.array([[row[c] for c in labels] for row in offline["probabilities"]])
    assert np.array_equal(scored[[f"probability_{c}" for c in labels]].to_numpy(), expected)
    sample = np.random.default_rng(1).choice(ROWS, 300, replace=False)
    with rayline.Client(serve_digits(digits, ws)) as client:
        online = client.predict(features.iloc[sample], probabilities=True)
    assert online["prediction"].tolist() == scored["prediction"].iloc[sample].tolist()
    assert np.array_equal(online.drop(columns="prediction").to_numpy(),
                          scored.iloc[sample][[f"probability_{c}" for c in labels]].to_numpy())
    assert sorted(os.listdir(tmp_path)) == ["scores.parquet"]


@pytest.mark.parametrize("engine", ["ray", "local"])
def test_a_failure_mid_dataset_leaves_no_output_and_keeps_an_existing_one(digits, ws, frame, tmp_path, engine):
    from rayline.batch import score
    from rayline.errors import DataError

    (tmp_path / "in").mkdir()
    good = frame.head(3_000)
    bad = frame.iloc[3_000:4_000].copy()
    bad.iloc[500, bad.columns.get_loc("pixel_3_4")] = np.nan  # digits imputes nothing
    good.to_parquet(tmp_path / "in" / "a.parquet", index=False)
    bad.to_parquet(tmp_path / "in" / "b.parquet", index=False)
    out = tmp_path / "scores.parquet"
    out.write_bytes(b"an earlier result")
    import ray

    free_before = ray.available_resources().get("CPU", 0)  # this module's endpoint's replicas hold some
    with pytest.raises(DataError) as info:
        score("digits", str(tmp_path / "in"), str(out), workspace=ws, engine=engine)
    assert str(info.value) == (f"--input: column(s) ['pixel_3_4'] hold missing values and model digits v{digits.version} "
                               "imputes none of them (allowed: a value in every row of these columns)")
    assert out.read_bytes() == b"an earlier result"
    assert sorted(os.listdir(tmp_path)) == ["in", "scores.parquet"]  # no .partial file left
    # The failed run's scorers give their CPUs back while the caller still holds the error (its
    # traceback once kept their handles, and their CPUs, until a garbage collection came by).
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU", 0) < free_before - 0.01:
        assert time.monotonic() < deadline, f"CPUs held after the failed run: {ray.available_resources()}"
        time.sleep(0.5)


@pytest.mark.parametrize("engine", ["auto", "ray"])
def test_cli_scores_a_directory_with_progress_lines(digits, ws, frame, predictor, tmp_path, engine):
    """`auto` in a subprocess with no cluster configured (no RAY_ADDRESS) scores in the CLI's own
    process; `--engine ray` (in this process) scores with Ray Data's actors on the session's Ray, as it
    would on any Ray it joins. Same output."""
    (tmp_path / "in").mkdir()
    for i in range(2):
        frame.iloc[i * 1_000:(i + 1) * 1_000].to_csv(tmp_path / "in" / f"part-{i}.csv", index=False)
    out = tmp_path / "scores.parquet"
    proc = _cli("digits", "--input", str(tmp_path / "in"), "--output", str(out), "-w", str(ws.root), "--engine", engine,
                in_process=engine != "auto")
    assert proc.returncode == 0, proc.stderr
    where = "in this process" if engine == "auto" else "on Ray"
    assert proc.stdout.startswith(f"wrote 2,000 rows to {out} (model digits v{digits.version}, {where}; "), proc.stdout
    assert "scored 2,000 rows" in proc.stderr and "Traceback" not in proc.stderr  # plain lines: not a terminal
    scored = pq.read_table(out).to_pandas()
    assert list(scored.columns) == list(frame.columns) + ["prediction"]  # every input column by default
    assert scored["id"].tolist() == frame["id"].head(2_000).tolist()
    expected = predictor.predict(pd.read_csv(tmp_path / "in" / "part-0.csv").drop(columns="id"))["predictions"]
    assert scored["prediction"].head(1_000).tolist() == expected


def test_engine_choice():
    """auto: local for local Parquet or CSV with no cluster to use; Ray otherwise."""
    import pyarrow as pa

    from rayline.batch import choose_engine
    from rayline.errors import DataError

    schema = pa.schema([("a", pa.float64())])
    assert choose_engine("auto", "parquet", ["/d/a.parquet"], schema, cluster=False) == "local"
    assert choose_engine("auto", "csv", ["/d/a.csv"], schema, cluster=True) == "ray"
    assert choose_engine("auto", "json", ["/d/a.jsonl"], schema, cluster=False) == "ray"
    assert choose_engine("auto", "parquet", ["s3://b/a.parquet"], None, cluster=False) == "ray"
    assert choose_engine("ray", "parquet", ["/d/a.parquet"], schema, cluster=False) == "ray"
    assert choose_engine("local", "csv", ["/d/a.csv"], schema, cluster=True) == "local"
    with pytest.raises(DataError, match=r"^--engine: local reads local Parquet and CSV files \(got json files; "):
        choose_engine("local", "json", ["/d/a.jsonl"], schema, cluster=False)
    with pytest.raises(DataError, match=r"^--engine: unknown engine \(got 'spark'; allowed: auto, local, ray\)$"):
        choose_engine("spark", "csv", ["/d/a.csv"], schema, cluster=False)


@pytest.mark.parametrize("case", ["missing input", "unknown model", "unknown version", "missing column",
                                  "missing keep column", "bad output"])
def test_errors_are_one_line_with_no_output(digits, ws, frame, data_file, tmp_path, case):
    out = tmp_path / "scores.parquet"
    args = {"missing input": ["digits", "--input", str(tmp_path / "nope.parquet")],
            "unknown model": ["no-such-model", "--input", str(data_file)],
            "unknown version": ["digits", "--version", "999", "--input", str(data_file)],
            "missing column": ["digits", "--input", str(tmp_path / "short.parquet")],
            "missing keep column": ["digits", "--input", str(data_file), "--keep", "row_id"],
            "bad output": ["digits", "--input", str(data_file)]}[case]
    expected = {"missing input": (2, f"error: --input: no such file or directory (got '{tmp_path / 'nope.parquet'}')"),
                "unknown model": (1, "error: model 'no-such-model': no registered versions in "),
                "unknown version": (1, "error: model 'digits' version 999: not found in "),
                "missing column": (2, f"error: --input: missing feature column 'pixel_7_7' that model 'digits' "
                                      f"v{digits.version} needs (got columns: id, pixel_0_0, "),
                "missing keep column": (2, "error: --keep: no such input column 'row_id' (allowed: id, pixel_0_0, "),
                "bad output": (2, "error: --output: batch scoring writes Parquet (got ")}[case]
    if case == "missing column":
        frame.head(10).drop(columns="pixel_7_7").to_parquet(tmp_path / "short.parquet", index=False)
    target = str(tmp_path / "scores.csv") if case == "bad output" else str(out)
    proc = _cli(*args, "--output", target, "-w", str(ws.root), timeout=60)
    _one_line_error(proc, expected[0], expected[1])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(("scores", ".scores"))]


def test_without_version_scores_with_the_champion_not_the_newest(digits, ws, frame, tmp_path):
    """What production serves is what offline scoring uses: the `champion` alias, else the newest."""
    from rayline.batch import score
    from rayline.inference.predictor import artifact_root
    from rayline.registry import Registry
    from rayline.spec import load_spec

    registry = Registry(ws)
    name = "digits-champion-check"
    spec = load_spec(ROOT / "pipelines" / "digits-torch.yaml").model_copy(update={"name": name})
    artifact = artifact_root(registry.download(registry.resolve("digits", digits.version)))
    versions = [registry.register(registry.start_pipeline_run(spec, None), name, artifact,
                                  {}, {"framework": "torch"}).version for _ in range(2)]
    registry.set_alias(name, "champion", versions[0])
    frame.head(200).to_parquet(tmp_path / "rows.parquet", index=False)
    # The local engine: `score` resolves the version before it picks an engine (rayline/batch/engine.py),
    # and each run on the session's Ray started a pool of scoring actors (~20 s of the suite each).
    result = score(name, str(tmp_path / "rows.parquet"), str(tmp_path / "scores.parquet"), workspace=ws, engine="local")
    assert result.version == versions[0] != max(versions, key=int)
    registry.delete_alias(name, "champion")
    newest = score(name, str(tmp_path / "rows.parquet"), str(tmp_path / "newest.parquet"), workspace=ws, engine="local")
    assert newest.version == max(versions, key=int)
