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


class _Ingress:
    """A real HTTP server on loopback answering /-/routes as Serve's ingress does: a JSON object of
    route prefix -> app, with `routes` listed once `after` requests have been answered without them,
    or `status` for every request."""

    def __init__(self, routes: dict, after: int = 0, status: int = 200):
        import http.server
        import json
        import threading

        self.requests = 0
        ingress = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ingress.requests += 1
                listed = routes if ingress.requests > after else {"/other": "other"}
                body = json.dumps(listed if status == 200 else {}).encode()
                self.send_response(status if self.path == "/-/routes" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = ServeAddress("127.0.0.1", self.server.server_address[1], existing=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_deploy_waits_until_the_ingress_lists_every_new_route():
    from rayline.serve.address import wait_routed

    with _Ingress({"/m": "m", "/m/v/2": "m-v2"}, after=3) as ingress:
        assert wait_routed(ingress.address, ["/m", "/m/v/2"], "127.0.0.1", timeout_s=30, here=True)
        assert ingress.requests == 4  # polled until the list named both, and no longer


def test_routes_still_missing_at_the_deadline_are_a_warning_not_a_failed_deploy(caplog):
    from rayline.serve.address import wait_routed

    with _Ingress({"/m": "m"}, after=10**6) as ingress, caplog.at_level("WARNING", logger="rayline.serve"):
        assert wait_routed(ingress.address, ["/m"], "127.0.0.1", timeout_s=0.5, here=True) is False
        assert ingress.requests >= 2
    (record,) = caplog.records
    assert f"at {ingress.address.url('/-/routes', '127.0.0.1')} does not list /m 0.5 s after" in record.getMessage()
    assert "(it lists /other)" in record.getMessage()


def test_no_wait_where_nothing_of_serve_answers_from_here():
    from rayline.serve.address import wait_routed

    with _Ingress({"/m": "m"}, status=404) as ingress:  # another server, no route list: nothing to wait for
        assert wait_routed(ingress.address, ["/m"], "127.0.0.1", timeout_s=30, here=True) is False
        assert ingress.requests == 1
    with socket.socket() as closed:  # nothing listens there at all: given up after unreachable_s
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert wait_routed(ServeAddress("127.0.0.1", port, True), ["/m"], "127.0.0.1", timeout_s=30, unreachable_s=0.5,
                       here=True) is False
    with _Ingress({"/m": "m"}) as ingress:  # no proxy of the cluster on this machine: not even asked
        assert wait_routed(ingress.address, ["/m"], "127.0.0.1", here=False) is False
        assert ingress.requests == 0
