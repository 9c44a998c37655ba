"""rayline.cluster.probe without a Ray: bad addresses and settings are one clear line, and the
deadline holds on real loopback sockets (a closed port, and one that accepts and never answers)."""

import socket
import time

import pytest

from rayline.cluster.probe import PROBE_TIMEOUT_ENV, probe_gcs, probe_jobs_api, seconds_from_env, split_address
from rayline.errors import ClusterError


@pytest.mark.parametrize("address", ["nonsense", "host:", ":6379", "host:port", "host:0", "host:70000"])
def test_an_address_that_is_not_host_port_names_what_is_allowed(address):
    with pytest.raises(ClusterError, match=r"--address: not a Ray head's address \(got .*allowed: HOST:PORT"):
        split_address(address)


def test_addresses_split_into_host_and_port():
    assert split_address("10.0.0.3:6379") == ("10.0.0.3", 6379)
    assert split_address("[::1]:6380") == ("::1", 6380)


@pytest.mark.parametrize("raw", ["soon", "0", "-3", ""])
def test_a_bad_timeout_setting_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(PROBE_TIMEOUT_ENV, raw)
    with pytest.raises(ClusterError, match=f"{PROBE_TIMEOUT_ENV}: must be a number of seconds > 0"):
        seconds_from_env(PROBE_TIMEOUT_ENV, 6.0)


def test_the_timeout_setting_and_its_default(monkeypatch):
    monkeypatch.delenv(PROBE_TIMEOUT_ENV, raising=False)
    assert seconds_from_env(PROBE_TIMEOUT_ENV, 6.0) == 6.0
    monkeypatch.setenv(PROBE_TIMEOUT_ENV, "2.5")
    assert seconds_from_env(PROBE_TIMEOUT_ENV, 6.0) == 2.5


@pytest.fixture
def silent_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)  # the kernel completes handshakes; nobody ever reads or answers
    yield sock.getsockname()[1]
    sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _never_asked():
    raise AssertionError("the token was asked for, yet no cluster answered")


def test_a_closed_port_is_refused_at_once():
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(ClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port} .*refused"):
        probe_gcs(f"127.0.0.1:{port}", token=_never_asked, timeout_s=5)
    assert time.monotonic() - started < 2


def test_a_port_that_never_answers_fails_at_the_deadline(silent_port):
    started = time.monotonic()
    with pytest.raises(ClusterError, match="accepts connections but no gRPC server answered within 1.5 s"):
        probe_gcs(f"127.0.0.1:{silent_port}", token=_never_asked, timeout_s=1.5)
    assert 1.4 < time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(ClusterError, match="no Ray Jobs API answered within 1.5 s"):
        probe_jobs_api(f"http://127.0.0.1:{silent_port}", token=_never_asked, timeout_s=1.5)
    assert time.monotonic() - started < 5


# Does the cluster want a token? In-process gRPC servers that answer as a Ray GCS (CheckAlive) and a
# Ray Client server (ClusterInfo PING) do, with or without token auth: a call without the right
# `authorization: Bearer` metadata gets UNAUTHENTICATED, as Ray 2.60's auth interceptor answers.

class _RayServers:
    def __init__(self, token):
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, ray_client_pb2, ray_client_pb2_grpc

        self.token, self.calls = token, []
        outer = self

        def check(context):
            sent = dict(context.invocation_metadata()).get("authorization")
            outer.calls.append(sent)
            if outer.token and sent != f"Bearer {outer.token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "Invalid or missing authentication token")

        class Gcs(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
            def CheckAlive(self, request, context):
                check(context)
                return gcs_service_pb2.CheckAliveReply(ray_version="2.60.0")

        class Client(ray_client_pb2_grpc.RayletDriverServicer):
            def ClusterInfo(self, request, context):
                check(context)
                assert request.type == ray_client_pb2.ClusterInfoType.PING
                return ray_client_pb2.ClusterInfoResponse(json="{}")

        self.gcs, self.client = (grpc.server(ThreadPoolExecutor(2)) for _ in range(2))
        gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Gcs(), self.gcs)
        ray_client_pb2_grpc.add_RayletDriverServicer_to_server(Client(), self.client)
        self.gcs_address = f"127.0.0.1:{self.gcs.add_insecure_port('127.0.0.1:0')}"
        self.client_address = f"ray://127.0.0.1:{self.client.add_insecure_port('127.0.0.1:0')}"
        self.gcs.start()
        self.client.start()

    def stop(self):
        self.gcs.stop(0)
        self.client.stop(0)


