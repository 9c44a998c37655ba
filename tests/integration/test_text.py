"""A mixed table with a text column to a served model: `pipelines/tickets-text.yaml` on tickets made
by `pipelines/make_tickets.py` (generated text with label-bearing words, distractors and typos, a
categorical channel, a numeric age), trained by the real runner (the tokenizer trained on the train
split in the data stage's one pass, a torch text CNN beside the one-hot and scaled columns),
registered, deployed behind its router, then asked over HTTP with strings and over the Open
Inference Protocol by tritonclient. Predictions over HTTP equal the offline model's on the same rows.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from .. import loopback
from ..ray_metrics import metrics_export_text
from .conftest import PORT, ROOT, pipeline_script, run

import tritonclient.http as tritonhttp  # declared in pyproject.toml: a broken install fails, not skips

ACCURACY = 0.85  # the test split's accuracy the spec reaches in the suite's budget (its 6 epochs, 1 worker)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory):
    path = tmp_path_factory.mktemp("tickets") / "tickets.csv"
    assert pipeline_script("make_tickets").make_tickets(path) == 2000
    return path


@pytest.fixture(scope="module")
def text_run(ray_session, ws, tickets):
    from rayline.spec import apply_overrides, load_spec

    path = ROOT / "pipelines" / "tickets-text.yaml"
    spec = apply_overrides(load_spec(path), {"data.source.path": str(tickets), "train.workers": 1})
    return run(spec, ws, spec_path=str(path))


def _rows(tickets, n):
    frame = pd.read_csv(tickets).iloc[::17].head(n)
    return frame, [{"text": t, "channel": c, "account_age_days": int(a)}
                   for t, c, a in zip(frame["text"], frame["channel"], frame["account_age_days"])]


def test_a_text_column_trains_to_the_stated_accuracy(text_run):
    assert text_run.test_metrics["accuracy"] >= ACCURACY, text_run.test_metrics
    done = [e for e in text_run.events if e[:2] == ("data", "done")]
    assert done and "36 features" in done[0][2]  # 32 token ids, 3 channels, 1 age


def test_strings_over_http_answer_as_the_offline_model(text_run, ws, tickets):
    from rayline import load_model

    frame, rows = _rows(tickets, 50)
    response = loopback.post(f"{text_run.endpoint}/predict", json={"instances": rows, "probabilities": True}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    offline = load_model(text_run.name, text_run.version, workspace=str(ws.root)).predict(
        frame[["text", "channel", "account_age_days"]], probabilities=True)
    assert body["predictions"] == offline["predictions"]
    classes = list(body["probabilities"][0])
    np.testing.assert_allclose([[p[c] for c in classes] for p in body["probabilities"]],
                               [[p[c] for c in classes] for p in offline["probabilities"]], rtol=1e-5, atol=1e-7)
    assert np.mean(np.asarray(body["predictions"]) == frame["team"].to_numpy()) >= ACCURACY - 0.1
    meta = loopback.get(f"{text_run.endpoint}/metadata", timeout=30).json()
    assert [(f["name"], f["type"]) for f in meta["features"]] == [("text", "text"), ("channel", "string"),
                                                                  ("account_age_days", "integer")]


@pytest.mark.parametrize("value, status, message", [
    (7, 422, '"loc":["body","instances",1,"text"],"msg":"Input should be a valid string"'),
    ("word " * 25_000, 422, "instances[1].text: text of 125,000 characters (allowed: at most 100,000)"),
], ids=["not-a-string", "too-long"])
def test_bad_text_is_refused_naming_the_row(text_run, tickets, value, status, message):
    _, rows = _rows(tickets, 2)
    rows[1]["text"] = value
    response = loopback.post(f"{text_run.endpoint}/predict", json={"instances": rows}, timeout=30)
    assert response.status_code == status, response.text[:500]
    assert message in response.text


def test_tritonclient_sends_text_as_bytes_tensors(text_run, tickets):
    frame, rows = _rows(tickets, 10)
    expected = loopback.post(f"{text_run.endpoint}/predict", json={"instances": rows}, timeout=60).json()["predictions"]
    client = tritonhttp.InferenceServerClient(url=f"127.0.0.1:{PORT}", connection_timeout=60, network_timeout=60)
    try:
        meta = client.get_model_metadata(text_run.name)
        assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("text", "BYTES"), ("channel", "BYTES"),
                                                                        ("account_age_days", "INT64")]
        for binary in (True, False):
            inputs = []
            for name, datatype, values in (("text", "BYTES", frame["text"].to_numpy(dtype=np.object_)),
                                           ("channel", "BYTES", frame["channel"].to_numpy(dtype=np.object_)),
                                           ("account_age_days", "INT64", frame["account_age_days"].to_numpy(np.int64))):
                tensor = tritonhttp.InferInput(name, [len(frame)], datatype)
                tensor.set_data_from_numpy(values, binary_data=binary)
                inputs.append(tensor)
            result = client.infer(text_run.name, inputs)
            got = [v.decode() if isinstance(v, bytes) else str(v) for v in result.as_numpy("predictions")]
            assert got == expected, binary
    finally:
        client.close()


def test_the_version_keeps_its_training_statistics(text_run, ws, tickets):
    """The registered artifact holds the train split's statistics of the raw features: the channel's
    categories and the age's moments and deciles (text is not summarised)."""
    from rayline import load_model

    stats = load_model(text_run.name, text_run.version, workspace=str(ws.root)).statistics
    assert set(stats.features) == {"channel", "account_age_days"}
    frame = pd.read_csv(tickets)
    channel = stats.features["channel"]
    assert channel.categories == sorted(frame["channel"].unique())
    assert sum(channel.counts) == stats.rows == text_run.rows["train"]
    age = stats.features["account_age_days"]
    assert frame["account_age_days"].min() <= age.min < age.mean < age.max <= frame["account_age_days"].max()
    assert len(age.edges) == 9 and sum(age.counts) == stats.rows


