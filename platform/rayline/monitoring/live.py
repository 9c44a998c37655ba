"""Live monitoring on a serving replica: what a version receives and answers, against its
training statistics, over a sliding window shared by all its replicas.

On the request path a replica only copies the summarised raw columns of each request batch (the
compiled preprocessing's input, before any step: data/compiled.py's `tap`) and the model's outputs
into a queue: a few microseconds, no counting. A daemon thread drains the queue every
UPDATE_S, counts the rows vectorised (monitoring/drift.py's FeatureCounts: whole batches through
numpy and pandas), and keeps this replica's most recent rows as chunks. Every PUBLISH_S it
writes its window's counts to Ray's KV store under the version's prefix; the version's window is
the merge of every replica's fresh entry (one older than STALE_S is a replica gone), trimmed
chunk by chunk to `window_rows` rows in each replica.

From the merged window: drift per feature and of the predicted classes (drift.py), exported as
Prometheus gauges per model, version and feature (the same numbers on every replica), answered
at GET {route}/monitoring, and read by `rayline serve status`. When a feature alerts the version's
status becomes drifting and the replica logs one line naming the features; back within limits,
one line again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict

import numpy as np

from rayline.monitoring.drift import FeatureCounts, drift, prediction_bins
from rayline.monitoring.statistics import TrainingStatistics
from rayline.serve.kv_namespace import KV_NAMESPACE

__all__ = ["UPDATE_S", "PUBLISH_S", "STALE_S", "KV_PREFIX", "SlidingWindow", "LiveMonitor", "gather_window",
           "latest_report", "version_report", "monitor_predictor", "live_versions", "live_drift", "window_status"]

UPDATE_S = 0.5  # how often queued answers are counted
PUBLISH_S = 2.0  # how often a replica writes its window to the KV store (also a heartbeat)
STALE_S = 30.0  # a replica's entry older than this is left out (the replica stopped)
KV_PREFIX = "monitoring"

log = logging.getLogger("rayline.monitoring")


def _key_prefix(model: str, version: str) -> bytes:
    return f"{KV_PREFIX}:{model}:{version}:".encode()


class SlidingWindow:
    """The most recent rows' counts as chunks: adding a chunk drops the oldest ones while the rest
    still hold `max_rows` rows (so the window holds between max_rows and max_rows plus one chunk),
    and, with `max_seconds`, any chunk older than that (`expire`, each round: a quiet endpoint's
    window empties rather than judging yesterday's traffic)."""

    def __init__(self, max_rows: int, max_seconds: float | None = None):
        self.max_rows, self.max_seconds = max_rows, max_seconds
        self.chunks: deque = deque()  # (monotonic time added, counts)
        self.total = FeatureCounts()

    def add(self, counts: FeatureCounts, now: float | None = None) -> None:
        if not counts.rows and counts.predictions is None:
            return
        self.chunks.append((time.monotonic() if now is None else now, counts))
        self.total.merge(counts)
        while len(self.chunks) > 1 and self.total.rows - self.chunks[0][1].rows >= self.max_rows:
            self.total.subtract(self.chunks.popleft()[1])

    def expire(self, now: float | None = None) -> None:
        if self.max_seconds is None:
            return
        now = time.monotonic() if now is None else now
        while self.chunks and now - self.chunks[0][0] > self.max_seconds:
            self.total.subtract(self.chunks.popleft()[1])


class LiveMonitor:
    """One version's monitor in one replica process (serve/stack.py builds it)."""

    def __init__(self, statistics: TrainingStatistics, spec, model: str, version: str, feature_names: list[str],
                 kv: bool = True):
        self.statistics, self.spec = statistics, spec
        self.model, self.version = model, str(version)
        self.columns = [c for c in statistics.features if c in set(feature_names)]
        self.window = SlidingWindow(spec.window_rows, spec.window_seconds)
        self.seen = 0  # rows this replica answered since it started
        self._queue: deque = deque()  # (rows, numeric columns, categorical columns) per request batch
        self._outputs: deque = deque()  # the model's outputs per answered request
        self._numeric, self._numeric_index, self._categorical = [], np.zeros(0, np.intp), []
        self._kv = kv
        self._replica = _replica_id()
        self._status = "collecting"
        self._reference_published = False
        self._gauges = _Gauges(model, self.version) if kv else None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rayline-monitor-{model}-{version}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the request path

    def attach(self, compiled) -> "LiveMonitor":
        """Tap the version's compiled preprocessing (data/compiled.py): every request batch's raw
        columns, before any step runs, come to `observe_inputs`."""
        layout = compiled.layout
        self._numeric = [(name, layout.numeric.index(name)) for name in self.columns if name in layout.numeric]
        self._numeric_index = np.array([j for _, j in self._numeric], dtype=np.intp)
        self._categorical = [name for name in self.columns if name in layout.categorical]
        compiled.tap = self.observe_inputs
        return self

    def observe_inputs(self, batch) -> None:
        """A request's raw columns: the summarised ones copied (the steps then work in place) and
        queued. A few microseconds; counting happens on the thread."""
        num = batch.num[:, self._numeric_index] if len(self._numeric_index) else None  # fancy indexing: a copy
        cat = {name: np.array(batch.cat[name], dtype=object) for name in self._categorical}
        self._queue.append((len(batch), num, cat))

    def observe_outputs(self, outputs) -> None:
        """The model's outputs for an answered request (counted by the prediction reference's bins:
        predicted classes, or value bins)."""
        if self.statistics.predictions is not None:
            self._outputs.append(outputs)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        published = 0.0
        while not self._closed.wait(UPDATE_S):
            try:
                self.update()
                if self._kv and time.monotonic() - published >= PUBLISH_S:
                    published = time.monotonic()
                    self._publish()
                    self._judge(gather_window(self.model, self.version))
            except Exception:  # noqa: BLE001 - monitoring must never take the replica down
                log.exception("rayline: monitoring of %s v%s failed this round", self.model, self.version)

    def update(self) -> None:
        """Count what was queued since the last round into this replica's window: one numpy pass
        per summarised column over every request of the round."""
        self.window.expire()
        rows, nums, cats = 0, [], {name: [] for name in self._categorical}
        while self._queue:
            n, num, cat = self._queue.popleft()
            rows += n
            if num is not None:
                nums.append(num)
            for name, values in cat.items():
                cats[name].append(values)
        predicted, bins = [], 0
        while self._outputs:
            ids, bins = prediction_bins(self.statistics, self._outputs.popleft())
            predicted.append(ids)
        if not rows and not predicted:
            return
        stacked = np.concatenate(nums) if nums else None
        numeric = {name: stacked[:, i] for i, (name, _) in enumerate(self._numeric)} if stacked is not None else {}
        categorical = {name: np.concatenate(parts) for name, parts in cats.items() if parts}
        counts = FeatureCounts.of_columns(self.statistics, rows, numeric, categorical)
        if predicted:
            counts.add_predictions(np.concatenate(predicted), bins)
        self.seen += rows
        self.window.add(counts)
        if not self._kv:
            self._judge(self.window.total)

    def _publish(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        if not self._reference_published:  # once: what `rayline report --live` judges the window against
            reference = {"statistics": self.statistics.to_dict(), "thresholds": asdict(self.spec.thresholds()),
                         "window_size": self.spec.window_rows, "min_rows": self.spec.min_rows}
            _internal_kv_put(_reference_key(self.model, self.version), json.dumps(reference).encode(),
                             overwrite=True, namespace=KV_NAMESPACE)
            self._reference_published = True
        entry = {"time": time.time(), "seen": self.seen, "window": self.window.total.to_dict()}
        _internal_kv_put(_key_prefix(self.model, self.version) + self._replica.encode(), json.dumps(entry).encode(),
                         overwrite=True, namespace=KV_NAMESPACE)

    def _judge(self, counts: FeatureCounts) -> None:
        report = version_report(self.statistics, counts, self.spec, self.model, self.version)
        before, self._status = self._status, report["status"]
        if self._kv:  # for `rayline serve status`, which has no training statistics at hand
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(_report_key(self.model, self.version), json.dumps({**report, "time": time.time()}).encode(),
                             overwrite=True, namespace=KV_NAMESPACE)
        if self._gauges is not None:
            self._gauges.set(report)
        if self._status == "drifting" and before != "drifting":
            named = ", ".join(f"{f['feature']} ({'; '.join(f['reasons'])})" for f in report["features"]
                              if f["level"] == "alert")
            log.warning("rayline: model %s v%s is drifting: %s", self.model, self.version, named)
        elif before == "drifting" and self._status != "drifting":
            log.warning("rayline: model %s v%s is back within its drift limits", self.model, self.version)

    # ------------------------------------------------------------ reading

    def report(self) -> dict:
        """The version's drift over the merged window (GET /monitoring), read now."""
        counts = gather_window(self.model, self.version) if self._kv else self.window.total
        return version_report(self.statistics, counts, self.spec, self.model, self.version)

    def close(self) -> None:
        """The version left this replica: stop counting, withdraw its entry and zero its gauges."""
        self._closed.set()
        if self._gauges is not None:
            self._gauges.close()
        if self._kv:
            try:
                from ray.experimental.internal_kv import _internal_kv_del

                _internal_kv_del(_key_prefix(self.model, self.version) + self._replica.encode(), namespace=KV_NAMESPACE)
            except Exception:  # noqa: BLE001 - Ray shutting down: the entry goes stale and is left out
                pass


def monitor_predictor(predictor, version: str, spec, kv: bool):
    """The LiveMonitor of a served version, attached to its preprocessing; None when
    `serve.monitoring` is off or the version has no training statistics."""
    if not spec.enabled or predictor.statistics is None:
        return None
    monitor = LiveMonitor(predictor.statistics, spec, predictor.name, version,
                          [f.name for f in predictor.preprocessing.features], kv=kv)
    return monitor.attach(predictor.preprocessing.compiled)


def _reference_key(model: str, version: str) -> bytes:
    return f"{KV_PREFIX}-reference:{model}:{version}".encode()


def live_versions(model: str) -> list[str]:
    """The versions of `model` whose replicas published a window within STALE_S, in version order."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    prefix, found, now = f"{KV_PREFIX}:{model}:".encode(), set(), time.time()
    for key in _internal_kv_list(prefix, namespace=KV_NAMESPACE):
        version = key[len(prefix):].split(b":", 1)[0].decode()
        if version in found:
            continue
        raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw is not None and now - json.loads(raw)["time"] <= STALE_S:
            found.add(version)
    return sorted(found, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))


def live_drift(model: str, version: str):
    """(drift per feature and of the answers, the merged window, the judging settings) of a served
    version's live window, as its replicas judge it; None when no replica published its reference."""
    from ray.experimental.internal_kv import _internal_kv_get

    from rayline.monitoring.drift import Thresholds

    raw = _internal_kv_get(_reference_key(model, version), namespace=KV_NAMESPACE)
    if raw is None:
        return None
    reference = json.loads(raw)
    statistics = TrainingStatistics.from_dict(reference["statistics"])
    counts = gather_window(model, version)
    drifts = drift(statistics, counts, Thresholds(**reference["thresholds"])) if counts.rows else []
    return drifts, counts, reference


def _report_key(model: str, version: str) -> bytes:
    return f"{KV_PREFIX}-report:{model}:{version}".encode()


def latest_report(model: str, version: str) -> dict | None:
    """The version's drift report as its replicas last judged it (within STALE_S), or None."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_report_key(model, version), namespace=KV_NAMESPACE)
    if raw is None:
        return None
    report = json.loads(raw)
    return report if time.time() - report.pop("time", 0) <= STALE_S else None


def gather_window(model: str, version: str) -> FeatureCounts:
    """The version's window: every replica's fresh entry in the KV store, merged."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    merged, now = FeatureCounts(), time.time()
    for key in _internal_kv_list(_key_prefix(model, version), namespace=KV_NAMESPACE):
        raw = _internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw is None:
            continue
        entry = json.loads(raw)
        if now - entry["time"] <= STALE_S:
            merged.merge(FeatureCounts.from_dict(entry["window"]))
    return merged


def window_status(drifts: list, rows: int, min_rows: int) -> str:
    """collecting (fewer than min_rows rows) | drifting (a feature alerts) | warn | ok."""
    if rows < min_rows:
        return "collecting"
    levels = {d.level for d in drifts}
    return "drifting" if "alert" in levels else "warn" if "warn" in levels else "ok"


def version_report(statistics: TrainingStatistics, counts: FeatureCounts, spec, model: str, version: str) -> dict:
    """{status: collecting | ok | warn | drifting, window_rows, features: [...largest PSI first]}."""
    drifts = drift(statistics, counts, spec.thresholds()) if counts.rows else []
    status = window_status(drifts, counts.rows, spec.min_rows)
    return {
        "model": model, "version": str(version), "status": status, "window_rows": counts.rows,
        "window_size": spec.window_rows, "min_rows": spec.min_rows,
        "thresholds": {"psi_warn": spec.psi_warn, "psi_alert": spec.psi_alert, "max_null_share": spec.max_null_share,
                       "max_unseen_share": spec.max_unseen_share,
                       "max_out_of_range_share": spec.max_out_of_range_share},
        "features": [{"feature": d.name, "kind": d.kind, "psi": round(d.psi, 6), "noise_psi": round(d.noise_psi, 6),
                      "null_share": round(d.null_share, 6),
                      "train_null_share": round(d.train_null_share, 6),
                      ("unseen_share" if d.kind == "categorical" else "out_of_range_share"): round(d.outside_share, 6),
                      "level": d.level if status != "collecting" else "collecting", "reasons": d.reasons}
                     for d in drifts],
    }


class _Gauges:
    """The drift numbers as Prometheus gauges (Ray's metrics export): per feature PSI, null share
    and out-of-range or unseen share, and per version the alerting features and window rows.
    Re-set every round (Ray drops a gauge series not re-reported for two export intervals)."""

    def __init__(self, model: str, version: str):
        from ray.serve.metrics import Gauge

        from rayline.serve.metrics import METRIC_NAMES

        tags = ("model", "version", "feature")
        self.psi = Gauge(METRIC_NAMES["drift_psi"], "Population stability index of a feature's live values (or the "
                                                    "predictions) against training.", tag_keys=tags)
        self.nulls = Gauge(METRIC_NAMES["drift_nulls"], "Share of missing values of a feature in the live window.",
                           tag_keys=tags)
        self.outside = Gauge(METRIC_NAMES["drift_outside"], "Share of a feature's live values outside the training "
                                                            "range, or of categories training never saw.", tag_keys=tags)
        self.alerts = Gauge(METRIC_NAMES["drift_alerts"], "Features of the version alerting now (status drifting when "
                                                          "> 0).", tag_keys=("model", "version"))
        self.rows = Gauge(METRIC_NAMES["drift_window"], "Rows in the version's monitoring window.",
                          tag_keys=("model", "version"))
        self.base = {"model": model, "version": version}
        self.features: set[str] = set()

    def set(self, report: dict) -> None:
        for f in report["features"]:
            tags = {**self.base, "feature": f["feature"]}
            self.psi.set(f["psi"], tags=tags)
            self.nulls.set(f["null_share"], tags=tags)
            self.outside.set(f.get("unseen_share", f.get("out_of_range_share", 0.0)), tags=tags)
            self.features.add(f["feature"])
        self.alerts.set(sum(f["level"] == "alert" for f in report["features"]), tags=self.base)
        self.rows.set(report["window_rows"], tags=self.base)

    def close(self) -> None:
        self.alerts.set(0, tags=self.base)
        self.rows.set(0, tags=self.base)


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (tests, in-process use)
        return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
