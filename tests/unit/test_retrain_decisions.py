"""The retrain loop's decisions (rayline/retrain/decisions.py) and its spec section, as tables:
when a retrain is due and why, what holds it back, how failures back off, what a canary's counts
say, and the `retrain` section's errors."""

from __future__ import annotations

import pytest
import yaml

from rayline.errors import SpecError
from rayline.retrain.decisions import (MAX_BACKOFF_S, add_decision, backoff_s, canary_verdict, due, new_record,
                                       note_drift)
from rayline.spec import RetrainSpec, parse_spec
from rayline.spec.retrain_spec import parse_duration
from rayline.spec.yaml_safe import load_yaml

NOW = 1_000_000.0
DRIFTING = {"status": "drifting", "features": [{"feature": "age", "psi": 0.61, "level": "alert"},
                                               {"feature": "city", "psi": 0.02, "level": "ok"}]}


def spec(**raw):
    return RetrainSpec.model_validate({"on": ["drift", "data_change"], "drift_for": 60, "min_interval": 600, **raw})


def record(**changes):
    return {**new_record(NOW, None), **changes}


@pytest.mark.parametrize("rec, fingerprint, kind, waits_for", [
    (record(), "a", None, "drifting for 0 of 60 s; data unchanged"),  # drifting, not yet for drift_for
    (record(drift_since=NOW - 59), "a", None, "drifting for 59 of 60 s"),
    (record(drift_since=NOW - 60), "a", "drift", ""),
    (record(), "b", "data_change", ""),  # the source changed since the champion was trained
    (record(tried="b"), "b", None, "data unchanged"),  # already retrained on this data: not again
    (record(tried="b"), "c", "data_change", ""),  # ... until it changes again
    (record(last_started=NOW - 599, drift_since=NOW - 999), "b", None, "min_interval: next retrain possible in 1 s"),
    (record(failures=2, retry_after=NOW + 30, drift_since=NOW - 999), "b", None, "backing off after 2 failed"),
    (record(state="canary", drift_since=NOW - 999), "b", None, "busy: canary"),
    # failed 3 times in a row on data "b": drift no longer retries it ...
    (record(failures=3, tried="b", drift_since=NOW - 999), "b", None, "3 retrains in a row failed on this data"),
    (record(failures=2, tried="b", drift_since=NOW - 999), "b", "drift", ""),  # ... 2 times: it still does
    (record(failures=3, tried="b", drift_since=NOW - 999), "c", "data_change", ""),  # new data: tried at once
])
def test_a_retrain_is_due_only_when_a_trigger_holds_and_nothing_holds_it_back(rec, fingerprint, kind, waits_for):
    note_drift(rec, True, NOW)
    trigger, waiting = due(spec(), rec, NOW, drift=DRIFTING, fingerprint=fingerprint, trained_on="a")
    assert (trigger.kind if trigger else None) == kind
    assert waits_for in waiting
    if kind == "drift":
        assert "age (psi 0.61)" in trigger.detail and "city" not in trigger.detail


def test_drift_is_timed_from_when_it_was_first_seen_and_forgotten_when_it_ends():
    rec = record()
    note_drift(rec, True, NOW)
    note_drift(rec, True, NOW + 30)
    assert rec["drift_since"] == NOW
    note_drift(rec, False, NOW + 31)
    assert rec["drift_since"] is None
    trigger, _ = due(spec(on=["drift"]), rec, NOW + 500, drift={"status": "ok", "features": []}, fingerprint=None, trained_on=None)
    assert trigger is None


def test_a_schedule_fires_when_due_and_only_then():
    s = spec(on=["schedule"], every="1h")
    rec = new_record(NOW, s.every)
    assert due(s, rec, NOW + 3599, drift=None, fingerprint=None, trained_on=None)[0] is None
    trigger, _ = due(s, rec, NOW + 3600, drift=None, fingerprint=None, trained_on=None)
    assert trigger.kind == "schedule" and "every 3600 s" in trigger.detail


def test_a_trigger_the_spec_does_not_name_is_ignored():
    rec = record(drift_since=NOW - 999)
    assert due(spec(on=["data_change"]), rec, NOW, drift=DRIFTING, fingerprint="a", trained_on="a")[0] is None
    assert due(spec(on=["drift"]), record(), NOW, drift=None, fingerprint="b", trained_on="a")[0] is None


@pytest.mark.parametrize("failures, seconds", [(1, 600), (2, 1200), (3, 2400), (20, MAX_BACKOFF_S)])
def test_failures_back_off_doubling_up_to_a_day(failures, seconds):
    assert backoff_s(failures, 600) == seconds


CANARY = RetrainSpec.model_validate({"on": ["drift"]}).canary  # percent 10, max_error_rate 0.05, promote_after 200


@pytest.mark.parametrize("requests, errors, tripped, verdict", [
    (199, 0, None, "wait"),
    (200, 10, None, "promote"),  # 5%: at the limit is within it
    (200, 11, None, "rolled_back"),
    (50, 0, {"detail": "error rate 0.2 > 0.05"}, "rolled_back"),
])
def test_a_canary_is_promoted_after_enough_requests_within_its_limit(requests, errors, tripped, verdict):
    assert canary_verdict(CANARY, requests, errors, tripped)[0] == verdict


def test_the_record_keeps_the_latest_decisions():
    rec = record()
    for i in range(30):
        add_decision(rec, f"t{i}", "failed", "x" * 1000, None)
    assert len(rec["decisions"]) == 10 and rec["decisions"][-1]["at"] == "t29"
    assert len(rec["decisions"][-1]["why"]) == 400


