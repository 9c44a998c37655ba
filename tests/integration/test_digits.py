"""The digits pipeline end to end: tune -> register -> serve, queried over real HTTP."""

import json
import re

import numpy as np
import pandas as pd
import pandas.testing as pd_testing
import pytest

from tests.cli import rayline

from .. import loopback
from .conftest import PORT, ROOT, metrics_by_in_memory, serve_digits

# Queries the session's served digits endpoint, kept up from module to module (conftest.DIGITS_ENDPOINT).
pytestmark = pytest.mark.digits_endpoint


@pytest.fixture(scope="module", autouse=True)
def served(digits, ws):
    return serve_digits(digits, ws)


@pytest.fixture(scope="module")
def test_split(digits, ws):
    """The raw rows of the pipeline's test split and its probe rows (those with the smallest split
    hashes, which the training loop predicted at every checkpoint), as the registered model saw them."""
    from rayline import load_model
    from rayline.data import prepare_data
    from rayline.spec import load_spec

    spec = load_spec(ROOT / "pipelines" / "digits-torch.yaml")
    data = prepare_data(spec)  # deterministic split: the same rows as in training
    # The data stage leaves no split in this process: the test metrics are computed where the
    # rows are (rayline/evaluation/offline.py); only the bounded probe rows are here.
    from rayline.data.pipeline import PROBE_ROWS

    import ray.data

    frames = {k: len(v) for k, v in vars(data).items() if isinstance(v, pd.DataFrame)}
    assert frames == {"probe_frame": min(PROBE_ROWS, data.rows["test"])}, (frames, data.rows)
    assert isinstance(data.test_rows, ray.data.Dataset) and data.test_rows.count() == data.rows["test"]
    model = load_model("digits", digits.version, workspace=str(ws.root))
    return data.collect_test_rows(), model, data.probe_frame, data


