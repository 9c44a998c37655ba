"""The closed loop (issue 39), end to end on the session's Ray and Serve: a model trained on
distribution A serves traffic from B; its endpoint's monitoring says drifting; the retrain loop
(a detached actor `rayline run` started) retrains on drift, and that challenger, trained on the
same data, is judged not better by `compare.min_delta` and stays registered, not deployed; B's
file lands in the source folder; the loop retrains on the change, the challenger beats the
champion on the new test split, goes out as a gated canary and is promoted under steady load with
no failed request, although the loop's process is killed while it watches the canary. Then the
schedule trigger on the same model, retraining a strictly worse challenger that `min_delta: 0` keeps
out, and a cluster that comes back empty: its Serve config, applied again with Ray's own `serve
deploy`, brings the loop back with its record.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest

from .. import loopback
from ..cli import rayline
from ..ray_metrics import metrics_export_text
from .conftest import OWN_RAY, PORT, fresh_ray, run

NAME = "loopy"
ROWS = 400

# Its own Ray, in the lane beside the session's (conftest.OWN_RAY): one test of ~190 s of the
# critical session lane (S16, 2026-11-29), with a Serve port of its own.
pytestmark = getattr(pytest.mark, OWN_RAY)
LOOP_PORT = PORT + 4  # test_cluster.py serves on PORT + 2, 3, 5 and 6


@pytest.fixture(scope="module")
def ray_session():
    yield from fresh_ray()


@pytest.fixture(scope="module")
def ws(ray_session, tmp_path_factory):
    from rayline.workspace import workspace

    return workspace(tmp_path_factory.mktemp("loop-workspace")).ensure()


def _rows(rng, centre: float, n: int = ROWS) -> pd.DataFrame:
    """Distribution A (centre 0) or B (centre 4): the label is x1 above the centre, x2 is noise."""
    x1 = rng.normal(centre, 1.0, n)
    return pd.DataFrame({"x1": x1.round(4), "x2": rng.normal(0, 1, n).round(4),
                         "y": np.where(x1 > centre, "yes", "no")})


def _write(frame: pd.DataFrame, folder, name: str) -> None:
    tmp = folder.parent / f".{name}"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, folder / name)  # the loop never reads half a file


def _status() -> dict:
    from rayline.retrain.loop import loop_status

    return loop_status(NAME) or {}


def _wait_for(what: str, check, timeout_s: float = 240.0):
    """Until `check()` is truthy; the loop's status in the failure message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; loop: {json.dumps(_status(), indent=1)[-3000:]}")


def _decision(kind: str, after: int = 0):
    def check():
        decisions = (_status().get("record") or {}).get("decisions") or []
        return next((d for d in decisions[after:] if d["decision"] == kind), None)
    return check


def _new_decision(kind: str, seen: list):
    """A decision of `kind` not among `seen` (the record keeps the last KEEP_DECISIONS: positions shift)."""
    def check():
        decisions = (_status().get("record") or {}).get("decisions") or []
        return next((d for d in decisions if d["decision"] == kind and d not in seen), None)
    return check


@pytest.fixture(scope="module")
def loop_run(ws, tmp_path_factory):
    from rayline.spec import load_spec

    root = tmp_path_factory.mktemp("retrain")
    folder = root / "data"
    folder.mkdir()
    rng = np.random.default_rng(7)
    _write(_rows(rng, 0.0), folder, "a.csv")
    spec_path = root / "loopy.yaml"
    spec_path.write_text(f"""
name: {NAME}
data:
  source: {{format: csv, path: {folder}}}
  label: y
  split: {{valid: 0.2, test: 0.3, seed: 0}}
task: classification
model: {{framework: xgboost, kind: gbdt, params: {{max_depth: 3, num_boost_round: 20}}}}
train: {{workers: 1}}
serve:
  monitoring: {{window_rows: 300, min_rows: 100}}
retrain:
  on: [drift, data_change]
  drift_for: 3s
  min_interval: 1s
  check_every: 500ms
  compare: {{metric: accuracy, min_delta: 0.05}}
  canary: {{percent: 50, min_requests: 20, promote_after: 120}}
""")
    summary = run(load_spec(spec_path), ws, spec_path=str(spec_path), port=LOOP_PORT)
    try:
        yield summary, folder, rng
    finally:
        from rayline.retrain.loop import stop_loop

        stop_loop(NAME)


