"""Connecting to Ray: an address, RAY_ADDRESS, a head from `rayline cluster up`, or embedded.

`rayline cluster up` starts a local head with `ray start --head` that outlives the CLI and
records its address in the workspace; `connect` finds it automatically.

One module a job: `env` (the environment Ray gets), `connection` (finding and joining a cluster),
`head` (a local head's life-cycle), `probe` (does a Ray head answer, does it want a token: asked
before joining), `orphans` (placement groups whose creator actor died, freed). The names below are
the ones the rest of rayline uses.
"""

from __future__ import annotations

from rayline.cluster.connection import Connection, connect, cluster_address, token_auth_on, pin_state_api
from rayline.cluster.env import train_env, serve_env, INGRESS_CHOICES, quiet_ray, quiet_driver_logs
from rayline.cluster.head import HOST_CHOICES, cluster_up, cluster_down, cluster_status

__all__ = ["Connection", "connect", "cluster_address", "train_env", "serve_env", "INGRESS_CHOICES", "HOST_CHOICES",
           "cluster_up", "cluster_down", "cluster_status", "token_auth_on", "quiet_ray", "quiet_driver_logs",
           "pin_state_api"]
