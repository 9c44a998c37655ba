"""Model versions in production, on the session's real Ray Serve and MLflow:

- every deployed version answers at ROUTE/v/N (Serve routes the longest matching prefix), the
  route follows the split and says which version answered (x-rayline-version);
- under a steady load, deploy canary -> promote -> rollback with zero failed requests, each stage
  answered by the expected versions; MLflow aliases follow;
- the metric gate: a slow canary (p99) and a failing one (504s) lose their traffic on their own,
  and `rayline serve status` names the limit with the numbers;
- `rayline serve deploy|promote|rollback|remove` errors are one line, exit non-zero;
- `version: latest` is resolved once when the app is built: a restarted replica keeps serving
  the version the app was built with after a newer one is registered;
- `rayline models show` prints the served version's lineage (data, run, trial, checkpoint, metrics,
  deployments), and each deploy, promote and rollback is on the version's deployment record.

The rollout's canary is a genuinely different model with no second training: the digits
fixture's sweep trained two trials (other hidden sizes and learning rate), and its losing trial's
best checkpoint is registered as a new version. Which version answered a routed request is read
from the answer itself: its probabilities equal those the model being trained recorded for the
same raw rows (the probe rows of the test split, rayline/train/probe.py) for exactly one of the
two, and the body names the version that computed them; never from the router's own header.
The gate's extra versions are registered from the digits fixture's own artifact (same model, new
version numbers): there the header is what is under test. Slow and failing versions are started
with build_app's test-only `debug_infer_delay_s` (and a tiny `request_timeout_s` for 504s) before
the rollout picks them up, as a team would find a regressed version: its app answers, badly.
"""

import json
import os
import threading
import time
from collections import Counter

import httpx
import pytest

from rayline.registry import DEPLOYMENTS_TAG

from tests.cli import rayline

from .. import loopback
from .conftest import PORT, ROOT, wait_for_200

BASE = f"http://127.0.0.1:{PORT}"
ROUTE = "/digits"
URL = BASE + ROUTE
CT = {"content-type": "application/json"}
# Each load thread's pause between requests: steady load (tens of requests a second per thread), not
# every cycle of the 2-core box, which the rollouts under test need for their replicas' start.
PACE_S = 0.02


def _register_losing_trial(digits, ws):
    """A new version of digits holding the sweep's losing trial's best checkpoint (its own weights and
    architecture) with the registered version's preprocessing, logged under a run of its own."""
    import shutil
    import tempfile

    from rayline.inference.predictor import WEIGHTS_DIR, artifact_root
    from rayline.registry import Registry
    from rayline.train.loop import MODEL_DIR
    from rayline.train.probe import PROBE_FILE

    registry = Registry(ws)
    client = registry.client
    mv = client.get_model_version("digits", digits.version)
    winner = registry.download(registry.resolve("digits", digits.version))
    loser = _losing_trial(digits)
    with tempfile.TemporaryDirectory(dir=ws.root) as tmp:
        artifact = os.path.join(tmp, "model")
        shutil.copytree(artifact_root(winner), artifact)
        shutil.rmtree(os.path.join(artifact, WEIGHTS_DIR))
        shutil.copytree(os.path.join(loser.checkpoint_dir, MODEL_DIR), os.path.join(artifact, WEIGHTS_DIR))
        shutil.copyfile(os.path.join(loser.checkpoint_dir, PROBE_FILE), os.path.join(artifact, PROBE_FILE))
        run = client.create_run(client.get_run(mv.run_id).info.experiment_id, run_name="losing-trial")
        client.log_artifacts(run.info.run_id, artifact, artifact_path="model")
        client.set_terminated(run.info.run_id)
    # Logged in the layout before pyfunc; a new version has no deployments yet.
    tags = {k: v for k, v in mv.tags.items() if k not in ("rayline.pyfunc", DEPLOYMENTS_TAG)}
    return str(client.create_model_version("digits", f"{run.info.artifact_uri}/model", run.info.run_id, tags=tags).version)


