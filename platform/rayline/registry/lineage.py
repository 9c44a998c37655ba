"""A registered version's lineage, for `rayline models show NAME [--version N]`: the data it
learned from, the pipeline run, the trial and checkpoint that won, its metrics, and the
deployments that gave it traffic.

Everything is read from MLflow: the version's tags (written at registration by the runner:
data_source, data_fingerprint, data_cache_key, experiment, trial_id, checkpoint; and on each
deployment by rayline/serve: registry.DEPLOYMENTS_TAG), its run (status, valid_*/test_*
metrics), and checked against the workspace: is the data cache entry still there
(`rayline cache prune` removes entries), is the checkpoint, what does the run record say. A
version registered before a tag existed shows it as unknown: nothing here fails on a missing
or malformed tag, or on a run, record or checkpoint that is gone.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

__all__ = ["Lineage", "lineage", "lineage_lines", "deployment_text", "judgement_text"]

UNKNOWN = "unknown"


@dataclass
class Lineage:
    name: str
    version: str
    created: str  # UTC, ISO 8601
    framework: str = ""
    task: str = ""
    aliases: list = field(default_factory=list)
    data_source: Optional[str] = None
    fingerprint: Optional[str] = None
    cache_key: Optional[str] = None
    cache_entry: Optional[str] = None  # where the cache entry is (or was)
    cache_present: Optional[bool] = None  # None: cannot tell (no key, or a workspace on object storage)
    run_id: str = ""
    run_name: Optional[str] = None
    run_status: Optional[str] = None  # MLflow's; None when the run is gone
    experiment: Optional[str] = None  # the run's folder under the workspace's runs dir
    record_status: Optional[str] = None  # the run record's (running, interrupted, failed, registered)
    trial_id: Optional[str] = None
    checkpoint: Optional[str] = None
    checkpoint_present: Optional[bool] = None
    metrics: dict = field(default_factory=dict)  # valid_* and test_*
    deployments: list = field(default_factory=list)  # oldest first
    judgement: Optional[dict] = None  # against the champion, when judged (rayline/retrain/judge.py)
    retrain: Optional[dict] = None  # why the retrain loop made it: {id, trigger, detail} (rayline/retrain/loop.py)

    def to_dict(self) -> dict:
        return asdict(self)


def _exists(location: str) -> Optional[bool]:
    """Whether a directory or object prefix is there; None when that cannot be asked (credentials
    masked in a recorded URI, storage unreachable)."""
    from rayline.storage import is_uri

    if not is_uri(location):
        return os.path.isdir(location)
    try:
        from rayline.storage import exists

        return exists(location)
    except Exception:  # noqa: BLE001 - a lookup, not the command's purpose: say "cannot tell"
        return None


def _record_status(ws, experiment: str) -> Optional[str]:
    try:
        from rayline.pipeline.record import RECORD_FILE
        from rayline.storage import join, read_json

        record = read_json(join(ws.runs_dir, experiment, RECORD_FILE))
    except Exception:  # noqa: BLE001 - storage unreachable: the record's status is unknown
        return None
    return str(record.get("status")) if isinstance(record, dict) and record.get("status") else None


def lineage(ws, name: str, version: Optional[str] = None) -> Lineage:
    """The lineage of version `version` of model `name` (default: the newest) in workspace `ws`;
    a one-line RegistryError for an unknown model (naming the registered ones) or version
    (naming the model's versions)."""
    from rayline.registry import RETRAIN_TAG, Registry, deployments_of

    registry = Registry(ws)
    mv, run = registry.version_details(name, version)
    tags = dict(mv.tags or {})
    metrics = {k: v for k, v in (run.data.metrics if run else {}).items() if k.startswith(("valid_", "test_"))}
    out = Lineage(
        name=name, version=str(mv.version),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((mv.creation_timestamp or 0) / 1000)),
        framework=tags.get("framework", ""), task=tags.get("task", ""), aliases=sorted(getattr(mv, "aliases", None) or []),
        data_source=tags.get("data_source") or None, fingerprint=tags.get("data_fingerprint") or None,
        cache_key=tags.get("data_cache_key") or None, run_id=mv.run_id or "",
        run_name=run.info.run_name if run else None, run_status=run.info.status if run else None,
        experiment=tags.get("experiment") or None, trial_id=tags.get("trial_id") or None,
        checkpoint=tags.get("checkpoint") or None, metrics=dict(sorted(metrics.items())),
        deployments=deployments_of(tags), judgement=_judgement(tags), retrain=_json_tag(tags, RETRAIN_TAG),
    )
    if out.cache_key:
        from rayline.data.cache import DataCache

        cache = DataCache.of(ws)
        out.cache_entry, out.cache_present = str(cache.location(out.cache_key)), cache.has(out.cache_key)
    if out.checkpoint:
        out.checkpoint_present = _exists(out.checkpoint)
    if out.experiment:
        out.record_status = _record_status(ws, out.experiment)
    return out