BASE = """
name: churn
data: {source: {format: csv, path: data.csv}, label: y}
model: {framework: xgboost, kind: gbdt}
serve: {}
"""


def problems(extra: str, base: str = BASE) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(load_yaml(base + extra), source="spec.yaml")
    return str(info.value)


@pytest.mark.parametrize("extra, message", [
    ("retrain: {on: [schedule]}", "retrain.every: on: [schedule] needs how often (got no every"),
    ("retrain: {on: [drift], every: 1h}", "retrain.every: a schedule that nothing follows"),
    ("retrain: {on: [drift], drift_for: soon}", "retrain.drift_for: not a positive duration (got 'soon'; allowed: "
                                                "seconds, or a number with a unit: 500ms, 30s, 5m, 1h, 7d)"),
    ("retrain: {on: [drift], min_interval: -5}", "retrain.min_interval: not a positive duration (got -5"),
    ("retrain: {on: [drift, drift]}", "retrain.on: a trigger named twice"),
    ("retrain: {on: [weekly]}", "retrain.on[0]: Input should be 'drift', 'data_change' or 'schedule' (got 'weekly')"),
    ("retrain: {on: [drift], canary: {promote_after: 10}}", "retrain.canary.promote_after: a canary is promoted only "
                                                            "after its limits were checked (got 10 < min_requests 50"),
    ("retrain: {on: [drift], canary: {percent: 100}}", "retrain.canary.percent"),
    ("retrain: {on: [drift], compare: {metric: r2}, task: classification}".replace(", task: classification}", "}")
     + "\ntask: classification", "retrain.compare.metric: unknown metric for classification (got 'r2'"),
    ("retrain: {on: [drift], canary: {max_error_rate: null}}", "retrain.canary.max_error_rate"),
])
def test_a_bad_retrain_section_names_the_field_the_value_and_what_is_allowed(extra, message):
    assert message in problems(extra)


def test_retrain_needs_an_endpoint_monitoring_for_drift_and_data_that_can_change():
    no_serve = BASE.replace("serve: {}\n", "")
    assert "retrain: the loop rolls each challenger out on the model's endpoint: add a serve section" in \
        problems("retrain: {on: [drift]}", no_serve)
    assert "retrain.on: drift is what the endpoint's monitoring counts, and it is off" in \
        problems("retrain: {on: [drift]}", BASE.replace("serve: {}", "serve: {monitoring: {enabled: false}}"))
    sklearn = BASE.replace("{format: csv, path: data.csv}", "{format: sklearn, name: iris}")
    assert "retrain.on: a bundled dataset (iris) never changes" in problems("retrain: {on: [data_change]}", sklearn)


def test_on_is_a_key_not_yaml_1_1s_true_and_bools_still_read():
    spec_ = parse_spec(load_yaml(BASE + "retrain:\n  on: [drift, data_change]\n  drift_for: 2m\n"), source="spec.yaml")
    assert spec_.retrain.on == ["drift", "data_change"] and spec_.retrain.drift_for == 120
    assert load_yaml("a: yes\nb: true\nc: False\nd: on") == {"a": "yes", "b": True, "c": False, "d": "on"}
    assert parse_spec(load_yaml(BASE.replace("serve: {}", "serve: {monitoring: {enabled: no}}")),
                      source="s").serve.monitoring.enabled is False


def test_a_retrain_section_survives_the_run_record_round_trip():
    """`rayline resume` and the loop's own run re-read the spec from model_dump: the section must too."""
    first = parse_spec(load_yaml(BASE + "retrain: {on: [drift, schedule], every: 7d, canary: {max_p99_ms: 50}}"), source="s")
    again = parse_spec(yaml.safe_load(yaml.safe_dump(first.model_dump(by_alias=True, exclude_none=True))), source="s")
    assert again.retrain == first.retrain


@pytest.mark.parametrize("text, seconds", [(30, 30), ("30s", 30), ("5m", 300), ("1.5h", 5400), ("7d", 604800),
                                           ("500ms", 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_a_failed_runs_reason_is_the_clis_error_line_not_rays_log(tmp_path):
    from rayline.retrain.loop import _tail

    log = tmp_path / "run.log"
    log.write_text("training...\n2026 ERROR streaming_executor_state.py:745 -- Operator failed\n"
                   "error: data.source.path: cannot read csv data 'x/data': column x1 is not a number\n\n")
    assert _tail(str(log)) == "error: data.source.path: cannot read csv data 'x/data': column x1 is not a number"
    log.write_text("a\nb\nKilled\n")
    assert _tail(str(log)) == "a | b | Killed" and _tail(str(tmp_path / "none.log")) == ""


def test_a_deploy_whose_version_spec_cannot_be_read_says_why_the_loop_did_not_start(tmp_path):
    """`rayline serve deploy` has deployed by then: a version it cannot read the spec of (here an
    unregistered model) is one line for the user, not a failed command."""
    from rayline.retrain.loop import start_for_version
    from rayline.workspace import workspace

    line = start_for_version("nomodel", "3", workspace(tmp_path / "ws").ensure())
    assert line.startswith("retrain loop of nomodel not started: version 3's spec could not be read: model 'nomodel' "
                           "version 3: not found in sqlite:"), line
    assert "\n" not in line and "Traceback" not in line
