"""`rayline cluster up|down|status`: a local head started with `ray start --head` that outlives the CLI,
its address recorded in the workspace; stopping it and every process it started.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

from rayline.cluster.connection import read_head_record, recorded_head, token_auth_on
from rayline.cluster.env import SINGLE_NODE_ENV, loopback_env, serve_env, train_env
from rayline.errors import ClusterError
from rayline.ports import free_port
from rayline.workspace import Workspace

__all__ = ["ray_cli", "head_temp_dir", "haproxy_state_dir", "HOST_CHOICES", "cluster_up", "head_processes",
           "stop_head", "cluster_down", "cluster_status"]


def ray_cli() -> str:
    exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if not exe:
        raise ClusterError("the `ray` command is not installed (pip install 'ray[default]')")
    return exe


def head_temp_dir(ws: Workspace) -> str:
    # One Ray temp dir per workspace, so `cluster down` can tell this head's processes from
    # any other Ray on the machine (`ray stop` would stop them all). Short, under /tmp:
    # Ray's unix socket paths must stay under ~107 characters.
    digest = hashlib.sha1(str(ws.root).encode()).hexdigest()[:10]
    return os.path.join("/tmp", f"rayline-{digest}")


def haproxy_state_dir(temp_dir: str, create: bool = True) -> str:
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
    from rayline.cluster.probe import seconds_from_env

    return seconds_from_env(_START_TIMEOUT_ENV, _START_TIMEOUT_S)


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
    temp_dir = head_temp_dir(ws)
    if record:  # recorded but not answering (or never finished starting): clear what is left of it
        stop_head(record)
    _check_ports_free(host, {"--port": port, "--dashboard-port": dashboard_port, "--client-port": client_port})
    loopback = host == "127.0.0.1"
    address = f"127.0.0.1:{port}"
    # Ray's dashboard agent (which runs submitted jobs) always takes port 52365 unless told
    # otherwise: a second Ray on this machine (an embedded `rayline run`, another head) held it,
    # this head's agent could not start, and every `rayline submit` got HTTP 500 "No available
    # agent". The default when free, else any free port.
    agent_port = free_port(host, _DASHBOARD_AGENT_PORT)
    cmd = [ray_cli(), "start", "--head", f"--port={port}", "--disable-usage-stats", "--include-dashboard=true",
           f"--dashboard-host={host}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}",
           f"--dashboard-agent-listen-port={agent_port}", f"--temp-dir={temp_dir}"]
    if loopback:
        cmd.append("--node-ip-address=127.0.0.1")
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    env = {**os.environ, **train_env(single_machine=loopback), **serve_env(ingress, state_dir=haproxy_state_dir(temp_dir))}
    if loopback:
        env.update(loopback_env())
    else:
        env.pop(SINGLE_NODE_ENV, None)
    info = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "temp_dir": temp_dir,
            "host": host, "loopback": loopback, "client_port": client_port, "token_auth": token_auth_on(),
            "haproxy_dir": haproxy_state_dir(temp_dir, create=False)}
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
        stop_head(info)
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


def head_processes(temp_dir: str, port: str | None = None, haproxy_dir: str | None = None) -> list:
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


def stop_head(info: dict, grace_s: float = _STOP_GRACE_S) -> list:
    """SIGTERM every process of the recorded head, the GCS last, SIGKILL what outlives `grace_s`;
    return the processes still there after that (normally none)."""
    import psutil

    temp_dir = info.get("temp_dir")
    if not temp_dir:
        return []
    port = str(info.get("address", "")).rpartition(":")[2] or None
    haproxy_dir = info.get("haproxy_dir") or haproxy_state_dir(temp_dir, create=False)

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

    procs = head_processes(temp_dir, port, haproxy_dir)
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
    left = head_processes(temp_dir, port, haproxy_dir)
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
    still = stop_head(info, grace_s)
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
    from rayline.cluster.probe import ClusterUnreachable, probe_gcs
    from rayline.jobs.auth import load_token

    try:
        answer = probe_gcs(address, token=load_token)
    # Not running. A head that answers but refuses this client's token is another ClusterError,
    # left to reach the CLI: it is running, and the user must be told why it refuses.
    except ClusterUnreachable as exc:
        return {"alive": False, "address": address, "detail": str(exc), "unreachable": exc.why or "no answer",
                **{k: info[k] for k in ("host", "loopback", "token_auth", "client_port") if k in info}}
    env = {**os.environ, **(loopback_env() if info.get("loopback") else {})}
    env.setdefault("RAY_AUTH_MODE", "token" if answer.token_required else "disabled")
    try:
        proc = subprocess.run([ray_cli(), "status", f"--address={address}"], capture_output=True, text=True,
                              timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"`ray status --address={address}`: no answer within 60 s (the head may be overloaded; "
                           "try again, or `rayline cluster down`)") from exc
    return {"alive": proc.returncode == 0, "address": address, "detail": proc.stdout.strip(),
            **{k: info[k] for k in ("host", "loopback", "token_auth", "client_port") if k in info}}
