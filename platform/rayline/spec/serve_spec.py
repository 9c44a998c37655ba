"""The spec's `serve:` section: the route, replicas and their resources, batching, limits, a canary,
API keys.
"""

from __future__ import annotations

import re
from typing import Optional

from pydantic import Field, field_validator, model_validator

from rayline.monitoring.drift import Thresholds
from rayline.spec.common import Strict
from rayline.spec.problems import problem

__all__ = ["ReplicasSpec", "ResourcesSpec", "BatchingSpec", "CanarySpec", "AuthSpec", "MonitoringSpec", "ServeSpec"]


class ReplicasSpec(Strict):
    min: int = Field(1, ge=0, description="Fewest replicas (0 scales to zero).")
    max: int = Field(1, ge=1, description="Most replicas.")
    target_ongoing_requests: float = Field(2, gt=0, description="Autoscaling target per replica.")
    upscale_delay_s: float = Field(30.0, ge=0, description="Load must stay above target this long before a replica is added (Ray Serve's default).")
    downscale_delay_s: float = Field(600.0, ge=0, description="Load must stay below target this long before a replica is removed (Ray Serve's default).")
    look_back_period_s: float = Field(30.0, gt=0, description="Window the load is averaged over (Ray Serve's default).")
    cpus: Optional[float] = Field(None, gt=0, description="Deprecated: use serve.resources_per_replica.cpus.")

    @model_validator(mode="after")
    def _bounds(self):
        if self.max < self.min:
            raise problem("max", "must be >= min", got=f"max={self.max}, min={self.min}")
        return self


class ResourcesSpec(Strict):
    cpus: float = Field(0.25, ge=0, description="Logical CPUs each replica reserves (fractions allowed).")
    gpus: float = Field(0.0, ge=0, description="GPUs each replica reserves (fractions share one GPU).")

    @model_validator(mode="after")
    def _something(self):
        if self.cpus == 0 and self.gpus == 0:
            raise problem("", "a replica must reserve some CPU or GPU", got="cpus: 0, gpus: 0",
                          allowed="cpus > 0 or gpus > 0")
        return self


class BatchingSpec(Strict):
    """Dynamic batching: concurrent requests' rows merged into one model call (Ray Serve's @serve.batch)."""

    enabled: bool = Field(True, description="false: every request calls the model alone.")
    # On by default: measured a tie for the digits MLP on 2 cores (figures in
    # rayline/serve/batching.py); merged model calls should pay where the model call is the cost.
    max_batch_size: int = Field(64, ge=1, le=100_000, description="Most rows in one model call.")
    wait_timeout_ms: float = Field(2.0, ge=0, le=10_000, description="Longest a request waits for others to join its batch.")

    @model_validator(mode="before")
    @classmethod
    def _flag(cls, v):
        # `batching: false` / `batching: true` as a shorthand.
        return {"enabled": v} if isinstance(v, bool) else v


class CanarySpec(Strict):
    """Deploy the run's winner as a canary beside the champion, with an automatic rollback gate."""

    percent: int = Field(10, ge=1, le=99, description="Percent of the route's traffic the canary gets (the champion the rest).")
    max_error_rate: Optional[float] = Field(
        None, ge=0, le=1, description="Canary error rate (5xx and failed calls; 4xx are the client's) above which traffic returns to the champion.")
    max_p99_ms: Optional[float] = Field(None, gt=0, description="Canary p99 latency (ms, at the router) above which traffic returns to the champion.")
    min_requests: int = Field(100, ge=1, description="Canary requests seen before the limits are checked.")

    def gate(self) -> Optional[dict]:
        """The router's gate limits, or None when no limit is set."""
        if self.max_error_rate is None and self.max_p99_ms is None:
            return None
        return {"max_error_rate": self.max_error_rate, "max_p99_ms": self.max_p99_ms, "min_requests": self.min_requests}


_THRESHOLDS = Thresholds()  # the drift limits' defaults, one place for batch scoring and the spec