def _trial_results(digits):
    return [t.result for t in digits.trials if t.result is not None]


def _winning_trial(digits):
    (winner,) = [r for r in _trial_results(digits) if r.metrics is digits.valid_metrics]
    return winner


def _losing_trial(digits):
    (loser,) = [r for r in _trial_results(digits) if r.metrics is not digits.valid_metrics]
    return loser


def _answered_by(body, expected):
    """The version whose training-time outputs a predict answer (with probabilities) reproduces;
    "none" or "several" otherwise."""
    import numpy as np

    got = np.array([[p[str(digit)] for digit in range(10)] for p in body["probabilities"]])
    hits = [v for v, outputs in expected.items()
            if got.shape == outputs.shape and np.allclose(got, outputs, rtol=1e-4, atol=1e-6)
            and body["predictions"] == outputs.argmax(axis=1).tolist()]
    return hits[0] if len(hits) == 1 else ("none" if not hits else "several")


def _register_copy(ws, name, version):
    """A new version of `name` holding version `version`'s artifact."""
    from rayline.registry import Registry

    client = Registry(ws).client
    mv = client.get_model_version(name, version)
    tags = {k: v for k, v in mv.tags.items() if k != DEPLOYMENTS_TAG}  # a new version has no deployments yet
    return str(client.create_model_version(name, mv.source, mv.run_id, tags=tags).version)


@pytest.fixture(scope="module")
def setup(digits, ws):
    from rayline.serve import versions
    from rayline.spec import ServeSpec

    # oip=False: no V2 application of its own (test_oip covers it); the module's version apps need the CPUs.
    rollout = versions.deploy("digits", digits.version, ws=ws, serve_spec=ServeSpec(route=ROUTE, oip=False), port=PORT)
    assert rollout.champion == digits.version and rollout.url == URL
    features = [f["name"] for f in loopback.get(f"{URL}/v/{digits.version}/metadata", timeout=30).json()["features"]]
    from sklearn.datasets import load_digits

    rows = [dict(zip(features, map(float, r))) for r in load_digits().data[:2]]
    return {"v1": digits.version, "body": json.dumps({"instances": rows}).encode(), "features": features}


def _post(client, url, body):
    return client.post(url, content=body, headers=CT)


def _wait_health(url, timeout_s=90):
    wait_for_200(f"{url}/health", timeout_s=timeout_s, what=url)


def _start_version_app(ws, version, **settings):
    """Version `version`'s application as the rollout would start it, but with test-only settings."""
    from ray import serve

    from rayline.serve.app import build_app

    args = {"name": "digits", "version": version, "workspace": str(ws.root), "framework": "torch", **settings}
    serve.run(build_app(args), name=f"digits-v{version}", route_prefix=f"{ROUTE}/v/{version}", blocking=False)
    _wait_health(f"{URL}/v/{version}")


def _cli(*args):
    """`rayline serve ARGS --address SESSION` in this process (tests/cli.py): it joins the session's Ray.
    A separate process joining a running cluster is test_serve_access.py's `serve status`."""
    import ray

    env = {k: v for k, v in os.environ.items() if k != "RAYLINE_DEBUG"}
    return rayline("serve", *args, "--address", ray.get_runtime_context().gcs_address, cwd=ROOT, env={**env, "COLUMNS": "250"})


def _one_line_error(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]  # before it only Ray's own "Connecting to existing Ray cluster" INFO lines
    assert last.startswith("error: ") and all("error" not in l for l in err.splitlines()[:-1]), err
    for needle in needles:
        assert needle in last, err


# ---------------------------------------------------------------- addressing