@pytest.fixture(params=["token", "disabled"])
def servers(request):
    running = _RayServers("rl-cluster-token" if request.param == "token" else None)
    yield running
    running.stop()


@pytest.mark.parametrize("kind", ["gcs", "ray client"])
def test_the_token_is_asked_for_only_where_the_cluster_requires_it(servers, kind):
    from rayline.cluster.probe import probe_ray_client

    asked = []

    def token():
        asked.append(1)
        return "rl-cluster-token"

    if kind == "gcs":
        answer = probe_gcs(servers.gcs_address, token=token, timeout_s=5)
    else:
        answer = probe_ray_client(servers.client_address.removeprefix("ray://"), token=token, timeout_s=5)
    if servers.token:
        assert answer.token_required and asked == [1] and servers.calls == [None, "Bearer rl-cluster-token"]
    else:
        assert not answer.token_required and asked == [] and servers.calls == [None]
    assert answer.ray_version == ("2.60.0" if kind == "gcs" else "")


@pytest.mark.parametrize("sent, message", [(None, "requires token authentication and no token is set"),
                                           ("rl-wrong", "rejected the auth token")])
def test_a_token_cluster_without_the_right_token_is_one_line(sent, message):
    from rayline.cluster.probe import probe_ray_client

    running = _RayServers("rl-cluster-token")
    try:
        for probe, address in ((probe_gcs, running.gcs_address),
                               (probe_ray_client, running.client_address.removeprefix("ray://"))):
            with pytest.raises(ClusterError, match=message) as info:
                probe(address, token=lambda: sent, timeout_s=5)
            assert address in str(info.value) and "\n" not in str(info.value)
    finally:
        running.stop()


@pytest.fixture
def decisions(monkeypatch, tmp_path):
    """rayline.cluster's token decision, recorded instead of applied (Ray's config in this process is
    left alone); the client has a token file in HOME, as after any earlier `ray start`."""
    from rayline.cluster import connection as cluster

    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("rl-cluster-token")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    made = []
    monkeypatch.setattr(cluster, "_enable_token_auth", lambda: made.append("token"))
    monkeypatch.setattr(cluster, "_disable_token_auth", lambda: made.append("disabled"))
    return made


def _expected(servers):
    return ["token" if servers.token else "disabled"]


def test_an_explicit_address_gets_the_token_mode_its_cluster_uses(servers, decisions):
    from rayline.cluster.connection import match_cluster_auth

    match_cluster_auth(servers.gcs_address)
    assert decisions == _expected(servers)


def test_ray_client_addresses_are_asked_too(servers, decisions):
    from rayline.cluster.connection import match_cluster_auth

    match_cluster_auth(servers.client_address)
    assert decisions == _expected(servers) and servers.calls[0] is None


def test_auto_asks_the_cluster_ray_would_join_from_ray_address(servers, decisions, monkeypatch):
    from rayline.cluster.connection import match_cluster_auth

    monkeypatch.setenv("RAY_ADDRESS", servers.gcs_address)
    match_cluster_auth("auto")
    assert decisions == _expected(servers) and servers.calls


def test_auto_asks_the_cluster_of_the_latest_ray_start(servers, decisions, monkeypatch):
    """No RAY_ADDRESS: Ray's "auto" reads the address the latest `ray start` wrote (ray_current_cluster)."""
    import ray._private.services as services

    from rayline.cluster.connection import match_cluster_auth

    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: servers.gcs_address)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset())
    match_cluster_auth("auto")
    assert decisions == _expected(servers) and servers.calls


def test_auto_with_no_cluster_on_this_machine_decides_nothing(decisions, monkeypatch):
    import ray._private.services as services

    from rayline.cluster.connection import match_cluster_auth

    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset())
    match_cluster_auth("auto")  # ray.init("auto") then says "Could not find any running Ray instance"
    assert decisions == []


def test_an_explicit_auth_mode_is_left_alone_but_the_address_still_asked(servers, decisions, monkeypatch):
    from rayline.cluster.connection import match_cluster_auth

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    match_cluster_auth(servers.gcs_address)
    assert decisions == [] and servers.calls
