"""The distributions of `tune.space` (`{loguniform: [low, high]}`, `{choice: [...]}`, ...): their
shape, checked without the rest of the spec, and the largest value each can draw.

Bounds are inclusive as rayline reads them: `randint: [2, 6]` draws 2..6 (the sweep passes high + 1
to Ray).
"""

from __future__ import annotations

import math
from typing import Any

from rayline.spec.problems import Problem

__all__ = ["DISTRIBUTIONS", "check_distributions", "largest_value"]

DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice", "grid")
_RANGES = ("loguniform", "uniform", "randint")


def largest_value(dist: dict[str, Any]) -> Any:
    """The largest value a trial can draw from one `tune.space` distribution.

    `uniform`/`loguniform`/`randint`: the high bound (inclusive, as rayline reads it);
    `choice`/`grid`: the largest listed value. For numeric paths (train.workers,
    train.batch_size, ...), e.g. to size resources for the most demanding trial; values
    that do not compare (strings mixed with numbers) raise TypeError. The distribution
    must already be valid (`check_distributions`).
    """
    ((kind, args),) = dist.items()
    if kind in _RANGES:
        return args[1]
    return max(args)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_distributions(space: dict[str, Any]) -> list[Problem]:
    """The shape of each distribution; paths relative to `tune.space`."""
    problems = []
    for path, dist in space.items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            problems.append(Problem(
                (path,), f"a distribution is one of {{{', '.join(k + ': ...' for k in DISTRIBUTIONS)}}}",
                got=repr(dist), allowed=", ".join(DISTRIBUTIONS)))
            continue
        ((kind, args),) = dist.items()
        if kind in _RANGES:
            pair = isinstance(args, list) and len(args) == 2 and all(_number(a) for a in args)
            if pair and not _finite(args):
                # Ray would reject it only when the sweep starts (or sample inf/nan); say it now.
                problems.append(Problem((path, kind), "bounds must be finite numbers", got=repr(args),
                                        allowed="finite [low, high] with low < high"))
                continue
            ok = pair and args[0] < args[1]
            if kind == "loguniform" and ok:
                ok = args[0] > 0
            if kind == "randint" and ok:
                ok = all(isinstance(a, int) for a in args)
            if not ok:
                problems.append(Problem(
                    (path, kind),
                    f"needs [low, high] with low < high"
                    f"{' and low > 0' if kind == 'loguniform' else ''}"
                    f"{' as integers' if kind == 'randint' else ''}",
                    got=repr(args)))
        elif not isinstance(args, list) or not args:
            problems.append(Problem((path, kind), "needs a non-empty list of values", got=repr(args)))
        elif not _finite(args):
            problems.append(Problem((path, kind), "values must be finite numbers", got=repr(args),
                                    allowed="no inf or nan"))
    return problems
