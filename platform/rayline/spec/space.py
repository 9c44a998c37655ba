"""tune.space: which spec paths a sweep may vary, and whether every value a trial can draw is valid there.

A sweep varies how one model family is trained; everything that decides what is trained
or where it runs is fixed for the whole sweep, because the runner reads it once before any
trial: the data is read, split and preprocessed once; resources (workers' CPUs, GPUs) are
planned once; one framework's backend is loaded and one model is registered. So the
tunable paths are an allow-list (`TUNABLE`, plus `model.params.<param>`), and each value a
distribution can draw is validated against the pydantic field it sets, at `rayline
validate` — not in a trial after the data stage.

Bounds are inclusive as rayline reads them: `randint: [2, 6]` draws 2..6 (the sweep passes
high + 1 to Ray). The distributions themselves: rayline.spec.distributions.
"""

from __future__ import annotations

import difflib
import functools
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from rayline.spec.paths import field_named, model_members
from rayline.spec.problems import Problem
from rayline.frameworks import BACKENDS

__all__ = [
    "TUNABLE",
    "NOT_TUNABLE",
    "check_grid",
    "check_space",
]


# Besides model.params.<param> (a built-in kind's known parameters; any name for model.import).
TUNABLE = (
    "train.epochs",
    "train.batch_size",
    "train.workers",
    "train.optimizer.name",
    "train.optimizer.lr",
    "train.optimizer.momentum",
    "train.optimizer.weight_decay",
    "train.precision",
    "train.grad_accumulation",
    "train.grad_compression",
)

_RESOURCES = "resources are planned once for the whole sweep; set it outside tune.space"
_FAMILY = "a sweep chooses model families with tune.space.model: {choice: [{framework: ..., kind: ..., params: ...}, ...]}"
# Why a path that exists is not tunable: a full path, or a top-level section for all under it.
NOT_TUNABLE = {
    "train.cpus_per_worker": _RESOURCES,
    "train.use_gpu": _RESOURCES,
    "train.use_tpu": _RESOURCES,
    "train.resources_per_worker": _RESOURCES,
    "train.accelerator_type": _RESOURCES,
    "train.tpu_topology": _RESOURCES,
    "model.framework": _FAMILY,
    "model.kind": _FAMILY,
    "model.import": _FAMILY,
    "train.metric": "every trial is ranked by the same metric; set it outside tune.space",
    "train.max_failures": "fault tolerance is set once for the whole sweep; set it outside tune.space",
    "train.strategy": "ddp and fsdp train the same model (sharding changes memory and speed, not the result); "
                      "set it outside tune.space",
    "train.in_process": "where a trial trains (its own process or a Train worker group) changes speed and fault "
                        "tolerance, not the model; set it outside tune.space",
    "train.in_memory": "how a worker holds its shard changes speed, not the model; set it outside tune.space",
    "data": "the data is read and split once for the whole sweep, so that trials compare on the same rows "
            "(only data.preprocess is tunable)",
    "serve": "serving settings do not change the trained model",
    "retrain": "when the served model retrains does not change the trained model",
    "tune": "the sweep's own settings are not tunable",
    "name": "one sweep registers one model name",
    "task": "one sweep solves one task",
}


def check_grid(search: str, space: dict[str, Any]) -> list[Problem]:
    """`search: grid` takes discrete values only; paths relative to `tune`."""
    if search != "grid":
        return []
    return [Problem(("space", path), "search grid needs discrete values", got=next(iter(dist)), allowed="grid, choice")
            for path, dist in space.items() if next(iter(dist)) not in ("grid", "choice")][:1]


