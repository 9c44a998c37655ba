"""The retrain loop's decisions, as pure functions of what it has seen and its record: whether a
retrain is due and why, how long a failure backs off, and what a live canary's counts say. No Ray,
no MLflow, no clock of their own (`now` is passed in), so every branch is a table test
(tests/unit/test_retrain_decisions.py); rayline/retrain/loop.py gathers the inputs and acts.

The record is a plain dict (JSON in a registered-model tag, so a restarted loop reads it back):
    state            watching | retraining | canary | stopped
    drift_since      when the loop first saw the champion drifting (epoch s), None when it is not
    last_started     when the last retrain started (epoch s)
    next_schedule    when the schedule is next due (epoch s)
    tried            the source fingerprint the last retrain ran on (not retried on the same data)
    failures         retrains failed in a row; retry_after: no retrain before this (epoch s)
    current          the retrain or canary in flight: {id, trigger, detail, version, rollout, started}
    decisions        the most recent decisions, newest last: {at, decision, version, why}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Trigger", "due", "note_drift", "backoff_s", "canary_verdict", "new_record", "add_decision",
           "MAX_BACKOFF_S", "KEEP_DECISIONS", "MAX_FAILURES_SAME_DATA"]

MAX_BACKOFF_S = 24 * 3600.0  # a failing retrain is tried at least once a day
KEEP_DECISIONS = 10  # in the record (the registry's versions keep every judgement)
WHY_CHARS = 400
# Retrains failed in a row on the same data after which drift and the schedule no longer retry it:
# a failure that repeats on unchanged data (bad rows, a spec they no longer fit) waits for the data
# to change; a passing one (a node lost mid-run) had its retries.
MAX_FAILURES_SAME_DATA = 3


@dataclass(frozen=True)
class Trigger:
    kind: str  # drift | data_change | schedule
    detail: str  # one line: which features drifted and how much, which fingerprint, the schedule

    def to_dict(self) -> dict:
        return {"trigger": self.kind, "detail": self.detail}


def new_record(now: float, every: Optional[float]) -> dict:
    return {"state": "watching", "drift_since": None, "last_started": None,
            "next_schedule": (now + every) if every else None, "tried": None, "failures": 0, "retry_after": None,
            "current": None, "decisions": []}


def note_drift(record: dict, drifting: bool, now: float) -> None:
    """Remember since when the champion has been drifting (reset as soon as it is not)."""
    if not drifting:
        record["drift_since"] = None
    elif record.get("drift_since") is None:
        record["drift_since"] = now


def due(spec, record: dict, now: float, *, drift: Optional[dict], fingerprint: Optional[str],
        trained_on: Optional[str]) -> tuple[Optional[Trigger], str]:
    """(the trigger of a retrain due now, or None; a line saying what the loop waits for).

    `drift`: the champion's drift report ({status, features}) or None when none is published;
    `fingerprint`: the source's fingerprint now (None: unreadable); `trained_on`: the fingerprint
    of the data the champion was trained on (its registry tag)."""
    if record.get("state") not in (None, "watching"):
        return None, f"busy: {record.get('state')}"
    retry_after = record.get("retry_after")
    if retry_after and now < retry_after:
        return None, f"backing off after {record.get('failures', 0)} failed retrain(s): next try in {retry_after - now:.0f} s"
    last = record.get("last_started")
    if last is not None and now - last < spec.min_interval:
        return None, f"min_interval: next retrain possible in {spec.min_interval - (now - last):.0f} s"
    if "data_change" in spec.on and fingerprint and trained_on and fingerprint != trained_on \
            and fingerprint != record.get("tried"):
        return Trigger("data_change", f"the source changed (fingerprint {trained_on[:19]} -> {fingerprint[:19]})"), ""
    failures = int(record.get("failures") or 0)
    if failures >= MAX_FAILURES_SAME_DATA and fingerprint is not None and fingerprint == record.get("tried"):
        return None, (f"{failures} retrains in a row failed on this data: waiting for it to change (see the last "
                      "failed decision)")
    since = record.get("drift_since")
    if "drift" in spec.on and since is not None and now - since >= spec.drift_for:
        alerts = [f for f in (drift or {}).get("features") or () if f.get("level") == "alert"]
        named = ", ".join(f"{f['feature']} (psi {f.get('psi', 0):.2f})" for f in alerts[:5]) or "the answers"
        return Trigger("drift", f"drifting for {now - since:.0f} s: {named}"), ""
    if "schedule" in spec.on and record.get("next_schedule") is not None and now >= record["next_schedule"]:
        return Trigger("schedule", f"every {spec.every:g} s"), ""
    waiting = []
    if "drift" in spec.on:
        waiting.append(f"drifting for {now - since:.0f} of {spec.drift_for:g} s" if since is not None
                       else f"drift: {(drift or {}).get('status', 'no report')}")
    if "data_change" in spec.on:
        waiting.append("data unchanged" if fingerprint == trained_on or fingerprint == record.get("tried")
                       else "data: unknown fingerprint")
    if "schedule" in spec.on and record.get("next_schedule") is not None:
        waiting.append(f"schedule in {record['next_schedule'] - now:.0f} s")
    return None, "; ".join(waiting)


def backoff_s(failures: int, min_interval: float) -> float:
    """How long after the `failures`-th failure in a row the next retrain may start: min_interval,
    doubling with each failure, at most MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, max(min_interval, 1.0) * 2 ** max(failures - 1, 0))


def canary_verdict(canary, requests: int, errors: int, tripped: Optional[dict]) -> tuple[str, str]:
    """(promote | rolled_back | wait, why) for a live canary: the router's gate decides a rollback
    (`tripped`, per replica, at once); promotion needs `promote_after` requests within the error limit."""
    if tripped:
        return "rolled_back", f"the gate rolled it back: {tripped.get('detail') or tripped.get('limit')}"
    if requests >= canary.promote_after:
        rate = errors / requests if requests else 0.0
        if rate > canary.max_error_rate:  # every replica trips on its own; the sum can still be over
            return "rolled_back", (f"error rate {rate:.3f} over {requests} requests > max_error_rate "
                                   f"{canary.max_error_rate:g}")
        return "promote", f"{requests} requests, error rate {rate:.3f} <= {canary.max_error_rate:g}"
    return "wait", f"{requests} of {canary.promote_after} canary requests"


def add_decision(record: dict, now_iso: str, decision: str, why: str, version: Optional[str] = None) -> dict:
    entry = {"at": now_iso, "decision": decision, "version": version, "why": why[:WHY_CHARS]}
    record["decisions"] = (record.get("decisions") or [])[-(KEEP_DECISIONS - 1):] + [entry]
    return entry
