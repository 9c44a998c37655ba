"""rayline.Client against real local HTTP servers (a thread each, on a free port; no Ray):
retries with the honoured Retry-After, connection failures, no retry on 4xx, chunking in
order, re-chunking to the server's max_instances, NaN as null, the API key header."""

import json
import math
import socket
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from rayline import Client, DataError, ServeError
from rayline.client import ServeRequestError, backoff_delay, parse_retry_after
from rayline.ports import free_port


class Server:
    """A tiny JSON model server: `script` is a list of (status, headers, body) answered in
    order, then 200s that predict `x * 10` per row (probabilities {"a": .25, "b": .75})."""

    def __init__(self, script=(), max_instances=None):
        self.script = list(script)
        self.max_instances = max_instances
        self.requests = []  # (method, path, headers, parsed body)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status, headers, body):
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                if "content-type" not in headers:  # None: no content type at all
                    self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    if value is not None:
                        self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.requests.append(("GET", self.path, dict(self.headers), None))
                self._answer(200, {}, {"status": "ok", "model": "m", "version": "3"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(("POST", self.path, dict(self.headers), body))
                if outer.script:
                    return self._answer(*outer.script.pop(0))
                rows = body["instances"]
                if outer.max_instances and len(rows) > outer.max_instances:
                    return self._answer(422, {}, {"detail": [{"loc": ["body", "instances"], "type": "too_long",
                                                              "msg": f"List should have at most {outer.max_instances} "
                                                                     f"items after validation, not {len(rows)}"}]})
                answer = {"predictions": [None if r.get("x") is None else r["x"] * 10 for r in rows],
                          "model": "m", "version": "3"}
                if body.get("probabilities"):
                    answer["probabilities"] = [{"a": 0.25, "b": 0.75} for _ in rows]
                self._answer(200, {"x-rayline-version": "4"}, answer)

        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.url = f"http://127.0.0.1:{self.port}/m"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def posts(self):
        return [r for r in self.requests if r[0] == "POST"]


class Closer:
    """Accepts connections and closes them without a word; counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", free_port()))
        self.sock.listen(16)
        self.count = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/m"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.recv(65536)
            conn.close()


ROWS = [{"x": float(i)} for i in range(7)]


def test_429_with_retry_after_then_503_then_200_honours_the_delay_and_counts_attempts():
    script = [(429, {"retry-after": "1"}, {"detail": "too many requests"}), (503, {}, b"Service Unavailable")]
    with Server(script) as server, Client(server.url, backoff_s=0.05, max_retries=3) as client:
        started = time.monotonic()
        frame = client.predict(ROWS[:2])
        elapsed = time.monotonic() - started
    assert client.attempts == 3 and len(server.posts) == 3
    assert 1.0 <= elapsed < 2.5, elapsed  # Retry-After: 1 waited; the 503's full-jitter backoff <= 0.1 s
    assert frame["prediction"].tolist() == [0.0, 10.0]
    assert client.version == "4"  # the router's header wins over the body's version


def test_retry_after_as_an_http_date_and_its_cap():
    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.5") == 0.5 and parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    # An HTTP date has whole seconds: "ten seconds from now" is written up to a second early (S2 of
    # 2026-12-01: written at x.9999 s, it parsed as 8.99999 s). Against a given clock it is exact.
    whole = math.floor(time.time())
    assert parse_retry_after(formatdate(whole + 10, usegmt=True), now=whole) == 10.0
    assert parse_retry_after(formatdate(whole + 10, usegmt=True), now=whole + 0.25) == 9.75
    assert 8.0 < parse_retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10.0  # and against this clock
    assert parse_retry_after(formatdate(time.time() - 100, usegmt=True)) == 0.0
    assert backoff_delay(0, 0.5, 30.0, retry_after=3600.0) == 30.0  # a server asking for an hour is capped
    delays = [backoff_delay(4, 0.5, 30.0) for _ in range(500)]
    assert 0.0 <= min(delays) < 1.0 and 7.0 < max(delays) <= 8.0  # full jitter: uniform(0, 0.5 * 2**4)
    assert max(backoff_delay(20, 0.5, 30.0) for _ in range(200)) <= 30.0


def test_retry_after_http_date_is_honoured_over_http():
    when = formatdate(time.time() + 2, usegmt=True)  # second resolution: waits 1-2 s
    with Server([(429, {"retry-after": when}, {"detail": "busy"})]) as server, Client(server.url, backoff_s=0.01) as client:
        started = time.monotonic()
        client.predict(ROWS[:1])
        assert 0.9 <= time.monotonic() - started < 3.0
    assert client.attempts == 2


def test_persistent_503_gives_up_with_attempts_and_last_status():
    with Server([(503, {}, b"Service Unavailable")] * 10) as server, Client(server.url, backoff_s=0.01, max_retries=2) as client:
        with pytest.raises(ServeRequestError) as info:
            client.predict(ROWS[:1])
    assert len(server.posts) == 3
    assert info.value.status == 503 and info.value.attempts == 3
    assert str(info.value) == f"{server.url}/predict answered 503 after 3 attempts: Service Unavailable"
    assert isinstance(info.value, ServeError)


@pytest.mark.parametrize("status", [502, 504])
def test_gateway_errors_are_retried(status):
    with Server([(status, {}, {"detail": "gateway"})]) as server, Client(server.url, backoff_s=0.01) as client:
        assert client.predict(ROWS[:1])["prediction"].tolist() == [0.0]
    assert len(server.posts) == 2


# Byte for byte what Serve's HAProxy ingress answers when no replica did (Ray's errorfile for its
# 502/503/504), and the two 500s a replica gives: rayline's JSON one and Serve's for an escaped exception.
INGRESS_500 = (500, {"content-type": "text/plain"}, b"Internal Server Error")
MODEL_500 = (500, {}, {"detail": "internal error (ValueError); the server log has the details"})
REPLICA_500 = (500, {"content-type": None}, b"Internal Server Error")


def test_the_ingress_500_for_a_lost_replica_is_retried_and_a_models_500_is_not():
    with Server([INGRESS_500, INGRESS_500]) as server, Client(server.url, backoff_s=0.01) as client:
        assert client.predict(ROWS[:2])["prediction"].tolist() == [0.0, 10.0]
    assert len(server.posts) == 3 and client.attempts == 3
    for answer, detail in ((MODEL_500, "internal error (ValueError)"), (REPLICA_500, "Internal Server Error")):
        with Server([answer] * 3) as server, Client(server.url, backoff_s=0.01) as client:
            with pytest.raises(ServeRequestError) as info:
                client.predict(ROWS[:1])
        assert len(server.posts) == 1 and info.value.status == 500, answer
        assert detail in str(info.value)
    with Server([INGRESS_500] * 5) as server, Client(server.url, backoff_s=0.01, max_retries=2) as client:
        with pytest.raises(ServeRequestError) as info:
            client.predict(ROWS[:1])
    assert len(server.posts) == 3 and info.value.attempts == 3
    assert "answered 500 after 3 attempts: no replica answered (Serve's HAProxy ingress" in str(info.value)


def test_a_server_closing_connections_is_retried_then_reported():
    closer = Closer()
    with Client(closer.url, backoff_s=0.01, max_retries=2) as client:
        with pytest.raises(ServeRequestError) as info:
            client.predict(ROWS[:1])
    closer.sock.close()
    assert closer.count == 3 and info.value.attempts == 3 and info.value.status is None
    assert str(info.value).startswith(f"cannot reach {closer.url}/predict after 3 attempts: ")
    assert "\n" not in str(info.value)


def test_connection_refused_is_retried():
    port = free_port()  # nothing listens there
    with Client(f"http://127.0.0.1:{port}/m", backoff_s=0.01, max_retries=1) as client:
        with pytest.raises(ServeRequestError, match=r"cannot reach .* after 2 attempts"):
            client.health()


@pytest.mark.parametrize("status, body, expected", [
    (422, {"detail": [{"loc": ["body", "instances", 0, "x"], "msg": "Input should be a valid number", "type": "float_type"}]},
     "answered 422: the model rejected the request: instances.0.x: Input should be a valid number"),
    (404, {"detail": "Not Found"}, "answered 404: Not Found"),
    (401, {"detail": "invalid API key"}, "answered 401: invalid API key (pass api_key="),
])
def test_other_4xx_fail_at_once_naming_the_field(status, body, expected):
    with Server([(status, {}, body)]) as server, Client(server.url, backoff_s=0.01) as client:
        with pytest.raises(ServeRequestError) as info:
            client.predict(ROWS[:1])
    assert len(server.posts) == 1 and info.value.attempts == 1 and info.value.status == status
    assert expected in str(info.value)


def test_chunks_are_sent_in_order_and_reassembled_on_the_frames_index():
    frame = pd.DataFrame({"x": [float(i) for i in range(7)]}, index=[f"r{i}" for i in range(7)])
    with Server() as server, Client(server.url + "/predict", batch_size=3, api_key="k" * 20) as client:
        out = client.predict(frame, probabilities=True)
    assert [len(r[3]["instances"]) for r in server.posts] == [3, 3, 1]
    assert {r[2]["authorization"] for r in server.posts} == {"Bearer " + "k" * 20}
    assert {r[1] for r in server.posts} == {"/m/predict"}  # a trailing /predict in the URL is not doubled
    assert list(out.index) == list(frame.index)
    assert list(out.columns) == ["prediction", "probability_a", "probability_b"]
    assert out["prediction"].tolist() == [i * 10.0 for i in range(7)]
    assert out["probability_b"].tolist() == [0.75] * 7


def test_a_smaller_server_max_instances_is_respected():
    with Server(max_instances=2) as server, Client(server.url, batch_size=5) as client:
        out = client.predict(ROWS)
    sizes = [len(r[3]["instances"]) for r in server.posts]
    assert sizes == [5, 2, 2, 2, 1]  # one refused chunk of 5, then chunks of 2
    assert out["prediction"].tolist() == [i * 10.0 for i in range(7)]


def test_nan_and_none_in_a_frame_go_as_null_and_inf_is_refused_before_sending():
    frame = pd.DataFrame({"x": [1.0, float("nan"), None], "s": ["a", None, "c"]})
    with Server() as server, Client(server.url) as client:
        out = client.predict(frame)
        assert server.posts[0][3]["instances"] == [{"x": 1.0, "s": "a"}, {"x": None, "s": None}, {"x": None, "s": "c"}]
        assert out["prediction"].iloc[0] == 10.0 and pd.isna(out["prediction"].iloc[1])
        with pytest.raises(DataError, match=r"predict: row 1, column 'x': not a finite number \(got inf"):
            client.predict(pd.DataFrame({"x": [1.0, float("inf")]}))
    assert len(server.posts) == 1


def test_metadata_health_and_bad_arguments():
    with Server() as server, Client(server.url) as client:
        assert client.health()["status"] == "ok"
        assert client.metadata()["model"] == "m"
        assert [r[1] for r in server.requests] == ["/m/health", "/m/metadata"]
    with pytest.raises(ServeError, match="Client url: not an HTTP URL"):
        Client("/digits")
    with pytest.raises(ServeError, match="Client batch_size: must be an integer >= 1"):
        Client("http://127.0.0.1:1/m", batch_size=0)
    with pytest.raises(DataError, match="expected a pandas DataFrame or a list of row dicts"):
        Client("http://127.0.0.1:1/m").predict("rows")