def test_each_version_has_its_own_route_and_the_route_says_who_answered(setup):
    v1, body = setup["v1"], setup["body"]
    with httpx.Client(timeout=30) as c:
        direct = _post(c, f"{URL}/v/{v1}/predict", body)
        routed = _post(c, f"{URL}/predict", body)
        missing = _post(c, f"{URL}/v/999/predict", body)
        meta = c.get(f"{URL}/metadata")
    assert direct.status_code == 200 and direct.json()["version"] == v1
    assert "x-rayline-version" not in direct.headers  # no hop: Serve sent it straight to digits-v{v1}
    assert routed.status_code == 200 and routed.headers["x-rayline-version"] == v1 and routed.json()["version"] == v1
    assert routed.json()["predictions"] == direct.json()["predictions"]
    assert missing.status_code == 404 and missing.json()["detail"] == (
        f"version 999 of model digits is not deployed (got 999; allowed: {v1})")
    assert meta.status_code == 200 and meta.json()["version"] == v1 and meta.headers["x-rayline-version"] == v1


# ---------------------------------------------------------------- lineage


def _models_cli(*args_list):
    """`rayline models ...` command lines, one after another in this process (tests/cli.py; the
    command's own process is test_lineage.py's): what each printed and its exit code."""
    env = {k: v for k, v in os.environ.items() if k != "RAYLINE_DEBUG"}
    return [rayline("models", *args, cwd=ROOT, env=env) for args in args_list]


def test_models_show_prints_the_served_versions_lineage(setup, digits, ws):
    """The chain of the version `rayline run` registered and `setup` serves, against what the run
    itself knows: its MLflow run, its run record, the winning trial and its checkpoint on disk."""
    from rayline.registry import Registry
    from rayline.spec import load_spec

    v1, w = setup["v1"], ["-w", str(ws.root)]
    show, no_model, no_version = _models_cli(["show", "digits", "--version", v1, *w], ["show", "nosuchmodel", *w],
                                             ["show", "digits", "--version", "99999", *w])
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    mv = Registry(ws).client.get_model_version("digits", v1)
    assert mv.run_id == digits.run_id
    (record,) = [r for r in (json.loads(p.read_text()) for p in (ws.root / "runs").glob("*/rayline-run.json"))
                 if r.get("run_id") == digits.run_id]
    winner = _winning_trial(digits)
    (trial,) = [t.trial_id for t in digits.trials if t.result is winner]
    assert os.path.isdir(winner.checkpoint_dir)
    source = load_spec(ROOT / "pipelines" / "digits-torch.yaml").data.source.name
    # The session's runs do not read the data cache, but they store the stage there (--no-cache).
    (key,) = record["data_cache_keys"]
    entry = ws.root / "data-cache" / key
    assert entry.is_dir()  # no test of the session prunes the cache
    metric = digits.metric
    assert lines[0].startswith(f"model:       digits version {v1} (registered ") and "torch, classification" in lines[0]
    assert "; aliases: champion" in lines[0]  # setup made it the champion
    assert lines[1:8] == [
        f"data:        source {source}",
        f"             fingerprint {record['fingerprint']}",
        f"             cache key {key} (entry present: {entry})",
        f"run:         MLflow run {digits.run_id} (FINISHED)",
        f"             experiment {record['experiment']} (run record: registered)",
        f"trial:       {trial}",
        f"checkpoint:  {winner.checkpoint_dir} (exists)",
    ]
    # The winner's validation metrics and the test metrics, as the run computed them.
    assert lines[8].startswith("metrics:     ") and lines[9].startswith(" " * 13)
    valid = dict(item.split(" ") for item in lines[8][13:].split(", "))
    assert f"valid_{metric}" in valid and all(k.startswith("valid_") for k in valid), valid
    assert valid == {k: f"{digits.valid_metrics[k[6:]]:.4f}" for k in valid}
    assert lines[9][13:] == ", ".join(f"test_{k} {v:.4f}" for k, v in sorted(digits.test_metrics.items()))
    deployments = [line[13:] for line in lines[10:]]
    assert lines[10].startswith("deployments: ") and all(line.startswith(" " * 13) for line in lines[11:])
    # setup's deploy: the champion with all of ROUTE's traffic, version 1's own app.
    assert any(d.endswith(f" deploy: champion 100% at {ROUTE} (app digits-v{v1}; {URL})") for d in deployments), lines

    for proc, message in ((no_model, "error: model 'nosuchmodel': not registered in "),
                          (no_version, "error: model 'digits' version 99999: not registered (got '99999'; allowed: ")):
        assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(message), line
    assert "allowed: " in no_model.stderr and "digits" in no_model.stderr.split("allowed: ")[1]
    assert f"{v1}, " in no_version.stderr.split("allowed: ")[1] or f"{v1} or latest" in no_version.stderr


