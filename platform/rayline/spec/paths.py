"""Paths into the spec: render a location as text, walk the model tree along one, set keys by dotted path.

A location is a tuple of segments, as pydantic reports them: a `str` is a mapping key, an
`int` a list index. `dotted(("data", "preprocess", 1, "impute"))` is
`data.preprocess[1].impute`, the form every spec message starts with.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Iterable, Union

from pydantic import BaseModel, Tag
from pydantic.fields import FieldInfo

__all__ = ["Segment", "dotted", "field_named", "unwrap", "model_members", "union_tags", "walk", "allowed_keys",
           "parse_dotted"]

Segment = Union[str, int]


def _plain_key(key: str) -> bool:
    # Keys that would make a message ambiguous or span lines are quoted: '', ' x', 'a: b', 'a\nb'.
    return bool(key) and key.isprintable() and key == key.strip() and ": " not in key and not key.endswith(":")


def dotted(loc: Iterable[Any]) -> str:
    """`("train", "optimizer", "lr")` -> `train.optimizer.lr`; indices as `[i]`; odd keys as `['a: b']`."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _plain_key(part):
            out += ("." if out else "") + part
        else:
            out += f"[{part!r}]"
    return out


def unwrap(annotation: Any) -> Any:
    """The annotation without `Annotated[...]` and `Optional[...]` around it."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def model_members(annotation: Any) -> list[type[BaseModel]]:
    """Every BaseModel class an annotation can hold directly: X, Optional[X], Union[X, Y], list[X]."""
    annotation = unwrap(annotation)
    if is_model(annotation):
        return [annotation]
    origin = typing.get_origin(annotation)
    if is_union(annotation) or origin is list:
        return [m for arg in typing.get_args(annotation) for m in model_members(arg)]
    return []


def union_tags(annotation: Any) -> dict[str, Any]:
    """Tag -> member of a discriminated union written as `Union[Annotated[X, Tag("x")], ...]`; {} otherwise."""
    tags = {}
    for arg in typing.get_args(unwrap(annotation)):
        if typing.get_origin(arg) is typing.Annotated:
            member, *meta = typing.get_args(arg)
            tags.update({m.tag: member for m in meta if isinstance(m, Tag)})
    return tags


def field_named(model: type[BaseModel], key: Any) -> FieldInfo | None:
    """The field of `model` that the spec key `key` sets (by alias or by name)."""
    for name, field in model.model_fields.items():
        if key == (field.alias or name) or key == name:
            return field
    return None


def walk(root: type[BaseModel], loc: Iterable[Any]) -> tuple[tuple, Any, list[tuple[int, Any]]]:
    """Follow a pydantic error location through the model tree.

    Returns the location without pydantic's union-member labels, the annotation found at
    its end (None where the tree cannot be followed), and, for each non-discriminated union
    passed, (index in the returned location, the union) so the caller can merge the member
    errors of one union into one problem. A discriminated union's tags are known (its
    `Tag`s), so exactly those are dropped; any other union's member label is the segment
    right after it.
    """
    out: list = []
    unions: list[tuple[int, Any]] = []
    ann: Any = root
    loc = list(loc)
    i = 0
    while i < len(loc):
        part = loc[i]
        node = unwrap(ann) if ann is not None else None
        if node is not None and is_union(node):
            tags = union_tags(node)
            if part in tags:  # the tag names the member; drop it
                ann = tags[part]
                i += 1
                continue
            having = [m for m in model_members(node) if field_named(m, part) is not None]
            if having:  # a location already without tags: the member with that field
                node = having[0]
            elif tags:
                node = None
            else:  # a member label such as 'int' or "literal['numeric']": drop it, member unknown
                unions.append((len(out), node))
                ann = None
                i += 1
                continue
        out.append(part)
        i += 1
        if node is None:
            continue
        if is_model(node):
            field = field_named(node, part)
            ann = field.annotation if field is not None else None
        elif typing.get_origin(node) is list:
            args = typing.get_args(node)
            ann = args[0] if args and isinstance(part, int) else None
        elif typing.get_origin(node) is dict:
            args = typing.get_args(node)
            ann = args[1] if args else None
            if i < len(loc) and loc[i] == "[key]":  # pydantic's marker for a bad key: the key itself is the problem
                i += 1
                ann = None
        else:
            ann = None
    return tuple(out), ann, unions


def allowed_keys(root: type[BaseModel], loc: Iterable[Any]) -> list[str]:
    """The keys the spec allows at `loc` (a cleaned location), in declaration order; [] if it is not a mapping of fields."""
    _, ann, _ = walk(root, loc)
    keys: dict[str, None] = {}
    for model in model_members(ann) if ann is not None else []:
        keys.update(dict.fromkeys(f.alias or name for name, f in model.model_fields.items()))
    return list(keys)


_INDEX_RE = re.compile(r"\[(\d+)\]")


def parse_dotted(path: str) -> list[Segment]:
    """`data.preprocess[0].impute.strategy` -> ["data", "preprocess", 0, "impute", "strategy"].

    The inverse of `dotted` for plain keys: list items are written the way error messages
    already write them, so a path copied from a message can be tuned or `--set`.
    """
    out: list[Segment] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            out.append(name)
        if rest:
            rest = "[" + rest
            indices = _INDEX_RE.findall(rest)
            if "".join(f"[{i}]" for i in indices) != rest:
                out.append(part if not name else rest)  # not an index: kept as a key, reported where it is used
                continue
            out.extend(int(i) for i in indices)
        elif not name:
            out.append(part)
    return out
