"""Set dotted paths (`train.lr`, `data.preprocess[0].impute.columns`) in a raw spec mapping: what
`--set` overrides, submitted jobs and resumed runs do to a spec before it is validated."""

from __future__ import annotations

import copy
from typing import Any

from rayline.errors import SpecError
from rayline.spec.paths import dotted, parse_dotted
from rayline.spec.problems import SpecProblem, from_validation_error, problem

__all__ = ["set_paths", "with_overrides"]


def set_paths(raw: dict, overrides: dict[str, Any]) -> None:
    """Set each dotted path of `overrides` in the raw spec mapping, creating mappings on the way.

    `[i]` segments index an existing list item (never create one). Raises SpecProblem naming
    the override when a parent on the way is not a mapping (or not a list, for an index).
    """
    for path, value in overrides.items():
        node: Any = raw
        keys = parse_dotted(path)
        *parents, leaf = keys
        for depth, p in enumerate(keys):
            last = depth == len(keys) - 1
            where = dotted(keys[:depth]) or "the spec"
            if isinstance(p, int):
                if not isinstance(node, list):
                    raise problem((path,), f"{where} is not a list, so it has no item [{p}]", got=repr(node))
                if p >= len(node):
                    raise problem((path,), f"{where} has no item [{p}]", got=f"{len(node)} items",
                                  allowed=f"[0] to [{len(node) - 1}]" if node else "none")
                if last:
                    node[p] = copy.deepcopy(value)
                else:
                    node = node[p]
                continue
            if not isinstance(node, dict):
                raise problem((path,), f"{where} is not a mapping, so it has no key {p!r}", got=repr(node))
            if last:
                node[p] = copy.deepcopy(value)
            else:
                node = node.setdefault(p, {}) if not isinstance(keys[depth + 1], int) else node.get(p)
                if node is None:
                    raise problem((path,), f"{dotted(keys[:depth + 1])} is not set, so it has no item [{keys[depth + 1]}]",
                                  got="nothing")


def with_overrides(spec, overrides: dict[str, Any], source: str = "overrides"):
    """A copy of the validated `spec` (a pydantic model) with each dotted path set, validated again
    by its own model class; SpecError with every problem. `spec.overrides.apply_overrides` is this
    for a PipelineSpec; the spec's own checks call it here, without the loading module."""
    from pydantic import ValidationError

    raw = spec.model_dump(by_alias=True, exclude_none=True)
    try:
        set_paths(raw, overrides)
    except SpecProblem as exc:
        raise SpecError(list(exc.problems), source) from exc
    try:
        return type(spec).model_validate(raw)
    except ValidationError as exc:
        raise SpecError(from_validation_error(exc, type(spec)), source) from exc