# ---------------------------------------------------------------- zero failed requests


def test_canary_promote_rollback_under_load_fail_no_request(setup, digits, ws):
    """4 threads post continuously to ROUTE/predict while a canary is deployed, promoted and rolled
    back; every response must be a 200 from the versions the stage allows. Version 2 is another
    trained model (the sweep's losing trial); each answer is attributed by its predictions."""
    import numpy as np

    from rayline.data import prepare_data
    from rayline.registry import Registry, deployments_of
    from rayline.serve import versions
    from rayline.spec import load_spec
    from rayline.train.probe import read_probe

    v1 = setup["v1"]
    v2 = _register_losing_trial(digits, ws)
    # What each model being trained answered for the probe rows (its checkpoint's record)...
    expected_all = {v1: read_probe(_winning_trial(digits).checkpoint_dir),
                    v2: read_probe(_losing_trial(digits).checkpoint_dir)}
    expected_all = {v: np.array(r["outputs"]) for v, r in expected_all.items()}
    # ... for these raw rows: the first of the test split. Rows where the two models' classes
    # differ come first, so that the predictions alone tell them apart as well.
    probe = prepare_data(load_spec(ROOT / "pipelines" / "digits-torch.yaml")).probe_frame
    differ = np.flatnonzero(expected_all[v1].argmax(axis=1) != expected_all[v2].argmax(axis=1))
    picked = (list(differ[:2]) + [i for i in range(len(probe)) if i not in differ[:2]])[:4]
    assert len(differ) >= 1, "the two trials' models predict the same classes on every probe row"
    expected = {v: outputs[picked] for v, outputs in expected_all.items()}
    assert not np.allclose(expected[v1], expected[v2], rtol=1e-3)
    rows = json.loads(probe.iloc[picked][setup["features"]].to_json(orient="records"))
    body = json.dumps({"instances": rows, "probabilities": True}).encode()
    answer = _post(loopback, f"{URL}/v/{v1}/predict", body).json()  # version 1's own route answers as it trained
    assert answer["version"] == v1 and _answered_by(answer, expected) == v1, answer

    phase, stop, seen = ["champion"], threading.Event(), []

    def load():
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                stage = phase[0]
                try:
                    r = _post(c, f"{URL}/predict", body)
                    if r.status_code != 200:
                        seen.append((stage, r.status_code, None))
                        continue
                    answer = r.json()
                    by_outputs = _answered_by(answer, expected)
                    # The body's version is the replica's own; the two must agree.
                    seen.append((stage, 200, by_outputs if answer["version"] == by_outputs else
                                 f"body says {answer['version']}, outputs say {by_outputs}"))
                except httpx.HTTPError as exc:
                    seen.append((stage, type(exc).__name__, None))
                time.sleep(PACE_S)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        registry = Registry(ws)
        steps = [("canary", lambda: versions.deploy("digits", v2, ws=ws, canary_percent=30, port=PORT)),
                 ("promoted", lambda: versions.promote("digits", ws=ws)),
                 ("rolled back", lambda: versions.rollback("digits", ws=ws))]
        aliases = {}
        for stage, action in steps:
            phase[0] = f"during {stage}"
            action()
            phase[0] = stage
            aliases[stage] = (registry.alias_version("digits", "champion"), registry.alias_version("digits", "canary"))
            time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    by_stage = {}
    for stage, status, version in seen:
        by_stage.setdefault(stage, Counter())[(status, version)] += 1
    failed = [s for s in seen if s[1] != 200]
    assert not failed, (len(failed), len(seen), by_stage)
    print(f"\nzero-failure rollout: {len(seen)} requests, all 200: {dict(by_stage)}")
    versions_in = {stage: {v for (_, v) in c} for stage, c in by_stage.items()}
    assert versions_in["champion"] == {v1}, by_stage
    assert versions_in["canary"] == {v1, v2}, by_stage
    assert versions_in["promoted"] == {v2}, by_stage
    assert versions_in["rolled back"] == {v1}, by_stage
    for stage in ("during canary", "during promoted", "during rolled back"):
        assert versions_in.get(stage, {v1}) <= {v1, v2}, by_stage  # mid-change: either, never an unknown answer
    assert aliases == {"canary": (v1, v2), "promoted": (v2, None), "rolled back": (v1, None)}
    assert sum(by_stage["canary"].values()) >= 20
    # Each step is on the deployment record of the version it gave traffic to (`rayline models show`).
    record = {v: [(d["action"], d["role"], d["percent"], d["route"], d["app"])
                  for d in deployments_of(registry.client.get_model_version("digits", v).tags)] for v in (v1, v2)}
    assert record[v2] == [("deploy", "canary", 30, ROUTE, f"digits-v{v2}"),
                          ("promote", "champion", 100, ROUTE, f"digits-v{v2}")]
    assert record[v1][-1] == ("rollback", "champion", 100, ROUTE, f"digits-v{v1}")

    answer = _post(loopback, f"{URL}/v/{v2}/predict", body).json()  # and version 2's, as it trained
    assert answer["version"] == v2 and _answered_by(answer, expected) == v2, answer

    # v2 holds no traffic now: it can be retired; the champion cannot.
    _one_line_error(_cli("remove", "digits", "--version", v1, "-w", str(ws.root)), f"version {v1} is the champion")
    proc = _cli("remove", "digits", "--version", v2, "-w", str(ws.root))
    assert proc.returncode == 0 and f"version {v2} removed" in proc.stdout, proc.stderr
    assert _post(loopback, f"{URL}/v/{v2}/predict", body).status_code == 404


