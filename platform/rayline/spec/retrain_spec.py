"""The `retrain` section: when the served model retrains itself, how the challenger is judged
against the champion, and how it is rolled out (rayline/retrain/loop.py runs it).

    retrain:
      on: [drift, data_change]      # and/or schedule (with every:)
      drift_for: 5m                 # a serving version drifting this long triggers
      min_interval: 1h              # never two retrains closer than this
      compare: {metric: accuracy, min_delta: 0.0}
      canary: {percent: 10, max_error_rate: 0.05, promote_after: 200}

Durations are a number of seconds or a number with a unit: 500ms, 30s, 5m, 1h, 7d.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from rayline.spec.common import Strict
from rayline.spec.problems import problem

__all__ = ["RetrainSpec", "RetrainCompareSpec", "RetrainCanarySpec", "TRIGGERS", "parse_duration"]

TRIGGERS = ("drift", "data_change", "schedule")

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value) -> float:
    """Seconds from 30, 30.5, "30s", "5m", "1h", "7d", "500ms" (ValueError otherwise)."""
    if isinstance(value, bool):
        raise ValueError("not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if not match:
            raise ValueError("not a duration")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError("not a positive duration")
    return seconds


def _duration(field: str):
    def check(cls, v):
        if v is None:
            return v
        try:
            return parse_duration(v)
        except ValueError:
            raise problem("", "not a positive duration", got=repr(v),
                          allowed="seconds, or a number with a unit: 500ms, 30s, 5m, 1h, 7d") from None
    return field_validator(field, mode="before")(classmethod(check))


class RetrainCompareSpec(Strict):
    """How the challenger is judged against the champion: both scored on the new run's test split."""

    metric: Optional[str] = Field(None, description="The metric both versions are scored by; default: train.metric "
                                                    "(or the task's default).")
    min_delta: float = Field(0.0, description="How much better the challenger must score, in the metric's own "
                                              "direction: 0 no worse; 0.01 better by at least 0.01; negative: a "
                                              "bounded loss accepted.")


class RetrainCanarySpec(Strict):
    """A qualifying challenger serves this share of traffic beside the champion, behind the metric gate,
    and becomes the champion once it answered `promote_after` requests within the limits."""

    percent: int = Field(10, ge=1, le=99, description="Percent of the route's traffic the canary gets.")
    # Always a number (no null): a canary nobody watches is always judged by its errors.
    max_error_rate: float = Field(0.05, ge=0, le=1, description="Canary error rate (5xx) above which traffic returns "
                                                               "to the champion and the canary is not promoted.")
    max_p99_ms: Optional[float] = Field(None, gt=0, description="Canary p99 latency (ms, at the router) above "
                                                                "which it is rolled back.")
    min_requests: int = Field(50, ge=1, description="Canary requests seen before the limits are checked.")
    promote_after: int = Field(200, ge=1, description="Canary requests answered within the limits after which "
                                                      "it becomes the champion.")

    def gate(self) -> dict:
        return {"max_error_rate": self.max_error_rate, "max_p99_ms": self.max_p99_ms, "min_requests": self.min_requests}

    @model_validator(mode="after")
    def _limits(self):
        if self.promote_after < self.min_requests:
            raise problem("promote_after", "a canary is promoted only after its limits were checked",
                          got=f"{self.promote_after} < min_requests {self.min_requests}",
                          allowed=f">= min_requests ({self.min_requests})")
        return self


class RetrainSpec(Strict):
    """Keep the served model current: retrain on drift, on changed data and/or on a schedule; judge the
    challenger against the champion on the new data's test split; roll it out as a gated canary."""

    on: list[Literal["drift", "data_change", "schedule"]] = Field(
        min_length=1, description="What triggers a retrain: drift (a serving version drifting for drift_for), "
                                  "data_change (the source's fingerprint changed: a new or changed file), "
                                  "schedule (every `every`).")
    every: Optional[float] = Field(None, description="With on: [schedule]: retrain this often (e.g. 7d).")
    drift_for: float = Field(300.0, description="How long a serving version must be drifting before it triggers "
                                                "(e.g. 5m): a short burst of odd traffic does not retrain.")
    min_interval: float = Field(3600.0, description="Never start a retrain sooner than this after the last one "
                                                    "started (e.g. 1h); a failed retrain waits longer each time.")
    check_every: float = Field(30.0, description="How often the loop looks at drift, the source and the clock.")
    compare: RetrainCompareSpec = Field(default_factory=RetrainCompareSpec)
    canary: RetrainCanarySpec = Field(default_factory=RetrainCanarySpec)

    _every = _duration("every")
    _drift_for = _duration("drift_for")
    _min_interval = _duration("min_interval")
    _check_every = _duration("check_every")

    @field_validator("on")
    @classmethod
    def _unique(cls, v):
        repeated = sorted({t for t in v if v.count(t) > 1})
        if repeated:
            raise problem("", "a trigger named twice", got=repr(v), allowed=", ".join(TRIGGERS) + ", each once")
        return v

    @model_validator(mode="after")
    def _schedule(self):
        if "schedule" in self.on and self.every is None:
            raise problem("every", "on: [schedule] needs how often", got="no every", allowed="a duration, e.g. 7d")
        if self.every is not None and "schedule" not in self.on:
            raise problem("every", "a schedule that nothing follows: add schedule to retrain.on",
                          got=f"every {self.every:g} s with on: {self.on}", allowed="on: [..., schedule], or no every")
        return self
