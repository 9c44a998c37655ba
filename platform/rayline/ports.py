"""Is a TCP port on this machine free, and if not, which process holds it."""

from __future__ import annotations

import errno
import socket

__all__ = ["port_holder", "free_port", "listen_port", "ephemeral_range"]

# Ray's worker processes listen on 10002-19999 (its min/max_worker_port defaults).
_ABOVE_RAY_WORKERS = 20000


def _describe_listener(port: int) -> str:
    import psutil

    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                try:
                    command = " ".join(psutil.Process(conn.pid).cmdline())[:120]
                except psutil.Error:
                    command = "?"
                return f"pid {conn.pid}: {command}"
    except (psutil.Error, OSError):
        pass
    return "a process rayline cannot see"


def port_holder(host: str, port: int) -> str | None:
    """None when (host, port) can be bound on this machine; else who holds it ('pid N: command').

    SO_REUSEADDR, as servers set it: a port with only connections in TIME_WAIT is free. A host
    that is not an address of this machine is not checked (None).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None
            return _describe_listener(port)
    return None


def free_port(host: str = "127.0.0.1", preferred: int | None = None) -> int:
    """`preferred` when it can be bound on `host`, else a port the OS picks as free now."""
    if preferred is not None and port_holder(host, preferred) is None:
        return preferred
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host or "0.0.0.0", 0))
        return sock.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """(first, last) port the OS hands to outgoing connections (Linux's ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            first, last = (int(v) for v in fh.read().split())
            return first, last
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def listen_port(host: str = "0.0.0.0", attempts: int = 200) -> int:
    """A port free now that stays free until a server binds it later (minutes later: HAProxy's
    stats and metrics ports are chosen when Ray starts and bound when Serve does).

    `free_port` asks the OS for a port from its ephemeral range, the range it also hands to
    every outgoing connection: on a busy machine one of them took such a port before HAProxy
    bound it ("cannot bind socket (Address already in use) for [0.0.0.0:43777]", a second Ray
    beside the test session's). So a random free port between Ray's worker ports and that
    range, which nothing takes without asking for it; `free_port` when there is no such range.
    """
    import random

    first, last = ephemeral_range()
    low, high = (_ABOVE_RAY_WORKERS, first) if first > _ABOVE_RAY_WORKERS + 1000 else (last + 1, 65536)
    pick = random.SystemRandom()
    for _ in range(attempts if high - low > 1000 else 0):
        port = pick.randrange(low, high)
        if port_holder(host, port) is None:
            return port
    return free_port(host)
