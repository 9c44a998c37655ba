"""Read one sweep back from the MLflow store: the pipeline run and its trial child runs.

What `Registry.start_pipeline_run`, `Registry.log_trial` and `Registry.register` wrote is
all there is: the spec as flat params on the pipeline run (`task`, `train.metric`, ...),
the winner's `valid_*` and `test_*` metrics on it, the registered version's tags (`metric`,
`task`), and per trial its overrides as params, each epoch's validation metrics (step =
epoch index) and the tags rayline.trial_status, rayline.winner, rayline.stop_reason,
rayline.units_trained, rayline.trial_events (JSON) and rayline.family. Runs logged before
the last four tags existed read back with those fields empty; the report says so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from rayline.errors import RegistryError
from rayline.spec import metric_mode

__all__ = ["Trial", "Sweep", "load_sweep", "parse_param"]

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Trial:
    trial_id: str
    run_id: str
    params: dict  # path -> value, parsed back from MLflow's strings (parse_param)
    curve: list  # [(units trained, metric value)] one point per epoch, in order
    status: str  # terminated | error (rayline.trial_status)
    winner: bool = False
    stop_reason: str | None = None  # completed | early_stopped | time_budget | error; None: not recorded
    units_trained: int | None = None
    events: list = field(default_factory=list)  # the scheduler's decisions (PBT exploits, ...)
    family: str | None = None  # "torch/mlp"

    def best(self, mode: str) -> float | None:
        """The trial's best value of the metric over its epochs (how the winner is picked)."""
        values = [v for _, v in self.curve if v is not None and math.isfinite(v)]
        if not values:
            return None
        return max(values) if mode == "max" else min(values)

    @property
    def units(self) -> int | None:
        """Units (epochs, boosting rounds) it trained: the tag, else the epochs it reported."""
        if self.units_trained is not None:
            return self.units_trained
        return self.curve[-1][0] if self.curve else None


@dataclass
class Sweep:
    run_id: str
    name: str  # the pipeline (spec) name
    run_name: str
    started_ms: int
    status: str  # MLflow's run status: FINISHED, FAILED, KILLED, RUNNING
    metric: str
    mode: str  # max | min
    trials: list  # Trial, in the order they were logged
    test_metrics: dict = field(default_factory=dict)  # the winner's, without the test_ prefix
    valid_metrics: dict = field(default_factory=dict)
    version: str | None = None  # the registered model version of this run, if any
    framework: str = ""

    @property
    def winner(self) -> Trial | None:
        flagged = [t for t in self.trials if t.winner]
        if flagged:
            return flagged[0]
        scored = [t for t in self.trials if t.best(self.mode) is not None]
        if not scored:
            return None
        sign = 1 if self.mode == "max" else -1
        return max(scored, key=lambda t: sign * t.best(self.mode))

    @property
    def has_decisions(self) -> bool:
        """Whether the run recorded why trials stopped (runs before rayline.stop_reason did not)."""
        return any(t.stop_reason or t.events for t in self.trials)


def parse_param(text):
    """An MLflow param string back to the value the trial used: numbers, booleans, lists
    (logged as JSON by Registry) and null as such; anything else stays the string."""
    if not isinstance(text, str):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float, bool, list, dict)) or value is None else text


def _not_found(what: str, allowed: str, registry) -> RegistryError:
    # A RegistryError passes through Registry._guard as it is (anything else is wrapped).
    return RegistryError(f"report: {what} in {registry.shown_uri} (allowed: {allowed})")


def _pipelines(client) -> list[str]:
    names, token = [], None
    while True:
        page = client.search_experiments(filter_string="name LIKE 'rayline/%'", page_token=token)
        names.extend(e.name[len("rayline/"):] for e in page)
        token = getattr(page, "token", None)
        if not token:
            return sorted(names)


def _search_all(client, experiment_ids: list, filter_string: str, order_by=None) -> list:
    out, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, order_by=order_by,
                                  max_results=1000, page_token=token)
        out.extend(page)
        token = getattr(page, "token", None)
        if not token:
            return out


def _trial_runs(client, run) -> list:
    """The sweep's trial child runs, oldest first; [] for a run without a sweep.

    A run of a spec without `tune:` logs its one training run as trial `train` with no
    params: that is no sweep to report on.
    """
    children = _search_all(client, [run.info.experiment_id],
                           f"tags.`mlflow.parentRunId` = '{run.info.run_id}'", order_by=["attributes.start_time ASC"])
    trials = [c for c in children if c.data.tags.get("rayline.kind") == "trial"]
    if len(trials) == 1 and trials[0].info.run_name == "trial-train" and not trials[0].data.params:
        return []
    return trials


