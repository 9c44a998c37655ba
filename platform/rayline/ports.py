"""Is a TCP port on this machine free, and if not, which process holds it."""

from __future__ import annotations

import errno
import socket

__all__ = ["port_holder", "free_port"]


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