# ---------------------------------------------------------------- the metric gate


def _drive(body, n, threads=4):
    """n requests to ROUTE/predict from `threads` threads; [(status, version)] in completion order."""
    out, lock = [], threading.Lock()

    def worker(k):
        with httpx.Client(timeout=30) as c:
            for _ in range(k):
                r = _post(c, f"{URL}/predict", body)
                with lock:
                    out.append((r.status_code, r.headers.get("x-rayline-version")))

    pool = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(120)
    return out


def test_slow_canary_is_rolled_back_by_p99_and_status_says_why(setup, ws):
    from rayline.registry import Registry
    from rayline.serve import versions

    v1, body = setup["v1"], setup["body"]
    v3 = _register_copy(ws, "digits", v1)
    _start_version_app(ws, v3, debug_infer_delay_s=0.25)  # the regressed version: 250 ms a request
    versions.deploy("digits", v3, ws=ws, canary_percent=50,
                    gate={"max_error_rate": None, "max_p99_ms": 150, "min_requests": 8}, port=PORT)
    out = _drive(body, 80)
    assert all(status == 200 for status, _ in out)
    canary_seen = [i for i, (_, v) in enumerate(out) if v == v3]
    assert 8 <= len(canary_seen) < 40, Counter(v for _, v in out)  # tripped after min_requests, not at the end
    routing = loopback.get(f"{URL}/-/routing", timeout=10).json()
    assert routing["tripped"]["limit"] == "max_p99_ms" and routing["effective_weights"] == {v1: 100}
    # The champion has it all again. (Asked after the trip is read back: how many of the 80
    # came after the canary's last answer depends on how fast this machine is at the moment.)
    after = _drive(body, 24)
    assert [status for status, _ in after] == [200] * 24 and {v for _, v in after} == {v1}, Counter(after)

    proc = _cli("status", "digits", "-w", str(ws.root))
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("digits:"))
    assert f"version {v1} champion 100%" in line
    assert f"canary version {v3} rolled back automatically at" in line
    assert "max_p99_ms (p99 " in line and "> max_p99_ms 150 over " in line
    assert Registry(ws).alias_version("digits", "canary") is None  # status (with the workspace) recorded it
    _one_line_error(_cli("promote", "digits", "-w", str(ws.root)), "no canary to promote",
                    f"version {v3} was rolled back by the gate")
    versions.remove("digits", v3, ws=ws)