def _judgement(tags: dict) -> Optional[dict]:
    from rayline.registry import JUDGEMENT_TAG

    return _json_tag(tags, JUDGEMENT_TAG)


def _json_tag(tags: dict, key: str) -> Optional[dict]:
    try:
        entry = json.loads(tags.get(key) or "null")
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def judgement_text(entry: dict) -> str:
    """`challenger of version 1 by accuracy on 1797 rows (digits.csv): 0.9410 vs 0.9520, gain -0.0110, needed
    >= +0.0000: does not qualify (2026-11-28T16:50:00Z)`; tolerant of missing keys."""
    def score(key):
        value = entry.get(key)
        return f"{value:.4f}" if isinstance(value, (int, float)) else UNKNOWN

    verdict = {True: "qualifies", False: "does not qualify"}.get(entry.get("qualifies"), UNKNOWN)
    return (f"challenger of version {entry.get('champion', UNKNOWN)} by {entry.get('metric', UNKNOWN)} on "
            f"{entry.get('rows', UNKNOWN)} rows ({entry.get('data', UNKNOWN)}): {score('challenger_score')} vs "
            f"{score('champion_score')}, gain {entry['gain']:+.4f}, needed >= {entry['min_delta']:+.4f}: {verdict} "
            f"({entry.get('time', UNKNOWN)})" if isinstance(entry.get("gain"), (int, float))
            and isinstance(entry.get("min_delta"), (int, float)) else f"{verdict} ({entry.get('time', UNKNOWN)})")


def deployment_text(entry: dict) -> str:
    """One deployment as a line: `2026-11-26T10:00:00Z deploy: canary 10% at /digits (app digits-v2,
    gate max_p99_ms 50)`; tolerant of missing keys (a record written by hand or by an older rayline)."""
    percent = entry.get("percent")
    share = f" {percent}%" if percent is not None else ""
    details = [f"app {entry['app']}"] if entry.get("app") else []
    if entry.get("url"):
        details.append(str(entry["url"]))
    gate = entry.get("gate")
    if isinstance(gate, dict) and any(v is not None for v in gate.values()):
        details.append("gate " + ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                                           for k, v in gate.items() if v is not None))
    return (f"{entry.get('at', UNKNOWN)} {entry.get('action', 'deploy')}: {entry.get('role', 'serving')}{share} "
            f"at {entry.get('route', UNKNOWN)}" + (f" ({'; '.join(details)})" if details else ""))


def _present(flag: Optional[bool], yes: str, no: str) -> str:
    return yes if flag else no if flag is not None else "cannot tell whether it is still there"


def lineage_lines(item: Lineage) -> list[str]:
    """The chain as lines of `label: value`, a continued value indented under its label."""
    lines: list[str] = []

    def add(label: str, *values: str) -> None:
        for i, value in enumerate(values):
            lines.append(f"{(label + ':') if i == 0 else '':<13}{value}")

    about = ", ".join(x for x in (item.framework, item.task) if x)
    aliases = f"; aliases: {', '.join(item.aliases)}" if item.aliases else ""
    add("model", f"{item.name} version {item.version} (registered {item.created}{', ' + about if about else ''}{aliases})")
    if item.cache_key:
        where = f" ({_present(item.cache_present, 'entry present', 'entry gone')}: {item.cache_entry})" \
            if item.cache_entry else " (no data cache in a workspace on object storage)"
        cache = f"cache key {item.cache_key}{where}"
    else:
        cache = f"cache key -: {'the run did not use the data cache' if item.fingerprint else UNKNOWN}"
    add("data", f"source {item.data_source or UNKNOWN}", f"fingerprint {item.fingerprint or UNKNOWN}", cache)
    run = f"MLflow run {item.run_id} ({item.run_status or 'gone from MLflow'})" if item.run_id else f"MLflow run {UNKNOWN}"
    record = f" (run record: {item.record_status or 'not found'})" if item.experiment else ""
    add("run", run, f"experiment {item.experiment or UNKNOWN}{record}")
    add("trial", item.trial_id or UNKNOWN)
    add("checkpoint", f"{item.checkpoint} ({_present(item.checkpoint_present, 'exists', 'gone')})"
        if item.checkpoint else UNKNOWN)
    groups = [", ".join(f"{k} {v:.4f}" for k, v in item.metrics.items() if k.startswith(prefix))
              for prefix in ("valid_", "test_")]
    add("metrics", *([g for g in groups if g] or ["none recorded"]))
    add("deployments", *([deployment_text(d) for d in item.deployments] or ["none recorded"]))
    if item.retrain:
        add("retrained", f"by the retrain loop on {item.retrain.get('trigger', UNKNOWN)}: {item.retrain.get('detail', UNKNOWN)}")
    if item.judgement:
        add("judged", judgement_text(item.judgement))
    return lines
