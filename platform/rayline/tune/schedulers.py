"""tune.scheduler: the trial schedulers a sweep can use, one class each, registered in SCHEDULERS.

A scheduler is written by name (`scheduler: asha`) or with its parameters as a mapping with
one key, the way data.preprocess steps are (`scheduler: {pbt: {perturbation_interval: 2}}`).
Each class holds its parameters' spec model (`Params`), the checks that need the whole spec
(`check`), its defaults derived from the spec (`settings`) and the Ray scheduler (`build`).

Every scheduler runs on one clock: the units a trial has trained (`TIME_ATTR`: epochs, boosting
rounds for xgboost), not Tune's count of reports; `settings` and `build` take the most units a
trial of the sweep trains (`max_units`, rayline.tune.clock.total_units), so this module needs
nothing of the sweep and the spec can import it. Ray is imported only in `build`, so the spec
(and `rayline validate`) never imports it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model, model_serializer, model_validator

# rayline.spec imports this module for TuneSpec: the spec's problem helpers are imported
# where they are used, so that importing either module first works.

__all__ = [
    "TIME_ATTR",
    "asha_defaults",
    "SCHEDULERS",
    "SCHEDULER_NAMES",
    "PBT_PATHS",
    "Scheduler",
    "SchedulerParams",
    "SchedulerChoice",
    "SchedulerField",
    "parse_scheduler",
    "check_scheduler",
    "scheduler_json_schema",
]

# ASHA's clock: how much a trial has trained, in the unit its framework trains in (epochs;
# boosting rounds for xgboost). Tune's default clock, `training_iteration`, counts reports:
# with xgboost reporting every `checkpoint_every` rounds, `max_t: epochs` stopped a
# 500-round booster that reports every 5 rounds at round 50. Added to every report
# by the sweep's report callback (the report's "epoch" is the 0-based index of the last unit).
TIME_ATTR = "units_trained"


def asha_defaults(max_units: int) -> dict:
    """ASHAScheduler arguments for a sweep whose trials train at most `max_units`.

    grace_period: a sixteenth of the run (at least one unit), so rungs sit at 1/16, 1/8,
    1/4, 1/2 of training with reduction factor 2; one boosting round or the first of 40
    epochs says little about a configuration.
    """
    return {"time_attr": TIME_ATTR, "max_t": max_units, "grace_period": max(1, max_units // 16), "reduction_factor": 2}


class SchedulerParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SchedulerChoice(BaseModel):
    """`{<name>: <params>}` as parsed: `.name` and `.params`; compares equal to its name as a string."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @property
    def name(self) -> str:
        return next(iter(type(self).model_fields))

    @property
    def params(self) -> SchedulerParams:
        return getattr(self, self.name)

    @property
    def scheduler(self) -> "Scheduler":
        return SCHEDULERS[self.name]

    def __eq__(self, other):  # `spec.tune.scheduler == "asha"` keeps working
        if isinstance(other, str):
            return self.name == other
        return super().__eq__(other)

    __hash__ = None

    def __str__(self) -> str:
        return self.name

    @model_serializer(mode="wrap")
    def _compact(self, handler):
        # Dumped as written: the bare name when no parameter was set (specs, MLflow's copy,
        # a trial's spec), else {name: {the parameters}}.
        if not self.params.model_fields_set:
            return self.name
        return handler(self)


# ---------------------------------------------------------------- the spec's clock, without Ray