def test_failing_canary_is_rolled_back_by_error_rate(setup, ws):
    from rayline.serve import versions
    from rayline.serve.status import gather_status

    v1, body = setup["v1"], setup["body"]
    v4 = _register_copy(ws, "digits", v1)
    # Every predict of this version is a 504 (a 5xx: the version's fault, not the client's).
    _start_version_app(ws, v4, debug_infer_delay_s=0.05, request_timeout_s=0.01)
    versions.deploy("digits", v4, ws=ws, canary_percent=50,
                    gate={"max_error_rate": 0.2, "max_p99_ms": None, "min_requests": 10}, port=PORT)
    out = _drive(body, 80)
    codes = Counter(out)
    assert set(codes) <= {(200, v1), (504, v4)}, codes
    assert 10 <= codes[(504, v4)] < 40, codes
    assert out[-20:] == [(200, v1)] * 20
    (app,) = gather_status("digits", with_metrics=False, ws=ws).applications
    gone = app.rollout["rolled_back"]
    assert gone["limit"] == "max_error_rate" and gone["version"] == v4
    assert gone["detail"].startswith("error rate 1 > max_error_rate 0.2 over ")
    assert app.rollout["weights"] == {v1: 100} and app.rollout["canary"] is None
    versions.remove("digits", v4, ws=ws)


# ---------------------------------------------------------------- CLI errors


def test_rollout_cli_errors_are_one_line(setup, ws):
    w = ["-w", str(ws.root)]
    _one_line_error(_cli("deploy", "digits", "--version", "99999", *w), "version 99999", "not found")
    _one_line_error(_cli("deploy", "nosuchmodel", "--version", "1", *w), "nosuchmodel")
    _one_line_error(_cli("rollback", "nosuchmodel", *w), "model nosuchmodel: no rollout is served on this cluster")


