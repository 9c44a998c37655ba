"""`rayline serve deploy NAME --version N --set serve.replicas.max=4`: serve-setting overrides on a
deployed model, validated like `rayline run --set` (the same dotted paths, YAML values and one-line
problems), and set on the settings the model runs with.
"""

from __future__ import annotations

from typing import Any

from rayline.errors import SpecError
from rayline.spec.problems import Problem

__all__ = ["FIXED", "with_serve_overrides"]

# Not changed by a redeploy: the route is the model's (every version answers under it), and a canary
# is its own command (`--canary PERCENT` with its gate options).
FIXED = {"route": "the model's route stays (a new route: `rayline serve delete` it, then deploy again)",
         "canary": "use --canary PERCENT and its gate options"}


def with_serve_overrides(serve_spec, overrides: dict[str, Any]):
    """A copy of `serve_spec` (a ServeSpec) with each `serve.`-prefixed dotted path set, validated
    again; SpecError naming `--set PATH` for a path outside `serve`, a fixed one, or a bad value."""
    from rayline.spec.assign import with_overrides

    problems, inner = [], {}
    for path, value in overrides.items():
        head, _, rest = path.partition(".")
        if head != "serve" or not rest:
            problems.append(Problem((f"--set {path}",), "rayline serve deploy changes serve settings only",
                                    got=repr(path), allowed="serve.<key>, e.g. serve.replicas.max=4"))
        elif rest.split(".")[0].split("[")[0] in FIXED:
            problems.append(Problem((f"--set {path}",), FIXED[rest.split(".")[0].split("[")[0]], got=repr(path)))
        else:
            inner[rest] = value
    if problems:
        raise SpecError(problems, "--set")
    try:
        return with_overrides(serve_spec, inner, "--set")
    except SpecError as exc:  # paths as the user wrote them: serve.<key>
        raise SpecError([p.under(("serve",)) if isinstance(p, Problem) else p for p in exc.details], "--set") from exc
