"""A model's rollout record in MLflow: the champion alias and its history (the registered-model tag
`rayline.champion_history`, oldest first, so rollback knows where to go; alias
`previous-champion`), and on each version the deployments that gave it traffic (the version tag
`rayline.deployments`, which `rayline models show` prints).
"""

from __future__ import annotations

import json
import time
from typing import Optional

__all__ = ["HISTORY_TAG", "ROLLBACK_TAG", "champion_history", "set_champion", "record_deployment"]

HISTORY_TAG = "rayline.champion_history"
ROLLBACK_TAG = "rayline.canary_rolled_back"  # registered-model tag: the gate's last decision (JSON)


def champion_history(registry, name: str) -> list:
    with registry._guard(f"read tags of model {name!r}"):
        tags = registry.client.get_registered_model(name).tags or {}
    try:
        return [str(v) for v in json.loads(tags.get(HISTORY_TAG) or "[]")]
    except ValueError:
        return []


def set_champion(registry, name: str, new: str, old: Optional[str], history: list) -> None:
    """Alias champion -> new; the old champion goes on the history (alias previous-champion)."""
    if old and old != new:
        history = [*history, old]
    registry.set_model_tag(name, HISTORY_TAG, json.dumps(history[-50:]))
    registry.set_alias(name, "champion", new)
    if history:
        registry.set_alias(name, "previous-champion", history[-1])
    else:
        registry.delete_alias(name, "previous-champion")


def record_deployment(registry, name: str, version: str, *, action: str, role: str, percent: int, route: str,
                      **extra) -> None:
    """One entry on version `version`'s deployment record (registry.DEPLOYMENTS_TAG): it was given
    `percent`% of `route`'s traffic as `role` by `action`, now (UTC)."""
    entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "action": action, "role": role,
             "percent": percent, "route": route, "app": f"{name}-v{version}",
             **{k: v for k, v in extra.items() if v}}
    registry.record_deployment(name, version, entry)
