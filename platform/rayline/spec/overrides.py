"""Overrides by dotted path: `--set PATH=VALUE` options and a trial's sampled values."""

from __future__ import annotations

from typing import Any

from rayline.errors import SpecError
from rayline.spec.pipeline_spec import PipelineSpec
from rayline.spec.assign import with_overrides
from rayline.spec.problems import Problem

__all__ = ["apply_overrides", "parse_set_options"]


def apply_overrides(spec: PipelineSpec, overrides: dict[str, Any]) -> PipelineSpec:
    """A copy of `spec` with each dotted path set to its value, validated again."""
    return with_overrides(spec, overrides, "overrides")


def parse_set_options(items: list[str]) -> dict[str, Any]:
    """`--set PATH=VALUE` options as overrides; VALUE is YAML (`2`, `0.01`, `[64, 32]`, `adam`)."""
    from rayline.spec.yaml_safe import load_yaml

    overrides: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            raise SpecError([Problem(("--set",), "expected PATH=VALUE such as train.epochs=2", got=repr(item))])
        try:
            overrides[path.strip()] = load_yaml(text)
        except SpecError as exc:
            what = "; ".join(p.what if isinstance(p, Problem) else p for p in exc.details)
            raise SpecError([Problem((f"--set {path.strip()}",), f"the value is not valid YAML: {what}",
                                     got=repr(text))]) from exc
    return overrides