def test_drift_then_new_data_retrain_judge_and_promote_a_canary_under_load(loop_run, ws):
    from rayline.registry import RETRAIN_TAG, Registry

    summary, folder, rng = loop_run
    assert summary.endpoint and summary.retrain.startswith(f"retrain loop of {NAME}: watching (drift, data_change")
    registry = Registry(ws)
    champion = summary.version
    status = _wait_for("the loop watching", lambda: _status().get("record", {}).get("state") == "watching" and _status())
    assert "drift:" in status["waiting"] and "data unchanged" in status["waiting"], status

    # B's traffic: the endpoint's monitoring says drifting, the loop retrains on drift ...
    b_rows = _rows(rng, 4.0)
    instances = b_rows.drop(columns="y").to_dict("records")
    for start in range(0, 200, 50):
        assert loopback.post(f"{summary.endpoint}/predict", json={"instances": instances[start:start + 50]},
                          timeout=60).status_code == 200
    started = _wait_for("a retrain on drift", _decision("retrain"))
    assert started["why"].startswith("drift: drifting for") and "x1 (psi" in started["why"], started
    # ... on unchanged data: that challenger is no better than the champion by min_delta.
    first = _wait_for("the drift retrain's version", lambda: next(
        (mv for mv in registry.model_versions(NAME) if json.loads((mv.tags or {}).get(RETRAIN_TAG) or "{}").get("trigger") == "drift"), None))
    # B's file lands once that run has read its data (its version is registered): the next retrain's data.
    _write(b_rows, folder, "b.csv")
    kept = _wait_for("the drift challenger not deployed", _decision("not_deployed"))
    assert kept["version"] == str(first.version) and "needed >= +0.0500" in kept["why"], kept
    judged = json.loads(registry.version_details(NAME, kept["version"])[0].tags["rayline.judgement"])
    assert judged["champion"] == champion and not judged["qualifies"] and judged["gain"] < 0.05
    assert registry.alias_version(NAME, "champion") == champion and registry.alias_version(NAME, "canary") is None

    # The changed source: retrain, judged better on the new test split, rolled out as a canary.
    count = len(_status()["record"]["decisions"])
    again = _wait_for("a retrain on the new file", _decision("retrain", after=count - 1))
    assert again["why"].startswith("data_change: the source changed"), again

    # Steady load from here on: not one failed request through the canary, its promotion and the loop's restart.
    answers, stop = [], threading.Event()

    # Rows of A and B in turn, as the challenger was trained on: the promoted version must not drift
    # on this traffic (a drift retrain after the promotion would be this test's own doing).
    mixed = [row for pair in zip(_rows(rng, 0.0).drop(columns="y").to_dict("records"), instances) for row in pair]

    def load():
        with httpx.Client(timeout=30) as client:
            i = 0
            while not stop.is_set():
                body = {"instances": mixed[i % (len(mixed) - 5):][:5]}
                i += 5
                try:
                    answers.append(client.post(f"{summary.endpoint}/predict", json=body).status_code)
                except httpx.HTTPError as exc:
                    answers.append(repr(exc))
                time.sleep(0.02)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        canary = _wait_for("the canary", lambda: _status().get("record", {}).get("state") == "canary" and _status())
        challenger = canary["record"]["current"]["version"]
        judged = json.loads(registry.version_details(NAME, challenger)[0].tags["rayline.judgement"])
        assert judged["qualifies"] and judged["gain"] >= 0.05 and judged["champion"] == champion, judged
        assert registry.alias_version(NAME, "canary") == challenger
        # The loop's process dies while it watches the canary: Ray restarts it, and it carries on.
        os.kill(canary["pid"], signal.SIGKILL)
        promoted = _wait_for("the promotion", _decision("promoted"))
        assert promoted["version"] == challenger and _status()["pid"] != canary["pid"]
        assert registry.alias_version(NAME, "champion") == challenger
        time.sleep(1.0)  # requests on the new split after the promotion
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    failed = [a for a in answers if a != 200]
    assert len(answers) > 150 and not failed, (len(answers), failed[:5])
    served = loopback.post(f"{summary.endpoint}/predict", json={"instances": instances[:3]}, timeout=30)
    assert served.headers["x-rayline-version"] == challenger
    decisions = [d["decision"] for d in _status()["record"]["decisions"]]
    assert decisions[-5:] == ["retrain", "not_deployed", "retrain", "canary", "promoted"], decisions

    # A bad file lands: the retrain fails, the champion keeps serving, and the same data is not retried.
    versions_before = len(registry.model_versions(NAME))
    count = len(_status()["record"]["decisions"])
    _write(pd.DataFrame({"x1": ["not a number"] * 20, "x2": [0.5] * 20, "y": ["yes"] * 20}), folder, "c.csv")
    failed = _wait_for("the failed retrain", _decision("failed", after=count))
    assert "the run exited with code" in failed["why"] and "the champion keeps serving" in failed["why"], failed
    assert registry.alias_version(NAME, "champion") == challenger and len(registry.model_versions(NAME)) == versions_before
    _wait_for("the loop declining the same data", lambda: "data unchanged" in (_status().get("waiting") or ""))
    assert [d["decision"] for d in _status()["record"]["decisions"][count:]] == ["retrain", "failed"]
    assert loopback.post(f"{summary.endpoint}/predict", json={"instances": instances[:3]}, timeout=30).status_code == 200

    # Prometheus: a counter per decision, exported by the loop's node (every 2 s in the session's Ray).
    def exported():
        from prometheus_client.parser import text_string_to_metric_families

        text = "\n".join(line for line in metrics_export_text().splitlines() if "rayline_retrain_decisions" in line)
        counts = {}
        for family in text_string_to_metric_families(text + "\n"):
            for sample in family.samples:
                if sample.labels.get("model") == NAME and sample.name.endswith("_total"):
                    decision = sample.labels.get("decision")
                    counts[decision] = counts.get(decision, 0) + sample.value
        return counts if counts.get("failed") and counts.get("promoted") else None

    counted = _wait_for("the decisions in the metrics export", exported, 60)
    # Summed over the loop's processes (it was restarted once): one promotion, the failure after it.
    assert counted["promoted"] == 1 and counted["failed"] >= 1, counted

    # What a user reads: the CLI's status and the stop.
    shown = rayline("retrain", "status", NAME, "-w", str(ws.root))
    assert shown.returncode == 0 and f"{NAME} retrain loop: watching" in shown.stdout
    assert f"promoted version {challenger}" in shown.stdout and "failed: the champion keeps serving" in shown.stdout, shown.stdout
    status = rayline("serve", "status", NAME, "-w", str(ws.root))
    assert status.returncode == 0 and f"{NAME} retrain loop: watching" in status.stdout, status.stdout
    stopped = rayline("retrain", "stop", NAME, "-w", str(ws.root))
    assert stopped.returncode == 0 and "retrain loop stopped" in stopped.stdout
    assert _status() == {}
    missing = rayline("retrain", "status", NAME, "-w", str(ws.root))
    assert missing.returncode != 0 and "no retrain loop runs on this cluster" in missing.stderr

    # `rayline serve deploy` of a version whose spec has a retrain section starts its loop again (the
    # bad file goes first: the fresh loop would retrain on it at once) ...
    (folder / "c.csv").unlink()
    deployed = rayline("serve", "deploy", NAME, "--version", challenger, "-w", str(ws.root), "--port", str(LOOP_PORT))
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert f"version {challenger} is the champion" in deployed.stdout
    assert f"retrain loop of {NAME}: watching (drift, data_change" in deployed.stdout, deployed.stdout
    _wait_for("the redeployed loop watching", lambda: _status().get("record", {}).get("state") == "watching")
    # ... and `rayline serve delete` takes the model off Serve: the loop stopped, every app of it gone,
    # the route answering 404, the registry as it was (versions and champion kept).
    from ray import serve

    from rayline.serve.routing_table import rollout_state

    versions_now = len(registry.model_versions(NAME))
    deleted = rayline("serve", "delete", NAME, "-w", str(ws.root))
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert f"model {NAME}: deleted from Serve ({NAME}, " in deleted.stdout and f"{NAME}-v{challenger}" in deleted.stdout
    assert "its retrain loop is stopped" in deleted.stdout, deleted.stdout
    assert _status() == {} and rollout_state(NAME) is None
    assert not [a for a in serve.status().applications if a == NAME or a.startswith(f"{NAME}-")]
    _wait_for("the deleted route's 404", lambda: loopback.post(f"{summary.endpoint}/predict", json={"instances": instances[:1]},
                                                            timeout=30).status_code == 404, 60)
    assert len(registry.model_versions(NAME)) == versions_now and registry.alias_version(NAME, "champion") == challenger
    entry = json.loads(registry.version_details(NAME, challenger)[0].tags["rayline.deployments"])[-1]
    assert (entry["action"], entry["role"], entry["was_percent"]) == ("delete", "deleted", 100), entry
    gone = rayline("serve", "delete", NAME, "-w", str(ws.root))
    assert gone.returncode == 1 and gone.stderr.startswith(f"error: model {NAME}: not served on this cluster"), gone.stderr


