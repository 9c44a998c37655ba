"""Every replica of a model's router follows the traffic split (README, "Model versions, canary and
rollback"): the real Router with two replicas behind Serve's HTTP ingress, the split rewritten in
Ray's KV by the driver's own writer (`versions._write_table`) and waited for as `versions.deploy`
waits (`versions._settle`), and every answer checked.

A router needs no version application to say which split it follows: `ROUTE/-/routing` answers
from the answering replica's own table. Which replica answered is not in the answer, so Serve's
per-replica request counters (Prometheus export) show that both replicas answered a good share
of the checked requests.
"""

import time
from collections import Counter

import httpx

from .conftest import PORT

NAME = "follow"  # a router only; no model of that name exists
REQUESTS_PER_SPLIT = 20


def _replica_requests(app: str) -> Counter:
    """Requests each replica of `app` answered, from Serve's counters in the Prometheus export."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    found = Counter()
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10).text
        ours = "\n".join(line for line in text.splitlines() if line.startswith("ray_serve_deployment_request_counter")) + "\n"
        for family in text_string_to_metric_families(ours):
            for s in family.samples:
                if s.labels.get("application") == app and s.name.endswith("_total"):
                    found[s.labels["replica"]] += s.value
    return found


def test_every_router_replica_follows_the_split(ray_session):
    from ray import serve
    from ray.experimental.internal_kv import _internal_kv_del

    from rayline.serve.router import KV_NAMESPACE, Router, routing_key
    from rayline.serve.versions import _ensure_serve, _settle, _wait_running, _write_table

    _ensure_serve("127.0.0.1", PORT)
    # The product's Router deployment, with two replicas from the start (build_router autoscales from one).
    serve.run(Router.options(name=f"{NAME}-router", num_replicas=2).bind(NAME), name=NAME, route_prefix=f"/{NAME}",
              blocking=False)
    try:
        _wait_running([NAME])
        splits = [({"1": 100}, "1", None), ({"1": 90, "2": 10}, "1", "2"), ({"2": 100}, "2", None),
                  ({"1": 30, "2": 70}, "2", "1")]
        answered = 0
        for revision, (weights, champion, canary) in enumerate(splits, start=1):
            table = {"model": NAME, "route": f"/{NAME}", "weights": weights, "champion": champion, "canary": canary,
                     "gate": None, "rollout": f"rollout-{revision}", "revision": revision, "serve": {}}
            _write_table(NAME, table)
            _settle(table)  # what `rayline serve deploy|promote|rollback` waits before saying the split is live
            seen = Counter()
            for _ in range(REQUESTS_PER_SPLIT):
                r = httpx.get(f"http://127.0.0.1:{PORT}/{NAME}/-/routing", timeout=30)
                assert r.status_code == 200, r.text
                body = r.json()
                seen[(body["revision"], tuple(sorted(body["effective_weights"].items())), body["canary"])] += 1
            answered += REQUESTS_PER_SPLIT
            assert seen == {(revision, tuple(sorted(weights.items())), canary): REQUESTS_PER_SPLIT}, (revision, seen)
        # Both replicas answered (Ray exports every 10 s: poll, bounded), each a fair share of the checked requests.
        deadline = time.monotonic() + 60
        while sum((counts := _replica_requests(NAME)).values()) < answered and time.monotonic() < deadline:
            time.sleep(2)
        assert sum(counts.values()) == answered and len(counts) == 2, counts
        assert min(counts.values()) >= answered // 5, counts
    finally:
        _internal_kv_del(routing_key(NAME), namespace=KV_NAMESPACE)
