"""Credentials out of every URI rayline prints, logs or puts in an error message.

A tracking URI such as `postgresql://u:secret@db/mlflow` or `https://user:token@host`, or
an artifact location with `?token=...` / `?X-Amz-Signature=...`, must never reach a
terminal or a CI log with its secret. Every place that formats a URI goes through
`redact_uri`; every place that shows the text of an exception that may quote one goes
through `redact_text`, passing the URIs it knows about, so that their secrets are masked
wherever they appear (a driver may echo the password alone, or percent-decoded).

Security first: over-redacting something that merely looks like a credential is
acceptable, leaking part of a password is not.
- userinfo `user:password@` keeps the user name (`user:***@`); a lone `token@` becomes
  `***@`; a password with a raw `@` or `/` in it is hidden up to the last `@`;
- values of query or connection-string parameters whose name looks secret (password,
  pwd, token, secret, key, sig/signature, credential, auth, session) become `***`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["redact_uri", "redact_text", "MASK"]

MASK = "***"

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# In free text a URI ends at whitespace, a quote or a bracket.
_URI_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}]+")
_SECRET_NAME = r"[A-Za-z0-9_.\-]*(?:pass|pwd|token|secret|key|sig|credential|auth|session)[A-Za-z0-9_.\-]*"
# name=value in a query string (?a=b&c=d), ;-separated parameters or a libpq "key=value" string.
_SECRET_PARAM = re.compile(
    rf"(?P<name>\b{_SECRET_NAME})=(?P<value>'[^']*'|\"[^\"]*\"|[^\s&;#'\"<>]+)", re.IGNORECASE
)
# Secrets shorter than this are only masked where they sit in a URI, not anywhere in the text
# (masking every "ab" of a message would make it unreadable and hides nothing worth hiding).
_MIN_SECRET_LEN = 3


def _split_userinfo(uri: str) -> tuple[str, str | None, str]:
    """(scheme://, userinfo or None, rest after '@'). Userinfo runs to the URI's last '@' when a
    ':' comes before any '/' (a password may hold raw '@' or '/'), or is a lone name before '@'."""
    m = _SCHEME.match(uri)
    if not m:
        return "", None, uri
    scheme, rest = m.group(0), uri[m.end():]
    at = rest.rfind("@")
    if at < 0:
        return scheme, None, rest
    candidate = rest[:at]
    colon, slash = candidate.find(":"), min((i for i in (candidate.find(c) for c in "/?#") if i >= 0), default=-1)
    if colon >= 0 and (slash < 0 or colon < slash):
        return scheme, candidate, rest[at + 1:]  # user:password (password may contain '@' or '/')
    first_at = rest.find("@")
    lone = rest[:first_at]
    if lone and not any(c in lone for c in "/?#:"):
        return scheme, lone, rest[first_at + 1:]  # a lone name (often a token) before the host
    return scheme, None, rest


def _mask_params(text: str) -> str:
    return _SECRET_PARAM.sub(lambda m: f"{m.group('name')}={MASK}", text)


def redact_uri(uri: object) -> str:
    """One URI, safe to print: `postgresql://u:***@db/mlflow`, `https://***@host`, `...?token=***`."""
    scheme, userinfo, rest = _split_userinfo(str(uri))
    if userinfo is not None:
        user = userinfo.split(":", 1)[0] if ":" in userinfo else None
        rest = f"{user}:{MASK}@{rest}" if user is not None else f"{MASK}@{rest}"
    return _mask_params(scheme + rest)


def _secrets_of(uri: str) -> set[str]:
    """The secret substrings of `uri` (password or lone token, secret parameter values), raw and decoded."""
    found = set()
    _, userinfo, _ = _split_userinfo(uri)
    if userinfo is not None:
        found.add(userinfo.split(":", 1)[1] if ":" in userinfo else userinfo)
    for m in _SECRET_PARAM.finditer(uri):
        found.add(m.group("value").strip("'\""))
    return {v for s in found for v in (s, unquote(s)) if len(v) >= _MIN_SECRET_LEN}


def redact_text(text: object, *known_uris: str | None) -> str:
    """`text` (an error message, a log line) with credentials masked: those of every URI in it,
    secret-named key=value pairs, and the secrets of `known_uris` wherever they appear."""
    out = _URI_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), str(text))
    out = _mask_params(out)
    for secret in sorted({s for uri in known_uris if uri for s in _secrets_of(str(uri))}, key=len, reverse=True):
        out = out.replace(secret, MASK)
    return out
