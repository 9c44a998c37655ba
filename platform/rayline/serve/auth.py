"""API keys for a served model: `Authorization: Bearer <key>` on every route but `GET /health`.

Where the keys live, and why there: the spec names only *where* to find them
(`serve.auth.api_keys_env: VAR` or `serve.auth.api_keys_file: PATH`); the replica reads them
when it starts. So the secret is never a deployment argument, never in a Serve config,
`serve status` output, the MLflow registry, a log line or an error body: those hold the
variable's name or the file's path, nothing more. The variable must be in the environment
of the Ray nodes (Ray workers inherit the raylet's environment: for an embedded Ray that is
the driver's environment at `ray.init`, for `rayline cluster up` the shell that ran it, on
KubeRay the pod spec); passing it through a runtime_env would write it into Serve's config.

Keys are compared in constant time: the presented token and every key are hashed to 32-byte
SHA-256 digests (so their lengths do not leak either) and the token is compared with *every*
key by `hmac.compare_digest`, with no early exit that would reveal which key matched.

The check is a plain ASGI middleware: ~5 microseconds per request with two keys (measured by
tests/unit/test_serve_auth.py), far below the ~2 ms a served prediction costs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from rayline.errors import ServeError

__all__ = ["MIN_KEY_LENGTH", "OPEN_PATHS", "BearerAuthMiddleware", "install_auth", "load_api_keys", "parse_keys"]

MIN_KEY_LENGTH = 16
OPEN_PATHS = frozenset({"/health"})  # GET only: load balancers and Serve health checks probe it
_KEY_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def parse_keys(text: str, *, separator: str | None, where: str) -> list[str]:
    """Keys from a file's text (`separator` None: one per line, blank lines and `#` comments
    ignored) or from a variable's value (comma-separated). Problems name the position of a
    key, never the key itself."""
    items = text.splitlines() if separator is None else text.split(separator)
    keys: list[str] = []
    for number, raw in enumerate(items, start=1):
        item = raw.strip()
        if not item or (separator is None and item.startswith("#")):
            continue
        position = f"line {number}" if separator is None else f"key {number}"
        if not all(0x21 <= ord(c) <= 0x7E for c in item):
            raise ServeError(f"{where}: {position} holds a space or a non-printable or non-ASCII character "
                             f"(the key is not shown; allowed: printable ASCII without spaces)")
        if len(item) < MIN_KEY_LENGTH:
            raise ServeError(f"{where}: {position} is shorter than {MIN_KEY_LENGTH} characters "
                             f"(the key is not shown; allowed: a random key, e.g. from `{_KEY_HINT}`)")
        keys.append(item)
    return keys


def load_api_keys(auth: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list[str]:
    """The API keys named by a `serve.auth` mapping, read here (on the replica).

    Raises ServeError naming the variable or file (never its contents) when none are found.
    """
    environ = os.environ if environ is None else environ
    var, path = auth.get("api_keys_env"), auth.get("api_keys_file")
    if (var is None) == (path is None):
        raise ServeError(f"serve.auth: give exactly one of api_keys_env or api_keys_file "
                         f"(got {sorted(k for k, v in auth.items() if v is not None)}; allowed: api_keys_env, api_keys_file)")
    if var is not None:
        where = f"serve.auth.api_keys_env: environment variable {var}"
        if var not in environ:
            raise ServeError(f"{where} is not set on the Ray node of this replica (allowed: comma-separated keys; "
                             f"set it in the environment that starts Ray: before `rayline cluster up` or `rayline run`, "
                             f"or in the pod spec on KubeRay)")
        keys = parse_keys(environ[var], separator=",", where=where)
    else:
        where = f"serve.auth.api_keys_file: {path}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ServeError(f"{where}: cannot be read on the Ray node of this replica ({reason}; allowed: a UTF-8 "
                             f"file with one key per line, readable where the replicas run)") from exc
        keys = parse_keys(text, separator=None, where=where)
    if not keys:
        raise ServeError(f"{where} holds no API keys (got none; allowed: "
                         f"{'comma-separated keys' if var is not None else 'one key per line, # comments and blank lines ignored'})")
    return keys


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class BearerAuthMiddleware:
    """ASGI middleware: 401 with a JSON body and `WWW-Authenticate: Bearer` unless the request
    carries `Authorization: Bearer <one of the keys>`; `GET`/`HEAD` of OPEN_PATHS pass."""

    def __init__(self, app, keys: Iterable[str], open_paths: Iterable[str] = OPEN_PATHS):
        self.app = app
        self._digests = tuple(_digest(k.encode("ascii")) for k in keys)  # the keys themselves are not kept
        if not self._digests:
            raise ServeError("serve.auth: no API keys to check requests against (got none)")
        self._open = frozenset(open_paths)

    def _authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        value = next((v for k, v in headers if k == b"authorization"), None)
        if value is None or value[:7].lower() != b"bearer ":
            return False
        presented = _digest(value[7:].strip())
        ok = False
        for digest in self._digests:  # every key, no early exit: timing does not tell which matched
            ok |= hmac.compare_digest(presented, digest)
        return ok

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        root = scope.get("root_path", "")
        path = scope["path"]
        if root and path.startswith(root):  # Serve mounts the app at its route prefix
            path = path[len(root):] or "/"
        if kind == "http" and path in self._open and scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        if self._authorized(scope.get("headers") or ()):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        has_header = any(k == b"authorization" for k, _ in scope.get("headers") or ())
        # The body never echoes what was sent: a mistyped key is still a secret.
        body = json.dumps({"detail": "invalid API key" if has_header else
                           "missing API key: send the header 'Authorization: Bearer <key>'"}).encode()
        challenge = b'Bearer error="invalid_token"' if has_header else b"Bearer"
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge)]})
        await send({"type": "http.response.body", "body": body})


def install_auth(app, keys: Iterable[str] | None) -> None:
    """Require one of `keys` on every route of the FastAPI/Starlette `app` but GET /health.
    `keys` None (no `serve.auth` in the spec) leaves the app open."""
    if keys is None:
        return
    app.add_middleware(BearerAuthMiddleware, keys=list(keys))
