"""Before Ray is asked to join a cluster: does a Ray head (or its Jobs API) answer at the address, and does it want a token?

Why ask first, ourselves:
- `ray.init(address=...)` on an address where nothing answers retries for minutes (measured: still
  waiting after 90 s for 127.0.0.1:1, and 10 min for a port that accepts and never answers), printing
  Ray's C++ warnings ("Failed to connect to the observability pubsub ...", "Failed to get cluster ID
  from GCS server: TimedOut") on the user's terminal.
- Ray 2.60 has no way to ask a cluster which authentication it uses, and a driver that sends a token
  to a cluster started without one (RAY_AUTH_MODE=disabled, or no token on its nodes) fails later, in
  cross-node object fetches ("The object's owner has exited"), or hangs in the data stage. A token
  file on the client machine (`~/.ray/auth_token`, left by any earlier `ray start`) says nothing
  about the cluster. The GCS does answer: a call without the token gets UNAUTHENTICATED from a
  cluster that requires one, and a normal reply from one that does not.

One cheap GCS call (`NodeInfoGcsService.CheckAlive`, what Ray's own health checks use), first without
the token and, when the cluster requires one, once with it, with a deadline on each step. A Ray Client
address (ray://HOST:10001) is asked the same way with the call Ray's client itself makes first
(`RayletDriver.ClusterInfo(PING)`): Ray 2.60's client server checks the token with the same gRPC
interceptor as the GCS, so it answers UNAUTHENTICATED exactly when the cluster requires one.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

from rayline.errors import ClusterError

__all__ = ["ClusterUnreachable", "GcsAnswer", "probe_gcs", "probe_ray_client", "probe_jobs_api", "PROBE_TIMEOUT_ENV",
           "split_address", "seconds_from_env"]

# The whole probe's bound, so a mistyped address fails within about 10 s with the CLI's start-up
# (~2-3 s on the 2-core machine). A live head answers the probe in ~0.2 s, loaded or not; a slow
# link can raise it with RAYLINE_CONNECT_TIMEOUT_S.
PROBE_TIMEOUT_ENV = "RAYLINE_CONNECT_TIMEOUT_S"


def seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from environment variable `name` (`default` when unset); a
    one-line ClusterError naming the variable for anything else."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ClusterError(f"{name}: must be a number of seconds > 0 (got {raw!r})")
    return value


def _probe_timeout() -> float:
    return seconds_from_env(PROBE_TIMEOUT_ENV, 6.0)


_WHAT_TO_CHECK = ("allowed: the address of a running Ray head, its GCS port (6379 by default), e.g. from "
                  "`rayline cluster status` or `ray status` on the head; is the head up and the port reachable from here?")


@dataclass(frozen=True)
class GcsAnswer:
    """What the head at `address` said: its Ray version and whether it requires a token."""

    address: str
    ray_version: str
    token_required: bool


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of a GCS address `HOST:PORT` (IPv6 as [::1]:PORT); a clear error otherwise."""
    text = address.strip()
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"--address: not a Ray head's address (got {address!r}; allowed: HOST:PORT, e.g. "
                           "127.0.0.1:6379, or ray://HOST:10001 for Ray Client)")
    return host, int(port)


class ClusterUnreachable(ClusterError):
    """Nothing answers as a Ray head at the address (as opposed to a head that refuses this client)."""

    why: str = ""  # what was seen there: "Connection refused", "no TCP answer within 6 s", ...


def _refused(address: str, why: str) -> ClusterUnreachable:
    from rayline.redact import redact_uri

    exc = ClusterUnreachable(f"no Ray cluster answers at {redact_uri(address)} ({why}; {_WHAT_TO_CHECK})")
    exc.why = why
    return exc


def _check_alive(channel, metadata, timeout_s: float):
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
    return stub.CheckAlive(gcs_service_pb2.CheckAliveRequest(), timeout=timeout_s, metadata=metadata)


def _client_ping(channel, metadata, timeout_s: float):
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    stub = ray_client_pb2_grpc.RayletDriverStub(channel)
    request = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
    return stub.ClusterInfo(request, timeout=timeout_s, metadata=metadata)


