"""Spec problems: what is wrong where, carried as parts and rendered to text in one place.

Every message reads ``path.to.field: <what> (got <value>; allowed: <...>); did you mean 'x'?``.
Validators raise `SpecProblem` (a ValueError, so pydantic collects it with the other
errors and keeps the exception itself in the error's context); `from_validation_error`
turns pydantic's errors into `Problem`s without reading their text back.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from rayline.spec.paths import allowed_keys, dotted, walk

__all__ = ["Problem", "SpecProblem", "problem", "render", "short", "from_validation_error"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec. `got` and `allowed` are text as shown (values already repr'd)."""

    path: tuple = ()
    what: str = ""
    got: str | None = None
    allowed: str | None = None
    hint: str | None = None  # a close match, shown as "; did you mean 'hint'?"
    allowed_label: str = "allowed"  # "supported", "allowed kinds for torch", ...

    def under(self, prefix: Iterable[Any]) -> "Problem":
        """The same problem, found inside the field at `prefix`."""
        return replace(self, path=tuple(prefix) + tuple(self.path))

    def __str__(self) -> str:
        return render(self)


def render(p: Problem) -> str:
    """The one place a problem becomes text."""
    text = f"{dotted(p.path) or '(top level)'}: {p.what}"
    if p.got is not None or p.allowed is not None:
        parts = [f"got {p.got}"] if p.got is not None else []
        if p.allowed is not None:
            parts.append(f"{p.allowed_label}: {p.allowed}")
        text += f" ({'; '.join(parts)})"
    if p.hint:
        text += f"; did you mean {p.hint!r}?"
    return text


class SpecProblem(ValueError):
    """Raised inside validators: one or more `Problem`s, their paths relative to the field validated."""

    def __init__(self, *problems: Problem):
        self.problems = problems
        super().__init__("; ".join(map(render, problems)))


def problem(path: Any, what: str, *, got: str | None = None, allowed: str | None = None,
            hint: str | None = None, allowed_label: str = "allowed") -> SpecProblem:
    """A SpecProblem for one problem; `path` is a segment or a tuple of segments ('' or () for the field itself)."""
    loc = tuple(path) if isinstance(path, tuple) else ((path,) if path != "" else ())
    return SpecProblem(Problem(loc, what, got, allowed, hint, allowed_label))


def short(value: Any) -> str:
    """A bad value as shown in a message: repr for strings, JSON otherwise, cut at 80 characters."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError, RecursionError):  # non-string keys such as dates, ints past 4300 digits
            text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def from_validation_error(exc: ValidationError, root: type[BaseModel]) -> list[Problem]:
    """One Problem per pydantic error of validating `root`; a union's member errors merge into one."""
    out: list[Problem] = []
    merged: dict[tuple, tuple[int, list[str]]] = {}  # union location -> (index in out, what each member expects)
    walked = [(err, *walk(root, err["loc"])) for err in exc.errors()]
    # A union member that got further (columns: [5] -> columns[0] is not a string) says more
    # than another member rejecting the value whole (columns is not 'numeric').
    deeper = {loc[: u[-1][0]] for _, loc, _, u in walked if u and u[-1][0] < len(loc)}
    for err, loc, _, unions in walked:
        at_member = bool(unions) and unions[-1][0] == len(loc)
        if at_member and loc in deeper:
            continue
        if at_member and err["type"] not in ("value_error", "extra_forbidden", "missing"):
            # An error of one member of a plain union (Union[list[str], Literal['numeric']]):
            # one problem saying what each member expects.
            if loc in merged:
                index, expects = merged[loc]
                expects.append(_expects(err))
                *head, last = expects
                out[index] = replace(out[index], what=f"Input should be {', '.join(head)} or {last}")
                continue
            merged[loc] = (len(out), [_expects(err)])
        out.extend(_problems(err, loc, root))
    return out


def _expects(err: dict) -> str:
    return err["msg"].removeprefix("Input should be ")


def _problems(err: dict, loc: tuple, root: type[BaseModel]) -> list[Problem]:
    kind = err["type"]
    if kind == "value_error":
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecProblem):
            return [p.under(loc) for p in cause.problems]
        # A plain ValueError from a validator outside this package; those follow the
        # convention "field: rest" when the problem belongs to one of the model's fields.
        msg = err["msg"].removeprefix("Value error, ")
        head, sep, rest = msg.partition(": ")
        if sep and head in allowed_keys(root, loc):
            return [Problem(loc + (head,), rest)]
        return [Problem(loc, msg)]
    if kind == "extra_forbidden":
        allowed = allowed_keys(root, loc[:-1])
        key = loc[-1]
        hint = difflib.get_close_matches(str(key), allowed, n=1)
        return [Problem(loc, "unknown key", got=repr(key), allowed=", ".join(allowed) or "none",
                        hint=hint[0] if hint else None)]
    if kind == "missing":
        return [Problem(loc, "required field is missing")]
    return [Problem(loc, err["msg"], got=short(err.get("input")))]
