"""Connecting to Ray: an address, RAY_ADDRESS, a head from `rayline cluster up`, or an embedded Ray;
the cluster's token auth matched before connecting.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rayline.cluster.env import loopback_env, quiet_driver_logs, quiet_ray, serve_env, train_env
from rayline.errors import ClusterError
from rayline.ports import free_port
from rayline.signals import stop_on_sigterm
from rayline.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["Connection", "read_head_record", "recorded_head", "match_cluster_auth", "cluster_address", "connect",
           "pin_state_api", "stop_log_monitor", "token_auth_on", "forkserver_dirs"]

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
        leftover_dirs = forkserver_dirs(processes)
        if _serve_started():
            try:
                from ray import serve

                serve.shutdown()
            except Exception:
                pass  # its controller is gone already
        ray.shutdown()
        _reap(processes)
        for path in leftover_dirs:
            shutil.rmtree(path, ignore_errors=True)


def forkserver_dirs(processes: list) -> list[str]:
    """The temp dirs (`/tmp/pymp-*`) of the multiprocessing forkservers among `processes`.

    Ray's dashboard starts its ten modules through a forkserver, which listens on a socket in a temp
    dir of its own and removes it only on a clean exit; Ray's shutdown kills it, so every embedded
    Ray with a dashboard left one dir behind (455 of them in this box's /tmp after a day of runs).
    Found by the forkserver's listening socket, while it runs."""
    import psutil

    found = set()
    for process in processes:
        try:
            if "multiprocessing.forkserver" not in " ".join(process.cmdline()):
                continue
            for socket in process.net_connections(kind="unix"):
                folder = os.path.dirname(socket.laddr) if isinstance(socket.laddr, str) else ""
                if os.path.basename(folder).startswith("pymp-") and os.path.dirname(folder) == tempfile.gettempdir():
                    found.add(folder)
        except psutil.Error:
            continue
    return sorted(found)


def _serve_started() -> bool:
    """Whether the embedded Ray runs Serve: its controller is a named actor in namespace "serve".
    `serve.shutdown()` with no Serve to stop cost every `rayline run --no-serve` a second."""
    import ray

    try:
        return any(actor.get("namespace") == "serve" for actor in ray.util.list_named_actors(all_namespaces=True))
    except Exception:  # noqa: BLE001 - the GCS is going: shut Serve down as before, to be sure
        return True


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


def _reap(processes: list, grace_s: float = 0.5) -> None:
    """After ray.shutdown: end what of the embedded Ray still runs. Ray's DashboardAgent and
    RuntimeEnvAgent outlived `rayline run` by about a minute (seen after SIGTERM and Ctrl-C).

    SIGTERM at once and SIGKILL `grace_s` later: the GCS and raylet are gone, so what is left (the
    dashboard's ten module processes, the agents, idle workers) has nothing to finish, and the
    dashboard's modules take 1.3 s over a graceful exit. A wait of a second for them to notice, then
    SIGTERM, then the wait for them cost `rayline run` 2.9 s at its end (2-core box, 2026-11-29)."""
    import psutil

    if not processes:
        return
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _wait_dead(processes, timeout_s=grace_s)
    for process in processes:
        try:
            if _running(process):
                process.kill()
        except psutil.Error:
            pass
    _wait_dead(processes, timeout_s=5.0)  # gone when the CLI returns, not a moment later


def _running(process) -> bool:
    """Alive and not a zombie. A zombie has exited: its parent (a killed Ray process, so init) reaps
    it when it does, and this machine's init took a second at it."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_dead(processes: list, timeout_s: float) -> None:
    """Until no process of `processes` runs (`_running`), at most `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(_running(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.02)


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


def _use_loopback_head() -> None:
    """Make this process reach a loopback-only head (see SINGLE_NODE_ENV)."""
    os.environ.update(loopback_env())
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


def match_cluster_auth(address: str) -> None:
    """Send the auth token exactly when the cluster at `address` requires one: it is asked
    (rayline.cluster.probe), since a token file on this machine says nothing about that cluster.

    A token sent to a cluster started without token auth broke cross-node object fetches ("The
    object's owner has exited") or hung the data stage. An explicit RAY_AUTH_MODE is left alone,
    as Ray leaves it (the address is still asked, to fail fast where nothing answers).

    - "auto": Ray itself turns token mode on for "auto" whenever a token file exists; rayline finds
      the address Ray would join (`_auto_address`) and asks it like an explicit one. Ray reads an
      explicit RAY_AUTH_MODE before its own rule, so the answer holds. No cluster found: nothing to
      ask; ray.init's own one-line error follows.
    - ray://HOST:PORT (Ray Client): the client server is asked with Ray's client PING
      (rayline.cluster.probe.probe_ray_client); it checks the token with the GCS's interceptor. The driver then
      runs in a process on the cluster, which has the cluster's own token mode; the client process
      only sends (or not) the token on its gRPC calls, which is what this decides.
    """
    from rayline.cluster.probe import probe_gcs, probe_ray_client
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
        match_cluster_auth(address)  # fails fast, one line, when nothing answers there
    if not verbose:
        quiet_driver_logs()  # after the probe: its imports (Ray Data, Serve: ~0.5 s) wait for an address that answers
    try:
        if address:
            if address == recorded and (read_head_record(ws) or {}).get("loopback"):
                _use_loopback_head()
            # A head from `rayline cluster up` already has train_env(); another cluster gets it per job.
            runtime_env = None if address == recorded else {"env_vars": train_env()}
            # logging_level: without it Ray prints its INFO lines ("Connecting to existing Ray cluster at
            # address ...", "Connected to Ray cluster. View the dashboard at ...") on every command's terminal.
            ray.init(address=address, log_to_driver=verbose, namespace="rayline", runtime_env=runtime_env,
                     logging_level="INFO" if verbose else "WARNING")
            stop_on_sigterm()  # over Ray's handler, which ray.init just installed
            return Connection(address=address, embedded=False, owned=True)
        # The dashboard hosts Ray's state API and Jobs API. (Train V2's PlacementGroupCleaner used the
        # state API to free the placement groups of trials Tune stops early; rayline's runs start no
        # cleaner now: rayline.cluster.orphans frees those groups from the GCS's own table.)
        os.environ.update(train_env(single_machine=True))  # inherited by the raylet and every worker
        os.environ.update(serve_env(ingress))
        _start_embedded(num_cpus, verbose)
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


def _start_embedded(num_cpus: int | None, verbose: bool, ports: tuple = (8265, None)) -> None:
    """ray.init of an embedded Ray, its dashboard on 8265 when free. Two runs started in the same
    second can both find 8265 free and the second's dashboard then fails to bind it ("Failed to
    start the dashboard"): that start is retried once on a port the OS picks among thousands.
    Likewise a start whose raylet did not register within Ray's fixed 30 s ("The current node
    timed out during startup", ray/_private/node.py): seen on a 2-core machine at load average 14,
    where the second start came up."""
    import ray

    for attempt, preferred in enumerate(ports):
        # address="local": a Ray of our own even when another head on this machine recorded
        # itself in /tmp/ray/ray_current_cluster (a bare ray.init() would join that cluster).
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
                     dashboard_port=pin_state_api(preferred), log_to_driver=verbose, namespace="rayline",
                     configure_logging=True, logging_level="WARNING")
            if not verbose:
                stop_log_monitor()
            return
        except Exception as exc:
            text = str(exc).lower()
            if attempt == len(ports) - 1 or not ("dashboard" in text or "timed out during startup" in text):
                raise
            log.warning("rayline: Ray did not start (%s); starting it again%s", str(exc).splitlines()[0],
                        " with its dashboard on another port" if "dashboard" in text else "")
            ray.shutdown()  # the half-started node's processes, before the second start


def stop_log_monitor() -> bool:
    """Stop the log monitor of the Ray embedded in this process; True when one was stopped.

    Ray's log monitor tails every worker's log file (a readline on each of up to 200 open files
    every 0.1 s, whatever the files hold) to publish the new lines to the drivers that asked for
    them (log_to_driver). An embedded Ray without `--verbose` has no such driver: nothing reads
    what it publishes, and the files stay where Ray wrote them (`ray logs`, the dashboard and the
    Jobs API read them there). It cost an idle Ray 0.93 of its 4.92 CPU-s a minute
    (benchmarks/idle_ray.py), and more as a long session's log folder grows. Ray starts it with
    the node and has no option of ray.init to leave it out (`ray start --include-log-monitor`
    is the CLI's), so it is stopped once the node is up."""
    from ray._private import ray_constants, worker

    node = worker._global_node
    if node is None or not node.all_processes.get(ray_constants.PROCESS_TYPE_LOG_MONITOR):
        return False
    node.kill_log_monitor(check_alive=False)
    return True


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