def _ready_channel(address: str, timeout_s: float, left: Callable[[], float]):
    """A gRPC channel to `address` whose HTTP/2 handshake completed; a one-line ClusterError else."""
    import grpc

    host, port = split_address(address)
    # A closed port is refused at once; gRPC alone would retry it with back-off until the deadline.
    try:
        socket.create_connection((host, port), timeout=left()).close()
    except socket.timeout:
        raise _refused(address, f"no TCP answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise _refused(address, exc.strerror or str(exc)) from None
    channel = grpc.insecure_channel(f"{host}:{port}", options=[("grpc.enable_http_proxy", 0)])
    try:
        grpc.channel_ready_future(channel).result(timeout=left())
    except grpc.FutureTimeoutError:
        channel.close()
        raise _refused(address, f"the port accepts connections but no gRPC server answered within {timeout_s:g} s: "
                                "not a Ray head's GCS port (the dashboard's 8265 and Ray Client's 10001 are "
                                "other ports)") from None
    return channel


def probe_gcs(address: str, token: Callable[[], str | None], timeout_s: float | None = None) -> GcsAnswer:
    """Ask the GCS at `address` whether it is alive and whether it requires a token.

    Raises ClusterError, one line naming the address and what to check, when nothing answers
    within `timeout_s`, when what answers is not a Ray head, or when the head requires a token
    that this client does not have or that it rejects. `token()`: the one this client would send
    (called only when the cluster requires one: a missing RAY_AUTH_TOKEN_PATH file matters only then).
    """
    reply, required = _ask(address, token, _check_alive, "a Ray GCS", timeout_s)
    return GcsAnswer(address, reply.ray_version, token_required=required)


def probe_ray_client(address: str, token: Callable[[], str | None], timeout_s: float | None = None) -> GcsAnswer:
    """As probe_gcs, for the Ray Client server at `address` (HOST:PORT of a ray://HOST:PORT address);
    its PING reply carries no Ray version ("")."""
    _, required = _ask(address, token, _client_ping, "a Ray Client server", timeout_s)
    return GcsAnswer(address, "", token_required=required)


def _ask(address: str, token: Callable[[], str | None], call, what: str, timeout_s: float | None):
    """`call` on a channel to `address` without the token and, when the server answers UNAUTHENTICATED,
    once with it: (its reply, whether it required the token), or a one-line ClusterError."""
    timeout_s = timeout_s or _probe_timeout()
    import grpc

    from rayline.jobs.auth import missing_token_message

    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(deadline - time.monotonic(), 0.05)

    channel = _ready_channel(address, timeout_s, left)
    try:
        try:
            return call(channel, (), left()), False
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise _refused(address, f"the server there is not {what} ({exc.code().name}: "
                                        f"{((exc.details() or '').splitlines() or [''])[0][:120]})") from None
        secret = token()
        if not secret:
            raise ClusterError(missing_token_message(address, had_token=False))
        try:
            reply = call(channel, (("authorization", f"Bearer {secret}"),), left())
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise ClusterError(missing_token_message(address, had_token=True)) from None
            raise _refused(address, f"{exc.code().name} with the token") from None
        return reply, True
    finally:
        channel.close()


def probe_jobs_api(url: str, token: Callable[[], str | None], timeout_s: float | None = None) -> str | None:
    """The token to send to the Ray Jobs API at `url` (a head's dashboard): None when it requires
    none. A one-line ClusterError when nothing answers there within `timeout_s`, what answers is not
    a Jobs API, or it requires a token this client lacks or that it rejects.

    Ray's JobSubmissionClient asks the same URL first with no deadline: on an address that accepts
    connections and never answers it waited for ever.
    """
    timeout_s = timeout_s or _probe_timeout()
    import httpx

    from rayline.jobs.auth import auth_headers, missing_token_message
    from rayline.redact import redact_uri

    shown = redact_uri(url)

    def version(headers: dict):
        try:
            return httpx.get(f"{url.rstrip('/')}/api/version", headers=headers, timeout=timeout_s, trust_env=False)
        except httpx.TimeoutException:
            raise ClusterError(f"{shown}: no Ray Jobs API answered within {timeout_s:g} s (allowed: the dashboard's "
                               "URL of a running cluster, e.g. http://HEAD:8265; is the head up and the port "
                               "reachable from here?)") from None
        except httpx.HTTPError as exc:
            raise ClusterError(f"{shown}: no Ray Jobs API answers there ({type(exc).__name__}; allowed: the "
                               "dashboard's URL of a running cluster, e.g. http://HEAD:8265; `kubectl port-forward` "
                               "or `ray dashboard` to reach a private one)") from None

    reply, secret = version({}), None
    if reply.status_code in (401, 403):
        secret = token()
        if not secret:
            raise ClusterError(missing_token_message(shown, had_token=False))
        reply = version(auth_headers(secret))
        if reply.status_code in (401, 403):
            raise ClusterError(missing_token_message(shown, had_token=True))
    try:
        ok = reply.status_code == 200 and "ray_version" in reply.json()
    except ValueError:
        ok = False
    if not ok:
        raise ClusterError(f"{shown}: not a Ray Jobs API address (GET /api/version answered {reply.status_code}; "
                           "allowed: the dashboard's URL, e.g. http://HEAD:8265)")
    return secret
