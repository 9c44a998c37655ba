"""The Ray auth token the Jobs API client sends, read where Ray reads it, never shown.

Ray 2.60's `ray start --head` turns token authentication on by default; the dashboard (and its
Jobs API) then answers 401 "Missing authentication token" to a request without
`Authorization: Bearer <token>`. Ray's own JobSubmissionClient adds that header only when
RAY_AUTH_MODE=token is set in the submitting process (its config is read once, at import), so a
user with a token but without that variable got a 401. rayline sends the header itself whenever
a token is present, from the same places as Ray's AuthenticationTokenLoader, in its order:
RAY_AUTH_TOKEN, then the file RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token.

The token goes into the request headers only: never into the job's runtime_env, its metadata,
an error message or a log line (`mask` hides it in any text rayline shows).
"""

from __future__ import annotations

import os
from pathlib import Path

from rayline.errors import ClusterError

__all__ = ["TOKEN_SOURCES", "load_token", "auth_headers", "mask", "missing_token_message"]

TOKEN_SOURCES = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"


def _default_token_file() -> Path:
    return Path.home() / ".ray" / "auth_token"


def load_token() -> str | None:
    """The token this process would send, or None when there is none."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    explicit = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    path = Path(explicit).expanduser() if explicit else _default_token_file()
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError as exc:
        if explicit:  # named but missing: say so, rather than sending nothing
            raise ClusterError(f"RAY_AUTH_TOKEN_PATH: no such file (got {explicit}; allowed: a file holding the "
                               "cluster's Ray auth token)") from exc
        return None
    except OSError as exc:
        raise ClusterError(f"{path}: cannot read the Ray auth token ({exc.strerror or exc})") from exc
    return token or None


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def mask(text: str, token: str | None) -> str:
    """`text` with the token (if any) replaced by ***."""
    return text.replace(token, "***") if token and len(token) >= 4 else text


def missing_token_message(url: str, had_token: bool) -> str:
    if had_token:
        return (f"{url}: the Ray cluster rejected the auth token (got a token from {TOKEN_SOURCES}; allowed: the "
                "token the cluster was started with: `ray get-auth-token` on the head, or the KubeRay Secret)")
    return (f"{url}: the Ray cluster requires token authentication and no token is set (allowed: set RAY_AUTH_TOKEN, "
            "or RAY_AUTH_TOKEN_PATH to a file holding it, or write it to ~/.ray/auth_token; on the head "
            "`ray get-auth-token` prints it)")
