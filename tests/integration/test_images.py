"""An image folder to a served model: `pipelines/digits-images-cnn.yaml` on images made by
`pipelines/make_digit_images.py` (scikit-learn's bundled digits as 16x16 PNGs in class folders),
trained by the real runner (data stage in Ray Data, the torch `cnn` kind, registered in MLflow,
deployed behind its router), then asked over HTTP with base64 PNGs, over the Open Inference
Protocol with raw bytes by tritonclient, and offline from a Parquet file with an image column.

Predictions over HTTP must equal the offline model's on the same files (the fitted decoding,
resizing and normalisation run on the replica exactly as in training).
"""

import base64

import numpy as np
import pytest

from tests.cli import rayline

from .. import loopback
from .conftest import PORT, ROOT, ensure_served, metrics_by_in_memory, pipeline_script, run

import tritonclient.http as tritonhttp  # declared in pyproject.toml: a broken install fails, not skips

ACCURACY = 0.85  # the test split's accuracy the spec reaches in the suite's budget (its 8 epochs, 1 worker)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("digit-images")
    assert pipeline_script("make_digit_images").make_digit_images(root) == 1797
    return root


@pytest.fixture(scope="module")
def images_run(ray_session, ws, folder):
    from rayline.spec import apply_overrides, load_spec

    path = ROOT / "pipelines" / "digits-images-cnn.yaml"
    spec = apply_overrides(load_spec(path), {"data.source.path": str(folder), "train.workers": 1,
                                             **{f"serve.{key}": value for key, value in SERVE.items()}})
    return run(spec, ws, own_v2=True, spec_path=str(path))


# How the run deploys its endpoint, and what the module's tests ask of it: the same, so no redeploy.
SERVE = {"oip": True, "resources_per_replica": {"cpus": 0.1}, "replicas": {"min": 1, "max": 1}}


@pytest.fixture(scope="module")
def endpoint(images_run, ws):
    return ensure_served(images_run, ws, **SERVE)


def _files(folder, n):
    files = sorted(folder.rglob("*.png"))[::7][:n]  # every class, spread over the folder
    return files, [f.parent.name for f in files]


def _b64(path):
    return base64.b64encode(path.read_bytes()).decode()


def test_an_image_folder_trains_to_the_stated_accuracy(images_run):
    assert images_run.rows == {"train": 1266, "valid": 347, "test": 184}
    assert images_run.test_metrics["accuracy"] >= ACCURACY, images_run.test_metrics
    done = [e for e in images_run.events if e[:2] == ("data", "done")]
    assert done and "256 features" in done[0][2]  # 16 x 16 x 1 pixels
    # The train split reaches training as read: its PNGs are decoded by the training worker, here once
    # (a few hundred kB decoded: train.in_memory auto holds them), not again at every epoch.
    assert any("decoded in training" in e[2] for e in images_run.events if e[:2] == ("data", "progress"))
    from rayline.train.loop import read_state

    starts = read_state(images_run.trials[0].result.checkpoint_dir)["starts"]
    assert [(s["train_shard"]["kind"], s["train_shard"]["decoded"], s["train_shard"]["handed_off"]) for s in starts] \
        == [("memory", True, False)], starts
    assert starts[0]["train_shard"]["estimated_bytes"] == 1266 * (256 * 4 + 8)


def test_images_decoded_once_train_as_well_as_images_decoded_every_epoch(ray_session, folder):
    """The same seed and data, the CNN's train split held decoded (`train.in_memory: always`) and decoded
    per batch at every epoch (`never`): both learn, and holding the images decoded costs no accuracy.
    The held shard trains each epoch in a fresh permutation of all its rows; the streamed one in the
    read's order (a fixed shuffle of the folder's files) through a 4-batch shuffle buffer, which Ray
    Data does not seed: the streamed run's accuracy after 3 epochs varies from run to run. Measured
    on the 2-core box, 2026-12-06: held 0.70 in each run, streamed 0.79, 0.53 and 0.86 (chance: 0.1). Before
    the data stage read small folders in its own process, Ray Data's read came nearly one class a
    block and the streamed run reached 0.48 (held 0.78). Each run in Ray Train's local mode (the
    torch loop in this process) on the data stage's splits as Ray Data datasets."""
    from rayline.data import prepare_data
    from rayline.spec import apply_overrides, load_spec

    spec = apply_overrides(load_spec(ROOT / "pipelines" / "digits-images-cnn.yaml"),
                           {"data.source.path": str(folder), "train.workers": 1, "train.epochs": 3})
    data = prepare_data(spec)
    assert data.train_streamed  # the PNGs' bytes, not decoded pixels
    final = metrics_by_in_memory(spec, data)
    assert final["always"]["epoch"] == final["never"]["epoch"] == 2
    assert final["always"]["accuracy"] > 0.4 and final["never"]["accuracy"] > 0.4, final  # both learned (chance: 0.1)
    # Held decoded trains as well as streamed. The streamed run's result is one draw of a spread (the read
    # order of the folder is not seeded: 0.53, 0.79 and 0.86 after 3 epochs on the 2-core box, 2026-12-06;
    # against 0.86 the held run's 0.70 once failed "within 0.15 of the streamed run"); the held run's is
    # the same every time (0.70 in each run measured). So the held run is held to the middle of the
    # streamed runs' spread, not to one draw of it.
    assert final["always"]["accuracy"] >= 0.6 and final["always"]["log_loss"] <= 1.3, final


