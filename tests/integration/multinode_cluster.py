"""A Ray cluster of several nodes on this one machine, started with `ray start` for a test.

Each node is its own `ray start` (a head, then workers joining its GCS), with its own Ray temp
dir, its own fixed ports and its own HAProxy state, so that one node can be killed alone (its
raylet, agents and workers, found by that temp dir) and the rest keep running, as when a
machine of a real cluster dies. The pytest process never calls `ray.init` on it: it already
drives the session's embedded Ray, and a process can drive only one.

Nodes bind the machine's own address, as on a real cluster: Ray's loopback-only mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which `rayline cluster up` uses) refuses worker nodes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import httpx
from .. import loopback

__all__ = ["LocalCluster", "Node"]

# Per node i (0: head) ports base + 10 * i + k; test_cluster.py's Ray Client ports are 20401-20404.
_NODE_PORT_BASE = 20420
_PORT_NAMES = ("--node-manager-port", "--object-manager-port", "--metrics-export-port", "--runtime-env-agent-port",
               "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port")
# A worker node's Serve proxy binds these instead of the head's HTTP port (Ray starts a proxy on
# every node with a replica; on one machine they would all want the same port).
_WORKER_PROXY_HTTP, _WORKER_PROXY_GRPC = 6, 7
_LABEL = "rayline-test-node"
_START_TIMEOUT_S = 180  # `ray start` took 9-23 s per node on the loaded 2-core machine
# A worker node's `ray start` gives up when its raylet has not registered with the GCS within 30 s
# (Ray's own limit): seen once with the machine's load average at 20 from other Ray clusters.
_START_ATTEMPTS = 2


def ray_cli() -> str:
    return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


@dataclass
class Node:
    index: int
    temp_dir: str
    haproxy_dir: str
    num_cpus: int
    node_id: str | None = None
    alive: bool = True

    @property
    def name(self) -> str:
        """This node's label value (`ray start --labels`): how it is told from the others in Ray's
        state. Not `--node-name`: Ray Serve takes a node's name for its IP address (measured: with
        names set, the deploy failed "Proxies not available after 60s")."""
        return os.path.basename(self.temp_dir)

    @property
    def info(self) -> dict:
        """What rayline.cluster's process helpers take to find (and stop) this node's processes."""
        return {"temp_dir": self.temp_dir, "haproxy_dir": self.haproxy_dir, "address": ""}


@dataclass
class LocalCluster:
    gcs_port: int
    dashboard_port: int
    client_port: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    nodes: list[Node] = field(default_factory=list)
    # Every node's Ray authentication, e.g. {"RAY_AUTH_MODE": "disabled"} or {"RAY_AUTH_MODE": "token",
    # "RAY_AUTH_TOKEN": ...}; None: as `ray start` decides from this machine (a token file turns it on).
    auth: dict | None = None
    port_base: int = _NODE_PORT_BASE  # node i's ports: port_base + 10 * i + k (another module's cluster: another base)

    @property
    def ip(self) -> str:
        """The machine's own address, where every node registers. Not get_node_ip_address: it
        answers 127.0.0.1 in a process where Ray's single-machine mode is on."""
        from ray._private.services import node_ip_address_from_perspective

        return node_ip_address_from_perspective(None)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self, node: Node | None = None) -> dict:
        from rayline.cluster.env import serve_env, train_env

        # Ray Train's run state (attempts, each worker's rank and node) in the dashboard; read where
        # the trainer is built (the job's driver, on the head) -- every node gets it alike.
        env = {**os.environ, **train_env(), "RAY_TRAIN_ENABLE_STATE_TRACKING": "1"}
        env.pop("RAY_ADDRESS", None)
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        if self.auth is not None:
            for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
                env.pop(key, None)
            env.update(self.auth)
        if node is not None:
            env.update(serve_env(None, state_dir=node.haproxy_dir))
            base = self.port_base + 10 * node.index
            if node.index:
                if self.auth is None:
                    from rayline.cluster.connection import token_auth_on

                    if token_auth_on():  # a joining node sends the token only in token mode (set explicitly)
                        env["RAY_AUTH_MODE"] = "token"
                # Every cluster's worker nodes: Serve's proxy ports there are this cluster's own.
                env["RAY_SERVE_WORKER_PROXY_HTTP_PORT"] = str(base + _WORKER_PROXY_HTTP)
                env["RAY_SERVE_WORKER_PROXY_GRPC_PORT"] = str(base + _WORKER_PROXY_GRPC)
        return env

    def _new_node(self, num_cpus: int) -> Node:
        index = len(self.nodes)
        node = Node(index, f"/tmp/rlmn-{self.tag}-{index}", f"/tmp/rlmnh-{self.tag}-{index}", num_cpus)
        os.makedirs(node.haproxy_dir, exist_ok=True)
        self.nodes.append(node)  # before starting: a failed start is still torn down
        return node

    def _start(self, num_cpus: int, *args: str, node: Node | None = None) -> Node:
        node = node or self._new_node(num_cpus)
        base = self.port_base + 10 * node.index
        ports = [f"{name}={base + k}" for k, name in enumerate(_PORT_NAMES)]
        cmd = [ray_cli(), "start", *args, f"--num-cpus={num_cpus}", f"--temp-dir={node.temp_dir}",
               f"--labels={_LABEL}={node.name}", "--disable-usage-stats", *ports]
        for attempt in range(_START_ATTEMPTS):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_START_TIMEOUT_S, env=self.env(node))
            if proc.returncode == 0:
                return node
            # What the failed start left (a raylet that never registered) goes before the next try.
            from rayline.cluster.head import stop_head

            stop_head(node.info, grace_s=5)
            os.makedirs(node.haproxy_dir, exist_ok=True)
        raise RuntimeError(f"{' '.join(cmd)} failed {_START_ATTEMPTS} times; last:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")

    def start_head(self, num_cpus: int = 0) -> Node:
        node = self._start(num_cpus, "--head", f"--port={self.gcs_port}", "--include-dashboard=true",
                           "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                           f"--ray-client-server-port={self.client_port}")
        node.node_id = self._wait_for_nodes([node.name])[node.name]
        return node

    def add_worker(self, num_cpus: int = 1) -> Node:
        """Start a worker node and wait until the cluster lists it alive (as an autoscaler would add one)."""
        return self.add_workers(1, num_cpus)[0]

    def add_workers(self, count: int, num_cpus: int = 1) -> list[Node]:
        """Start `count` worker nodes at once (`ray start` took 9-12 s each on the loaded 2-core
        machine, mostly waiting) and wait until the cluster lists them alive."""
        from concurrent.futures import ThreadPoolExecutor

        nodes = [self._new_node(num_cpus) for _ in range(count)]
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda n: self._start(num_cpus, f"--address={self.address}", node=n), nodes))
        ids = self._wait_for_nodes([n.name for n in nodes])
        for node in nodes:
            node.node_id = ids[node.name]
        return nodes

    # -- Ray's state, from the head's dashboard (the state API over HTTP) --

    def headers(self) -> dict:
        from rayline.cluster.connection import token_auth_on

        if self.auth is not None:
            token = self.auth.get("RAY_AUTH_TOKEN")
            return {"authorization": f"Bearer {token}"} if self.auth.get("RAY_AUTH_MODE") == "token" else {}
        if not token_auth_on():
            return {}
        token = os.environ.get("RAY_AUTH_TOKEN")
        if not token:
            path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
            with open(path) as fh:
                token = fh.read().strip()
        return {"authorization": f"Bearer {token}"}

    def state(self, kind: str, **filters: str) -> list[dict]:
        params = [("limit", "1000"), ("detail", "true")]
        for key, value in filters.items():
            params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        response = loopback.get(f"{self.dashboard}/api/v0/{kind}", params=params, headers=self.headers(), timeout=30)
        response.raise_for_status()
        return response.json()["data"]["result"]["result"]

    def alive_nodes(self) -> dict[str, str]:
        """Label value (Node.name) -> node id of every alive node."""
        return {n["labels"].get(_LABEL): n["node_id"] for n in self.state("nodes") if n["state"] == "ALIVE"}

    def _wait_for_nodes(self, names: list[str], timeout_s: float = 120) -> dict[str, str]:
        """Until each node named is alive in the cluster's state; name -> node id."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                alive = self.alive_nodes()
                if all(name in alive for name in names):
                    return alive
            except httpx.HTTPError:
                alive = {}  # the dashboard is still starting
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {names} not alive within {timeout_s:g} s (alive: {sorted(alive, key=str)})")
            time.sleep(1)

    # -- faults and teardown --

    def kill(self, node: Node) -> list[int]:
        """SIGKILL every process of `node` (raylet, agents, workers, its HAProxy) at once: a machine dying."""
        import psutil

        from rayline.cluster.head import head_processes

        procs = head_processes(node.temp_dir, None, node.haproxy_dir)
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        node.alive = False
        return [p.pid for p in procs]

    def save_logs(self, dest: str) -> None:
        """Copy every node's Ray logs to `dest`/<node> (for a failed test: the nodes' temp dirs
        are removed at shutdown)."""
        for node in self.nodes:
            logs = os.path.join(node.temp_dir, "session_latest", "logs")
            if os.path.isdir(logs):
                shutil.copytree(logs, os.path.join(dest, node.name), symlinks=True, dirs_exist_ok=True,
                                ignore_dangling_symlinks=True)

    def shutdown(self) -> list[str]:
        """Stop every node this cluster started, workers first, the head last; return what is left."""
        from rayline.cluster.head import head_processes, stop_head

        for node in reversed(self.nodes):
            stop_head(node.info, grace_s=5)
        left = []
        for node in self.nodes:
            left += [f"{p.pid} {' '.join(p.cmdline())[:150]}" for p in head_processes(node.temp_dir, None, node.haproxy_dir)]
            shutil.rmtree(node.temp_dir, ignore_errors=True)
            shutil.rmtree(node.haproxy_dir, ignore_errors=True)
        return left
