"""YAML for spec files: PyYAML's safe loader, plus the checks a spec needs before any object is built.

- A duplicate mapping key is an error naming the key path and both lines (YAML forbids
  them; PyYAML silently keeps the last, so a second `train:` replaced the first).
- An alias that contains itself is an error: PyYAML would build a recursive list or dict,
  which pydantic, json and deepcopy then walk forever or until RecursionError.
- The document with every alias expanded has at most `MAX_VALUES` values, and at most
  `MAX_DEPTH` levels of nesting. PyYAML itself shares one object per anchor, so a
  "billion laughs" file of ~300 bytes (9 levels of 10 aliases each: 10^9 values) loads in
  a millisecond, and the blow-up comes later, when an error message json-dumps the value
  or a trial dumps the spec: minutes of CPU and unbounded memory.

The checks walk PyYAML's node graph once (an alias is the same node object there, not a
copy), memoising each node's expanded size, so time and memory are linear in the file
whatever the aliases would expand to.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from rayline.errors import SpecError
from rayline.spec.problems import Problem

__all__ = ["MAX_VALUES", "MAX_DEPTH", "load_yaml"]

# A real spec has ~50-200 values and nests 5-6 levels (pipelines/*.yaml); these leave a
# margin of 500x and 10x while bounding what a hostile file can make us build.
MAX_VALUES = 100_000
MAX_DEPTH = 64

_MERGE = "tag:yaml.org,2002:merge"

_BOOL = "tag:yaml.org,2002:bool"


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: true and false only. PyYAML follows YAML 1.1,
    where on, off, yes, no, y and n are booleans too, so `retrain: {on: [drift]}` read as
    `{True: [drift]}` (GitHub Actions' `on:` has the same trap). A bool field still takes "yes" or
    "on" (pydantic reads those strings as true)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    if isinstance(exc, yaml.reader.ReaderError):  # str(exc) spans lines; rebuild its message on one
        pos = exc.position
        line, column = text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return Problem(("(yaml)",), f"line {line}, column {column}: unacceptable character #x{ord(char):04x}: {exc.reason}")
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    what = getattr(exc, "problem", None) or getattr(exc, "context", None) or exc
    context = getattr(exc, "context", None)
    if context and what is not context and not context.startswith("while "):  # "expected a single document ..."
        what = f"{context}, {what}"
    return Problem(("(yaml)",), _one_line(f"{where}{what}"))


def _children(node: yaml.Node, path: tuple) -> list[tuple[yaml.Node, tuple]]:
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                out.append((value, path + (key.value,)))
            else:  # a complex key (`? [a, b]`) counts too; the constructor rejects it later
                out += [(key, path + ("?",)), (value, path + ("?",))]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(item, path + (i,)) for i, item in enumerate(node.value)]
    return []


def _duplicates(node: yaml.MappingNode, path: tuple) -> list[Problem]:
    seen: dict[tuple, int] = {}
    problems = []
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
            continue  # `<<: *base` keys may be overridden by explicit keys: that is what merge means
        line = key.start_mark.line + 1
        ident = (key.tag, key.value)
        if ident in seen:
            problems.append(Problem(path + (key.value,), "duplicate key",
                                    got=f"{key.value!r} at lines {seen[ident]} and {line}", allowed="each key once"))
        else:
            seen[ident] = line
    return problems


def check_nodes(root: yaml.Node) -> list[Problem]:
    """Duplicate keys, recursive aliases, expanded size and depth of a composed document."""
    problems: list[Problem] = []
    size: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, tuple, bool]] = [(root, (), False)]
    while stack:
        node, path, leaving = stack.pop()
        key = id(node)
        if leaving:
            open_.discard(key)
            total = 1 + sum(size[id(child)] for child, _ in _children(node, path))
            size[key] = min(total, MAX_VALUES + 1)  # capped: the sum of a few capped children stays small
            if total > MAX_VALUES:
                return problems + [Problem(path, f"aliases expand this value to more than {MAX_VALUES:,} values",
                                           got=f"the value at line {node.start_mark.line + 1}",
                                           allowed=f"at most {MAX_VALUES:,}")]
            continue
        if key in size:
            continue  # an alias of a node already checked: its size is known
        if key in open_:
            return problems + [Problem(path, "recursive YAML alias: the value contains itself",
                                       got=f"the anchor at line {node.start_mark.line + 1}",
                                       allowed="aliases of complete values")]
        if len(path) > MAX_DEPTH:
            return problems + [Problem(path[:MAX_DEPTH], f"nested more than {MAX_DEPTH} levels deep",
                                       got=f"line {node.start_mark.line + 1}", allowed=f"at most {MAX_DEPTH} levels")]
        open_.add(key)
        if isinstance(node, yaml.MappingNode):
            problems += _duplicates(node, path)
        stack.append((node, path, True))
        stack.extend((child, child_path, False) for child, child_path in reversed(_children(node, path)))
    return problems


def load_yaml(text: str, source: str | None = None) -> Any:
    """The one YAML document in `text`, or SpecError with one line per problem."""
    try:
        loader = _SpecLoader(text)  # checks every character is printable
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_problem(exc, text)], source) from exc
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise SpecError([_yaml_problem(exc, text)], source) from exc
        except RecursionError as exc:  # PyYAML composes nested collections recursively (~500 levels)
            raise SpecError([Problem(("(yaml)",), "nested too deeply to read", allowed=f"at most {MAX_DEPTH} levels")],
                            source) from exc
        if node is None:
            return None
        problems = check_nodes(node)
        if problems:
            raise SpecError(problems, source)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise SpecError([_yaml_problem(exc, text)], source) from exc
        except (ValueError, OverflowError) as exc:  # e.g. a date 2026-02-30, an int past 4300 digits
            raise SpecError([Problem(("(yaml)",), f"a value cannot be read: {_one_line(exc)}")], source) from exc
    finally:
        loader.dispose()