def test_base64_pngs_over_http_answer_as_the_offline_model(images_run, endpoint, ws, folder):
    import pandas as pd

    from rayline import load_model

    files, labels = _files(folder, 60)
    response = loopback.post(f"{endpoint}/predict", json={"instances": [{"image": _b64(f)} for f in files],
                                                       "probabilities": True}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    model = load_model(images_run.name, images_run.version, workspace=str(ws.root))
    offline = model.predict(pd.DataFrame({"image": [f.read_bytes() for f in files]}), probabilities=True)
    assert body["predictions"] == offline["predictions"]
    classes = list(body["probabilities"][0])
    np.testing.assert_allclose([[p[c] for c in classes] for p in body["probabilities"]],
                               [[p[c] for c in classes] for p in offline["probabilities"]], rtol=1e-5, atol=1e-7)
    assert np.mean(np.asarray(body["predictions"]) == np.asarray(labels)) >= ACCURACY - 0.1
    meta = loopback.get(f"{endpoint}/metadata", timeout=30).json()
    assert meta["features"][0]["name"] == "image" and meta["features"][0]["type"] == "image"


def test_concurrent_image_requests_are_batched_and_each_gets_its_own_rows(images_run, endpoint, ws, folder):
    """Serve's request batching is on (the default): concurrent requests of different sizes are
    merged into model calls, and each still gets exactly its own images' answers; a request with
    a bad image fails alone, naming its own row."""
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    from rayline import load_model

    files, _ = _files(folder, 40)
    sizes = [1, 3, 5, 2, 4, 1, 6, 2, 3, 5, 1, 4]
    starts = np.cumsum([0] + sizes[:-1]) % (len(files) - 6)
    requests = [[{"image": _b64(f)} for f in files[s:s + n]] for s, n in zip(starts, sizes)]
    bad = {2, 7}
    for i in bad:
        requests[i][-1] = {"image": base64.b64encode(b"no image here").decode()}
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda inst: loopback.post(f"{endpoint}/predict", json={"instances": inst}, timeout=60),
                                requests))
    model = load_model(images_run.name, images_run.version, workspace=str(ws.root))
    for i, (instances, response) in enumerate(zip(requests, answers)):
        if i in bad:
            assert response.status_code == 422, response.text
            assert f"instances[{len(instances) - 1}].image: not a usable image" in response.text
            continue
        assert response.status_code == 200, response.text
        offline = model.predict(pd.DataFrame({"image": [base64.b64decode(r["image"]) for r in instances]}))
        assert response.json()["predictions"] == offline["predictions"]


@pytest.mark.parametrize("value, message", [
    ("not base64 at all!", "instances[1].image: not a usable image: not base64"),
    (base64.b64encode(b"plain text, no image").decode(), "instances[1].image: not a usable image: not an image Pillow can decode"),
    (None, '"loc":["body","instances",1,"image"],"msg":"Input should be a valid string"'),
    (12, '"loc":["body","instances",1,"image"],"msg":"Input should be a valid string"'),
    # a file path is read only where rows are read (training, batch scoring), never from a request
    ("0/00000-0.png", "instances[1].image: not a usable image: not base64"),
])
def test_a_bad_image_is_a_422_naming_the_row(endpoint, folder, value, message):
    good = _b64(_files(folder, 1)[0][0])
    response = loopback.post(f"{endpoint}/predict", json={"instances": [{"image": good}, {"image": value}]}, timeout=30)
    assert response.status_code == 422, response.text
    assert message in response.text