def test_sweep_ran_trials_and_registered_the_winner(digits, ws):
    assert [e[:2] for e in digits.events if e[1] not in ("progress", "tick")] == [
        (s, ev) for s in ("data", "train", "register", "deploy") for ev in ("start", "done")]
    # The data stage tells how far it got between its start and done: rows profiled and transformed
    # (and, in a phase long enough, rows so far: "tick").
    progress = [detail for stage, event, detail in digits.events if event == "progress"]
    assert all(stage == "data" for stage, event, _ in digits.events if event in ("progress", "tick"))
    assert any(d.startswith(f"profiled {sum(digits.rows.values()):,} rows") for d in progress), progress
    assert any(d.startswith("transformed ") and " rows/s" in d for d in progress), progress
    assert len(digits.trials) == 2 and all(t.status == "terminated" for t in digits.trials)
    # One worker a trial: each trained in its trial's own process, no Train worker group.
    (started,) = [detail for stage, event, detail in digits.events if (stage, event) == ("train", "start")]
    assert re.search(r"\b2 at once, 1 workers x [\d.]+ CPU, each in its trial's process", started), started
    scores = [t.result.metrics["accuracy"] for t in digits.trials]
    assert digits.valid_metrics["accuracy"] == max(scores)
    assert {tuple(sorted(t.overrides)) for t in digits.trials} == {("model.params.hidden_sizes", "train.optimizer.lr")}

    from rayline.registry import Registry

    reg = Registry(ws)
    mv = reg.resolve("digits")
    assert mv.version == digits.version and mv.metrics["test_accuracy"] == pytest.approx(digits.test_metrics["accuracy"])
    runs = reg.client.search_runs([reg.client.get_experiment_by_name("rayline/digits").experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{digits.run_id}'")
    assert len(runs) == 2
    history = reg.client.get_metric_history(runs[0].info.run_id, "accuracy")
    assert len(history) >= 1 and sorted(m.step for m in history) == list(range(len(history)))


def _winner(digits):
    """The sweep's winning trial's result (its best checkpoint is the registered version's)."""
    (winner,) = [t.result for t in digits.trials if t.result is not None and t.result.metrics is digits.valid_metrics]
    return winner


def test_http_predictions_equal_the_predictions_made_while_training(digits, ws, test_split):
    """Offline == online with an offline side that shares no code with serving: the outputs the
    training loop's live model (torch, in the Train worker) gave on the probe rows of the test split
    at the winning checkpoint, against what the route `rayline run` deployed answers for the same
    raw rows over HTTP: the same classes exactly, the same probabilities to float tolerance."""
    from rayline.inference.predictor import artifact_root
    from rayline.registry import Registry
    from rayline.data.pipeline import PROBE_ROWS
    from rayline.train.probe import read_probe

    from rayline.data.split import row_hashes

    frame, model, probe_frame, _ = test_split
    # The probe is the test split's rows with the smallest split hashes, in hash order (bounded:
    # PROBE_ROWS), whatever the order the test split's blocks came in.
    assert len(probe_frame) == min(PROBE_ROWS, len(frame)) > 0
    first = np.argsort(row_hashes(frame, list(frame.columns), 0), kind="stable")[:len(probe_frame)]
    pd_testing.assert_frame_equal(probe_frame.reset_index(drop=True), frame.iloc[first].reset_index(drop=True))
    recorded = read_probe(_winner(digits).checkpoint_dir)  # written by the Train worker's rank 0
    assert recorded is not None and recorded["rows"] == len(probe_frame) and recorded["precision"] == "fp32"
    registry = Registry(ws)
    artifact = artifact_root(registry.download(registry.resolve("digits", digits.version)))
    assert read_probe(artifact) == recorded  # the registered artifact carries them

    features = [f.name for f in model.preprocessing.features]
    rows = json.loads(probe_frame[features].to_json(orient="records"))  # raw rows, as a client sends them
    response = loopback.post(f"{digits.endpoint}/predict", json={"instances": rows, "probabilities": True}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "digits" and body["version"] == digits.version
    # Digits' classes are the integers 0..9 (sorted): class id i is the digit i.
    assert body["predictions"] == recorded["class_ids"]
    online = np.array([[p[str(digit)] for digit in range(10)] for p in body["probabilities"]])
    np.testing.assert_allclose(online, np.array(recorded["outputs"]), rtol=1e-4, atol=1e-6)
    # And the model being trained was a model of these rows' labels (the id -> digit reading holds).
    assert np.mean(np.array(recorded["class_ids"]) == probe_frame["target"].to_numpy()) > 0.8


def test_http_predictions_give_exactly_the_recorded_test_metrics(digits, ws, test_split):
    """HTTP predictions on the whole test split score exactly the test metrics registered with the
    version, as sklearn computes them. Those figures are computed at registration by the serving
    Predictor in Ray tasks, per block of the test split, merged in the driver (rayline/pipeline/register.py,
    rayline/evaluation/offline.py), so this pins the route to the offline Predictor on every test
    row and the merged metrics to sklearn's; the check against training itself is the probe test."""
    from sklearn import metrics as skm

    frame, model, _, _ = test_split
    features = [f.name for f in model.preprocessing.features]
    rows = frame[features].to_dict(orient="records")
    response = loopback.post(f"{digits.endpoint}/predict", json={"instances": rows, "probabilities": True}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "digits" and body["version"] == digits.version
    truth = frame["target"].to_numpy()
    accuracy = float(np.mean(np.array(body["predictions"]) == truth))
    assert accuracy == digits.test_metrics["accuracy"]
    from rayline.registry import Registry

    assert accuracy == Registry(ws).resolve("digits", digits.version).metrics["test_accuracy"]
    probs = np.array([[p[str(digit)] for digit in range(10)] for p in body["probabilities"]])
    predicted = probs.argmax(axis=1)
    labels = np.arange(10)
    expected = {
        "f1": skm.f1_score(truth, predicted, labels=labels, average="macro", zero_division=0),
        "recall": skm.recall_score(truth, predicted, labels=labels, average="macro", zero_division=0),
        "log_loss": skm.log_loss(truth, probs, labels=labels),
        "roc_auc": skm.roc_auc_score(truth, probs, multi_class="ovr", labels=labels),
    }
    for name, value in expected.items():  # float32 model outputs, float64 over JSON: to 1e-6
        assert digits.test_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_the_two_torch_workers_valid_metrics_are_the_whole_splits(digits, test_split):
    """Each DDP worker predicted its own share of the valid split; their metric partials, gathered
    over torch.distributed (rayline/train/loop.py), give the registered model's metrics on the
    whole split computed here in one process."""
    from rayline.evaluation.metrics import compute_metrics

    _, model, _, data = test_split
    valid = data.valid.to_pandas()
    features = np.stack(valid["features"].to_numpy()).astype(np.float32)
    expected = compute_metrics("classification", model._predict(features), valid["label"].to_numpy())
    assert expected.keys() <= digits.valid_metrics.keys()
    for name, value in expected.items():
        assert digits.valid_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_a_shard_held_in_memory_trains_as_well_as_a_streamed_one_and_each_run_records_which(digits, test_split):
    """train.in_memory (rayline/train/loop.py's shard_plan): digits' splits are small, so the driver
    handed them to the sweep's trials as arrays, which sliced batches in memory, recorded with the
    figures that decided it; and the same training streamed from Ray Data every epoch reaches the
    same metrics within noise (same seed, same data; each run here in Ray Train's local mode, the
    torch loop in this process, on the splits as Ray Data datasets)."""
    from rayline.spec import apply_overrides, load_spec
    from rayline.train.loop import read_state

    starts = read_state(_winner(digits).checkpoint_dir)["starts"]
    shard = starts[0]["train_shard"]
    assert {s["train_shard"]["kind"] for s in starts} == {"memory"}, starts
    # A few hundred kB: the driver handed the splits over as arrays (rayline/train/splits.py).
    assert shard["shard_rows"] == -(-digits.rows["train"] // starts[0]["workers"]) and shard["setting"] == "auto" \
        and shard["handed_off"]
    assert 0 < shard["estimated_bytes"] <= shard["budget_bytes"] / 2

    _, _, _, data = test_split
    spec = apply_overrides(load_spec(ROOT / "pipelines" / "digits-torch.yaml"), {"train.epochs": 4, "train.workers": 1})
    final = metrics_by_in_memory(spec, data)
    assert final["always"]["epoch"] == final["never"]["epoch"] == 3
    assert min(final["always"]["accuracy"], final["never"]["accuracy"]) > 0.9, final
    assert abs(final["always"]["accuracy"] - final["never"]["accuracy"]) <= 0.03, final
    assert abs(final["always"]["log_loss"] - final["never"]["log_loss"]) <= 0.1, final


def test_test_metrics_per_block_in_tasks_or_here_equal_one_process_and_bad_rows_name_the_column(test_split):
    import ray.data

    from rayline.errors import DataError
    from rayline.evaluation import offline
    from rayline.evaluation.offline import evaluate_rows

    frame, model, _, _ = test_split
    blocks = ray.data.from_pandas([frame.iloc[:60], frame.iloc[60:61], frame.iloc[61:]])  # uneven blocks
    expected = model.evaluate(frame)
    bad = frame.copy()
    bad.loc[bad.index[5], "pixel_0_1"] = np.nan  # no impute step fills it
    # Ray Data tasks per block, and this process block by block (what a small materialized split gets).
    for in_process in (False, True):
        got = evaluate_rows(model.model_dir, blocks, in_process=in_process)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=1e-9), (in_process, name)
        with pytest.raises(DataError, match="pixel_0_1"):
            evaluate_rows(model.model_dir, ray.data.from_pandas(bad), in_process=in_process)
    assert offline._small(blocks)  # materialized and small: here
    assert not offline._small(blocks.map_batches(lambda b: b))  # still to be computed: in tasks


def test_offline_and_online_predictions_are_identical(digits, test_split):
    """The two input paths in front of the registered model agree: HTTP answers (JSON rows ->
    the request encoder) equal the loaded model's outputs on the same rows put through the
    training data path (Ray Data tasks, pandas batches from Arrow), and `load_model`'s predict.
    Both sides load the model as serving does; training against serving is the probe test's."""
    import ray

    from rayline.data.pipeline import _ToTrainingBatch

    frame, model, _, _ = test_split
    features = [f.name for f in model.preprocessing.features]
    rows = frame[features].head(40).to_dict(orient="records")
    ds = ray.data.from_pandas(frame.head(40)).map_batches(_ToTrainingBatch(model.preprocessing), batch_format="pandas")
    reference = model._predict(np.stack(ds.take_batch(40, batch_format="numpy")["features"]))  # the backend's raw predict
    online = loopback.post(f"{digits.endpoint}/predict", json={"instances": rows, "probabilities": True}, timeout=60).json()
    labels = [str(c) for c in model.preprocessing.label.classes]
    assert np.array_equal(np.array([[p[label] for label in labels] for p in online["probabilities"]]), reference.astype(np.float64))
    assert online["predictions"] == [model.preprocessing.label.classes[i] for i in reference.argmax(axis=1)]
    offline = model.predict(rows, probabilities=True)
    assert online == {**offline, "model": "digits", "version": digits.version}


ROW = {f"pixel_{i}_{j}": 0.0 for i in range(8) for j in range(8)}


@pytest.mark.parametrize("body, field", [
    ({"instances": [{k: v for k, v in ROW.items() if k != "pixel_3_4"}]}, "pixel_3_4"),
    ({"instances": [{**ROW, "pixel_9_9": 1.0}]}, "pixel_9_9"),
    ({"instances": [{**ROW, "pixel_0_1": "bright"}]}, "pixel_0_1"),
    ({"instances": [{**ROW, "pixel_0_1": None}]}, "pixel_0_1"),
    ({"instances": []}, "instances"),
    ({"rows": [ROW]}, "instances"),
])
def test_bad_requests_get_422_naming_the_field(digits, body, field):
    response = loopback.post(f"{digits.endpoint}/predict", json=body, timeout=30)
    assert response.status_code == 422, response.text
    assert field in json.dumps(response.json()["detail"])


def test_malformed_json_is_422_not_500(digits):
    response = loopback.post(f"{digits.endpoint}/predict", content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422


def test_health_metadata_and_docs(digits):
    assert loopback.get(f"{digits.endpoint}/health", timeout=30).json()["status"] == "ok"
    meta = loopback.get(f"{digits.endpoint}/metadata", timeout=30).json()
    assert meta["name"] == "digits" and meta["version"] == digits.version and meta["framework"] == "torch"
    assert len(meta["features"]) == 64 and meta["features"][0] == {"name": "pixel_0_0", "type": "number", "nullable": False}
    assert meta["metrics"]["accuracy"] == pytest.approx(digits.valid_metrics["accuracy"])
    assert loopback.get(f"{digits.endpoint}/docs", timeout=30).status_code == 200
    schema = loopback.get(f"{digits.endpoint}/openapi.json", timeout=30).json()
    assert "pixel_0_0" in json.dumps(schema)


def _replica_processes(apps):
    """pid -> Serve application of each replica process of `apps` in this session's Ray (its raylet's
    children: the other lane's Rays serve apps of the same names)."""
    import psutil
    import ray

    session_dir = ray._private.worker._global_node.get_session_dir_path()
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        try:
            if (cmd.startswith("ray::ServeReplica:") and cmd.split(":")[3] in apps
                    and session_dir in " ".join(proc.parent().cmdline())):
                found[proc.pid] = cmd.split(":")[3]
        except (psutil.Error, AttributeError):
            continue
    return found


def test_replicas_load_the_version_from_the_deploys_record_without_opening_mlflow(digits, ws):
    """The deploy resolved the version and put its files in this node's cache; every replica
    holding the model (the version's, the route's) loads them from there, never importing MLflow
    and SQLAlchemy (~3 s of CPU a replica). A record for another store, or no copy on the node,
    loads through the registry, the same version."""
    import shutil

    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    from rayline.serve.kv_namespace import KV_NAMESPACE
    from rayline.serve.version_files import load_version

    replicas = _replica_processes({"digits", f"digits-v{digits.version}"})
    assert sorted(set(replicas.values())) == sorted({"digits", f"digits-v{digits.version}"}), replicas
    for pid, app in replicas.items():
        with open(f"/proc/{pid}/maps") as maps:
            assert "sqlalchemy" not in maps.read(), f"replica {pid} of {app} opened the MLflow store"

    key = f"rayline/version-files/digits/{digits.version}".encode()
    record = json.loads(_internal_kv_get(key, namespace=KV_NAMESPACE))
    assert record["tracking_uri"] == ws.tracking_uri and record["version"] == digits.version
    _, resolved = load_version("digits", digits.version, str(ws.root), None)
    assert resolved == digits.version
    try:  # another store's record: not this workspace's files; the registry's way, the same version
        _internal_kv_put(key, json.dumps({**record, "tracking_uri": "sqlite:////elsewhere/mlflow.db"}).encode(),
                         overwrite=True, namespace=KV_NAMESPACE)
        predictor, resolved = load_version("digits", digits.version, str(ws.root), None)
        assert resolved == digits.version and predictor.version == digits.version
    finally:
        _internal_kv_put(key, json.dumps(record).encode(), overwrite=True, namespace=KV_NAMESPACE)
    from rayline.registry.downloads import cache_entry

    entry = cache_entry(ws, "digits", digits.version, record["run_id"], record["source"])
    assert entry.is_dir()
    shutil.rmtree(entry)  # no copy on this node: downloaded again through the registry
    _, resolved = load_version("digits", digits.version, str(ws.root), None)
    assert resolved == digits.version and entry.is_dir()


def _cli(*args):
    """The CLI in this process (tests/cli.py); its own process is tested in test_client.py and test_lineage.py."""
    return rayline(*args, cwd=ROOT)


def test_cli_predict_and_models(digits, ws, tmp_path):
    proc = _cli("predict", "/digits", "--port", str(PORT), "--json", json.dumps({"instances": [ROW]}), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["version"] == digits.version
    csv = tmp_path / "rows.csv"
    csv.write_text(",".join(ROW) + "\n" + ",".join("0" for _ in ROW) + "\n")
    table = _cli("predict", f"http://127.0.0.1:{PORT}/digits", "--input", str(csv))
    assert table.returncode == 0 and "digits v" in table.stdout
    bad = _cli("predict", "/digits", "--port", str(PORT), "--json", json.dumps({"instances": [{"x": 1}]}))
    assert bad.returncode == 1 and "the model rejected the request" in bad.stderr and "Traceback" not in bad.stderr
    models = _cli("models", "digits", "--workspace", str(ws.root), "--output", "json")
    assert models.returncode == 0, models.stderr
    assert json.loads(models.stdout)[-1]["version"] == digits.version
