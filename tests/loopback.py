"""Plain-HTTP calls on loopback for the suite, without httpx's TLS set-up on every call.

`httpx.get` and `httpx.post` make a new client per call, and each new client builds an SSL context
from certifi's CA bundle (34 ms of CPU on the 2-core box), for http:// URLs too: the session lane's
driver spent ~27 s of CPU there in one run (py-spy, 2026-12-06). These pass one context, made once,
as `verify=` (httpx then uses it as it is); otherwise they are httpx's own calls and clients: a new
connection per `get`/`post`, the same requests, answers and exceptions.

    from tests import loopback
    loopback.post(f"{url}/predict", json=body, timeout=30)
"""

from __future__ import annotations

import ssl

import httpx

__all__ = ["get", "post", "client", "TLS"]

TLS = ssl.create_default_context()  # one context for every call here (and `verify=loopback.TLS` elsewhere)


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, verify=TLS, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, verify=TLS, **kwargs)


def client(**kwargs) -> httpx.Client:
    return httpx.Client(verify=TLS, **kwargs)
