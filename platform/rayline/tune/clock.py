"""The sweep's clock: how much a trial trains, in its framework's units, and what follows from it.

Every scheduler runs on one clock, the units a trial has trained (`TIME_ATTR`: epochs, boosting
rounds for xgboost), not Tune's count of reports. `total_units` is the most units a trial of a
spec trains over every draw of its space; ASHA's defaults, the median rule's grace period and
PBT's interval derive from it (the scheduler classes take it as `max_units`), and in a sweep
over model families whose units differ, `clock_scale` puts every trial on the longest one's.
"""

from __future__ import annotations

import math

from rayline.errors import RaylineError
from rayline.spec.pipeline_spec import PipelineSpec
from rayline.spec.overrides import apply_overrides
from rayline.spec.distributions import largest_value
from rayline.tune.schedulers import TIME_ATTR

__all__ = ["TIME_ATTR", "largest_draw", "max_workers", "total_units", "family_spec", "clock_scale"]


def largest_draw(dist: dict):
    """The largest value a `tune.space` distribution can draw (None when its values are not numbers).

    choice/grid: the largest listed value; randint: its high bound (inclusive in rayline);
    uniform/loguniform: the high bound.
    """
    values = list(next(iter(dist.values())))
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    return largest_value(dist)


def max_workers(spec: PipelineSpec) -> int:
    """The most Train workers any trial can ask for: the plan must fit the largest draw.

    Elastic `train.workers: {min, max}` is never tuned (spec.space); its `max` is the most.
    """
    workers = spec.train.max_workers
    dist = spec.tune.space.get("train.workers") if spec.tune else None
    top = largest_draw(dist) if dist else None
    return max(workers, int(math.ceil(top))) if top is not None else workers


def total_units(spec: PipelineSpec) -> int:
    """Epochs (or rounds) a trial of `spec` trains at most, over every draw of the space.

    The framework says what its unit is (`rayline.frameworks.total_units`: epochs, or xgboost's
    num_boost_round).
    """
    from rayline.spec.pipeline_space import PipelineSpace

    if spec.tune and (families := PipelineSpace(spec).families):
        # A sweep over model families: the most any family trains (each family's clock is
        # scaled to this one in trials: `clock_scale`).
        return max(total_units(family_spec(spec, i)) for i in range(len(families)))
    from rayline.frameworks import total_units as framework_units

    top = {path: largest_draw(dist) for path, dist in (spec.tune.space.items() if spec.tune else ())}
    top = {path: v for path, v in top.items() if v is not None and (path == "train.epochs" or path.startswith("model.params."))}
    try:
        largest = apply_overrides(spec, {p: (int(math.ceil(v)) if isinstance(v, float) and p == "train.epochs" else v)
                                         for p, v in top.items()})
    except RaylineError:
        largest = spec  # a value the spec rejects never reaches a trial either
    return max(1, int(framework_units(spec.model.framework, dict(largest.model.params or {}), largest.train.epochs)))



def family_spec(spec: PipelineSpec, index: int) -> PipelineSpec:
    """`spec` as a sweep of family `index` alone (its model, and its sub-space as tune.space)."""
    from rayline.spec.pipeline_space import FAMILY_KEY, PipelineSpace

    family = PipelineSpace(spec).families[index]
    raw = spec.model_dump(by_alias=True, exclude_none=True)
    raw["model"] = family.model
    raw["tune"]["space"] = {**{k: v for k, v in raw["tune"]["space"].items() if k != FAMILY_KEY},
                            **{f"model.params.{k}": v for k, v in family.space.items()}}
    from rayline.spec.loading import parse_spec

    return parse_spec(raw, source="tune.space.model")


def clock_scale(spec: PipelineSpec, trial_spec: PipelineSpec) -> float:
    """How many of the sweep's clock units one of the trial's own units is worth.

    1 unless the sweep chooses among model families whose units differ (epochs against
    boosting rounds): ASHA, median stopping and the time budget then compare trials at the
    same fraction of their training, a trial's units scaled to the longest family's."""
    from rayline.spec.pipeline_space import PipelineSpace

    if not spec.tune or not PipelineSpace(spec).families:
        return 1.0
    from rayline.frameworks import total_units as framework_units

    own = framework_units(trial_spec.model.framework, dict(trial_spec.model.params or {}), trial_spec.train.epochs)
    return total_units(spec) / max(1, int(own))
