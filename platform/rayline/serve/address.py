"""Where Serve answers HTTP on the connected cluster, so the printed endpoint is the real one.

Ray Serve keeps the HTTP options of the Serve instance already running on a cluster and only
logs a warning when `serve.start` asks for others ("The new HTTP config is ignored"): rayline
printed the requested port, a URL where nothing of ours listens. And when the port is held by
a process that is not Serve, Serve's proxy cannot bind it while the app still deploys: the
printed URL then belonged to that other process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rayline.errors import ServeError

__all__ = ["ServeAddress", "serve_address", "check_port_free", "wait_routed", "wait_ingress_direct"]

_WILDCARD = ("0.0.0.0", "::", "")
_warned: set = set()  # (running, requested) pairs warned about: once a process, not at each check


@dataclass(frozen=True)
class ServeAddress:
    host: str
    port: int
    existing: bool  # True: a Serve already running on the cluster fixed this address

    def url(self, route: str, requested_host: str) -> str:
        # A wildcard bind is reached at the host the user asked for (or loopback).
        host = self.host
        if host in _WILDCARD:
            host = requested_host if requested_host not in _WILDCARD else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}{route}"


def running_serve_http():
    """(host, port) of the Serve already running on the connected cluster, else None."""
    try:
        from ray.serve.context import _get_global_client
    except ImportError:  # moved in another Ray: behave as before (Serve's own warning)
        return None
    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    config = client.http_config
    return config.host or "127.0.0.1", int(config.port)


def check_port_free(host: str, port: int) -> None:
    """Raise ServeError naming the holder when (host, port) cannot be bound on this machine."""
    from rayline.ports import port_holder

    holder = port_holder(host, port)
    if holder is not None:
        raise ServeError(f"--port: {host}:{port} is already in use by another process, so Serve cannot listen "
                         f"there (got {holder}; allowed: a free port, or stop that process)")


def _serve_runs_here() -> bool:
    """Whether a Serve proxy of the connected cluster would run on this machine (embedded Ray,
    `rayline cluster up`): only then can a local process hold its port."""
    import psutil
    import ray

    local = {"127.0.0.1", "::1"}
    try:
        for addrs in psutil.net_if_addrs().values():
            local.update(a.address.split("%")[0] for a in addrs)
        return any(node.get("Alive") and node.get("NodeManagerAddress") in local for node in ray.nodes())
    except Exception:  # cannot tell: do not block a deploy on a guess
        return False


def serve_address(host: str, port: int) -> ServeAddress:
    """Where Serve will answer once deployed: an already-running Serve's own address, else
    (host, port) after checking that no other process holds that port."""
    running = running_serve_http()
    if running is not None:
        if (running[1] != port or running[0] not in (host, *_WILDCARD)) and (running, (host, port)) not in _warned:
            _warned.add((running, (host, port)))
            logging.getLogger("rayline.serve").warning(
                "Serve already runs on this cluster at %s:%s; the requested %s:%s is ignored (Ray keeps the HTTP "
                "options of a running Serve; to move it, stop Serve on the cluster first)", running[0], running[1], host, port)
        return ServeAddress(running[0], running[1], existing=True)
    if _serve_runs_here():
        check_port_free(host, port)
    return ServeAddress(host, port, existing=False)


def wait_routed(address: ServeAddress, routes, requested_host: str, timeout_s: float = 60.0, *,
                unreachable_s: float = 10.0, here: bool | None = None) -> bool:
    """Until Serve's HTTP ingress on this machine lists every prefix of `routes` at `/-/routes`.

    An application is RUNNING (what `serve.run` and `wait_running` wait for) a moment before the
    ingress routes it: HAProxy reloads its configuration after the controller's next broadcast,
    and a request in between got HAProxy's own 404 "Path ... not found" (seen on the 2-core box at
    load average 14: the first request of a freshly deployed app). The ingress's route list is
    rendered from the same configuration as its routing, so once it lists a prefix, it routes it.
    First, wherever the ingress is HAProxy, until it routes the prefixes to their replicas rather
    than to Serve's fallback proxy (wait_ingress_direct: a request during that reload once got a 404).

    Best effort, never a failure of a deploy that Serve finished: no wait where no proxy of the
    cluster runs on this machine (`here`: computed when None), or where nothing answers there
    within `unreachable_s` (a node this process cannot reach); a warning when the routes are
    still missing after `timeout_s`. True once every route is listed."""
    import httpx

    wait_ingress_direct(routes, timeout_s)
    if not (_serve_runs_here() if here is None else here):
        return False
    url = address.url("/-/routes", requested_host)
    wanted = list(routes)
    started = time.monotonic()
    listed: dict = {}
    # One client for the whole wait (a new one per poll built an SSL context each time: 34 ms of CPU),
    # and a new connection per poll: a kept one could reach an ingress process the reload replaced.
    with httpx.Client(timeout=5, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while True:
            try:
                response = http.get(url)
                if response.status_code == 404:
                    return False  # not Serve's ingress answering there: nothing to wait for
                listed = response.json() if response.status_code == 200 else {}
            except ValueError:  # not JSON: an ingress draining or starting says so in text
                listed = {}
            except httpx.HTTPError:  # nothing answers there (yet), or it answered nothing readable
                if time.monotonic() - started > unreachable_s:
                    return False
                listed = {}
            if all(route in listed for route in wanted):
                return True
            if time.monotonic() - started > timeout_s:
                logging.getLogger("rayline.serve").warning(
                    "Serve's HTTP ingress at %s does not list %s %g s after the applications started (it lists %s); "
                    "requests there may get a 404 until it does", url, ", ".join(r for r in wanted if r not in listed),
                    timeout_s, ", ".join(sorted(listed)) or "none")
                return False
            time.sleep(0.2)


def wait_ingress_direct(routes, timeout_s: float = 60.0) -> bool:
    """Until every HAProxy ingress of the cluster has applied a configuration that routes each prefix
    of `routes` straight to a running replica, not through Serve's fallback proxy.

    Why: `serve.run` (and RUNNING) returns once the ingress answers with the configuration it has
    (Ray's readiness check, HAProxyManager.serving, counts the fallback proxy as a ready server), and
    for a new application that is the one sending its prefix to Serve's Python fallback proxy; the
    controller's next broadcast, with the app's replicas, makes HAProxy reload once more (a new
    process takes over from the old one). On the 2-core CI box `serve.run` returned 0.07 s before
    that broadcast and 0.7 s before its reload finished, and a request in between got a 404
    "Path ... not found" right after the route had answered three (2026-12-06, twice:
    tests/integration/test_serve_access.py; which process answered it, the logs do not say). This waits until each HAProxy manager holds the route's
    replicas as targets with no update pending or reloading (asked in the manager itself, Ray's
    `__ray_call__`: Serve has no public call for it).

    Best effort: True when every HAProxy ingress routes them directly or none runs (Ray's Python
    proxy routes from its route table, no reload); False after `timeout_s`, or where Serve's
    proxies cannot be asked (another Ray's internals), and the deploy goes on as before."""
    import ray

    if not routes or not ray.is_initialized():
        return True
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        if client is None:
            return True
        proxies = ray.get(client._controller.get_proxies.remote(), timeout=timeout_s)
        # Only the routes the controller itself sends to replicas now: a route scaled to zero
        # (serve.replicas.min 0, idle) has none, and its requests go to the fallback proxy by design.
        expected = ray.get(client._controller.get_target_groups.remote(None, True), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - never fail a deploy Serve finished
        return False
    wanted = sorted(set(routes) & _direct_routes(expected))
    if not wanted:
        return True
    deadline = time.monotonic() + timeout_s
    applied = _applied_in_manager(wanted)
    for handle in proxies.values():
        if not hasattr(handle, "get_target_groups"):  # Ray's Python proxy: no reload to wait for
            continue
        try:
            while not ray.get(handle.__ray_call__.remote(applied), timeout=max(deadline - time.monotonic(), 1)):
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
        except Exception:  # noqa: BLE001 - a proxy that died or timed out (Serve replaces it), or another Ray
            return False
    return True


def _applied_in_manager(routes: list):
    """A check run inside Serve's HAProxyManager actor: its targets route every one of `routes` to
    replicas, and no update waits or reloads. A closure, so cloudpickle ships it by value: a
    cluster's Ray image need not hold rayline."""

    def applied(manager) -> bool:
        groups = getattr(manager, "_target_groups", None) or ()
        # _direct_routes's test, inline: a reference to it would make the actor import rayline.
        direct = {g.route_prefix for g in groups if g.targets and str(getattr(g.protocol, "value", g.protocol)) == "HTTP"}
        task = manager._coalesce_task
        busy = manager._update_pending or (task is not None and not task.done()) or manager._reload_lock.locked()
        return set(routes) <= direct and not busy

    return applied


def _direct_routes(groups) -> set:
    """The HTTP route prefixes that Serve's target groups send to replicas (not to a fallback proxy)."""
    return {g.route_prefix for g in groups or () if g.targets and str(getattr(g.protocol, "value", g.protocol)) == "HTTP"}
