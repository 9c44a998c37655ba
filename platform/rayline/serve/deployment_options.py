"""Serve deployment options shared by every deployment that holds a model (a version's own
replicas, the model's route replicas): resources, the framework's environment, autoscaling,
Ray's request limits, draining; and the workspace argument as replicas must receive it."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["deployment_options", "workspace_arg", "REFUSAL_HEADROOM"]

# Requests past running + waiting that Ray still hands to a replica, so the app (not Ray)
# is the one refusing them, with a JSON body.
REFUSAL_HEADROOM = 16


def deployment_options(spec, framework, name: str) -> dict:
    """Serve deployment options of a replica serving a model under ServeSpec `spec`: its
    resources, the framework's worker environment, autoscaling, and Ray's request limits
    (the version's own replicas and the model's route replicas alike)."""
    from rayline.frameworks import BACKENDS
    from rayline.inference import framework_env

    env = framework_env(framework) if framework in BACKENDS else {}
    replicas, resources = spec.replicas, spec.resources_per_replica
    actor_options: dict[str, Any] = {"num_cpus": resources.cpus}
    if resources.gpus:
        actor_options["num_gpus"] = resources.gpus
    if env:
        actor_options["runtime_env"] = {"env_vars": env}
    return {
        "name": name,
        "autoscaling_config": {
            "min_replicas": replicas.min,
            "initial_replicas": max(1, replicas.min),
            "max_replicas": replicas.max,
            "target_ongoing_requests": replicas.target_ongoing_requests,
            "upscale_delay_s": replicas.upscale_delay_s,
            "downscale_delay_s": replicas.downscale_delay_s,
            "look_back_period_s": replicas.look_back_period_s,
        },
        "ray_actor_options": actor_options,
        # Ray lets running + waiting requests into a replica, plus room for the ones to refuse;
        # the app's AdmissionLimit (limits.py) runs max_ongoing of them, holds max_queued and
        # answers the rest with a JSON 429 + Retry-After in microseconds. Ray's own queue limit
        # would answer first, with its plain-text body (seen in the 429 test), so it is off: a
        # request Ray holds back waits only until the app has refused the ones ahead of it.
        "max_ongoing_requests": spec.max_ongoing_requests + max(spec.max_queued_requests, 0) + REFUSAL_HEADROOM,
        "max_queued_requests": -1,
        # A stopping replica takes no new requests and waits this long for its in-flight ones.
        "graceful_shutdown_timeout_s": spec.drain_timeout_s,
    }


def workspace_arg(value):
    """A path is made absolute where the app is built (replicas start elsewhere); an s3:// or
    gs:// workspace is passed on as written."""
    if not value:
        return None
    return str(value) if "://" in str(value) else os.path.abspath(value)