def test_tritonclient_sends_raw_png_bytes(images_run, endpoint, folder):
    files, _ = _files(folder, 12)
    expected = loopback.post(f"{endpoint}/predict", json={"instances": [{"image": _b64(f)} for f in files]},
                          timeout=60).json()["predictions"]
    client = tritonhttp.InferenceServerClient(url=f"127.0.0.1:{PORT}", connection_timeout=60, network_timeout=60)
    try:
        meta = client.get_model_metadata(images_run.name)
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
        tensor = tritonhttp.InferInput("image", [len(files)], "BYTES")
        tensor.set_data_from_numpy(np.array([f.read_bytes() for f in files], dtype=np.object_))  # binary by default
        result = client.infer(images_run.name, [tensor])
        assert [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy("predictions")] == expected
        json_tensor = tritonhttp.InferInput("image", [len(files)], "BYTES")
        json_tensor.set_data_from_numpy(np.array([_b64(f) for f in files], dtype=np.object_), binary_data=False)
        result = client.infer(images_run.name, [json_tensor])
        assert [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy("predictions")] == expected
    finally:
        client.close()


def test_batch_scoring_a_table_with_an_image_column(images_run, ws, folder, tmp_path):
    import pandas as pd

    files, labels = _files(folder, 40)
    table = tmp_path / "images.parquet"
    pd.DataFrame({"id": range(len(files)), "image": [f.read_bytes() for f in files]}).to_parquet(table)
    out = tmp_path / "scored.parquet"
    done = rayline("predict", images_run.name, "--input", table, "--output", out, "--keep", "id", "--workspace", ws.root,
                   "--engine", "local", cwd=ROOT)  # in this process (tests/cli.py)
    assert done.returncode == 0, done.stdout + done.stderr
    scored = pd.read_parquet(out)
    from rayline import load_model

    offline = load_model(images_run.name, images_run.version, workspace=str(ws.root)).predict(
        pd.DataFrame({"image": [f.read_bytes() for f in files]}))
    assert scored["id"].tolist() == list(range(len(files)))
    assert scored["prediction"].astype(str).tolist() == [str(v) for v in offline["predictions"]]


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_batch_scoring_a_csv_of_image_file_paths(images_run, ws, folder, tmp_path, engine):
    """A CSV naming its images by path relative to itself: the files are scored, the output keeps
    the paths as given, and a missing file is one line naming it."""
    import pandas as pd

    from rayline import load_model
    from rayline.batch import score

    files, _ = _files(folder, 25)
    table = folder / f"paths-{engine}.csv"  # beside the class folders: paths relative to it
    pd.DataFrame({"image": [str(f.relative_to(folder)) for f in files]}).to_csv(table, index=False)
    try:
        result = score(images_run.name, str(table), str(tmp_path / "scored.parquet"), workspace=ws, engine=engine)
        assert result.rows == 25 and result.engine == engine
        scored = pd.read_parquet(tmp_path / "scored.parquet")
        assert scored["image"].tolist() == [str(f.relative_to(folder)) for f in files]
        offline = load_model(images_run.name, images_run.version, workspace=str(ws.root)).predict(
            pd.DataFrame({"image": [f.read_bytes() for f in files]}))
        assert scored["prediction"].astype(str).tolist() == [str(v) for v in offline["predictions"]]
        pd.DataFrame({"image": [str(files[0].relative_to(folder)), "3/none.png"]}).to_csv(table, index=False)
        from rayline.errors import DataError

        with pytest.raises(DataError, match=r"^--input: column 'image': no such image file '3/none.png' \(looked for "
                                             + str(folder / "3" / "none.png")):
            score(images_run.name, str(table), str(tmp_path / "bad.parquet"), workspace=ws, engine=engine)
        assert not (tmp_path / "bad.parquet").exists()
    finally:
        table.unlink()


def test_a_table_of_image_paths_with_stated_types_needs_no_steps(ray_session, folder, tmp_path):
    """`data.feature_types: {image: image, shop: categorical}` and no preprocessing: the data stage
    reads each path's file, adds an image step at the files' size (16 x 16, grayscale) and a
    one-hot step; the test split's raw rows hold the files' bytes."""
    import pandas as pd
    import pyarrow as pa

    from rayline.data import prepare_data
    from rayline.spec import load_spec

    files, labels = _files(folder, 200)
    table = folder / "stated.csv"
    pd.DataFrame({"image": [str(f.relative_to(folder)) for f in files], "shop": ["a", "b"] * 100,
                  "digit": labels}).to_csv(table, index=False)
    (tmp_path / "spec.yaml").write_text(
        f"name: stated\ndata:\n  source: {{format: csv, path: {table}}}\n  label: digit\n"
        "  feature_types: {image: image, shop: categorical}\n"
        "model: {framework: torch, kind: cnn}\n")
    try:
        prepared = prepare_data(load_spec(tmp_path / "spec.yaml"))
    finally:
        table.unlink()
    steps = {step.kind: step for step in prepared.preprocessing.steps}
    assert steps["image"].size == [16, 16] and steps["image"].channels == 1
    assert steps["one_hot"].categories == {"shop": ["a", "b"]}
    assert len(prepared.preprocessing.output_columns) == 256 + 2
    # training gets the train split as read (images decoded per batch there), valid model-ready
    assert prepared.train_streamed and prepared.train.schema().names == ["image", "shop", "digit"]
    assert prepared.train.schema().types[0] == pa.binary() and prepared.train.count() == prepared.rows["train"]
    assert prepared.valid.schema().names == ["features", "label"]
    test_rows = prepared.collect_test_rows()
    assert len(test_rows) == prepared.rows["test"] > 0
    assert set(test_rows["image"]) <= {f.read_bytes() for f in files}