class MonitoringSpec(Strict):
    """Each replica compares what it receives and answers with the version's training statistics
    over a sliding window (rayline/monitoring): drift per feature as metrics, in `serve status`
    and at GET {route}/monitoring."""

    enabled: bool = Field(True, description="false: no counting, no drift metrics, /monitoring answers 404.")
    window_rows: int = Field(10_000, ge=100, le=10_000_000, description="Rows of the sliding window drift is judged "
                                                                        "over (the most recent, all replicas together).")
    window_seconds: Optional[float] = Field(
        None, gt=0, description="Also leave out rows older than this (e.g. 900: the last 15 minutes); default: the "
                                "window is the most recent window_rows rows however old.")
    min_rows: int = Field(500, ge=1, description="Rows the window needs before drift is judged (status: collecting).")
    psi_warn: float = Field(_THRESHOLDS.psi_warn, gt=0, description="Population stability index from which a feature is flagged warn.")
    psi_alert: float = Field(_THRESHOLDS.psi_alert, gt=0, description="... and alert: the version's status becomes drifting.")
    max_null_share: Optional[float] = Field(
        None, ge=0, le=1, description="Share of missing values above which a feature alerts; default: its share in "
                                      "training plus 0.05.")
    max_unseen_share: float = Field(_THRESHOLDS.max_unseen_share, ge=0, le=1, description="Share of categories never seen in training above "
                                                                 "which a categorical feature alerts.")
    max_out_of_range_share: float = Field(_THRESHOLDS.max_out_of_range_share, ge=0, le=1, description="Share of values outside the training range "
                                                                       "above which a numeric feature alerts.")

    @model_validator(mode="before")
    @classmethod
    def _flag(cls, v):
        # `monitoring: false` / `monitoring: true` as a shorthand.
        return {"enabled": v} if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _levels(self):
        if self.psi_warn >= self.psi_alert:
            raise problem("psi_warn", "must be below psi_alert", got=f"{self.psi_warn:g} >= {self.psi_alert:g}",
                          allowed=f"< {self.psi_alert:g}")
        if self.min_rows > self.window_rows:
            raise problem("min_rows", "more than the window holds", got=f"{self.min_rows} > {self.window_rows}",
                          allowed=f"<= window_rows ({self.window_rows})")
        return self

    def thresholds(self) -> Thresholds:
        return Thresholds(psi_warn=self.psi_warn, psi_alert=self.psi_alert, max_null_share=self.max_null_share,
                          max_unseen_share=self.max_unseen_share, max_out_of_range_share=self.max_out_of_range_share)


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AuthSpec(Strict):
    """Where the replicas find the API keys; the spec never holds a key itself."""

    api_keys_env: Optional[str] = Field(
        None, description="Environment variable of the Ray nodes holding comma-separated keys (read by each replica).")
    api_keys_file: Optional[str] = Field(
        None, description="File with one key per line (# comments allowed), readable where the replicas run; "
                          "relative to the spec file.")

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, v):
        if v is not None and not _ENV_NAME_RE.match(v):
            # Do not echo it: a value that is not a variable name may be a key pasted by mistake.
            raise problem("", "not an environment variable name", got="a value that is not shown",
                          allowed="letters, digits and '_', not starting with a digit, e.g. RAYLINE_API_KEYS")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("api_keys_env", "api_keys_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise problem("", "give exactly one of api_keys_env or api_keys_file", got=str(given or "neither"),
                          allowed="api_keys_env: VAR or api_keys_file: PATH")
        if self.api_keys_file is not None and not self.api_keys_file.strip():
            raise problem("api_keys_file", "empty path", got="''", allowed="a file path")
        return self


class ServeSpec(Strict):
    route: Optional[str] = Field(None, description="HTTP route prefix; default /<name>.")
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    resources_per_replica: ResourcesSpec = Field(default_factory=ResourcesSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    max_instances: int = Field(10_000, ge=1, description="Most instances accepted in one request.")
    max_ongoing_requests: int = Field(64, ge=1, description="Requests one replica works on at once (batching needs >= max_batch_size requests to fill a batch).")
    max_queued_requests: int = Field(256, ge=-1, description="Requests waiting for a replica before new ones get 429 with Retry-After (-1: no limit).")
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds on a 429.")
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="Largest request body; larger ones get 413 before parsing.")
    request_timeout_s: float = Field(60.0, gt=0, description="A request still unanswered after this long gets 504.")
    oip: bool = Field(True, description="Serve the Open Inference Protocol (KServe V2) for this model at /v2/models/<name> from replicas of its own that hold the model, as the route's do (one hop, like /predict); false: /v2 still answers through the shared rayline-v2 application, one hop more, and saves a replica.")
    drain_timeout_s: float = Field(20.0, ge=0, description="When a replica stops (SIGTERM of `rayline run`, a scale-down, a redeploy): how long its in-flight requests may take to finish. Keep it below the pod's terminationGracePeriodSeconds (Kubernetes' default 30 s).")
    auth: Optional[AuthSpec] = Field(None, description="API keys required on every route but GET /health.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Drift of live traffic against "
                                       "the training statistics, per feature (`monitoring: false` turns it off).")
    canary: Optional[CanarySpec] = Field(
        None, description="`rayline run` deploys the winner as a canary (percent of traffic, rollback limits) instead of the new champion.")

    @field_validator("route")
    @classmethod
    def _route(cls, v):
        if v is not None and (not v.startswith("/") or v == "/" or v.endswith("/") or " " in v):
            raise problem("", "must start with '/', not end with '/', and hold no spaces", got=repr(v),
                          allowed="e.g. /digits")
        return v

    @model_validator(mode="after")
    def _deprecated_replica_cpus(self):
        # `replicas.cpus` (before resources_per_replica existed) still works and moves over.
        cpus = self.replicas.cpus
        if cpus is not None:
            if "resources_per_replica" in self.model_fields_set and self.resources_per_replica.cpus != cpus:
                raise problem(("replicas", "cpus"), "deprecated, and it contradicts resources_per_replica.cpus",
                              got=f"{cpus:g} and {self.resources_per_replica.cpus:g}",
                              allowed="only resources_per_replica.cpus")
            self.resources_per_replica = ResourcesSpec(cpus=cpus, gpus=self.resources_per_replica.gpus)
            self.replicas.cpus = None
        return self