def test_a_schedule_retrains_on_its_clock_with_no_drift_and_no_new_data(loop_run, ws):
    """`retrain: {on: [schedule], every: ...}` on the same model after the test above (its loop stopped,
    its endpoint deleted): the loop waits for the clock, retrains when it comes (the data and the
    endpoint unchanged), and judges the challenger like any other. Here the spec the loop retrains with
    makes a strictly worse model (one depth-1 tree, where the champion has 20 of depth 3) and asks only
    for no loss (`min_delta: 0`): the challenger scores below the champion on the same test split and
    stays registered, not deployed, the comparison recorded. The next tick is a schedule again."""
    from rayline.registry import RETRAIN_TAG, Registry
    from rayline.retrain.loop import start_loop, stop_loop
    from rayline.inference.predictor import version_spec
    from rayline.spec import parse_spec

    registry = Registry(ws)
    champion = registry.alias_version(NAME, "champion")
    raw = version_spec(registry, registry.resolve(NAME, champion)).model_dump(by_alias=True, exclude_none=True)
    raw["retrain"].update(on=["schedule"], every="3s", min_interval="1s", check_every="500ms")
    raw["retrain"]["compare"]["min_delta"] = 0.0  # no worse is enough: only a loss keeps it out
    raw["model"]["params"] = {"max_depth": 1, "num_boost_round": 1}  # one stump: x1's two thresholds (A, B) need two
    line = start_loop(parse_spec(raw), ws)
    assert line.startswith(f"retrain loop of {NAME}: watching (schedule"), line
    try:
        seen = list(_status()["record"]["decisions"])  # the stopped loop's, kept; its clock fires 3 s after the start
        assert "schedule in" in _wait_for("the loop waiting for its clock", lambda: (
            _status().get("record", {}).get("state") == "watching" and _status().get("waiting")), 60)
        started = _wait_for("a retrain on the schedule", _new_decision("retrain", seen), 60)
        assert started["why"] == "schedule: every 3 s", started
        kept = _wait_for("the scheduled challenger judged", _new_decision("not_deployed", seen))
        # "accuracy C vs champion version N X on R rows of the new test split: gain G, needed >= +0.0000"
        judged = re.fullmatch(r"accuracy ([\d.]+) vs champion version (\d+) ([\d.]+) on (\d+) rows of the new test "
                              r"split: gain ([-+][\d.]+), needed >= \+0\.0000", kept["why"])
        assert judged, kept
        challenger_score, judged_champion, champion_score = float(judged[1]), judged[2], float(judged[3])
        assert judged_champion == champion and challenger_score < champion_score, kept  # strictly worse
        assert float(judged[5]) == pytest.approx(challenger_score - champion_score, abs=1e-4) and float(judged[5]) < 0
        mv = registry.version_details(NAME, kept["version"])[0]
        assert json.loads(mv.tags[RETRAIN_TAG])["trigger"] == "schedule", mv.tags
        assert registry.alias_version(NAME, "champion") == champion  # the champion stays
        # Its next tick is the clock's again, `every` after this retrain started.
        again = _wait_for("the next scheduled retrain", _new_decision("retrain", seen + [started]), 60)
        assert again["why"] == "schedule: every 3 s", again
    finally:
        stop_loop(NAME)
    assert _status() == {}