def check_space(spec: BaseModel) -> list[Problem]:
    """Each path of `spec.tune.space` is tunable and every value it can draw is valid; absolute paths."""
    from rayline.spec.pipeline_space import (FAMILY_KEY, check_data_path, check_families, check_variant_count,
                                             is_data_path, model_families)

    problems = []
    families = model_families(spec.tune.space)
    for path, dist in spec.tune.space.items():
        if path == FAMILY_KEY:
            problems.extend(check_families(spec, dist))  # a choice of model families, each with its sub-space
            continue
        if families and path.startswith("model."):
            continue  # check_families says to tune it inside a family's params
        if is_data_path(path):
            problems.extend(check_data_path(spec, path, dist))  # a preprocessing variant per value
            continue
        found = _path_problem(spec, path) or _value_problem(spec, path, dist)
        if found:
            problems.append(found)
    return problems or check_variant_count(spec)


def _tunable_text(spec: BaseModel) -> str:
    model = spec.model
    if model.import_ is not None:
        params = [f"model.params.<any parameter of {model.import_}>"]
    else:
        params = [f"model.params.{p}" for p in sorted(BACKENDS[model.framework].kinds[model.kind])]
    return ", ".join(params + list(TUNABLE) + ["data.preprocess[i]...", "model (a choice of model families)"])


def _path_problem(spec: BaseModel, path: str) -> Problem | None:
    at = ("tune", "space", path)
    parts = path.split(".")
    if parts[0] in NOT_TUNABLE:
        return Problem(at, f"not tunable: {NOT_TUNABLE[parts[0]]}", got=repr(path), allowed=_tunable_text(spec))
    if parts == ["model", "params"]:
        return Problem(at, "names a section, not a value", got=repr(path), allowed="model.params.<param>")
    if parts[:2] == ["model", "params"] and len(parts) >= 3:
        if len(parts) > 3:
            return Problem(at, "a parameter is tuned whole, not a part of it", got=repr(path),
                           allowed=f"model.params.{parts[2]}")
        if spec.model.import_ is not None:
            return None  # a custom model takes whatever params it declares
        allowed = BACKENDS[spec.model.framework].kinds[spec.model.kind]
        if parts[2] in allowed:
            return None
        return Problem(at, f"no such parameter for {spec.model.framework} {spec.model.kind}", got=repr(parts[2]),
                       allowed=", ".join("model.params." + a for a in sorted(allowed)))
    for i in range(2, len(parts)):
        if ".".join(parts[:i]) in NOT_TUNABLE:  # train.resources_per_worker.CPU: say why, not "a value"
            prefix = ".".join(parts[:i])
            return Problem(at, f"not tunable: {NOT_TUNABLE[prefix]}", got=repr(path), allowed=_tunable_text(spec))
    models = [type(spec)]
    for i, part in enumerate(parts):
        fields = {f.alias or n: f for m in models for n, f in m.model_fields.items()}
        if part not in fields:
            where = ".".join(parts[:i]) or "the spec"
            hint = difflib.get_close_matches(part, list(fields), n=1)
            return Problem(at, f"no field {part!r} in {where}", got=repr(path),
                           allowed=", ".join(".".join(parts[:i] + [a]) for a in sorted(fields)) or "nothing",
                           hint=".".join(parts[:i] + hint) if hint else None)
        models = model_members(fields[part].annotation)
        if not models and i < len(parts) - 1:
            where = ".".join(parts[: i + 1])
            return Problem(at, f"{where} is a value, not a section", got=repr(path), allowed=where)
    if path in TUNABLE:
        return None  # train.workers is a number or an elastic {min, max}: a sweep draws numbers
    if models:
        return Problem(at, "names a section, not a value", got=repr(path), allowed="one of its fields")
    reason = NOT_TUNABLE.get(path)
    return Problem(at, "not tunable" + (f": {reason}" if reason else ""), got=repr(path), allowed=_tunable_text(spec))


@functools.lru_cache(maxsize=None)
def _adapter(model: type[BaseModel], name: str) -> TypeAdapter:
    # The field's own type and constraints (ge, le, gt, Literal...), so the space is checked
    # by exactly the rules a trial's spec will be validated with.
    field = model.model_fields[name]
    return TypeAdapter(Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation)


