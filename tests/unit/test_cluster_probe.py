"""rayline.cluster_probe without a Ray: bad addresses and settings are one clear line, and the
deadline holds on real loopback sockets (a closed port, and one that accepts and never answers)."""

import socket
import time

import pytest

from rayline.cluster_probe import PROBE_TIMEOUT_ENV, probe_gcs, probe_jobs_api, seconds_from_env, split_address
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
