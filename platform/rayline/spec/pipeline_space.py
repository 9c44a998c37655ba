"""Whole-pipeline search: `tune.space` paths into `data.preprocess` and a choice of model families.

Two kinds of path go beyond training parameters:

- **Preprocessing** — `data.preprocess[0].impute.strategy: {grid: [mean, median]}`, or a
  whole step, `data.preprocess[1]: {choice: [{standard_scale: {...}}, {min_max_scale: {...}}]}`
  (list items written as error messages write them). Only discrete values (choice, grid):
  the data stage runs once per distinct preprocessing configuration before any trial, and
  trials share those prepared datasets; a range would make each trial's data its own.
- **Model families** — `model: {choice: [{framework: torch, kind: mlp, params: {...}}, ...]}`
  (or `grid:`). A family's `params` may hold distributions of their own (its sub-space),
  drawn only for trials of that family.

`PipelineSpace(spec)` turns `tune.space` into the flat space Tune samples (`flat()`: Tune key
-> rayline distribution) and a trial's Tune config back into spec overrides by dotted path
(`overrides(config)`), which is what trials apply, what MLflow records and what the winner's
spec is made of. Tune keys: plain paths as written; `data` for the index of the
preprocessing variant (`variants()`: the product of every preprocessing path's values);
`model` for the family's index and `model[i].params.<p>` for family i's sub-space (under
`search: grid`, `model` indexes every family's own grid instead, so no trial repeats another
with an unused parameter changed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from rayline.spec.paths import parse_dotted
from rayline.spec.problems import Problem

__all__ = [
    "DATA_KEY",
    "FAMILY_KEY",
    "MAX_DATA_VARIANTS",
    "Family",
    "PipelineSpace",
    "family_label",
    "is_data_path",
    "is_distribution",
    "model_families",
]

DATA_KEY = "data"
FAMILY_KEY = "model"
# Each variant is a full data stage (fit and transform every split) before the first trial
# and a copy of the splits in the object store for the whole sweep.
MAX_DATA_VARIANTS = 16

_DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice", "grid")


def is_distribution(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _DISTRIBUTIONS


def is_data_path(path: str) -> bool:
    return path == "data.preprocess" or path.startswith(("data.preprocess[", "data.preprocess."))


def family_label(model: Any) -> str:
    """`torch/mlp`, `xgboost/gbdt`, `torch/pipelines.custom_net:build`: a family's name."""
    if isinstance(model, dict):
        framework, kind, imported = model.get("framework"), model.get("kind"), model.get("import")
    else:
        framework, kind, imported = model.framework, model.kind, model.import_
    return f"{framework}/{kind or imported}"


@dataclass
class Family:
    """One model family of a `model: {choice: [...]}` space."""

    model: dict  # the ModelSpec mapping with its fixed params (the sub-space's parameters left out)
    space: dict[str, dict] = field(default_factory=dict)  # param name -> distribution

    @property
    def label(self) -> str:
        return family_label(self.model)


def model_families(space: dict[str, Any]) -> list[Family] | None:
    """The families of `space["model"]`, None when the space does not choose a model family.

    Shapes are checked by `check_families`; this only reads them."""
    dist = space.get(FAMILY_KEY)
    if not is_distribution(dist):
        return None
    ((_, options),) = dist.items()
    families = []
    for option in options if isinstance(options, list) else []:
        if not isinstance(option, dict):
            continue
        params = option.get("params") or {}
        params = params if isinstance(params, dict) else {}
        fixed = {k: v for k, v in params.items() if not is_distribution(v)}
        sub = {k: v for k, v in params.items() if is_distribution(v)}
        families.append(Family(model={**{k: v for k, v in option.items() if k != "params"}, "params": fixed}, space=sub))
    return families


def _values(dist: dict) -> list:
    ((_, values),) = dist.items()
    return list(values)