def _field_of(spec: BaseModel, path: str) -> tuple[type[BaseModel], str]:
    """The model class and field name that a (checked) dotted path sets."""
    model: Any = type(spec)
    *parents, leaf = path.split(".")
    for part in parents:
        (model,) = model_members(field_named(model, part).annotation)
    field = field_named(model, leaf)
    return model, next(n for n, f in model.model_fields.items() if f is field)


def _draws(kind: str, args: list) -> list[tuple[Any, Any]]:
    """(value as shown, value as a trial gets it) for the values that decide validity."""
    if kind in ("choice", "grid"):
        return [(v, v) for v in args]
    low, high = args
    if kind == "randint":
        return [(low, low), (high, high)]
    # A fractional value inside the range: an integer field must reject uniform draws even
    # when both bounds are whole numbers (1/sqrt(2) of the way: whole only by coincidence).
    inside = low + (high - low) * 0.7071067811865476
    return [(low, float(low)), (high, float(high)), (inside, inside)]


def _workers_problem(spec: BaseModel, dist: dict) -> Problem | None:
    """train.workers in a sweep: whole numbers drawn around a fixed worker count.

    Elastic training (`train.workers: {min, max}`) lets Ray Train pick the count as the
    cluster changes; a sweep that also drew it would compare trials trained on different
    worker counts for reasons that are not the draw, and plan resources for neither."""
    at = ("tune", "space", "train.workers")
    if spec.train.elastic:
        return Problem(at, "not tunable with elastic train.workers: {min, max} (Ray Train picks the count)",
                       got=repr(dist), allowed=f"a whole number train.workers, or no train.workers in tune.space")
    ((kind, args),) = dist.items()
    if kind in ("choice", "grid"):
        bad = [v for v in args if not isinstance(v, int) or isinstance(v, bool)]
        if bad:
            return Problem(at, f"{kind} draws {bad[0]!r}; a sweep draws whole worker counts "
                               "(elastic {min, max} is set outside tune.space)", got=repr(dist), allowed="whole numbers >= 1")
    return None


# Valid or not depending on the framework and the workers (PipelineSpec._technique_problem).
_TECHNIQUES = ("train.precision", "train.grad_accumulation", "train.grad_compression")


def _technique_draw_problem(spec: BaseModel, path: str, kind: str, args) -> Problem | None:
    from rayline.frameworks import BACKENDS

    key = path.split(".", 1)[1]
    for shown, value in _draws(kind, args):
        try:
            train = type(spec.train).model_validate({**spec.train.model_dump(by_alias=True), key: value})
            found = spec.model_copy(update={"train": train})._technique_problem(BACKENDS[spec.model.framework])
        except ValidationError as exc:  # a value the field does not take
            why = exc.errors()[0]["msg"].removeprefix("Value error, ").removeprefix("(top level): ")
            return Problem(("tune", "space", path), f"{kind} can draw {shown!r}, which {path} does not take: {why}",
                           got=repr(dict([(kind, args)])))
        if found is not None:
            reason = found.problems[0]
            return Problem(("tune", "space", path), f"{kind} can draw {shown!r}, which {path} does not take here: "
                           f"{reason.what}", got=repr(dict([(kind, args)])), allowed=reason.allowed)
    return None


def _value_problem(spec: BaseModel, path: str, dist: dict) -> Problem | None:
    if path.startswith("model.params."):
        return None  # the catalog knows parameter names, not their types: trials validate values
    if path == "train.workers":
        found = _workers_problem(spec, dist)
        if found:
            return found
    model, name = _field_of(spec, path)
    adapter = _adapter(model, name)
    ((kind, args),) = dist.items()
    if path in _TECHNIQUES:
        found = _technique_draw_problem(spec, path, kind, args)
        if found:
            return found
    for shown, value in _draws(kind, args):
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            at = ("tune", "space", path)
            if err["type"] == "int_from_float" and kind in ("uniform", "loguniform"):
                return Problem(at, f"{kind} draws fractional numbers, and {path} takes whole numbers",
                               got=repr(dist), allowed="randint or choice")
            return Problem(at, f"{kind} can draw {shown!r}, which {path} does not take: {err['msg']}", got=repr(dist))
    return None