def _largest_draws(spec) -> dict:
    """The largest value of each numeric tune.space path (no parsing: usable inside validation)."""
    out = {}
    for path, dist in spec.tune.space.items():
        if not isinstance(dist, dict) or len(dist) != 1:
            continue
        ((kind, args),) = dist.items()
        values = args[1:2] if kind in ("uniform", "loguniform", "randint") else args
        values = [v for v in (values or []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if values:
            out[path] = max(values)
    return out


def most_units(spec) -> int | None:
    """The most units a trial of `spec` can train, or None where it cannot be told here.

    The spec-time twin of `rayline.tune.clock.total_units` (which applies the draws to the spec and
    so cannot run while the spec is being validated); None for a sweep over model families.
    """
    if "model" in spec.tune.space:
        return None
    from rayline.frameworks import total_units

    top = _largest_draws(spec)
    params = dict(spec.model.params or {})
    params.update({p.split(".", 2)[2]: v for p, v in top.items() if p.startswith("model.params.")})
    epochs = int(math.ceil(top.get("train.epochs", spec.train.epochs)))
    try:
        return max(1, int(total_units(spec.model.framework, params, epochs)))
    except Exception:  # noqa: BLE001 - a bad value is reported by its own check
        return None


def _grace_problem(spec, name: str, params, field: str = "grace_period") -> list[Problem]:
    from rayline.spec.problems import Problem, short

    value = getattr(params, field)
    top = most_units(spec)
    if value is None or top is None or value <= top:
        return []
    return [Problem(("tune", "scheduler", name, field), "longer than any trial trains: no trial would ever be compared",
                    got=short(value), allowed=f"1..{top} (units a trial trains at most: epochs, or boosting rounds)")]


# ---------------------------------------------------------------- the schedulers


class Scheduler:
    """One tune.scheduler: its parameters, spec checks, defaults and Ray scheduler."""

    name: ClassVar[str]
    Params: ClassVar[type[SchedulerParams]] = SchedulerParams
    # Whether trials report Tune checkpoints that restart them (PBT's exploit, rayline.tune.handoff).
    hands_off_checkpoints: ClassVar[bool] = False

    def check(self, spec, params) -> list[Problem]:
        """Problems that need the whole spec (paths from the spec's root)."""
        return []

    def settings(self, spec, params, max_units: int) -> dict:
        """The Ray scheduler's arguments, defaults resolved from the spec and the sweep's clock
        (`max_units`: the most units a trial trains, rayline.tune.clock.total_units)."""
        return {}

    def build(self, spec, params, *, max_units: int, metric: str, mode: str):
        raise NotImplementedError


class AshaParams(SchedulerParams):
    grace_period: Optional[int] = Field(None, ge=1, description="Units (epochs; rounds) every trial trains before it can be "
                                                                  "stopped. Default: a sixteenth of the longest run, at least 1.")
    reduction_factor: float = Field(2, gt=1, description="1/reduction_factor of the trials go on at each rung.")
    max_t: Optional[int] = Field(None, ge=1, description="Units at which every trial stops. Default: the most a trial trains.")
    brackets: int = Field(1, ge=1, le=10, description="Brackets of ASHA (Hyperband-style); 1 is plain ASHA.")

    @model_validator(mode="after")
    def _grace_below_max(self):
        from rayline.spec.problems import problem

        if self.grace_period is not None and self.max_t is not None and self.grace_period > self.max_t:
            raise problem("grace_period", "must be <= max_t", got=f"grace_period={self.grace_period}, max_t={self.max_t}")
        return self


class Asha(Scheduler):
    """Asynchronous successive halving: stops the worse trials at rungs of units trained."""

    name = "asha"
    Params = AshaParams

    def check(self, spec, params):
        return _grace_problem(spec, self.name, params)

    def settings(self, spec, params, max_units):
        out = asha_defaults(max_units)
        if params.max_t is not None:
            out["max_t"] = params.max_t
        out["grace_period"] = params.grace_period or min(out["grace_period"], out["max_t"])
        out["reduction_factor"] = params.reduction_factor
        out["brackets"] = params.brackets
        return out

    def build(self, spec, params, *, max_units, metric, mode):
        from ray.tune.schedulers import ASHAScheduler

        return _recording(ASHAScheduler)(**self.settings(spec, params, max_units))


class Fifo(Scheduler):
    """Every trial runs to its end."""

    name = "fifo"

    def build(self, spec, params, *, max_units, metric, mode):
        from ray.tune.schedulers import FIFOScheduler

        return FIFOScheduler()


class MedianParams(SchedulerParams):
    grace_period: Optional[int] = Field(None, ge=1, description="Units a trial trains before it can be stopped. "
                                                                  "Default: a sixteenth of the longest run, at least 1.")
    min_samples_required: int = Field(3, ge=1, description="Trials that must have reached a point before a trial is "
                                                           "compared with their median there.")
    min_time_slice: int = Field(0, ge=0, description="Units each trial trains between two of its comparisons.")


class Median(Scheduler):
    """Median stopping (Vizier): stops a trial whose best result so far is worse than the median
    of the other trials' running averages at the same point."""

    name = "median"
    Params = MedianParams

    def check(self, spec, params):
        return _grace_problem(spec, self.name, params)

    def settings(self, spec, params, max_units):
        return {"time_attr": TIME_ATTR, "grace_period": params.grace_period or max(1, max_units // 16),
                "min_samples_required": params.min_samples_required, "min_time_slice": params.min_time_slice,
                # A paused trial would restart its Train run from scratch in a new actor: stop instead.
                "hard_stop": True}

    def build(self, spec, params, *, max_units, metric, mode):
        from ray.tune.schedulers import MedianStoppingRule, TrialScheduler

        class NeverPausing(MedianStoppingRule):
            # Ray's rule pauses a trial that has too few others to compare with while trials
            # wait; a paused rayline trial restarts its Train run (a new worker group, seconds
            # each): it trains on instead, and is compared at its next report.
            def _on_insufficient_samples(self, tune_controller, trial, time):
                return TrialScheduler.CONTINUE

        return _recording(NeverPausing)(**self.settings(spec, params, max_units))


# The tune.space paths that a trial may change in the middle of its training: a checkpoint
# taken before the change still fits the model and optimizer after it.
PBT_PATHS = (
    "train.optimizer.lr",
    "train.optimizer.momentum",
    "train.optimizer.weight_decay",
    "train.batch_size",
)


class PbtParams(SchedulerParams):
    perturbation_interval: Optional[int] = Field(
        None, ge=1, description="Units (epochs) between two exploit/explore steps of a trial. Default: a quarter of the run, "
                                "at least 1.")
    burn_in_period: int = Field(0, ge=0, description="Units every trial trains before its first exploit/explore step.")
    quantile_fraction: float = Field(0.25, ge=0, le=0.5, description="The worst fraction of trials copies the best fraction.")
    resample_probability: float = Field(0.25, ge=0, le=1, description="Chance that explore draws a parameter anew from "
                                                                       "tune.space instead of perturbing it.")
    perturbation_factors: tuple[float, float] = Field((1.2, 0.8), description="Factors a continuous parameter is "
                                                                               "multiplied by when perturbed.")
    synch: bool = Field(False, description="true: every trial waits for the others at each perturbation point.")

    @model_validator(mode="after")
    def _factors(self):
        from rayline.spec.problems import problem, short

        if not all(math.isfinite(f) and f > 0 for f in self.perturbation_factors):
            raise problem("perturbation_factors", "two finite factors > 0", got=short(list(self.perturbation_factors)),
                          allowed="e.g. [1.2, 0.8]")
        return self


class Pbt(Scheduler):
    """Population based training: at every perturbation interval the worst trials continue from
    a copy of a better trial's checkpoint (weights and optimizer state) with its parameters
    perturbed (rayline.tune.handoff moves the checkpoint between the trials' Train runs)."""

    name = "pbt"
    Params = PbtParams
    hands_off_checkpoints = True

    def check(self, spec, params):
        from rayline.spec.problems import Problem
        from rayline.frameworks import BACKENDS

        problems = []
        info = BACKENDS[spec.model.framework]
        if not info.epoch_based:
            allowed = ", ".join(n for n, b in BACKENDS.items() if b.epoch_based)
            problems.append(Problem(
                ("tune", "scheduler"), f"pbt needs a model trained in epochs by an optimizer whose parameters can change "
                f"mid-training; framework {spec.model.framework} trains {info.units}",
                got=f"pbt with framework {spec.model.framework}", allowed=f"asha, median or fifo; or pbt with {allowed}"))
        if spec.tune.search != "random" and spec.tune.search != "grid":
            problems.append(Problem(("tune", "search"), "pbt chooses the trials' parameters itself: it works with random or "
                                    "grid starting points only", got=repr(spec.tune.search), allowed="random, grid"))
        for path in spec.tune.space:
            # `model` (a choice of families) has its own pbt message (rayline.spec.pipeline_space).
            if path not in PBT_PATHS and path != "model":
                problems.append(Problem(
                    ("tune", "space", path), "pbt changes a trial's parameters mid-training, from a checkpoint of another "
                    "trial: a path that changes the model's shape, the training length or the optimizer's kind cannot change then",
                    got=repr(path), allowed=", ".join(PBT_PATHS)))
        return problems + _grace_problem(spec, self.name, params, "perturbation_interval")

    def settings(self, spec, params, max_units):
        return {"time_attr": TIME_ATTR, "perturbation_interval": params.perturbation_interval or max(1, max_units // 4),
                "burn_in_period": params.burn_in_period, "quantile_fraction": params.quantile_fraction,
                "resample_probability": params.resample_probability,
                "perturbation_factors": tuple(params.perturbation_factors), "synch": params.synch,
                # Ray's own pbt_global.txt / pbt_policy files: the exploits are in TrialOutcome.events.
                "log_config": False}

    def mutations(self, spec) -> dict:
        """PBT's hyperparam_mutations from tune.space (only PBT_PATHS pass the spec's checks)."""
        from ray import tune

        out = {}
        for path, dist in spec.tune.space.items():
            ((kind, args),) = dist.items()
            if kind == "loguniform":
                out[path] = tune.loguniform(*args)
            elif kind == "uniform":
                out[path] = tune.uniform(*args)
            elif kind == "randint":
                out[path] = tune.randint(args[0], args[1] + 1)  # inclusive in rayline
            else:
                out[path] = list(args)  # explore moves to a neighbouring value
        return out

    def build(self, spec, params, *, max_units, metric, mode):
        from ray.tune.schedulers import PopulationBasedTraining

        return _recording(PopulationBasedTraining)(hyperparam_mutations=self.mutations(spec),
                                                    **self.settings(spec, params, max_units))


SCHEDULERS: dict[str, Scheduler] = {cls.name: cls() for cls in (Asha, Fifo, Median, Pbt)}
SCHEDULER_NAMES = tuple(SCHEDULERS)


# ---------------------------------------------------------------- the spec field

# `{<name>: <Params>}`, one model per scheduler, named `<Name>Scheduler`.
SCHEDULER_SPEC_MODELS: dict[str, type[SchedulerChoice]] = {
    name: create_model(f"{name.title()}Scheduler", __base__=SchedulerChoice,
                       **{name: (cls.Params, Field(default_factory=cls.Params))})
    for name, cls in SCHEDULERS.items()
}
_TAGS = {name: model.__name__ for name, model in SCHEDULER_SPEC_MODELS.items()}


def _tag(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        return _TAGS.get(next(iter(value)))
    return type(value).__name__ if isinstance(value, SchedulerChoice) else None


SchedulerField = Annotated[
    Union[tuple(Annotated[m, Tag(m.__name__)] for m in SCHEDULER_SPEC_MODELS.values())],
    Discriminator(_tag),
]


def parse_scheduler(value: Any) -> Any:
    """A `tune.scheduler` value as written -> `{name: params}` for SchedulerField (a pydantic before-validator)."""
    from rayline.spec.problems import problem, short

    if isinstance(value, SchedulerChoice):
        return value
    allowed = ", ".join(SCHEDULER_NAMES) + "; with parameters {<name>: {<parameter>: <value>}}"
    if isinstance(value, str):
        if value not in SCHEDULERS:
            raise problem("", "unknown scheduler", got=short(value), allowed=allowed)
        return {value: {}}
    if not isinstance(value, dict) or len(value) != 1:
        raise problem("", "a scheduler name, or a mapping with one key: the scheduler and its parameters",
                      got=short(value), allowed=allowed)
    ((name, params),) = value.items()
    if name not in SCHEDULERS:
        raise problem("", "unknown scheduler", got=short(name), allowed=allowed)
    return {name: {} if params is None else params}


def scheduler_json_schema(schema: dict) -> None:
    """TuneSpec.scheduler's JSON Schema: the bare name as well as `{<name>: <params>}`."""
    one_of = schema.pop("oneOf", None)
    if one_of:
        schema["anyOf"] = [{"type": "string", "enum": list(SCHEDULER_NAMES)}, *one_of]


def check_scheduler(spec) -> list[Problem]:
    """The scheduler's whole-spec checks (PBT's tunable paths and framework, grace periods)."""
    if spec.tune is None:
        return []
    choice = spec.tune.scheduler
    return choice.scheduler.check(spec, choice.params)


# ---------------------------------------------------------------- decisions, for TrialOutcome


def _recording(cls):
    """`cls` (a Ray scheduler class) that also records its STOP decisions: `rayline_stopped`, trial id -> units."""
    from ray.tune.schedulers import TrialScheduler

    class Recording(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rayline_stopped: dict[str, Any] = {}
            self.rayline_events: dict[str, list] = {}

        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.STOP:
                self.rayline_stopped[trial.trial_id] = result.get(TIME_ATTR)
            return decision

        def _exploit(self, tune_controller, trial, trial_to_clone):  # PBT only
            super()._exploit(tune_controller, trial, trial_to_clone)
            mutated = getattr(self, "_hyperparam_mutations", {}) or {}
            self.rayline_events.setdefault(trial.trial_id, []).append({
                "unit": _plain_number(self._trial_state[trial].last_train_time),
                "kind": "exploit",
                "from_trial": trial_to_clone.trial_id,
                "config": {k: _plain_number(trial.config.get(k)) for k in mutated},
            })

    Recording.__name__ = Recording.__qualname__ = f"Rayline{cls.__name__}"
    return Recording


def _plain_number(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