def _resolve(registry, target: str):
    """(pipeline run, its trial runs) for a run id or a pipeline name."""
    from mlflow.exceptions import MlflowException

    client = registry.client
    if _RUN_ID.match(target):
        try:
            run = client.get_run(target)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            run = None
        if run is not None:
            tags = run.data.tags
            if tags.get("rayline.kind") == "trial" and tags.get("mlflow.parentRunId"):
                run = client.get_run(tags["mlflow.parentRunId"])  # a trial's id: report on its sweep
            elif tags.get("rayline.kind") != "pipeline":
                raise _not_found(f"run {target} is not a rayline pipeline run (no tag rayline.kind=pipeline)",
                                 "the run id `rayline run` printed", registry)
            trials = _trial_runs(client, run)
            if not trials:
                raise _not_found(f"run {target} has no tuning trials (a run of a spec without tune:)",
                                 "the run id of a sweep, as `rayline run` prints it", registry)
            return run, trials
    experiment = client.get_experiment_by_name(f"rayline/{target}")
    if experiment is None or experiment.lifecycle_stage == "deleted":
        known = _pipelines(client)
        what = "run id" if _RUN_ID.match(target) else "run id or pipeline name"
        raise _not_found(f"unknown {what} {target!r}", "a run id printed by `rayline run`, or a pipeline name: "
                         f"{', '.join(known[:20]) if known else 'none yet'}", registry)
    runs = _search_all(client, [experiment.experiment_id], "tags.`rayline.kind` = 'pipeline'",
                       order_by=["attributes.start_time DESC"])
    for run in runs:
        trials = _trial_runs(client, run)
        if trials:
            return run, trials
    raise _not_found(f"pipeline {target!r} has no run with tuning trials ({len(runs)} runs)",
                     "a pipeline whose spec has a tune: section, run with `rayline run`", registry)


def _int(text) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


def _events(text) -> list:
    if not text:
        return []
    try:
        events = json.loads(text)
    except ValueError:
        return []  # cut at MLflow's tag limit, or not ours: the report does without
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def _metric(registry, run, trials: list, version) -> str:
    """The metric the sweep ranked trials by.

    The registered version's `metric` tag (Registry.register) says it outright; else the
    spec's train.metric param; else the default of the task (`task` param): the same rule
    as PipelineSpec.resolved_metric; else what the trials reported.
    """
    if version is not None and (version.tags or {}).get("metric"):
        return version.tags["metric"]
    params = run.data.params
    if params.get("train.metric"):
        return params["train.metric"]
    task = params.get("task") or ((version.tags or {}).get("task") if version is not None else None)
    if task in ("classification", "regression"):
        return "accuracy" if task == "classification" else "rmse"
    reported = set().union(*(t.data.metrics for t in trials)) if trials else set()
    for name in ("accuracy", "rmse"):
        if name in reported:
            return name
    from rayline.train.loop import TRAINING_STATS

    candidates = reported - {"resumed", "epoch", *TRAINING_STATS}
    return sorted(candidates)[0] if candidates else "accuracy"


def _curve(client, run_id: str, metric: str) -> list:
    by_step = {}
    for m in client.get_metric_history(run_id, metric):
        by_step[int(m.step)] = float(m.value)  # a step logged twice: the later value wins
    # step = the epoch's 0-based index; the curve's x is units trained (epoch + 1), the scale
    # rayline.units_trained and the schedulers' decisions ("unit") are on.
    return [(step + 1, by_step[step]) for step in sorted(by_step)]


def load_sweep(registry, target: str) -> Sweep:
    """The sweep of run id `target` (a trial's run id also names its sweep), or of pipeline
    `target`: its newest pipeline run that has tuning trials.

    Raises RegistryError (one line) for an unknown run id or name, for a run without
    trials, and when the store cannot be read.
    """
    client = registry.client
    with registry._guard(f"read the sweep {target!r}"):
        run, trial_runs = _resolve(registry, target)
        run_id = run.info.run_id
        versions = client.search_model_versions(f"run_id = '{run_id}'")
        version = max(versions, key=lambda v: int(v.version)) if versions else None
        metric = _metric(registry, run, trial_runs, version)
        trials = []
        for tr in trial_runs:
            tags = tr.data.tags
            name = tr.info.run_name or ""
            trials.append(Trial(
                trial_id=name[len("trial-"):] if name.startswith("trial-") else name or tr.info.run_id[:8],
                run_id=tr.info.run_id,
                params={k: parse_param(v) for k, v in sorted(tr.data.params.items())},
                curve=_curve(client, tr.info.run_id, metric),
                status=tags.get("rayline.trial_status", "terminated"),
                winner=tags.get("rayline.winner") == "true",
                stop_reason=tags.get("rayline.stop_reason") or None,
                units_trained=_int(tags.get("rayline.units_trained")),
                events=_events(tags.get("rayline.trial_events")),
                family=tags.get("rayline.family") or None,
            ))
        metrics = run.data.metrics
        experiment = client.get_experiment(run.info.experiment_id)
    name = experiment.name[len("rayline/"):] if experiment.name.startswith("rayline/") else experiment.name
    return Sweep(
        run_id=run_id, name=name, run_name=run.info.run_name or run_id, started_ms=run.info.start_time or 0,
        status=run.info.status, metric=metric, mode=metric_mode(metric), trials=trials,
        test_metrics={k[5:]: v for k, v in sorted(metrics.items()) if k.startswith("test_")},
        valid_metrics={k[6:]: v for k, v in sorted(metrics.items()) if k.startswith("valid_")},
        version=str(version.version) if version is not None else None,
        framework=(version.tags or {}).get("framework", "") if version is not None else run.data.params.get("model.framework", ""),
    )