class PipelineSpace:
    """`tune.space` of a spec, split into training paths, preprocessing variants and model families."""

    def __init__(self, spec):
        self.search = spec.tune.search
        space = dict(spec.tune.space)
        self.families = model_families(space)
        self.data_paths = [p for p in space if is_data_path(p)]
        self._data = {p: space[p] for p in self.data_paths}
        self.plain = {p: d for p, d in space.items() if p not in self._data and not (p == FAMILY_KEY and self.families)}
        # Under grid search, every family's own grid, listed: (family index, {param: value}).
        self._grid_members: list[tuple[int, dict]] = []
        if self.families and self.search == "grid":
            for i, fam in enumerate(self.families):
                names = list(fam.space)
                for combo in itertools.product(*(_values(fam.space[n]) for n in names)):
                    self._grid_members.append((i, dict(zip(names, combo))))

    # ------------------------------------------------------------ preprocessing

    def variants(self) -> list[dict[str, Any]]:
        """Every distinct preprocessing configuration: overrides by path ([{}] when none is tuned)."""
        if not self._data:
            return [{}]
        paths = list(self._data)
        return [dict(zip(paths, combo)) for combo in itertools.product(*(_values(self._data[p]) for p in paths))]

    # ------------------------------------------------------------ Tune's view

    def flat(self) -> dict[str, dict]:
        """Tune key -> rayline distribution ({"choice": [...]}, {"grid": [...]}, {"loguniform": [a, b]}...)."""
        kind = "grid" if self.search == "grid" else "choice"
        flat: dict[str, dict] = dict(self.plain)
        if self._data:
            flat[DATA_KEY] = {kind: list(range(len(self.variants())))}
        if self.families:
            if self.search == "grid":
                flat[FAMILY_KEY] = {"grid": list(range(len(self._grid_members)))}
            else:
                flat[FAMILY_KEY] = {"choice": list(range(len(self.families)))}
                for i, fam in enumerate(self.families):
                    for name, dist in fam.space.items():
                        flat[f"{FAMILY_KEY}[{i}].params.{name}"] = dist
        return flat

    def variant_index(self, config: dict) -> int:
        return int(config.get(DATA_KEY, 0)) if self._data else 0

    def overrides(self, config: dict) -> dict[str, Any]:
        """A trial's Tune config as spec overrides by dotted path, in the order they apply.

        The family's whole `model` mapping comes first, then its drawn `model.params.<p>`;
        the preprocessing variant's paths; then every plain path as drawn."""
        out: dict[str, Any] = {}
        if self.families:
            index = int(config.get(FAMILY_KEY, 0))
            if self.search == "grid":
                family_index, params = self._grid_members[index]
            else:
                family_index = index
                prefix = f"{FAMILY_KEY}[{index}].params."
                params = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
            out[FAMILY_KEY] = self.families[family_index].model
            out.update({f"model.params.{k}": v for k, v in params.items()})
        if self._data:
            out.update(self.variants()[self.variant_index(config)])
        out.update({k: v for k, v in config.items() if k in self.plain})
        return out


# ---------------------------------------------------------------- validation