def test_models_compare_judges_a_version_against_the_champion_on_the_same_rows(setup, digits, ws, tmp_path):
    """`rayline models compare` scores the challenger and the serving champion with each version's own
    preprocessing and model on the same labelled rows: the scores are those each version's Predictor
    gives those rows, the verdict follows the gain against --min-delta (exit 0 or 4), and the judgement
    is recorded on the version and printed by `rayline models show`. Bad input is one line, exit 2."""
    from sklearn.datasets import load_digits

    import rayline as rl
    from rayline.registry import JUDGEMENT_TAG, Registry

    frame = load_digits(as_frame=True).frame  # the rows the digits spec reads, every feature and the label
    data = tmp_path / "digits.csv"
    frame.to_csv(data, index=False)
    champion = Registry(ws).alias_version("digits", "champion")
    loser, same = _register_losing_trial(digits, ws), _register_copy(ws, "digits", champion)
    expected = {v: rl.load_model("digits", v, workspace=str(ws.root)).evaluate(frame)["accuracy"] for v in (champion, loser)}
    assert expected[loser] != expected[champion]  # two different models: the comparison can go either way

    judged = rayline("models", "compare", "digits", loser, "--data", data, "-w", ws.root, "-o", "json", cwd=ROOT)
    result = json.loads(judged.stdout)
    assert (result["champion"], result["metric"], result["rows"]) == (champion, "accuracy", len(frame))  # the spec's metric
    assert result["challenger_score"] == pytest.approx(expected[loser]) and result["champion_score"] == pytest.approx(expected[champion])
    gain = expected[loser] - expected[champion]
    assert result["gain"] == pytest.approx(gain) and result["qualifies"] is (gain >= 0)
    assert judged.returncode == (0 if gain >= 0 else 4), judged.stderr
    tag = json.loads(Registry(ws).client.get_model_version("digits", loser).tags[JUDGEMENT_TAG])
    assert tag["challenger_score"] == result["challenger_score"] and tag["champion"] == champion
    shown = rayline("models", "show", "digits", "--version", loser, "-w", ws.root, cwd=ROOT)
    judged_line = shown.stdout.split("\njudged:", 1)[1].splitlines()[0]
    assert f"challenger of version {champion} by accuracy on {len(frame)} rows" in judged_line, shown.stdout
    assert ("does not qualify" in judged_line) is (gain < 0), judged_line

    # The same model as the champion: a gain of exactly 0 qualifies at --min-delta 0, not when a gain is required.
    even = rayline("models", "compare", "digits", same, "--data", data, "-w", ws.root, cwd=ROOT)
    assert even.returncode == 0 and "gain +0.0000" in even.stdout and "qualifies" in even.stdout, even.stdout + even.stderr
    required = rayline("models", "compare", "digits", same, "--data", data, "-w", ws.root, "--min-delta", "0.01", "--metric", "f1", cwd=ROOT)
    assert required.returncode == 4 and "f1=" in required.stdout and "does not qualify" in required.stdout, required.stdout

    frame.drop(columns=["target"]).to_csv(tmp_path / "unlabelled.csv", index=False)
    for args, needle in ((["--data", tmp_path / "unlabelled.csv"], "--data: no label column 'target'"),
                         (["--data", tmp_path / "rows.json"], "--data: unknown file type"),
                         (["--data", tmp_path / "missing.csv"], "--data: no such file"),
                         (["--data", data, "--metric", "rmse"], "--metric: 'rmse' is not a metric of this classification model"),
                         (["--data", data, "--champion", same], "--champion: the challenger itself")):
        bad = rayline("models", "compare", "digits", same, *args, "-w", ws.root, cwd=ROOT)
        assert bad.returncode in (1, 2) and bad.stderr.startswith("error: ") and needle in bad.stderr, bad.stderr
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr, bad.stderr


def _most_replicas(version):
    """Serve's own view of version `version`'s deployment: the most replicas it may run."""
    from rayline.serve.details import serve_details

    (deployment,) = serve_details()["applications"][f"digits-v{version}"]["deployments"].values()
    config = deployment["deployment_config"]
    return (config.get("autoscaling_config") or {}).get("max_replicas") or config.get("num_replicas")


