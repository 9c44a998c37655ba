"""Where Serve answers: a port held by another process is an error naming it (no Ray needed)."""

import os
import socket

import pytest

from rayline.errors import ServeError
from rayline.serve.address import ServeAddress, check_port_free


def test_a_port_held_by_another_process_is_an_error_naming_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServeError) as err:
            check_port_free("127.0.0.1", port)
        with pytest.raises(ServeError):
            check_port_free("0.0.0.0", port)  # a wildcard bind collides with it too
    message = str(err.value)
    assert message.startswith(f"--port: 127.0.0.1:{port} is already in use by another process")
    assert f"got pid {os.getpid()}:" in message and "allowed: a free port" in message
    check_port_free("127.0.0.1", port)  # free again once the holder closed it


def test_url_of_a_wildcard_bind_uses_the_requested_host():
    assert ServeAddress("0.0.0.0", 8000, True).url("/m", "127.0.0.1") == "http://127.0.0.1:8000/m"
    assert ServeAddress("0.0.0.0", 8000, True).url("/m", "0.0.0.0") == "http://127.0.0.1:8000/m"
    assert ServeAddress("10.1.2.3", 8123, True).url("/m", "127.0.0.1") == "http://10.1.2.3:8123/m"
    assert ServeAddress("::1", 8000, False).url("/m", "::1") == "http://[::1]:8000/m"