def check_families(spec, dist: Any) -> list[Problem]:
    """`tune.space.model`: a choice (or grid) of model families, each a valid `model:` with its sub-space.

    Each family is checked as the whole spec would be with it (framework against the
    accelerators asked for, kind, parameter names), and each sub-space distribution's shape.
    """
    from rayline.spec.distributions import check_distributions

    at = ("tune", "space", FAMILY_KEY)
    if not is_distribution(dist) or next(iter(dist)) not in ("choice", "grid"):
        return [Problem(at, "a choice of model families: {choice: [{framework: ..., kind: ..., params: ...}, ...]}",
                        got=repr(dist), allowed="choice, grid")]
    ((kind, options),) = dist.items()
    if not isinstance(options, list) or len(options) < 2:
        return [Problem(at + (kind,), "needs at least two model families", got=repr(options))]
    problems: list[Problem] = []
    if spec.tune.scheduler == "pbt":  # a name, or a {pbt: {...}} choice (which compares equal to its name)
        problems.append(Problem(("tune", "scheduler"), "pbt copies one trial's weights into another, so every trial "
                                "must train the same model family", got="pbt with tune.space.model",
                                allowed="asha, median, fifo with a choice of families; or pbt over one family"))
    for path in spec.tune.space:
        if path.startswith("model."):
            problems.append(Problem(("tune", "space", path), "with a choice of model families, tune a family's "
                                    "parameters inside its own params", got=repr(path),
                                    allowed="model: {choice: [{..., params: {<param>: {choice: [...]}}}]}"))
    raw = spec.model_dump(by_alias=True, exclude_none=True, exclude={"tune"})
    seen: set[str] = set()
    for i, option in enumerate(options):
        where = at + (kind, i)
        if not isinstance(option, dict):
            problems.append(Problem(where, "a model family is a mapping like `model:`", got=repr(option),
                                    allowed="{framework: ..., kind: ..., params: {...}}"))
            continue
        params = option.get("params", {})
        if not isinstance(params, dict):
            problems.append(Problem(where + ("params",), "a mapping of parameters", got=repr(params)))
            continue
        sub = {k: v for k, v in params.items() if is_distribution(v)}
        for p in check_distributions(sub):
            problems.append(p.under(where + ("params",)))
        if spec.tune.search == "grid":
            for name, d in sub.items():
                if next(iter(d)) not in ("grid", "choice"):
                    problems.append(Problem(where + ("params", name), "search grid needs discrete values",
                                            got=next(iter(d)), allowed="grid, choice"))
        # The family as a whole spec: its sub-space parameters take their first draw for the check.
        sample = {k: (_values(v)[0] if is_distribution(v) else v) for k, v in params.items()}
        try:
            type(spec).model_validate({**raw, "model": {**option, "params": sample}})
        except Exception as exc:  # noqa: BLE001 - reported as this family's problems
            problems.extend(_family_problems(exc, where, type(spec)))
        label = family_label(option)
        if label in seen:
            problems.append(Problem(where, "the same model family twice: put both settings in one family's "
                                    "params as a choice", got=label))
        seen.add(label)
    return problems


def _family_problems(exc: Exception, where: tuple, spec_model) -> list[Problem]:
    """The problems of one family's spec (`spec_model`: the spec's own model class)."""
    from rayline.spec.paths import dotted
    from rayline.spec.problems import from_validation_error

    try:
        problems = from_validation_error(exc, spec_model)
    except Exception:  # noqa: BLE001 - not a ValidationError: its first line
        return [Problem(where, str(exc).splitlines()[0])]
    out = []
    for p in problems:
        loc = tuple(p.path)
        if loc[:1] == ("model",):
            out.append(Problem(where + loc[1:], p.what, got=p.got, allowed=p.allowed, allowed_label=p.allowed_label))
        else:
            out.append(Problem(where, f"with this family, {dotted(loc)}: {p.what}", got=p.got,
                               allowed=p.allowed, allowed_label=p.allowed_label))
    return out


def check_data_path(spec, path: str, dist: Any) -> list[Problem]:
    """`tune.space.data.preprocess...`: discrete values, each giving a valid spec."""
    from rayline.errors import SpecError
    from rayline.spec.assign import with_overrides

    at = ("tune", "space", path)
    ((kind, values),) = dist.items()
    if kind not in ("choice", "grid"):
        return [Problem(at, "preprocessing takes discrete values: the data stage runs once per distinct "
                            "preprocessing before the trials", got=kind, allowed="choice, grid")]
    segments = parse_dotted(path)
    if any(isinstance(s, str) and s.startswith("[") for s in segments):
        return [Problem(at, "a list item is written [i] with a whole number", got=repr(path),
                        allowed="e.g. data.preprocess[0].impute.strategy")]
    base = spec.model_copy(update={"tune": None})
    for value in values:
        try:
            with_overrides(base, {path: value})
        except SpecError as exc:
            detail = "; ".join(str(p) for p in exc.details)[:400]
            return [Problem(at, f"{kind} value {value!r} makes an invalid spec: {detail}")]
    return []


def check_variant_count(spec) -> list[Problem]:
    count = len(PipelineSpace(spec).variants())
    if count > MAX_DATA_VARIANTS:
        return [Problem(("tune", "space"), "too many preprocessing configurations: each is a data stage run "
                        "before the trials", got=f"{count} combinations", allowed=f"at most {MAX_DATA_VARIANTS}")]
    return []