def test_a_cluster_that_comes_back_empty_gets_its_loop_back_from_its_serve_config(loop_run, ws, tmp_path):
    """A head that restarts without GCS fault tolerance comes back with no actors, no Serve apps and no
    KV: the retrain loop, a detached actor, is gone with the rest. What brings the endpoint back is its
    Serve config applied again (KubeRay's RayService does it; here Ray's own `serve deploy` CLI on a new
    Ray), and building the config's router application starts the champion's loop again, which picks
    up from its record (a tag of the registered model, kept in the workspace's MLflow store)."""
    import subprocess
    import sys

    import ray
    from ray import serve

    from rayline.registry import RETRAIN_LOOP_TAG, Registry

    summary, folder, rng = loop_run
    registry = Registry(ws)
    champion = registry.alias_version(NAME, "champion")
    config = tmp_path / f"{NAME}-serve.yaml"
    export = rayline("serve", "export", NAME, "-w", str(ws.root), "--output", str(config), f"--port={LOOP_PORT}",
                    "--no-v2")  # the model's own apps: what brings its loop back
    assert export.returncode == 0, export.stdout + export.stderr
    before = json.loads(registry.model_tag(NAME, RETRAIN_LOOP_TAG))
    assert before["state"] == "stopped" and before["decisions"], before  # the tests above stopped it

    serve.shutdown()
    ray.shutdown()  # the old head: its actors, applications and KV gone with it
    # The new Ray, as the suite starts one; the module's fixture stops it at the end, as it would the old.
    next(fresh_ray())
    assert _status() == {}  # no loop on the new cluster until the config is applied
    dashboard = ray._private.worker.get_dashboard_url()
    serve_cli = os.path.join(os.path.dirname(sys.executable), "serve")
    deployed = subprocess.run([serve_cli, "deploy", str(config), "--address", f"http://{dashboard}"],
                              capture_output=True, text=True, timeout=120)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    status = _wait_for("the loop started again by the config's router", lambda: (
        _status().get("record", {}).get("state") == "watching" and _status()), 180)
    # Its record as the old cluster left it, carried on: the earlier decisions in order, the stop last
    # (a decision taken since would follow them; the record keeps the last 10).
    kept = status["record"]["decisions"]
    assert before["decisions"][-1] in kept, status["record"]
    upto = kept[:kept.index(before["decisions"][-1]) + 1]
    assert upto == before["decisions"][-len(upto):], status["record"]
    shown = rayline("retrain", "status", NAME, "-w", str(ws.root))
    assert shown.returncode == 0 and f"{NAME} retrain loop: watching" in shown.stdout, shown.stdout + shown.stderr
    instances = [{"x1": 0.5, "x2": 0.0}]
    answered = _wait_for("the config's route answering", lambda: (
        (r := loopback.post(f"http://127.0.0.1:{LOOP_PORT}/{NAME}/predict", json={"instances": instances}, timeout=30))
        .status_code == 200 and r), 120)
    assert answered.headers["x-rayline-version"] == champion
    deleted = rayline("serve", "delete", NAME, "-w", str(ws.root))
    assert deleted.returncode == 0 and "its retrain loop is stopped" in deleted.stdout, deleted.stdout + deleted.stderr
    assert _status() == {}