def test_batch_scoring_an_image_folder_keeps_each_files_path_and_class(images_run, ws, folder, tmp_path):
    """`rayline predict NAME --input FOLDER`: every image, in path order, with its path and class
    folder beside the prediction (Ray Data on the session's Ray: an image folder is never local);
    images directly in the folder are scored too, with a null label."""
    import shutil

    import pandas as pd

    from rayline import load_model
    from rayline.batch import score

    files, _ = _files(folder, 30)
    mixed = tmp_path / "to-score"
    for f in files[:20]:
        (mixed / f.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, mixed / f.parent.name / f.name)
    for f in files[20:]:
        shutil.copy(f, mixed / f"loose-{f.parent.name}-{f.name}")
    result = score(images_run.name, str(mixed), str(tmp_path / "scored.parquet"), workspace=ws, engine="ray")
    assert result.rows == 30 and result.engine == "ray"
    scored = pd.read_parquet(tmp_path / "scored.parquet")
    expected_paths = sorted(str(p.relative_to(mixed)) for p in mixed.rglob("*.png"))
    assert scored["path"].tolist() == expected_paths
    assert scored["label"].isna().sum() == 10 and set(scored["label"].dropna()) <= {str(i) for i in range(10)}
    offline = load_model(images_run.name, images_run.version, workspace=str(ws.root)).predict(
        pd.DataFrame({"image": [(mixed / p).read_bytes() for p in expected_paths]}))
    assert scored["prediction"].astype(str).tolist() == [str(v) for v in offline["predictions"]]


def test_plain_mlflow_pyfunc_takes_the_image_bytes_or_base64(images_run, ws, folder, monkeypatch):
    """The registered version as a user of MLflow alone loads it: image bytes or base64 text in a
    DataFrame give /predict's answers."""
    import mlflow
    import pandas as pd

    monkeypatch.setenv("MLFLOW_TRACKING_URI", ws.tracking_uri)
    files, _ = _files(folder, 8)
    expected = loopback.post(f"{images_run.endpoint}/predict", json={"instances": [{"image": _b64(f)} for f in files]},
                          timeout=60).json()["predictions"]
    model = mlflow.pyfunc.load_model(f"models:/{images_run.name}/{images_run.version}")
    for column in ([f.read_bytes() for f in files], [_b64(f) for f in files]):
        assert [str(v) for v in model.predict(pd.DataFrame({"image": column}))["prediction"]] == expected


def test_the_tensorflow_cnn_trains_on_the_streamed_split_and_registers(ray_session, ws, folder):
    """The same pipeline with `model.framework: tensorflow`: the Keras cnn trains on the train split
    as read (decoded once in the worker, and held), and registration's probe check passes (the loaded
    artifact reproduces the live model on the probe rows), so the served model is the trained one."""
    from rayline import load_model
    from rayline.spec import apply_overrides, load_spec

    path = ROOT / "pipelines" / "digits-images-cnn.yaml"
    spec = apply_overrides(load_spec(path), {"data.source.path": str(folder), "train.workers": 1, "train.epochs": 3,
                                             "model.framework": "tensorflow", "name": "digits-images-tf"})
    summary = run(spec, ws, spec_path=str(path), deploy=False)
    assert any("decoded in training" in e[2] for e in summary.events if e[:2] == ("data", "progress"))
    from rayline.train.loop import read_state

    (start,) = read_state(summary.trials[0].result.checkpoint_dir)["starts"]
    assert (start["train_shard"]["kind"], start["train_shard"]["decoded"]) == ("memory", True), start  # decoded once
    # It learned (ten classes: chance is 0.1). 3 epochs on 1 worker gave 0.56 to 0.89 across machines
    # (tensorflow's CPU kernels are not deterministic across them); accuracy itself is the torch test's.
    assert summary.test_metrics["accuracy"] >= 0.35, summary.test_metrics
    files, labels = _files(folder, 50)
    import pandas as pd

    model = load_model(summary.name, summary.version, workspace=str(ws.root))
    predictions = model.predict(pd.DataFrame({"image": [f.read_bytes() for f in files]}))["predictions"]
    assert np.mean(np.asarray(predictions).astype(str) == np.asarray(labels)) >= 0.3