def _until(predicate, what, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def test_a_running_version_takes_new_serve_settings_in_place_under_load(setup, ws):
    """`rayline serve deploy NAME --version N --set serve.KEY=VALUE` on the running champion (issue 38:
    it used to return early and keep the old settings, saying nothing): Serve updates the application
    in place under steady load with no failed request, the command says what changed, the deployment
    record keeps the settings, and the route's own request stack (the router's) follows a changed
    request limit. The same settings again change nothing and say nothing."""
    from rayline.registry import Registry, deployments_of

    registry = Registry(ws)
    champion = registry.alias_version("digits", "champion")
    w = ["-w", str(ws.root)]
    before = _most_replicas(champion)
    stop, seen, lock = threading.Event(), Counter(), threading.Lock()

    def load():
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                status = _post(c, f"{URL}/predict", setup["body"]).status_code
                with lock:
                    seen[status] += 1
                time.sleep(PACE_S)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    _until(lambda: sum(seen.values()) >= 20, "the load's first 20 answers")
    proc = _cli("deploy", "digits", "--version", champion, "--set", f"serve.replicas.max={before + 1}", *w)
    after_deploy = sum(seen.values())
    _until(lambda: sum(seen.values()) >= after_deploy + 40, "40 answers after the update")
    stop.set()
    for t in threads:
        t.join(60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (The module's router took oip: false while the fixture's run had deployed this version with the
    # default, so that may be among the changes too: the deploy applies the model's settings.)
    assert "its serve settings changed in place: " in proc.stdout, proc.stdout
    assert f"replicas.max: {before} -> {before + 1}" in proc.stdout, proc.stdout
    assert set(seen) == {200}, seen  # no failed request while the application was updated
    assert _most_replicas(champion) == before + 1
    entry = deployments_of(registry.client.get_model_version("digits", champion).tags)[-1]
    assert entry["settings"]["replicas.max"] == before + 1 and f"replicas.max: {before} -> {before + 1}" in entry["changed"]

    again = _cli("deploy", "digits", "--version", champion, "--set", f"serve.replicas.max={before + 1}", *w)
    assert again.returncode == 0 and "changed in place" not in again.stdout, again.stdout + again.stderr

    # A request limit the route's stack enforces: the router rebuilds the version's stack with it.
    assert len(setup["body"]) > 1024  # over the smallest limit serve.max_body_bytes allows
    small = _cli("deploy", "digits", "--version", champion, "--set", "serve.max_body_bytes=1024", *w)
    assert small.returncode == 0 and "max_body_bytes" in small.stdout, small.stdout + small.stderr
    _until(lambda: _post(loopback, f"{URL}/predict", setup["body"]).status_code == 413, "413 for a body over the new limit")
    back = _cli("deploy", "digits", "--version", champion, "--set", f"serve.replicas.max={before}",
                "--set", "serve.max_body_bytes=10485760", *w)
    assert back.returncode == 0, back.stdout + back.stderr
    _until(lambda: _post(loopback, f"{URL}/predict", setup["body"]).status_code == 200, "200 again")
    assert _most_replicas(champion) == before


def test_serve_deploy_set_errors_are_one_line_before_ray_is_reached(setup, ws):
    w = ["-w", str(ws.root)]
    for setting, problem in (("train.epochs=2", "--set train.epochs: rayline serve deploy changes serve settings only"),
                             ("serve.replicas.max=0", "serve.replicas.max: Input should be greater than or equal to 1 (got 0)"),
                             ("serve.route=/elsewhere", "--set serve.route: the model's route stays")):
        proc = _cli("deploy", "digits", "--version", "1", "--set", setting, *w)
        assert proc.returncode == 2 and problem in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- version: latest


def test_latest_is_resolved_once_when_the_app_is_built(setup, ws):
    """A replica that restarts after a newer version was registered still serves the app's version."""
    import ray
    from ray import serve

    from rayline.registry import Registry
    from rayline.serve.app import build_app

    built = Registry(ws).resolve("digits").version
    args = {"name": "digits", "version": "latest", "workspace": str(ws.root), "framework": "torch"}
    serve.run(build_app(args), name="digits-latest", route_prefix="/digits-latest", blocking=False)
    url = f"{BASE}/digits-latest"
    _wait_health(url)
    assert loopback.get(f"{url}/metadata", timeout=30).json()["version"] == built
    newer = _register_copy(ws, "digits", built)
    assert Registry(ws).resolve("digits").version == newer
    (replica,) = [a for a in ray.util.list_named_actors(all_namespaces=True) if "digits-latest" in a["name"]]
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # Serve replaces the dead replica
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "digits-latest" in a["name"]]
        if names and names != [replica["name"]]:
            break
        time.sleep(0.3)
    _wait_health(url)
    versions_seen = {loopback.get(f"{url}/metadata", timeout=30).json()["version"] for _ in range(5)}
    assert versions_seen == {built}
    serve.delete("digits-latest")