def _drifted_sample(text_run, ws, tickets, tmp_path):
    """600 tickets drawn like the training data (the frame), and the same with the age shifted by two
    training standard deviations and half the channels replaced by one never seen (a CSV's path)."""
    from rayline import load_model

    frame = pd.read_csv(tickets).drop(columns=["team"]).sample(600, random_state=3)
    std = load_model(text_run.name, text_run.version, workspace=str(ws.root)).statistics.features["account_age_days"].std
    shifted = frame.assign(account_age_days=frame["account_age_days"] + 2 * std)
    shifted.loc[shifted.index[:300], "channel"] = "fax"
    path = tmp_path / "shifted.csv"
    shifted.to_csv(path, index=False)
    return frame, path


def test_batch_scoring_reports_the_drift_of_its_input(text_run, ws, tickets, tmp_path):
    """Scored data drawn like the training data drifts nowhere; with the age shifted by two training
    standard deviations and half the channels replaced by one never seen, exactly those two
    features are flagged (text has no statistics). The answers written are counted against the
    version's predicted classes: one team's tickets leave the features alone and drift the answers.
    (The local engine; the Ray engine's counts are compared with it in the next test.)"""
    from rayline.batch import score

    whole = pd.read_csv(tickets)
    frame, path = _drifted_sample(text_run, ws, tickets, tmp_path)
    plain = tmp_path / "plain.csv"
    frame.to_csv(plain, index=False)
    result = score(text_run.name, str(plain), str(tmp_path / "plain.parquet"), workspace=ws, engine="local")
    assert result.engine == "local" and {d.name: d.level for d in result.drift} == {
        "channel": "ok", "account_age_days": "ok", "(prediction)": "ok"}, result.drift
    answers = pd.read_parquet(tmp_path / "plain.parquet")["prediction"]
    prediction = next(d for d in result.drift if d.name == "(prediction)")
    assert prediction.rows == 600 and prediction.shares == pytest.approx(
        [float((answers == team).mean()) for team in prediction.labels])  # every written answer, in its class
    # One team's tickets: channel and age are drawn apart from the team.
    one_team = tmp_path / "one_team.csv"
    whole[whole["team"] == whole["team"].iloc[0]].drop(columns=["team"]).to_csv(one_team, index=False)
    result = score(text_run.name, str(one_team), str(tmp_path / "one_team.parquet"), workspace=ws, engine="local")
    assert {d.name: d.level for d in result.drift} == {"channel": "ok", "account_age_days": "ok",
                                                       "(prediction)": "alert"}, result.drift
    result = score(text_run.name, str(path), str(tmp_path / "shifted.parquet"), workspace=ws, engine="local")
    report = {d.name: d for d in result.drift}
    assert report["account_age_days"].level == "alert" and report["account_age_days"].psi > 0.25
    assert report["channel"].level == "alert" and report["channel"].outside_share == pytest.approx(0.5)
    # The command prints the same table.
    page = tmp_path / "drift.html"
    # A process of its own, as a user runs it (the command family's subprocess check: the table is
    # what reaches its terminal).
    done = subprocess.run([sys.executable, "-m", "rayline.cli", "predict", text_run.name, "--input", str(path),
                           "--output", str(tmp_path / "cli.parquet"), "--engine", "local", "--drift-report",
                           str(page), "--workspace", str(ws.root)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b[23] of 3 features drifted", done.stdout), done.stdout  # the answers are the third
    assert "unseen categories 50.0% > 5.0%" in done.stdout and "account_age_days" in done.stdout
    # the page: one panel per feature, training beside scored shares (the figure's JSON)
    import json

    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page.read_text(), "html.parser")
    panels = {s["data-feature"]: s for s in soup.select("section.feature")}
    assert set(panels) == {"channel", "account_age_days", "(prediction)"}
    channel = json.loads(panels["channel"].select_one("script[data-figure]").string)
    assert [t["name"] for t in channel["data"]] == ["training", "scored"]
    assert channel["data"][0]["x"][-1] == "(unseen)" and channel["data"][1]["y"][-1] == pytest.approx(0.5)


def test_batch_scoring_on_ray_counts_drift_as_the_local_engine_does(text_run, ws, tickets, tmp_path):
    """Ray Data's scoring actors count the features and the answers of their blocks, and the driver
    merges the partial counts: on the drifted sample above, the Ray engine reports exactly what the
    local engine does (every feature's counts, shares, PSI and level: the two flagged features and the
    answers) and writes the same answers. One Ray run (each starts a pool of actors that load the
    model: ~25 s of the suite); before, the plain sample was scored on Ray as well."""
    from dataclasses import asdict

    from rayline.batch import score

    _, path = _drifted_sample(text_run, ws, tickets, tmp_path)
    on_ray = score(text_run.name, str(path), str(tmp_path / "ray.parquet"), workspace=ws, engine="ray")
    local = score(text_run.name, str(path), str(tmp_path / "local.parquet"), workspace=ws, engine="local")
    assert (on_ray.engine, local.engine) == ("ray", "local")
    report = {d.name: d for d in on_ray.drift}
    assert report["account_age_days"].level == "alert" and report["channel"].outside_share == pytest.approx(0.5)
    assert report["(prediction)"].rows == 600
    assert [asdict(d) for d in on_ray.drift] == [asdict(d) for d in local.drift]
    answers = [pd.read_parquet(tmp_path / f"{engine}.parquet")["prediction"].tolist() for engine in ("ray", "local")]
    assert answers[0] == answers[1] and len(answers[0]) == 600


def _monitoring(endpoint, until, timeout_s=30.0):
    """GET {route}/monitoring until `until(report)` holds (replicas publish every 2 s)."""
    import time

    deadline, report = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        response = loopback.get(f"{endpoint}/monitoring", timeout=10)
        assert response.status_code == 200, response.text
        report = response.json()
        if until(report):
            return report
        time.sleep(0.5)
    raise AssertionError(f"monitoring never got there: {report}")


def test_live_traffic_is_monitored_against_the_training_statistics(text_run, ws, tickets):
    """The endpoint with a small window: traffic drawn like the training data drifts nowhere; once
    the window holds traffic with the age shifted by two training standard deviations and half the
    channels never seen, exactly those two features alert, in /monitoring, in Ray's Prometheus
    export (scraped) and in `rayline serve status`; text has no statistics and is not judged."""
    import time
    from urllib.parse import urlparse

    from rayline import load_model
    from rayline.serve import versions
    from rayline.serve.status import gather_status
    from rayline.spec import ServeSpec

    from rayline.monitoring.live import STALE_S
    from rayline.serve.applications import delete_apps, serve_apps

    route = urlparse(text_run.endpoint).path
    # A running version keeps its settings: its applications go first, then come back with a small window.
    delete_apps([app for app in serve_apps() if app == text_run.name or app.startswith(f"{text_run.name}-")])
    spec = ServeSpec(route=route, oip=False, resources_per_replica={"cpus": 0.1}, replicas={"min": 1, "max": 1},
                     monitoring={"window_rows": 400, "min_rows": 200})
    versions.deploy(text_run.name, text_run.version, ws=ws, serve_spec=spec, port=PORT)
    frame = pd.read_csv(tickets).drop(columns=["team"])
    rows = [{"text": t, "channel": c, "account_age_days": int(a)}
            for t, c, a in zip(frame["text"], frame["channel"], frame["account_age_days"])]

    def send(batch):
        for i in range(0, len(batch), 25):
            response = loopback.post(f"{text_run.endpoint}/predict", json={"instances": batch[i:i + 25]}, timeout=60)
            assert response.status_code == 200, response.text

    send(rows[:400])
    report = _monitoring(text_run.endpoint, lambda r: r["window_rows"] >= 400)
    features = {f["feature"]: f for f in report["features"]}
    assert report["status"] == "ok" and set(features) >= {"channel", "account_age_days"}, report
    assert "text" not in features

    std = load_model(text_run.name, text_run.version, workspace=str(ws.root)).statistics.features["account_age_days"].std
    shifted = [{**r, "account_age_days": r["account_age_days"] + 2 * std, "channel": "fax" if i % 2 else r["channel"]}
               for i, r in enumerate(rows[400:1000])]
    send(shifted)
    # Until the window is the shifted rows alone: the replica stopped above may have left its entry,
    # merged until it is STALE_S (30 s) old (rayline/monitoring/live.py), so the wait outlasts that.
    def shifted_alone(r):
        channel = [f for f in r["features"] if f["feature"] == "channel"]
        return r["status"] == "drifting" and r["window_rows"] >= 400 and channel and channel[0]["unseen_share"] >= 0.45

    report = _monitoring(text_run.endpoint, shifted_alone, timeout_s=STALE_S + 30)
    alerts = {f["feature"] for f in report["features"] if f["level"] == "alert" and f["kind"] != "prediction"}
    assert alerts == {"channel", "account_age_days"}, report
    channel = next(f for f in report["features"] if f["feature"] == "channel")
    # every other shifted row's channel is one training never saw: half of the window
    assert channel["unseen_share"] == pytest.approx(0.5, abs=0.02) and any("unseen categories" in r for r in channel["reasons"])

    # Ray's Prometheus export: the gauges per feature (exported every few seconds)
    deadline, psi = time.monotonic() + 40, {}
    while time.monotonic() < deadline and not {"channel", "account_age_days"} <= {k for k, v in psi.items() if v >= 0.25}:
        text = metrics_export_text()
        from prometheus_client.parser import text_string_to_metric_families

        ours = "\n".join(line for line in text.splitlines() if "rayline_drift_psi" in line)
        psi = {s.labels["feature"]: s.value for fam in text_string_to_metric_families(ours + "\n") for s in fam.samples
               if s.labels.get("model") == text_run.name and s.labels.get("version") == str(text_run.version)}
        time.sleep(1)
    assert psi["channel"] >= 0.25 and psi["account_age_days"] >= 0.25, psi

    # `rayline serve status`'s report (what the command prints: its line is unit-tested) and its line
    from rayline.cli.serve import drift_line

    (app,) = gather_status(text_run.name).applications
    status = app.monitoring[str(text_run.version)]
    assert status["status"] == "drifting"
    line = drift_line(app.model, str(text_run.version), status)
    assert "drifting" in line and "channel" in line and "account_age_days" in line and "[alert]" in line

    # `rayline report NAME --live`'s page (its connection and CLI lines are unit-tested): a panel per
    # feature of the live window, the two shifted ones flagged; a version not serving is refused.
    from rayline.errors import ServeError
    from rayline.monitoring.live import live_versions
    from rayline.monitoring.report import live_report_html

    assert live_versions(text_run.name) == [str(text_run.version)]
    page, (summary,) = live_report_html(text_run.name)
    assert summary["status"] == "drifting" and {"channel", "account_age_days"} <= set(summary["flagged"]), summary
    assert summary["window_rows"] >= 400
    panels = set(re.findall(r'<section class="feature" data-feature="([^"]+)"', page))
    assert panels >= {"channel", "account_age_days", "(prediction)"} and "text" not in panels, panels
    with pytest.raises(ServeError, match=r"--version: .* no monitored window for version '99' \(allowed: "):
        live_report_html(text_run.name, ["99"])
    with pytest.raises(ServeError, match="has no monitored version serving"):
        live_report_html("no-such-model")
