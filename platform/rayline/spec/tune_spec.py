"""The spec's `tune:` section: the space, the search, the scheduler, the sweep's limits.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from rayline.spec.common import Strict
from rayline.spec.distributions import check_distributions
from rayline.spec.problems import SpecProblem
from rayline.spec.space import check_grid
from rayline.tune.schedulers import SCHEDULER_SPEC_MODELS, SchedulerField, parse_scheduler, scheduler_json_schema
from rayline.tune.searchers import SEARCH_NAMES

__all__ = ["Distribution", "TuneSpec"]

Distribution = dict[str, Any]


class TuneSpec(Strict):
    num_samples: int = Field(8, ge=1, le=10_000, description="Trials (times each grid combination).")
    max_concurrent: int = Field(2, ge=1, description="Trials running at once (lowered to what the cluster fits).")
    scheduler: SchedulerField = Field(
        default_factory=lambda: SCHEDULER_SPEC_MODELS["asha"](),
        description="Trial scheduler, by name or as {<name>: {<parameter>: <value>}}: asha (grace_period, "
                    "reduction_factor, max_t, brackets), median (grace_period, min_samples_required, min_time_slice), "
                    "pbt (perturbation_interval, burn_in_period, quantile_fraction, resample_probability, "
                    "perturbation_factors, synch) or fifo. Clock: units trained (epochs; boosting rounds).",
        json_schema_extra=scheduler_json_schema,
    )
    search: Literal[SEARCH_NAMES] = Field("random", description="random, grid, or optuna (Bayesian: Optuna's TPE).")
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1, description="Seed of the search (random draws, Optuna's "
                                                                        "sampler); default data.split.seed.")
    time_budget_s: Optional[float] = Field(None, gt=0, description="Stop the sweep after this many seconds; the winner "
                                                                   "is chosen among the trials finished or stopped by then.")
    space: dict[str, Distribution] = Field(
        min_length=1,
        description="Dotted spec path -> distribution. Tunable: model.params.<param>, train.epochs, "
                    "train.batch_size, train.workers, train.optimizer.name/lr/momentum/weight_decay.",
    )

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_name(cls, v):
        return parse_scheduler(v)  # `asha` or `{asha: {grace_period: 2}}`

    @field_validator("space")
    @classmethod
    def _distributions(cls, space):
        problems = check_distributions(space)
        if problems:
            raise SpecProblem(*problems)
        return space

    @model_validator(mode="after")
    def _grid_search(self):
        problems = check_grid(self.search, self.space)
        if problems:
            raise SpecProblem(*problems)
        return self
