"""The session Ray's Prometheus export, read as a scraper would: every alive node's
`/metrics`, joined.

A node's metrics agent answers on loopback in milliseconds on an idle machine, but on a 2-core CI
box busy with trainings it has been seen to take more than 10 s for one answer (the failure that
motivated this helper). A scraper retries; so do the tests: a read that times out or is refused
is tried again until `deadline_s`, and only then fails, naming the node's URL.
"""

from __future__ import annotations

import time

import httpx

__all__ = ["metrics_export_text"]


def metrics_export_text(deadline_s: float = 120.0, read_timeout_s: float = 30.0) -> str:
    """The text of every alive node's Prometheus export, one after another."""
    import ray

    texts = []
    for node in ray.nodes():
        if not node.get("Alive") or not node.get("MetricsExportPort"):
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                response = httpx.get(url, timeout=read_timeout_s)
                response.raise_for_status()
                texts.append(response.text)
                break
            except httpx.HTTPError as e:
                if time.monotonic() >= give_up:
                    raise AssertionError(f"Ray's metrics export at {url} gave no answer within {deadline_s:.0f} s: {e!r}") from e
                time.sleep(1)
    return "\n".join(texts)
