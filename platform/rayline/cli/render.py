"""Renderings several commands share: times, sizes, durations, and text with credentials masked."""

from __future__ import annotations

import os

from rayline.errors import SpecError


def when(ms) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def duration_s(text: str) -> float:
    """'30m', '12h', '7d' or '90s' -> seconds; SpecError naming the option otherwise."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not match:
        raise SpecError([f"--older-than: not a duration (got {text!r}; allowed: a number and a unit s, m, h or d, "
                         "e.g. 12h or 7d)"])
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def _known_uris() -> list[str | None]:
    return [os.environ.get(k) for k in ("RAYLINE_TRACKING_URI", "MLFLOW_TRACKING_URI", "RAY_ADDRESS")]


def shown(text: str) -> str:
    """Text from an exception as the terminal may show it: credentials in any URI masked."""
    from rayline.redact import redact_text

    return redact_text(text, *_known_uris())
