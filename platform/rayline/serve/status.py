"""What is served on the connected Ray cluster: `rayline serve status [NAME]`.

Two sources, both cheap and neither touching a replica's request path:
- Serve's controller: applications, routes, status, replicas (running / target) and the
  autoscaling bounds (min / max);
- the Prometheus export of each node's Ray metrics agent: the model and version each
  application serves (`rayline_model_info`, one per live replica) and its request and error
  counts since its replicas started (rayline/serve/metrics.py). Ray exports metrics every
  `metrics_report_interval_ms` (10 s by default), so counts lag the traffic by up to ~10 s.

Also `deployment_failure(app)`: the rayline error a failed replica constructor raised
(Serve's own exception says only "Failed to update the deployments").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from rayline.errors import ServeError
from rayline.serve.details import serve_details

__all__ = ["AppStatus", "ServeStatusReport", "connect_existing", "gather_status", "scrape_model_metrics"]


def connect_existing(ws, address: Optional[str] = None):
    """Join the named cluster (else RAY_ADDRESS, else the head `rayline cluster up` recorded,
    else the Ray running on this machine); never start one, which would serve nothing.

    An address where no Ray head answers fails within seconds (rayline.cluster.probe, inside
    `connect`): `ray.init` would retry for minutes (measured: still waiting after 10 min for 127.0.0.1:1).
    """
    import os

    from rayline.cluster.connection import recorded_head, connect

    address = address or os.environ.get("RAY_ADDRESS") or recorded_head(ws) or "auto"
    return connect(ws, address)


@dataclass
class AppStatus:
    name: str
    route: Optional[str]
    status: str
    message: str
    model: Optional[str] = None  # from the replicas' metrics; None for non-rayline apps (or before the first export)
    versions: list[str] = field(default_factory=list)
    replicas_running: int = 0
    replicas_target: int = 0
    replicas_min: Optional[int] = None  # None: a fixed replica count, no autoscaling
    replicas_max: Optional[int] = None
    requests: Optional[int] = None  # since the replicas started; None: metrics not reachable
    errors: Optional[int] = None
    requests_by_code: dict[str, int] = field(default_factory=dict)
    rows_predicted: Optional[int] = None
    rollout: Optional[dict] = None  # a routed model's split, canary gate and gate rollback (rayline/serve/versions.py)
    # version -> its drift report as its replicas last judged it (rayline/monitoring/live.py)
    monitoring: dict = field(default_factory=dict)
    retrain: Optional[dict] = None  # a routed model's retrain loop: its state and last decision (rayline/retrain/loop.py)


@dataclass
class ServeStatusReport:
    applications: list[AppStatus]
    metrics_note: Optional[str] = None  # why counts are missing, when they are

    def to_dict(self) -> dict:
        return {"applications": [asdict(a) for a in self.applications], "metrics_note": self.metrics_note}


_SAMPLES = {
    "ray_rayline_requests_total": "requests",
    "ray_rayline_errors_total": "errors",
    "ray_rayline_rows_predicted_total": "rows",
    "ray_rayline_model_info": "info",
}


def scrape_model_metrics(timeout_s: float = 3.0) -> tuple[dict[str, dict], Optional[str]]:
    """rayline's metrics summed over every alive node, per Serve application:
    {app: {"model", "versions", "requests", "errors", "by_code", "rows"}}, and a note naming
    the nodes whose metrics could not be read (None when all were)."""
    import httpx
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    per_app: dict[str, dict] = {}
    unreachable = []
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("MetricsExportPort")]
    for node in nodes:
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        try:
            text = httpx.get(url, timeout=timeout_s).text
        except httpx.HTTPError:
            unreachable.append(url)
            continue
        # Only our lines: the export holds hundreds of Ray's own series.
        ours = "\n".join(line for line in text.splitlines() if "rayline_" in line)
        for family in text_string_to_metric_families(ours + "\n"):
            for sample in family.samples:
                kind = _SAMPLES.get(sample.name)
                app = sample.labels.get("application")
                if kind is None or app is None:
                    continue
                entry = per_app.setdefault(app, {"model": None, "versions": {}, "requests": 0, "errors": 0, "by_code": {}, "rows": 0})
                value = int(round(sample.value))
                if kind == "info":
                    entry["model"] = sample.labels.get("model")
                    version = sample.labels.get("version", "?")
                    entry["versions"][version] = entry["versions"].get(version, 0) + value
                elif kind == "requests":
                    entry["requests"] += value
                    code = sample.labels.get("code", "?")
                    entry["by_code"][code] = entry["by_code"].get(code, 0) + value
                elif kind == "errors":
                    entry["errors"] += value
                else:
                    entry["rows"] += value
    note = None
    if not nodes:
        note = "no node exports Ray metrics (was Ray started with metrics export turned off?)"
    elif unreachable:
        note = f"metrics of {len(unreachable)} of {len(nodes)} node(s) not reachable from here ({unreachable[0]})"
    return per_app, note


def gather_status(name: Optional[str] = None, *, with_metrics: bool = True, ws=None) -> ServeStatusReport:
    """The Serve applications of the connected cluster (or only `name`), with replica counts,
    autoscaling bounds and, from the metrics export, model, versions and request counts."""
    apps = serve_details().get("applications") or {}
    if name is not None and name not in apps:
        running = ", ".join(sorted(apps)) or "none"
        raise ServeError(f"no Serve application named {name!r} on this cluster (got {name!r}; running: {running})")
    metrics, note = scrape_model_metrics() if with_metrics else ({}, "metrics not read")
    out = []
    for app_name in sorted(apps) if name is None else [name]:
        details = apps[app_name]
        status = AppStatus(name=app_name, route=details.get("route_prefix"), status=_text(details.get("status")),
                           message=(details.get("message") or "").strip())
        for dep in (details.get("deployments") or {}).values():
            config = dep.get("deployment_config") or {}
            autoscaling = config.get("autoscaling_config")
            status.replicas_running += sum(1 for r in dep.get("replicas") or () if r.get("state") == "RUNNING")
            status.replicas_target += int(dep.get("target_num_replicas") or 0)
            if autoscaling:
                status.replicas_min = (status.replicas_min or 0) + int(autoscaling.get("min_replicas") or 0)
                status.replicas_max = (status.replicas_max or 0) + int(autoscaling.get("max_replicas") or 0)
            if _text(dep.get("status")) not in ("None", "HEALTHY") and dep.get("message") and not status.message:
                status.message = dep["message"].strip().splitlines()[-1]
        found = metrics.get(app_name)
        if found:
            status.model = found["model"]
            status.versions = sorted(found["versions"], key=lambda v: (len(v), v))
            status.requests, status.errors = found["requests"], found["errors"]
            status.requests_by_code, status.rows_predicted = dict(sorted(found["by_code"].items())), found["rows"]
        elif note is None:
            status.requests, status.errors = 0, 0  # reachable, nothing recorded yet
        if not status.versions:
            args = ((details.get("deployed_app_config") or {}).get("args") or {})  # `serve deploy` configs
            if args.get("name"):
                status.model = status.model or args["name"]
                status.versions = [str(args.get("version") or "latest")]
        if not status.versions:
            from rayline.serve.app_models import app_model

            recorded = app_model(app_name)  # what its replicas load, before any metrics export
            if recorded:
                status.model = status.model or recorded["model"]
                status.versions = [recorded["version"]]
        if f"{app_name}-router" in (details.get("deployments") or {}):
            from rayline.serve.routing_table import rollout_state

            status.rollout = rollout_state(app_name, ws)  # with ws, a gate rollback also drops the canary alias
            status.model = status.model or app_name
            if status.rollout:
                status.versions = sorted(status.rollout.get("weights") or {}, key=int)
            # A loop Ray is restarting is waited for briefly: status answers, the loop's line may be missing.
            status.retrain = _loop_status(app_name)
        if status.model:
            from rayline.monitoring.live import latest_report

            for version in status.versions:
                report = latest_report(status.model, version)
                if report is not None:
                    status.monitoring[version] = report
        out.append(status)
    return ServeStatusReport(out, note)


def _loop_status(name: str) -> Optional[dict]:
    from ray.exceptions import GetTimeoutError, RayActorError

    from rayline.retrain.loop import loop_status

    try:
        return loop_status(name, restart_wait_s=5.0)
    except (RayActorError, GetTimeoutError):
        return None


def _text(value) -> str:
    """An enum from Serve's details (ApplicationStatus.RUNNING) as its value ("RUNNING")."""
    return str(getattr(value, "value", value))
