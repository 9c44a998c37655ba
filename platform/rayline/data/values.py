"""How raw values compare: one key for equal categories across types, an order for mixed values, missing.

Shared by the preprocessing steps (fitting) and the compiled transform (requests, blocks), which
must agree on them.
"""

from __future__ import annotations

import math

__all__ = ["value_key", "value_rank", "is_missing"]


def value_key(value):
    """Hashable, type-tolerant key: 1 and 1.0 and np.int64(1) name the same category or class."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def value_rank(value):
    """Sort key that orders mixed numbers and strings deterministically."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
