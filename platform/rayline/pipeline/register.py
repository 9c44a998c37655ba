"""The register stage: every trial logged to the pipeline's MLflow run, the winner's artifact
assembled (checkpoint + fitted preprocessing + spec), checked against the probe rows the model
answered while training, scored on the test split and registered as a new model version.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable

from rayline.errors import TrainingError
from rayline.spec import PipelineSpec
from rayline.train.loop import TRAINING_STATS
from rayline.workspace import Workspace

__all__ = ["Registered", "register_stage"]

_BOOKKEEPING = ("epoch", "resumed", *TRAINING_STATS)  # in each history row, but not model metrics


@dataclass
class Registered:
    version: str
    test_metrics: dict
    leaderboard: list  # a sweep over model families: the best trial of each, best first; else []
    judgement: str | None = None  # the new version against the champion on this run's test split, a line


def register_stage(registry, run_id: str, spec: PipelineSpec, trained, *, ws: Workspace, experiment: str,
                   on_stage: Callable[[str, str, str], None]) -> Registered:
    """Log `trained`'s trials and register its winner as model `spec.name`'s next version."""
    from rayline.data.task_cpus import fitted_to_free_cpus
    from rayline.redact import redact_uri
    from rayline.registry import RETRAIN_TAG
    from rayline.retrain.reason import RETRAIN_REASON_ENV
    from rayline.spec import apply_overrides, metric_mode
    from rayline.tune.leaderboard import family_leaderboard

    winner, trials, data = trained.winner, trained.trials, trained.data
    metric = spec.resolved_metric(data.task)
    on_stage("register", "start", redact_uri(ws.tracking_uri))
    for trial in trials:
        registry.log_trial(run_id, spec.name, trial.trial_id, trial.overrides, trial.status,
                           trial.result.history if trial.result else [], winner=trial.result is winner,
                           stop_reason=trial.stop_reason, units_trained=trial.units_trained,
                           events=trial.events, family=trial.family)
    leaderboard = family_leaderboard(trials, metric, metric_mode(metric)) if spec.tune else []
    if len(leaderboard) > 1:  # a sweep over model families
        registry.log_leaderboard(run_id, metric, leaderboard)
    winning_spec = apply_overrides(spec, winner.overrides) if winner.overrides else spec
    model_metrics = {k: v for k, v in winner.metrics.items() if k not in _BOOKKEEPING}
    staging = ws.temp_dir("artifact")  # <ws>/tmp; a killed run's is removed by the next run
    try:
        artifact = _artifact(os.path.join(staging, "model"), winner.checkpoint_dir, data, winning_spec, model_metrics)
        # Offline, through the serving Predictor (the same code as the endpoint's answers),
        # where the test rows are: no test split in this process.
        from rayline.evaluation.offline import evaluate_rows

        with fitted_to_free_cpus("register", required=False):  # tasks only for a large test split
            test_metrics, partials = evaluate_rows(artifact, data.test_rows, with_partials=True)
        _add_test_metrics(artifact, test_metrics)
        _add_predictions(artifact, partials, data.preprocessing)
        mv = registry.register(
            run_id, spec.name, artifact,
            metrics={**{f"valid_{k}": v for k, v in model_metrics.items()},
                     **{f"test_{k}": v for k, v in test_metrics.items()}},
            tags={"framework": winning_spec.model.framework, "task": data.task, "metric": metric,
                  f"valid_{metric}": winner.metrics[metric], "data_fingerprint": data.fingerprint,
                  **({"data_cache_key": data.cache_key} if data.cache_key else {}),
                  # Lineage (`rayline models show`): the data, the trial and the checkpoint it came from.
                  "data_source": redact_uri(spec.data.source.path or spec.data.source.name or ""),
                  "experiment": experiment,
                  "trial_id": next((t.trial_id for t in trials if t.result is winner), ""),
                  "checkpoint": redact_uri(winner.checkpoint_dir),
                  # The retrain loop's reason for this run (rayline/retrain/loop.py sets it for its run).
                  **({RETRAIN_TAG: os.environ[RETRAIN_REASON_ENV]} if os.environ.get(RETRAIN_REASON_ENV) else {})},
            input_example=data.probe_frame,  # raw test rows, bounded (PROBE_ROWS)
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # The new version against the one serving, on this run's own test split (rayline/retrain/judge.py).
    from rayline.retrain import judge_on_test_split

    compare = spec.retrain.compare if spec.retrain else None
    with fitted_to_free_cpus("register", required=False):
        judged, why_not = judge_on_test_split(registry, spec.name, mv.version, test_metrics, data.test_rows,
                                               metric=(compare and compare.metric) or metric,
                                               rows=data.rows["test"], data=f"the test split of run {run_id}",
                                               min_delta=compare.min_delta if compare else 0.0)
    judgement = judged.line() if judged is not None else (why_not or None)
    if judgement:
        on_stage("register", "progress", "judged: " + judgement)
    on_stage("register", "done", f"model {spec.name} version {mv.version}")
    return Registered(mv.version, test_metrics, leaderboard if len(leaderboard) > 1 else [], judgement)


def _artifact(target: str, checkpoint_dir: str, data, spec: PipelineSpec, metrics: dict) -> str:
    """The model artifact at `target`, loaded back as a Serve replica loads it and checked against
    the probe: training/serving skew fails the run here, before registering."""
    from rayline.pipeline.artifact import write_artifact
    from rayline.inference.predictor import Predictor
    from rayline.storage import download_dir, is_uri
    from rayline.train.backend import load_backend

    if is_uri(checkpoint_dir):  # on object storage: the artifact is assembled from a local copy
        checkpoint_dir = download_dir(checkpoint_dir, os.path.join(os.path.dirname(target), "checkpoint"))
    artifact = write_artifact(target, checkpoint_dir=checkpoint_dir, preprocessing=data.preprocessing, spec=spec,
                              metrics=metrics, fingerprint=data.fingerprint,
                              versions=load_backend(spec.model.framework).versions(),
                              statistics=getattr(data, "statistics", None))
    _check_probe(Predictor(artifact), data)
    return artifact


def _check_probe(predictor, data) -> None:
    """The artifact, loaded as a Serve replica loads it, must reproduce on the raw probe rows the
    outputs the model being trained gave at its checkpoint (rayline/train/probe.py)."""
    from rayline.inference.predictor import artifact_root
    from rayline.train.probe import check_probe, read_probe

    record = read_probe(artifact_root(predictor.model_dir))
    if record is None or data.probe_frame is None:
        return  # a checkpoint from before the probe (a resumed older run)
    outputs = predictor.infer(predictor.preprocessing.transform(data.probe_frame))
    problem = check_probe(record, outputs, f"register: model {predictor.name}")
    if problem:
        raise TrainingError(problem)


def _add_predictions(artifact: str, partials, preprocessing) -> None:
    """The held-out split's predictions into the training statistics: the reference that prediction
    drift compares answers with (rayline/monitoring). Read off the test metrics' partials, no other
    pass: classification, the predicted classes (the confusion matrix's column sums); regression, a
    histogram of the predicted values in BINS bins at their deciles (their KLL sketch)."""
    from rayline.monitoring.statistics import STATISTICS_FILE, TrainingStatistics, value_histogram

    path = os.path.join(artifact, STATISTICS_FILE)
    if not os.path.isfile(path) or partials is None or not partials.rows:
        return
    statistics = TrainingStatistics.load(path)
    if partials.task == "regression":
        sketch = partials.predicted_sketch()
        if sketch is None or sketch.is_empty():
            return
        edges, counts = value_histogram(sketch)
        statistics.predictions = {"edges": edges, "counts": counts}
    else:
        classes = preprocessing.label.classes or []
        statistics.predictions = {"labels": [c.item() if hasattr(c, "item") else c for c in classes],
                                  "counts": partials.confusion.sum(axis=0).astype(int).tolist()}
    statistics.save(path)


def _add_test_metrics(artifact: str, test_metrics: dict) -> None:
    import json

    from rayline.files import atomic_write
    from rayline.inference.predictor import META_FILE

    path = os.path.join(artifact, META_FILE)
    with open(path) as fh:
        meta = json.load(fh)
    meta["test_metrics"] = test_metrics
    atomic_write(path, json.dumps(meta, indent=1))
